"""Golden loss curves: committed reference numbers for a matrix of tiny float64 runs that together take every path of
the training step (dense and MoE; Llama's scale vectors, none, and the unified strategy; AdamW and Muon; cosine and
WSD; gradient accumulation; two gloo ranks; a resume mid-run). tests/test_golden.py replays each run and fails when a
recorded value (per step: train loss, grad norm, lr, the batch digest of the step's tokens, a MoE's aux loss and
expert loads; per eval: the val losses) moves by more than the rounding bound derived there: eager float64 on CPU,
so that any x86 CPU and torch version agree up to the order of their reductions.

Regenerate (from the repository root):

    python tests/golden.py --write                 # every case → tests/golden/<name>.json
    python tests/golden.py --write --only NAME ... # some cases
    python tests/golden.py                         # list the cases

A change that is meant to move training numbers regenerates the files in a commit of its own, whose message says
why the numbers moved; the replay then holds every later commit to the new curves. A golden file that changes in
the same commit as unrelated code hides which change moved it.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
for _p in (REPO, TESTS):  # `python tests/golden.py` from the repository root: import train, data, test_train
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import train  # noqa: E402
from data.config import DataConfig  # noqa: E402
from data.prepare import prepare  # noqa: E402
from data.shards import load_meta, open_shard  # noqa: E402
from test_train import args_for, records, run_ranks  # noqa: E402

GOLDEN_DIR = TESTS / "golden"
FORMAT = 1  # the golden files' layout; bump with a change of what they hold

# ------------------------------------------------------------------------------------------------------ data

# The prepared corpus of tests/test_train.py's `data_dir` fixture, rebuilt from the installed built-in corpus
# without pytest: the first 240,000 characters of the Shakespeare documents (joined as conftest.py's
# `shakespeare_text` joins them), cut into 24 documents, tokenized by a 320-token BPE trained on them.
TEXT_CHARS, N_DOCS = 240_000, 24


def corpus_text(chars: int = TEXT_CHARS) -> str:
    """The built-in corpus's first `chars` characters, documents joined by a blank line."""
    from data.builtin import pd_english_documents
    docs, size = [], 0
    for doc in pd_english_documents():
        docs.append(doc)
        size += len(doc) + 2  # the blank line that joins it to the next
        if size - 2 >= chars:
            break
    return "\n\n".join(docs)[:chars]


def data_config(root: str) -> DataConfig:
    """The data settings of the golden runs, their documents in root/docs, prepared into root/prepared."""
    return DataConfig(source=f"{root}/docs", dir=f"{root}/prepared", tokenizer="bpe:320", seq_len=32, val_frac=0.2)


def build_data(root: Path) -> DataConfig:
    """Prepare the golden runs' corpus under `root`; deterministic on every machine."""
    cfg = data_config(str(root))
    text = corpus_text()
    docs = Path(cfg.source)
    docs.mkdir(parents=True, exist_ok=True)
    per_doc = TEXT_CHARS // N_DOCS
    for i in range(N_DOCS):
        (docs / f"doc{i:02d}.txt").write_text(text[i * per_doc:(i + 1) * per_doc])
    prepare(cfg, progress=False)
    return cfg


def data_fingerprint(data: DataConfig) -> dict:
    """What names the tokens a run reads: a sha256 over each split's token ids (as int64, shard after shard) and the
    tokenizer's vocabulary size. Taken from the tokens themselves, not from meta.json's fingerprint, so that a change
    of the shard file format or meta.json's version alone does not read as a change of data."""
    meta = load_meta(data.dir)
    out: dict = {"n_vocab": meta.tokenizer["n_vocab"]}
    for split, info in sorted(meta.splits.items()):
        h = hashlib.sha256()
        for shard in info.shards:
            h.update(np.asarray(open_shard(Path(data.dir) / shard.file), dtype=np.int64).tobytes())
        out[split] = {"tokens": info.tokens, "sha256": h.hexdigest()}
    return out


# ------------------------------------------------------------------------------------------------------ cases

STEPS, EVAL_EVERY = 20, 5
# Every golden run: eager float64 on CPU (reduction order is then the only difference between machines), a record
# per step, an eval every 5 steps over 1024 held-out tokens, no checkpoint but the final one (train.py always
# saves the last step) and the stop of the resume case.
COMMON = ("train.dtype=float64", "train.compile=false", "train.device=cpu", "log.wandb.mode=disabled", "log.every=1",
          f"train.steps={STEPS}", f"train.eval_every={EVAL_EVERY}", "train.eval_tokens=1024", "train.ckpt_every=1000")
MOE = ("--config", "configs/tiny_moe.yaml", "model.moe.n_experts=4", "model.moe.top_k=2")
MUON = ("optim.name=muon", "optim.muon.ns_dtype=float64")


def _scale(preset: str) -> tuple[str, ...]:
    return ("--config", f"configs/scale/{preset}.yaml")


@dataclass(frozen=True)
class Case:
    """One golden run. `overrides` follow tests/test_train.py's `args_for` (d_model 32, 2 layers, 2 heads, d_ffn 64,
    seq_len 32, global batch 8, lr 3e-3 with 2 warmup steps) and COMMON. The accumulation per rank is
    global_batch / (micro_batch × ranks)."""

    name: str
    overrides: tuple[str, ...]
    ranks: int = 1
    stop_at_step: Optional[int] = None  # the run stops (checkpointed) after this step; the same command then resumes
    replays: Optional[str] = None  # the case whose golden file this one must reproduce (None: its own)

    @property
    def golden_name(self) -> str:
        return self.replays or self.name

    @property
    def golden_path(self) -> Path:
        return GOLDEN_DIR / f"{self.golden_name}.json"


CASES: list[Case] = [
    Case("dense_baseline_adamw_cosine", (*_scale("baseline"), "train.micro_batch=8")),
    Case("dense_unified_adamw_cosine_accum2", (*_scale("unified"), "train.micro_batch=4")),
    Case("dense_none_muon_wsd", (*_scale("none"), *MUON, "schedule.name=wsd", "train.micro_batch=8")),
    Case("moe_unified_adamw_wsd_accum2", (*MOE, *_scale("unified"), "schedule.name=wsd", "train.micro_batch=4")),
    # the paper's literal unified (the figures' preset): the magnitudes only a Norm reads kept and decayed
    Case("dense_unified_literal_muon_cosine_2ranks_accum2", (*_scale("unified_literal"), *MUON, "train.micro_batch=2"),
         ranks=2),
    # the bias balancing too (the loads all-reduced over ranks decide each expert's bias step)
    Case("moe_unified_literal_adamw_cosine_2ranks", (*MOE, *_scale("unified_literal"), "model.moe.balance=bias",
                                                     "model.moe.bias_rate=0.01", "train.micro_batch=4"), ranks=2),
    # the other designs and paths of the step, each case carrying one design and one or two paths
    Case("dense_hg_ap_adamw_wsd_ckpt_full", (*_scale("hg_ap"), "schedule.name=wsd", "train.micro_batch=8",
                                             "train.activation_checkpointing=full")),
    Case("dense_hg_dp_adamw_cosine_ckpt_selective_accum2", (*_scale("hg_dp"), "train.micro_batch=4",
                                                            "train.activation_checkpointing=selective")),
    Case("dense_hg_dnp_er_adamw_wsd_chunks", (*_scale("hg_dnp_er"), "schedule.name=wsd", "train.micro_batch=8",
                                              "train.loss_chunk_tokens=64")),
    Case("dense_hg_adamw_cosine_lr2e-3_reduce_each_accum2", (*_scale("hg"), "optim.lr=2e-3", "train.micro_batch=4",
                                                             "train.grad_reduce=micro_batch")),
    Case("dense_gemma_adamw_cosine_skip", (*_scale("gemma"), "train.micro_batch=8", "train.on_nonfinite=skip")),
    Case("dense_hg_dp_or_adamw_cosine_mixture_eval", (*_scale("hg_dp_or"), "train.micro_batch=8",
                                                      "train.eval_sample=mixture")),
    # the DNP designs with direct and OR vectors, DP with ER, and an MoE design other than unified: each computes
    # the paper's equation its own way, so each pins its numbers
    Case("dense_hg_dnp_adamw_cosine_full_logits", (*_scale("hg_dnp"), "train.micro_batch=8",
                                                   "train.loss_chunk_tokens=0")),
    Case("dense_hg_dnp_or_muon_wsd", (*_scale("hg_dnp_or"), *MUON, "schedule.name=wsd", "train.micro_batch=8")),
    Case("dense_hg_dp_er_adamw_cosine_accum2", (*_scale("hg_dp_er"), "train.micro_batch=4")),
    Case("moe_hg_dp_or_muon_cosine", (*MOE, *_scale("hg_dp_or"), *MUON, "train.micro_batch=8")),
    # stopped after step 10 and resumed by the same command: the uninterrupted run's curve, step for step
    Case("dense_unified_adamw_cosine_accum2_resumed", (*_scale("unified"), "train.micro_batch=4"), stop_at_step=10,
         replays="dense_unified_adamw_cosine_accum2"),
]
BY_NAME = {c.name: c for c in CASES}

DATA_PLACEHOLDER, OUT_PLACEHOLDER, RUN_PLACEHOLDER = "<data>", "<out>", "<run>"


def case_argv(case: Case, data: DataConfig, out_dir: Path, run_name: Optional[str] = None) -> list[str]:
    return args_for(data, out_dir, run_name or case.name, *COMMON, *case.overrides)


def portable_argv(case: Case) -> list[str]:
    """The case's command with its paths and run name as placeholders: what a golden file records, and what a case
    that replays another's file must share with it."""
    return case_argv(case, data_config(DATA_PLACEHOLDER), Path(OUT_PLACEHOLDER), RUN_PLACEHOLDER)


# ------------------------------------------------------------------------------------------------------ runs

TRAIN_KEYS = ("loss", "grad_norm", "lr", "aux_loss")  # aux_loss: MoE runs only
# Equal on every machine or not at all: the digest of the step's tokens (an integer), and each MoE layer's largest and
# smallest expert load (token counts over their mean, exact dyadic fractions), which change only when a token's
# top-k choice does.
EXACT_KEYS = re.compile(r"batch_digest|moe/L\d+/(max|min)_load")


def commands(case: Case, data: DataConfig, out_dir: Path) -> list[list[str]]:
    """The train.py commands of a case, in order: the stopped run first where it has one."""
    argv = case_argv(case, data, out_dir)
    return [["--stop-at-step", str(case.stop_at_step), *argv], argv] if case.stop_at_step else [argv]


def run_cases(cases: Sequence[Case], data: DataConfig, out_dir: Path) -> dict[str, dict]:
    """Run the cases into `out_dir`; returns each one's curve by name: {"train": [per step], "eval": [per eval]}.
    The cases on the same number of ranks share one spawn, whose workers run them one after the other (each spawned
    worker spends seconds importing torch and train.py)."""
    for ranks in sorted({c.ranks for c in cases if c.ranks > 1}):
        run_ranks(ranks, *[cmd for c in cases if c.ranks == ranks for cmd in commands(c, data, out_dir)])
    # One thread in-process, as in each spawned rank (test_train._worker): the curve then does not depend on the
    # number of cores that run it
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for case in (c for c in cases if c.ranks == 1):
            for argv in commands(case, data, out_dir):
                train.main(argv)
    finally:
        torch.set_num_threads(threads)
    return {c.name: read_curve(out_dir / c.name) for c in cases}


def read_curve(run: Path) -> dict:
    """The recorded values of a run's metrics.jsonl."""
    steps = [{"step": r["step"], **{k: v for k, v in r.items() if k in TRAIN_KEYS or EXACT_KEYS.fullmatch(k)}}
             for r in records(run, "train")]
    evals = [{"step": r["step"], **{k: v for k, v in r.items() if k.startswith("val_loss")}}
             for r in records(run, "eval")]
    return {"train": steps, "eval": evals}


def golden_record(case: Case, data: DataConfig, curve: dict) -> dict:
    return {"format": FORMAT, "case": case.golden_name, "torch": torch.__version__,
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "ranks": case.ranks,
            "argv": portable_argv(case), "data": data_fingerprint(data), **curve}


def dumps(golden: dict) -> str:
    """Pretty JSON with one record per line (a diff then shows which steps moved); floats as repr (exact)."""
    lines = []
    for key, value in golden.items():
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n".join(f"  {json.dumps(r)}" for r in value)
            lines.append(f" {json.dumps(key)}: [\n{rows}\n ]")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def load_golden(case: Case) -> dict:
    return json.loads(case.golden_path.read_text())


def write(names: list[str]) -> int:
    """Run the named cases and write their golden files; a case that replays another's file is run beside that
    case (selected or not) and must reproduce it bit for bit, as a resumed run does on one machine. Returns the exit
    status."""
    unknown = sorted(set(names) - set(BY_NAME))
    if unknown:
        raise SystemExit(f"error: no case {', '.join(unknown)}; the cases: {', '.join(BY_NAME)}")
    chosen = [BY_NAME[n] for n in names]
    run = [c for c in CASES if c in chosen or any(r.replays == c.name for r in chosen)]
    GOLDEN_DIR.mkdir(exist_ok=True)
    status = 0
    with tempfile.TemporaryDirectory(prefix="scalevec-golden-") as tmp:
        data = build_data(Path(tmp) / "data")
        curves = run_cases(run, data, Path(tmp) / "runs")
        for case in chosen:
            if case.replays:  # no file of its own: it must be the run it replays
                same = curves[case.name] == curves[case.replays]
                print(f"{case.name}: {'reproduces' if same else 'DIFFERS FROM'} {case.replays} bit for bit")
                status = status or (0 if same else 1)
                continue
            case.golden_path.write_text(dumps(golden_record(case, data, curves[case.name])))
            print(f"wrote {case.golden_path.relative_to(REPO)}")
    return status


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--write", action="store_true", help="run the cases and write tests/golden/<name>.json")
    p.add_argument("--only", nargs="+", metavar="NAME", help="only these cases (default: all)")
    args = p.parse_args(argv)
    os.chdir(REPO)  # the cases' --config paths are relative to the repository root
    if not args.write:
        for c in CASES:
            print(f"{c.name}: {c.ranks} rank(s){f', stopped at {c.stop_at_step}' if c.stop_at_step else ''}"
                  f"{f', replays {c.replays}' if c.replays else ''}")
        return 0
    return write(args.only or [c.name for c in CASES])


if __name__ == "__main__":
    sys.exit(main())
