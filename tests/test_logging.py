"""RunLogger: run-dir files, metrics.jsonl records and resume truncation, wandb mode resolution and failures."""
from __future__ import annotations

import json
import re
import sys
import types
from pathlib import Path

import pytest
import yaml

from config import RunConfig
from runtime.logging import (
    TRAIN_KEYS,
    RunLogger,
    git_commit,
    resolve_wandb_mode,
    truncate_metrics,
    wandb_run_id,
)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No test may touch ~/.netrc, ~/.config/wandb or /tmp caches, or see a real key.
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb_dir"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(var, raising=False)


def _cfg(mode: str = "disabled") -> RunConfig:
    cfg = RunConfig()
    cfg.log.wandb.mode = mode  # type: ignore[assignment]
    cfg.log.run_name = "test-run"
    return cfg


def _train(step: int, **kw) -> dict:
    return {"tokens": step * 100, "loss": 5.0 - 0.1 * step, "lr": 1e-3, "grad_norm": 0.5, "tok_per_s": 1234.5, **kw}


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_run_dir_files_and_records(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with RunLogger(run, _cfg(), rank=0, total_steps=10) as log:
        for step in range(1, 4):
            log.log_train(step, _train(step, mfu=0.4))
        log.log_eval(3, {"tokens": 300, "val_loss": 4.2, "val_loss/wikitext": 4.9,
                         "telemetry": {"scale/layer0.q": 1.5, "grad": {"embed": 0.1}}})
    assert yaml.safe_load((run / "config.yaml").read_text()) == _cfg().to_dict()
    assert (run / "git.txt").read_text().startswith("commit: ")
    records = _records(run)
    assert [r["kind"] for r in records] == ["train"] * 3 + ["eval"]
    for r in records[:3]:
        assert set(TRAIN_KEYS) <= r.keys() and r["mfu"] == 0.4
    ev = records[3]
    assert ev["step"] == 3 and ev["val_loss"] == 4.2 and ev["val_loss/wikitext"] == 4.9
    assert ev["telemetry/scale/layer0.q"] == 1.5 and ev["telemetry/grad/embed"] == 0.1  # flat keys


def test_non_finite_and_tensor_values_stay_valid_json(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with RunLogger(tmp_path, _cfg(), rank=0, total_steps=5) as log:
        log.log_train(1, _train(1, loss=float("nan"), grad_norm=torch.tensor(float("inf")), lr=torch.tensor(2e-3)))
    (r,) = _records(tmp_path)  # json.loads of the strict file: no NaN/Infinity tokens
    assert r["loss"] is None and r["grad_norm"] is None and r["lr"] == pytest.approx(2e-3)


def test_missing_required_keys_fail_fast(tmp_path: Path) -> None:
    with RunLogger(tmp_path, _cfg(), rank=0, total_steps=5) as log:
        with pytest.raises(ValueError, match="grad_norm"):
            log.log_train(1, {"tokens": 1, "loss": 1.0, "lr": 1.0, "tok_per_s": 1.0})
        with pytest.raises(ValueError, match="val_loss"):
            log.log_eval(1, {"tokens": 1})


def test_other_ranks_do_no_io(tmp_path: Path) -> None:
    run = tmp_path / "run"
    log = RunLogger(run, _cfg(), rank=1, total_steps=5)
    log.log_train(1, _train(1))
    log.log_eval(1, {"tokens": 1, "val_loss": 1.0})
    log.close()
    assert not run.exists()


def test_resume_truncates_records_after_the_checkpoint(tmp_path: Path) -> None:
    with RunLogger(tmp_path, _cfg(), rank=0, total_steps=10) as log:
        for step in range(1, 8):
            log.log_train(step, _train(step))
            if step % 2 == 0:
                log.log_eval(step, {"tokens": step * 100, "val_loss": 3.0})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 8, "tokens": 8')  # the interrupted run died mid-line
    with RunLogger(tmp_path, _cfg(), rank=0, total_steps=10, start_step=4) as log:  # checkpoint at step 4
        for step in range(5, 11):
            log.log_train(step, _train(step))
    records = _records(tmp_path)
    train_steps = [r["step"] for r in records if r["kind"] == "train"]
    assert train_steps == list(range(1, 11))  # no duplicates, no gap
    assert [r["step"] for r in records if r["kind"] == "eval"] == [2, 4]
    assert not list(tmp_path.glob("*.partial"))


def test_fresh_start_clears_records_of_a_run_that_never_checkpointed(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "kind": "eval", "tokens": 0, "val_loss": 9.0}\n{"step": 1}\n')
    assert truncate_metrics(path, 0) == 2 and path.read_text() == ""
    assert truncate_metrics(tmp_path / "absent.jsonl", 5) == 0


# ---------------------------------------------------------------------------------------------------- wandb


def test_wandb_auto_is_offline_without_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_wandb_mode("auto") == "offline"
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / ".netrc").write_text("machine example.com login u password p\n")
    assert resolve_wandb_mode("auto") == "offline"
    (tmp_path / "home" / ".netrc").write_text("garbage that does not parse \"\n")
    assert resolve_wandb_mode("auto") == "offline"


def test_wandb_auto_is_online_with_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "home").mkdir()
    netrc_file = tmp_path / "home" / ".netrc"
    netrc_file.write_text("machine api.wandb.ai\n  login user\n  password abc123\n")
    netrc_file.chmod(0o600)
    assert resolve_wandb_mode("auto") == "online"
    netrc_file.unlink()
    monkeypatch.setenv("WANDB_API_KEY", "abc123")
    assert resolve_wandb_mode("auto") == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the user's shell says no
    assert resolve_wandb_mode("auto") == "disabled"


def test_explicit_wandb_modes_pass_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "abc123")
    for mode in ("online", "offline", "disabled"):
        assert resolve_wandb_mode(mode) == mode


def test_wandb_run_id_is_stable_across_resumes(tmp_path: Path) -> None:
    first = wandb_run_id(tmp_path)
    assert first == wandb_run_id(tmp_path) and re.fullmatch(r"[0-9a-z]{8}", first)


class _FakeRun:
    def __init__(self, fail_log: bool) -> None:
        self.fail_log, self.logged, self.finished = fail_log, [], None
        self.config = types.SimpleNamespace(update=lambda *a, **k: None)

    def define_metric(self, *a, **k) -> None:
        pass

    def log(self, data: dict) -> None:
        if self.fail_log:
            raise ConnectionError("network is down")
        self.logged.append(data)

    def finish(self, exit_code: int = 0) -> None:
        self.finished = exit_code


def _fake_wandb(monkeypatch: pytest.MonkeyPatch, init) -> types.ModuleType:
    fake = types.ModuleType("wandb")
    fake.init = init  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return fake


def test_wandb_failures_never_stop_training(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture) -> None:
    def broken_init(**kw):
        raise RuntimeError("api.wandb.ai unreachable")

    _fake_wandb(monkeypatch, broken_init)
    with RunLogger(tmp_path / "a", _cfg("online"), rank=0, total_steps=3) as log:
        log.log_train(1, _train(1))
    out = capsys.readouterr()
    assert (out.out + out.err).count("WARNING: wandb init") == 1
    assert len(_records(tmp_path / "a")) == 1

    runs: list[_FakeRun] = []
    _fake_wandb(monkeypatch, lambda **kw: runs.append(_FakeRun(fail_log=True)) or runs[-1])
    with RunLogger(tmp_path / "b", _cfg("offline"), rank=0, total_steps=3) as log:
        for step in (1, 2, 3):
            log.log_train(step, _train(step))
    out = capsys.readouterr()
    assert (out.out + out.err).count("WARNING: wandb log") == 1  # one warning, then wandb is off
    assert runs[0].finished == 1 and len(_records(tmp_path / "b")) == 3


def test_wandb_init_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from config import run_tags
    calls: list[dict] = []
    run = _FakeRun(fail_log=False)
    _fake_wandb(monkeypatch, lambda **kw: calls.append(kw) or run)
    cfg = _cfg("auto")
    cfg.log.wandb.group, cfg.log.wandb.tags = "sweep1", ["a", "b"]
    for start in (0, 2):  # a second construction = a resume: the same id
        with RunLogger(tmp_path, cfg, rank=0, total_steps=3, start_step=start, tags=run_tags(cfg)) as log:
            log.log_train(start + 1, _train(start + 1))  # train.py passes config.run_tags(cfg)
    first, second = calls
    assert first["mode"] == "offline" and first["resume"] == "allow" and first["dir"] == str(tmp_path)
    assert (first["project"], first["group"], first["name"]) == ("scalevec", "sweep1", "test-run")
    assert first["tags"][:2] == ["a", "b"] and "lr:0.004" in first["tags"]  # the config's, then the derived ones
    assert first["id"] == second["id"] == (tmp_path / "wandb_id.txt").read_text().strip()
    assert run.logged[0]["step"] == 1 and "kind" not in run.logged[0]
    calls.clear()
    RunLogger(tmp_path / "c", cfg, rank=0, total_steps=3, disable_wandb=True).close()
    assert calls == []


def test_git_commit() -> None:
    commit = git_commit()
    assert commit is None or (len(commit) == 40 and int(commit, 16) >= 0)
    assert git_commit(Path("/")) is None
