"""scripts.bench (time, per-design memory, the transformers reference row) and harness/gpu_check.sh's dry mode."""
import dataclasses
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

import train
from config import load_config
from harness import gpu_check, gpu_summary
from bench import memory_probe, steps as benchmark
from scripts import bench
from train_harness import args_for, data_dir, records  # noqa: F401 - data_dir is a fixture

REPO = Path(__file__).resolve().parents[1]
TINY = ["--vocab-size", "512", "--micro-batch", "2", "--seq-len", "32", "--steps", "2", "--warmup", "1",
        "--device", "cpu", "model.d_model=64", "model.n_layers=2", "model.n_heads=2", "train.compile=false",
        "train.dtype=float32"]


def _rows(out: str) -> tuple[list[str], dict[str, list[str]]]:
    """The time table's header words and rows by design (the footprint table, if any, follows it)."""
    lines = out.splitlines()
    end = next((i for i in range(2, len(lines)) if lines[i].startswith("design")), len(lines))
    return lines[1].split(), {line.split()[0]: line.split() for line in lines[2:end]}


def _footprint(out: str) -> dict[str, list[str]]:
    """The footprint table's rows by design."""
    lines = out.splitlines()
    start = next(i for i in range(2, len(lines)) if lines[i].startswith("design"))
    return {line.split()[0]: line.split() for line in lines[start + 1:]}


def test_table_has_every_design_its_memory_and_the_ratios(tmp_path, capsys):
    table = tmp_path / "bench.json"
    assert bench.main(["--presets", "baseline", "unified", "--hf-reference", "--json", str(table), *TINY]) == 0
    out = capsys.readouterr().out
    header, rows = _rows(out)
    assert "peak MiB" in out.splitlines()[1] and header[-8:] == ["RSS", "MiB", "RSS", "×", "time", "×", "mem", "×"]
    assert set(rows) == {"baseline", "unified", "hf-llama"}
    assert rows["baseline"][-3:] == ["1.000", "1.000", "1.000"]  # every ratio is to the first design
    data = json.loads(table.read_text())
    assert data["memory"] == ("tensors held + a step's peak (torch.profiler), and peak RSS growth; "
                              "one process per design")
    by_name = {r["design"]: r for r in data["rows"]}
    for r in data["rows"]:  # each design measured in its own process: memory > 0, and finite ratios
        assert r["ms_per_step"] > 0 and r["peak_mem_mib"] > 0 and r["mem_ratio"] > 0, r
        assert r["rss_mib"] > 0 and r["rss_ratio"] > 0, r
    # transformers' Llama with the baseline's configuration has exactly the baseline's parameters
    assert by_name["hf-llama"]["params"] == by_name["baseline"]["params"] == 163_904
    assert by_name["unified"]["params"] > by_name["baseline"]["params"]
    # the footprint table: ours only (the reference row is not our model), counted and in the JSON
    footprint = _footprint(out)
    assert set(footprint) == {"baseline", "unified"} and footprint["baseline"][2] == "1.000"
    assert by_name["unified"]["param_tensors"] > by_name["baseline"]["param_tensors"] > 0  # OR: α and β each
    for name in ("baseline", "unified"):
        assert by_name[name]["saved_block_mib"] > 0 and by_name[name]["host_ops"] > 0, by_name[name]
        assert by_name[name]["kernels"] is None  # CPU: no kernel count


def test_a_probe_measures_its_peak_from_after_the_setup():
    """A transient of the probe's setup larger than the design (here 256 MiB, freed) must not hide the design's own
    64 MiB: the peak is reset after the setup where the kernel allows it (Linux), not read over the process's life.
    The allocator is tuned as in training, so the freed setup stays in the heap until the probe hands it back."""
    import numpy as np

    from runtime.cpu import tune_glibc_malloc
    tune_glibc_malloc()
    setup = np.ones(256 * 2**20 // 8)
    del setup
    start = memory_probe.reset_peak_rss()
    if start is None:  # no resettable high-water mark on this kernel: the whole-life peak is what there is
        assert not Path("/proc/self/clear_refs").exists()
        return
    design = np.ones(64 * 2**20 // 8)
    grown = memory_probe.proc_status_mib("VmHWM") - start
    del design
    assert 60 < grown < 128, grown


def test_a_steps_tensor_peak_is_what_it_allocates_over_its_start():
    """The CPU's max_memory_allocated (bench/memory_probe.py): a step that builds 4 MiB, then 2 MiB beside it,
    then frees both peaks at 6 MiB over what was live before it, whatever was live (here 8 MiB); 4 MiB kept to the
    end counts as well, so a step that grows its state is seen."""
    held = torch.ones(2 * 2**20)  # 8 MiB live before the step: not counted

    def step(keep: list):
        a = torch.ones(2**20)  # 4 MiB
        b = torch.ones(2**19)  # 2 MiB: the peak, 6 MiB
        del b
        keep.append(a)

    kept: list = []
    assert memory_probe.step_tensor_peak(lambda: step(kept)) == 6 * 2**20
    assert held.numel() and len(kept) == 1


def test_a_cut_bench_keeps_the_rounds_it_timed(tmp_path, monkeypatch):
    """The JSON is rewritten after every timed round, so a part the GPU check's timeout cuts still returns rows:
    here the third step of the second design dies (as a SIGKILL would end the process), after one timed round."""
    table = tmp_path / "bench.json"
    build, calls = benchmark.build, []

    def build_dying(design, di, seq_len, batches):
        runner = build(design, di, seq_len, batches)
        step = runner.step

        def counted():
            calls.append(design.name)
            if calls.count("unified") == 3:  # warmup 1, timed round 1, then round 2 dies
                raise KeyboardInterrupt("cut")
            return step()
        return dataclasses.replace(runner, step=counted)
    monkeypatch.setattr(benchmark, "build", build_dying)
    argv = ["--presets", "baseline", "unified", "--no-hf-reference", "--no-memory", "--json", str(table), *TINY]
    argv[argv.index("--steps") + 1] = "3"
    with pytest.raises(KeyboardInterrupt):
        bench.main(argv)
    data = json.loads(table.read_text())
    assert data["steps"] == 1 and [r["design"] for r in data["rows"]] == ["baseline", "unified"]
    assert all(r["ms_per_step"] > 0 for r in data["rows"])


def test_bench_runs_the_step_train_py_runs(data_dir, tmp_path):
    """--data: the bench's step is train.py's (runtime/trainer.py), on the same data in the same order: for one config
    and seed its losses are train.py's, step for step, bit for bit (the same process, the same arithmetic)."""
    argv = args_for(data_dir, tmp_path, "train", "train.global_batch=4", "train.micro_batch=4")
    train.main(["--stop-at-step", "4", *argv])
    trained = [r["loss"] for r in records(tmp_path / "train", "train")]
    table = tmp_path / "bench.json"
    overrides = [a for a in argv if "=" in a and not a.startswith(("log.", "train.device"))]
    assert bench.main(["--config", "configs/base.yaml", "--presets", "unified", "--data", "--device", "cpu",
                       "--steps", "3", "--warmup", "1", "--no-memory", "--no-hf-reference", "--json", str(table),
                       *overrides]) == 0
    benched = json.loads(table.read_text())["losses"]["unified"]
    assert len(trained) == 4 and benched == trained


def test_precisions_are_columns_of_the_same_design_and_auto_says_what_it_chose(monkeypatch, capsys, tmp_path):
    """--precisions: each design once per precision, side by side in one table; auto is named by what train.py would
    choose on this machine (runtime/precision.py), which is what its row then runs."""
    import runtime.precision as precision
    parse = benchmark.build_parser().parse_args
    argv = ["--presets", "unified", "--no-hf-reference", "--device", "cpu", "--precisions", "auto", "eager-fp32",
            "compiled-fp32", "compiled-bf16"]
    for cpu, auto in ((precision.CpuArithmetic("AVX2", False, False), "auto=eager-fp32"),
                      (precision.CpuArithmetic("AVX512", True, True), "auto=compiled-bf16")):
        monkeypatch.setattr(precision, "cpu_arithmetic", lambda cpu=cpu: cpu)
        designs, _ = benchmark.plan(parse(argv))
        assert [d.name for d in designs] == [f"unified/{auto}", "unified/eager-fp32", "unified/compiled-fp32",
                                             "unified/compiled-bf16"]
        assert [(d.cfg.train.dtype, d.cfg.train.compile) for d in designs] == [
            ("auto", "auto"), ("float32", False), ("float32", True), ("bfloat16", True)]
    # timed, as on a CPU without bf16 arithmetic (no compile to wait for): the auto row runs what its name says, and
    # each row records the dtype and compile it ran
    monkeypatch.setattr(precision, "cpu_arithmetic", lambda: precision.CpuArithmetic("AVX2", False, False))
    table = tmp_path / "p.json"
    assert bench.main([*TINY, "--presets", "baseline", "--no-hf-reference", "--no-memory", "--precisions", "auto",
                       "eager-bf16", "--json", str(table)]) == 0
    rows = json.loads(table.read_text())["rows"]
    assert [(r["design"], r["dtype"], r["compile"]) for r in rows] == [
        ("baseline/auto=eager-fp32", "float32", False), ("baseline/eager-bf16", "bfloat16", False)]
    assert "cpu (" in capsys.readouterr().out


def test_hf_reference_rules(capsys):
    parse = benchmark.build_parser().parse_args
    designs, notes = benchmark.plan(parse(["--presets", "baseline", "--no-hf-reference"]))
    assert [d.name for d in designs] == ["baseline"] and not notes
    designs, notes = benchmark.plan(parse(["--models", "configs/tiny_moe.yaml", "configs/tiny_cpu.yaml",
                                       "--presets", "baseline"]))
    assert not any(d.hf for d in designs) and "MoE" in notes[0]  # LlamaForCausalLM is dense: no row, a note
    designs, _ = benchmark.plan(parse(["--models", "configs/tiny_cpu.yaml model.d_ffn=96", "--presets", "hg"]))
    assert [d.name for d in designs] == ["tiny_cpu[d_ffn=96]/hg", "tiny_cpu[d_ffn=96]/hf-llama"]
    assert designs[1].cfg.model.d_ffn == 96  # built from the first model's configuration
    with pytest.raises(SystemExit):  # asked for explicitly where it cannot be: an error, not a silent skip
        benchmark.plan(parse(["--config", "configs/tiny_moe.yaml", "--hf-reference"]))


def test_table_prints_missing_values_as_dashes():
    rows = [{"design": "a", "params": 10, "activated": 10, "ms_per_step": 2.0, "ms_sd": 0.1, "tok_per_s": 5.0,
             "mfu": 0.5, "peak_mem_mib": None, "time_ratio": 1.0, "mem_ratio": None}]
    line = benchmark.format_table(rows).splitlines()[1].split()
    assert line == ["a", "10", "10", "2.0", "0.1", "5", "50.0%", "-", "1.000", "-"]


def test_sync_differences_attribute_syncs_to_steps_that_do_not_log():
    """B − A: K non-logging steps (A and B log once each, at their last step); C − B: what a logging step adds."""
    def run(name, steps, every, syncs, sites):
        return {"name": name, "steps": steps, "log_every": every, "reached": steps, "syncs": syncs, "sites": sites,
                "seconds": 1.0, "last_train": None, "last_eval": {}}
    runs = [run("warmup", 2, 1, None, {}), run("A", 10, 10, 31, {"train.py:213": 11, "train.py:259": 20}),
            run("B", 20, 20, 61, {"train.py:213": 21, "train.py:259": 40}),
            run("C", 20, 10, 63, {"train.py:213": 23, "train.py:259": 40})]
    got = gpu_check._sync_differences(runs, 10)
    assert got == {"syncs_per_nonlog_step": 3.0, "nonlog_sites": {"train.py:259": 2.0, "train.py:213": 1.0},
                   "extra_syncs_per_log_step": 2}
    text = "\n".join(gpu_summary._sync_lines({"device": "x", "torch": "t", "every": 10, "detector": "warn",
                                            "runs": runs, **got}))
    assert "host syncs per non-logging step: 3**" in text and "`train.py:259`: 2 per non-logging step" in text
    runs[2]["reached"] = 7  # a run cut by its timeout gives no difference
    assert gpu_check._sync_differences(runs, 10) == {}


def test_offline_hides_the_packages_the_gpu_machine_lacks(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import importlib.util, socket, sys\n"
                      "assert importlib.util.find_spec('wandb') is None\n"
                      "try:\n    import datasets\nexcept ModuleNotFoundError:\n    pass\nelse:\n    sys.exit(3)\n"
                      "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=1)\n"
                      "except OSError as e:\n    assert 'network disabled' in str(e), e\nelse:\n    sys.exit(4)\n"
                      "print('args', sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "-m", "harness.gpu_check", "offline", str(script), "a=1"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "args ['a=1']" in done.stdout


@pytest.fixture(scope="module")
def carried(tmp_path_factory) -> Path:
    """What `python -m harness.gpu_check prepare` carries to the GPU machine, without WikiText-2 (its local-file
    path needs `datasets`, slow to import): the training dir doubles as the extra eval set, under its name."""
    out = tmp_path_factory.mktemp("carried")
    gpu_check.prepare(out, wikitext=False, progress=False)
    assert (out / "tokenizers" / "gpt2.tiktoken").is_file()
    (out / "wikitext2").symlink_to(out / "pd_english", target_is_directory=True)
    return out


def test_gpu_check_dry_run(carried, tmp_path):
    """Every part of the script on CPU with tiny sizes, as the GPU machine runs them, under this interpreter: what
    it writes is few and flat (at most 8 files, at most two folders deep under $OUT: easy to copy back), the logs
    are in one archive, training needs neither datasets, wandb, the corpus packages nor network, and summary.md is
    printed last."""
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_DATA": str(carried), "PYTHON": sys.executable,
           "GPU_CHECK_SCRATCH": str(tmp_path / "scratch")}
    for var in ("SCALEVEC_TOKENIZER_DIR", "GPU_CHECK_PARTS", "GPU_CHECK_BUDGET_S"):
        env.pop(var, None)  # the carried ranks file must be enough; every part runs
    done = subprocess.run(["bash", "harness/gpu_check.sh", "--dry"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=400)
    with tarfile.open(out / "logs.tar.gz") as tar:
        logs = {Path(m.name).name: tar.extractfile(m).read().decode() for m in tar.getmembers() if m.isfile()}
    status = [line.split("\t") for line in logs["status.tsv"].splitlines()[1:]]
    failed = [row[0] for row in status if row[1] != "0"]
    assert not failed and done.returncode == 0, "\n".join(logs.get(f"{p}.log", "")[-3000:] for p in failed) or (
        done.stdout + done.stderr)
    parts = ["env", "tests-gpu", "moe-gemm", "bench-0.12b", "loss-chunk", "sync", "bench-1b"]
    assert [row[0] for row in status] == parts and {f"{p}.log" for p in parts} <= set(logs)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(p.relative_to(out).parts) <= 3 for p in files), files  # $OUT/a/b/file at most
    assert {p.name for p in files} == {"summary.md", "logs.tar.gz", "moe_gemm.json", "bench_0.12b.json",
                                       "loss_chunk.json", "sync.json", "bench_1b.json"}
    summary = (out / "summary.md").read_text()
    assert done.stdout.rstrip().endswith(summary.rstrip())  # printed last
    moe = json.loads((out / "moe_gemm.json").read_text())
    # float32 on CPU, normwise: ≤ K·ε per reduction (K: the rows, d_model or the padded hidden), 4 chained through
    # the layer's gate/up/down and combine; a wrong expert's rows are O(1) off
    k = max(moe["rows"], moe["d_model"], moe["expert_dim_padded"])
    assert moe["grouped_path"] == [True, False] and moe["dtype"] == "float32"
    assert max(moe["rel_err_to_loop"].values()) <= 4 * k * 2**-23, moe["rel_err_to_loop"]
    chunks = json.loads((out / "loss_chunk.json").read_text())
    assert [r["design"] for r in chunks["rows"]] == [f"0.12b[loss_chunk_tokens={c}]/baseline" for c in (16, "null", 64)]
    for name in ("bench_0.12b", "bench_1b"):
        assert [r["design"] for r in json.loads((out / f"{name}.json").read_text())["rows"]] == ["baseline", "unified"]
    sync = json.loads((out / "sync.json").read_text())
    assert [(r["name"], r["steps"], r["log_every"], r["reached"]) for r in sync["runs"]] == [
        ("warmup", 2, 1, 2), ("A", 2, 2, 2), ("B", 4, 4, 4), ("C", 4, 2, 4)]
    assert all("val_loss/wikitext2" in r["last_eval"] for r in sync["runs"])
    for text in ("## MoE: grouped GEMM", "## Bench dense 1B", "loss_chunk_tokens=64", "## Host syncs",
                 "| sync | 0 |", "| bench-1b | 0 |", "### Where the step's time goes", "| matmul |"):
        assert text in summary, text
    profiles = json.loads(logs["profile_0.12b.json"])  # every op of both designs, in the logs
    assert [p["design"] for p in profiles] == ["baseline", "unified"] and all(p["ops"] for p in profiles)
