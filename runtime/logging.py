"""Run logging: `metrics.jsonl` (the record scripts read), the console (tqdm), and wandb (optional, never fatal).

Only rank 0 does IO; on other ranks every method is a no-op, so the trainer calls them unconditionally.

Files in the run dir: `config.yaml` (resolved config), `git.txt` (commit, dirty flag), `metrics.jsonl` (one JSON
object per line, `kind` = "train" | "eval"), `wandb_id.txt` (so a resumed run continues the same wandb run),
`wandb/` (wandb's own files).
"""
from __future__ import annotations

import json
import math
import netrc
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional
from urllib.parse import urlparse

from config import RunConfig
from runtime.files import atomic_write

TRAIN_KEYS = ("step", "tokens", "loss", "lr", "grad_norm", "tok_per_s")
EVAL_KEYS = ("step", "tokens", "val_loss")
METRICS_FILE = "metrics.jsonl"
WANDB_ID_FILE = "wandb_id.txt"
_REPO_ROOT = Path(__file__).resolve().parent.parent


def git_commit(repo: Path = _REPO_ROOT) -> Optional[str]:
    """HEAD of the repository this code runs from, or None (not a checkout, git missing, …)."""
    out = _git(repo, "rev-parse", "HEAD")
    return out.strip() if out else None


def _git_dirty(repo: Path = _REPO_ROOT) -> Optional[bool]:
    out = _git(repo, "status", "--porcelain", "--untracked-files=no")
    return None if out is None else bool(out.strip())


def _git(repo: Path, *args: str) -> Optional[str]:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


# ------------------------------------------------------------------------------------------------------ wandb


def wandb_logged_in(env: Mapping[str, str] = os.environ, home: Optional[Path] = None) -> bool:
    """An API key in WANDB_API_KEY, or a netrc entry for the wandb host (what `wandb login` writes)."""
    if env.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(env.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    path = Path(env["NETRC"]) if env.get("NETRC") else (home or Path.home()) / ".netrc"
    try:
        entry = netrc.netrc(str(path)).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(entry and entry[2])


def resolve_wandb_mode(mode: str, env: Mapping[str, str] = os.environ, home: Optional[Path] = None) -> str:
    """auto → online when logged in, else offline (wandb itself fails rather than fall back). Others pass through.

    Under auto an explicit WANDB_MODE in the environment wins: it is the user's choice for this shell.
    """
    if mode != "auto":
        return mode
    if env.get("WANDB_MODE") in ("online", "offline", "disabled"):
        return env["WANDB_MODE"]
    return "online" if wandb_logged_in(env, home) else "offline"


def wandb_run_id(run_dir: Path) -> str:
    """The run's wandb id, created once and stored in the run dir so that a resume continues the same run."""
    path = run_dir / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = secrets.token_hex(4)  # wandb ids: [a-z0-9], unique per project
    atomic_write(path, run_id + "\n")
    return run_id


# ----------------------------------------------------------------------------------------------------- helpers


def _plain(value: Any) -> Any:
    """Tensors / numpy scalars → Python numbers; NaN/inf → None (JSON has no NaN; `json.loads` must accept it)."""
    if hasattr(value, "tolist") and callable(value.tolist):  # torch / numpy, 0-d → a scalar
        value = value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def flatten(record: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"scale": {"q": 1.0}} → {"scale/q": 1.0}: flat keys for jsonl columns and wandb charts alike."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "/"))
        else:
            out[name] = _plain(value)
    return out


def truncate_metrics(path: Path, start_step: int) -> int:
    """Drop records the resumed run will write again; returns how many were dropped.

    Resuming from the checkpoint at `start_step` re-runs steps > start_step, so their records go. A fresh
    start (start_step = 0, no checkpoint) re-runs everything, so the file starts empty. Lines that do not
    parse — a crash mid-write leaves a half line — go too. Rewritten atomically: a crash here loses nothing.
    """
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
            keep = start_step > 0 and isinstance(record, dict) and int(record["step"]) <= start_step
        except (ValueError, KeyError, TypeError):
            keep = False
        if keep:
            kept.append(line)
        else:
            dropped += 1 if line.strip() else 0
    if dropped:
        atomic_write(path, "".join(line + "\n" for line in kept))
    return dropped


def metrics_tail(path: Path) -> tuple[int, set[int]]:
    """The last step metrics.jsonl holds a record of (0: none), and the steps it holds an evaluation of."""
    last, evals = 0, set()
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
                step = int(record["step"])
            except (ValueError, KeyError, TypeError):
                continue
            last = max(last, step)
            if record.get("kind") == "eval":
                evals.add(step)
    return last, evals


def _fmt_si(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def _console_fields(record: Mapping[str, Any]) -> dict[str, str]:
    fields = {}
    if record.get("loss") is not None:
        fields["loss"] = f"{record['loss']:.4f}"
    if record.get("lr") is not None:
        fields["lr"] = f"{record['lr']:.2e}"
    if record.get("tok_per_s") is not None:
        fields["tok/s"] = _fmt_si(record["tok_per_s"])
    if record.get("mfu") is not None:
        fields["MFU"] = f"{100 * record['mfu']:.1f}%"
    return fields


# ------------------------------------------------------------------------------------------------------ logger


class RunLogger:
    """metrics.jsonl + console + wandb for one run. Safe to construct on every rank: only rank 0 acts."""

    def __init__(self, run_dir: Path, cfg: RunConfig, rank: int, total_steps: int, start_step: int = 0,
                 disable_wandb: bool = False, tags: Optional[list[str]] = None) -> None:
        """`tags`: the wandb run's tags (default: log.wandb.tags; train.py adds what sets the run apart,
        config.run_tags)."""
        self.run_dir = Path(run_dir)
        self.tags = list(cfg.log.wandb.tags if tags is None else tags)
        self.active = rank == 0
        self.total_steps = total_steps
        self.start_step = start_step
        self._file = None
        self._bar = None
        self._wandb: Any = None  # the wandb run, or None
        self._closed = False
        self.eval_steps: set[int] = set()  # the steps metrics.jsonl has an evaluation of (rank 0 reads it)
        if not self.active:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(self.run_dir / "config.yaml", cfg.to_yaml())
        commit, dirty = git_commit(), _git_dirty()
        self.commit = commit
        atomic_write(self.run_dir / "git.txt", f"commit: {commit}\ndirty: {dirty}\n")
        metrics = self.run_dir / METRICS_FILE
        dropped = truncate_metrics(metrics, start_step)
        if dropped:
            self._print(f"resume from step {start_step}: dropped {dropped} later records from {metrics}")
        last, self.eval_steps = metrics_tail(metrics)
        if start_step > 0 and last < start_step:  # the file lost what it had not synced when the machine went down
            print(f"warning: {metrics} ends at step {last}, before the checkpoint's step {start_step}: the records "
                  f"of steps {last + 1}..{start_step} are lost (the checkpoint's own evaluation is done again)",
                  file=sys.stderr)
        self._file = open(metrics, "a")
        self._t0, self._step0 = time.perf_counter(), start_step
        if sys.stderr.isatty():  # a progress bar on a terminal; plain lines in log files (no \r clutter)
            from tqdm import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True)
        if not disable_wandb:
            self._start_wandb(cfg)

    # -------------------------------------------------------------------------------------------- public API

    def log_train(self, step: int, record: Mapping[str, Any]) -> None:
        """One train record: at least tokens, loss, lr, grad_norm, tok_per_s (+ mfu when known)."""
        if not self.active:
            return
        out = self._record("train", step, record, TRAIN_KEYS)
        self._write(out)
        if self._bar is not None:
            self._bar.update(max(0, step - self._bar.n))
            self._bar.set_postfix(_console_fields(out), refresh=True)
        else:
            self._print(f"step {step}/{self.total_steps} | "
                        + " | ".join(f"{k} {v}" for k, v in _console_fields(out).items()) + self._eta(step))

    def log_eval(self, step: int, record: Mapping[str, Any]) -> None:
        """One eval record: tokens, val_loss, `val_loss/<name>` per extra set, telemetry (nested dicts flatten)."""
        if not self.active:
            return
        out = self._record("eval", step, record, EVAL_KEYS)
        self._write(out)
        losses = " | ".join(f"{k} {v:.4f}" for k, v in out.items() if k.startswith("val_loss") and v is not None)
        self._print(f"eval step {step}: {losses}")

    def sync(self) -> None:
        """Flush and fsync metrics.jsonl: a checkpoint is marked complete only after the records up to it are on
        disk, so a resume never starts past a gap."""
        if self.active and self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self, failed: bool = False) -> None:
        if not self.active or self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        if self._file is not None:
            self._file.close()
        if self._wandb is not None:
            try:
                self._wandb.finish(exit_code=1 if failed else 0)
            except Exception as e:  # noqa: BLE001 - wandb must never take the run down
                self._wandb_failed("finish", e)

    def __enter__(self) -> "RunLogger":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    # ------------------------------------------------------------------------------------------------- inner

    def _record(self, kind: str, step: int, record: Mapping[str, Any], required: tuple[str, ...]) -> dict:
        out = {"step": int(step), **flatten({k: v for k, v in record.items() if k != "step"})}
        missing = [k for k in required if k not in out]
        if missing:  # a trainer bug: fail on the first record, not in a plotting script weeks later
            raise ValueError(f"{kind} record for step {step} lacks required keys {missing}; has {sorted(out)}")
        out["kind"] = kind
        out["time"] = round(time.time(), 3)
        return out

    def _write(self, out: dict) -> None:
        assert self._file is not None
        self._file.write(json.dumps(out, allow_nan=False) + "\n")
        self._file.flush()  # a crash loses at most the line being written (truncate_metrics drops it)
        if self._wandb is not None:
            try:
                self._wandb.log({k: v for k, v in out.items() if k not in ("kind", "time") and v is not None})
            except Exception as e:  # noqa: BLE001
                self._wandb_failed("log", e)

    def _eta(self, step: int) -> str:
        done, elapsed = step - self._step0, time.perf_counter() - self._t0
        if done <= 0 or step >= self.total_steps:
            return ""
        left = int(elapsed / done * (self.total_steps - step))
        return f" | eta {left // 3600}:{left // 60 % 60:02d}:{left % 60:02d}"

    def _print(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text, flush=True)

    def _start_wandb(self, cfg: RunConfig) -> None:
        w = cfg.log.wandb
        mode = resolve_wandb_mode(w.mode)
        if mode == "disabled":
            return
        try:
            import wandb

            self._wandb = wandb.init(
                project=w.project, group=w.group, tags=self.tags,
                name=cfg.log.run_name or self.run_dir.name, dir=str(self.run_dir), id=wandb_run_id(self.run_dir),
                resume="allow", mode=mode, config=cfg.to_dict(),
            )
            # Chart against our step, not wandb's internal counter: after a resume wandb's counter is past the
            # checkpoint, and points logged with an explicit smaller `step=` would be silently dropped.
            self._wandb.define_metric("step")
            self._wandb.define_metric("*", step_metric="step")
            if self.commit:
                self._wandb.config.update({"git_commit": self.commit}, allow_val_change=True)
        except Exception as e:  # noqa: BLE001
            self._wandb_failed(f"init (mode={mode})", e)

    def _wandb_failed(self, what: str, e: Exception) -> None:
        self._print(f"WARNING: wandb {what} failed ({type(e).__name__}: {e}); continuing without wandb — "
                    f"{self.run_dir / METRICS_FILE} has every record")
        run, self._wandb = self._wandb, None
        if run is not None and what != "finish":
            try:
                run.finish(exit_code=1)
            except Exception:  # noqa: BLE001
                pass
