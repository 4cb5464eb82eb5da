"""scripts.bench (time, per-design memory, the transformers reference row) and scripts/gpu_check.sh's dry mode."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import bench, gpu_check

REPO = Path(__file__).resolve().parents[1]
TINY = ["--vocab-size", "512", "--micro-batch", "2", "--seq-len", "32", "--steps", "2", "--warmup", "1",
        "--device", "cpu", "model.d_model=64", "model.n_layers=2", "model.n_heads=2", "train.compile=false"]


def _rows(out: str) -> tuple[list[str], dict[str, list[str]]]:
    lines = out.splitlines()
    return lines[1].split(), {line.split()[0]: line.split() for line in lines[2:]}


def test_table_has_every_design_its_memory_and_the_ratios(tmp_path, capsys):
    table = tmp_path / "bench.json"
    assert bench.main(["--presets", "baseline", "unified", "--hf-reference", "--json", str(table), *TINY]) == 0
    out = capsys.readouterr().out
    header, rows = _rows(out)
    assert "peak MiB" in out.splitlines()[1] and header[-4:] == ["time", "×", "mem", "×"]
    assert set(rows) == {"baseline", "unified", "hf-llama"}
    assert rows["baseline"][-2:] == ["1.000", "1.000"]  # both ratios are to the first design
    data = json.loads(table.read_text())
    assert data["memory"] == "peak RSS growth, one process per design"
    by_name = {r["design"]: r for r in data["rows"]}
    for r in data["rows"]:  # each design measured in its own process: memory > 0, and a finite ratio
        assert r["ms_per_step"] > 0 and r["peak_mem_mib"] > 0 and r["mem_ratio"] > 0, r
    # transformers' Llama with the baseline's configuration has exactly the baseline's parameters
    assert by_name["hf-llama"]["params"] == by_name["baseline"]["params"] == 163_904
    assert by_name["unified"]["params"] > by_name["baseline"]["params"]


def test_hf_reference_rules(capsys):
    parse = bench.build_parser().parse_args
    designs, notes = bench.plan(parse(["--presets", "baseline", "--no-hf-reference"]))
    assert [d.name for d in designs] == ["baseline"] and not notes
    designs, notes = bench.plan(parse(["--models", "configs/tiny_moe.yaml", "configs/tiny_cpu.yaml",
                                       "--presets", "baseline"]))
    assert not any(d.hf for d in designs) and "MoE" in notes[0]  # LlamaForCausalLM is dense: no row, a note
    designs, _ = bench.plan(parse(["--models", "configs/tiny_cpu.yaml model.d_ffn=96", "--presets", "hg"]))
    assert [d.name for d in designs] == ["tiny_cpu[d_ffn=96]/hg", "tiny_cpu[d_ffn=96]/hf-llama"]
    assert designs[1].cfg.model.d_ffn == 96  # built from the first model's configuration
    with pytest.raises(SystemExit):  # asked for explicitly where it cannot be: an error, not a silent skip
        bench.plan(parse(["--config", "configs/tiny_moe.yaml", "--hf-reference"]))


def test_table_prints_missing_values_as_dashes():
    rows = [{"design": "a", "params": 10, "activated": 10, "ms_per_step": 2.0, "ms_sd": 0.1, "tok_per_s": 5.0,
             "mfu": 0.5, "peak_mem_mib": None, "time_ratio": 1.0, "mem_ratio": None}]
    line = bench.format_table(rows).splitlines()[1].split()
    assert line == ["a", "10", "10", "2.0", "0.1", "5", "50.0%", "-", "1.000", "-"]


def test_train_steps_follow_the_measured_rate(tmp_path):
    table = tmp_path / "b.json"
    table.write_text(json.dumps({"rows": [{"tok_per_s": 400_000.0}]}))
    assert gpu_check.train_steps(table, 90, 65536, fallback=7) == 549
    assert gpu_check.train_steps(tmp_path / "missing.json", 90, 65536, fallback=7) == 7
    assert gpu_check.train_steps(table, 0, 65536, fallback=7, lo=4) == 4


def test_offline_hides_the_packages_the_gpu_machine_lacks(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import importlib.util, socket, sys\n"
                      "assert importlib.util.find_spec('wandb') is None\n"
                      "try:\n    import datasets\nexcept ModuleNotFoundError:\n    pass\nelse:\n    sys.exit(3)\n"
                      "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=1)\n"
                      "except OSError as e:\n    assert 'network disabled' in str(e), e\nelse:\n    sys.exit(4)\n"
                      "print('args', sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-m", "scripts.gpu_check", "offline", str(script), "a=1"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "args ['a=1']" in done.stdout


@pytest.fixture(scope="module")
def carried(tmp_path_factory) -> Path:
    """What `python -m scripts.gpu_check prepare` carries to the lent machine, without WikiText-2 (its local-file
    path needs `datasets`, slow to import): the training dir doubles as the extra eval set, under its name."""
    out = tmp_path_factory.mktemp("carried")
    gpu_check.prepare(out, wikitext=False, progress=False)
    assert (out / "tokenizers" / "gpt2.tiktoken").is_file()
    (out / "wikitext2").symlink_to(out / "pd_english", target_is_directory=True)
    return out


def test_gpu_check_dry_run(carried, tmp_path):
    """The script's parts on CPU with tiny sizes, as the lent machine would run them: the bench table, then a
    training run with datasets, wandb and the corpus packages hidden and no network, then the summary."""
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_DATA": str(carried), "GPU_CHECK_DRY": "1",
           "GPU_CHECK_PARTS": "env bench-1b train", "GPU_CHECK_SCRATCH": str(tmp_path / "scratch")}
    env.pop("SCALEVEC_TOKENIZER_DIR", None)  # the carried ranks file must be enough
    done = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=240)
    out = tmp_path / "out"
    assert done.returncode == 0, done.stdout + done.stderr
    status = {line.split("\t")[0]: line.split("\t")[1] for line in (out / "status.tsv").read_text().splitlines()[1:]}
    assert status == {"env": "0", "bench-1b": "0", "train": "0"}, (out / "train.log").read_text()[-3000:]
    table = json.loads((out / "bench_1b.json").read_text())
    assert [r["design"] for r in table["rows"]] == ["baseline", "unified", "hf-llama"]
    metrics = [json.loads(line) for line in (out / "train" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if r["kind"] == "train"] == [1, 2, 3, 4]
    assert all("val_loss/wikitext2" in r for r in metrics if r["kind"] == "eval")
    summary = (out / "summary.md").read_text()
    for text in ("## Bench 1b", "| hf-llama |", "## Training run", "val_loss/wikitext2", "| train | 0 |"):
        assert text in summary
