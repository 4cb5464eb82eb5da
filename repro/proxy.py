"""How a paper run becomes a CPU proxy run: the proxy's shapes, and the steps and batch that size each run by its
tokens per parameter (issue: results v2).

The ratio that decides what a run measures is tokens per parameter: the paper's Llama-0.12B sees 10.5B tokens on
81.1M compute parameters (≈ 130; docs/paper.md §3.1, §3.6), and a run stopped at 0.2 measures only how fast a design
leaves the starting line. Every proxy run therefore trains on TOKENS_PER_PARAM × N tokens, N counted as the paper's
compute axis counts it (every parameter but the input embedding; for MoE the total, not the activated ones; docs/paper.md
§3.6), over at least MIN_STEPS optimizer steps, with a warmup of WARMUP_FRAC of them (the paper does not state its
warmup, docs/paper.md §3.1; this repository's paper-size configs warm up 1,000 of 20,000 steps), reading the
built-in corpus at most MAX_PASSES times. N is the *baseline strategy's* at the
run's shape, so every strategy of a comparison trains on the same tokens (the paper compares at equal tokens); the
few thousand extra scale parameters of a design (HG, DNP, OR; 1.5 % at the dense proxy) leave it above 10.

Shapes, measured on 2 CPU cores (AMD EPYC, torch 2.13), one run at a time: 150 steps of 12 × 256 tokens, the range
of train.py's own tok/s over the last 50 steps, from

    python train.py --config configs/tiny_cpu.yaml --config configs/scale/baseline.yaml model.d_model=64 \
        model.n_heads=2 data.dir=data_cache/pd_english_bpe1024 data.tokenizer=bpe:1024 train.global_batch=12 \
        train.micro_batch=12 train.steps=150 schedule.warmup_steps=10 train.eval_every=1000 train.ckpt_every=1000

with the row's changes (MoE: `--config configs/tiny_moe.yaml` first, `model.moe.n_experts=8 model.moe.top_k=2`):

    d 64, 4 layers, BPE 2048, compiled bf16, baseline      32–35k tok/s
    d 64, 4 layers, BPE 1024, compiled bf16, baseline      46–48k tok/s   ← the dense proxy
    d 64, 4 layers, BPE 1024, compiled bf16, unified       33–37k tok/s
    d 64, 4 layers, 4 heads of 16 (BPE 2048), baseline     24–26k tok/s   (heads of 32 kept: 2 at d 64)
    MoE d 64, top-2 of 8, BPE 1024, eager fp32            24–27k tok/s   ← the MoE proxy's path
    MoE d 64, top-2 of 8, BPE 2048, compiled bf16          14–15k tok/s   (the per-expert loop does not compile well)

The 1,024-token BPE halves the LM head (at d 64 it is a quarter of N instead of 40 %) and its tokens go 1.4× faster
than the 2,048-token BPE's: the 0.12B proxy's 2.75M tokens (10.5 per parameter) take about a minute of training at
those speeds. The corpus holds 3.49M training tokens in it; the largest run (the top rung of Fig. 7's ladder, 6.48M
tokens) reads 1.86 passes.

Precision, measured again on a 2-core AMD EPYC with AVX2 and no AVX-512 (`torch.backends.cpu.get_cpu_capability()`
says AVX2), one thread per run as `repro.results --jobs 2` runs them, the dense proxy's command of
`python -m repro.results --dry-run` with `train.steps=100` or 150:

    d 64, 4 layers, compiled bf16, baseline (two side by side)   1.4k tok/s   (bf16 emulated in AVX2)
    d 64, 4 layers, compiled fp32, baseline                      7.8–7.9k tok/s
    d 64, 4 layers, eager fp32, baseline                         7.6k tok/s
    d 64, 4 layers, compiled fp32, unified                       6.7–6.9k tok/s, 126 s for 150 steps (compiling)
    d 64, 4 layers, eager fp32, unified                          5.9–6.0k tok/s,  76 s for 150 steps

so the proxy runs eager fp32 everywhere: bf16 is 5.4× slower (7.6k / 1.4k) on a CPU that has no bf16 arithmetic, and in fp32 the
compile costs about a minute per run for at most 1.15× per step. Runs of one page may be done in parts on different
CPUs; fp32 keeps each part's speed predictable.

Evaluation (results v3): every evaluation reads the training mixture, every window of the val split (105,216
targets; data/evalset.py), and WikiText-2's first 32,768 tokens as v2 did. Trainer.step and Trainer.evaluate of the
dense proxy timed alternately in one process, one thread, eager fp32 (torch 2.11, on an otherwise idle 16-core
machine: this one's 2 cores were shared), medians of 2 × 20 steps and 2 evaluations, for a run of 1,076 steps and
22 evaluations (every 53 steps, at step 0 and at the last):

    v2: the val split's first 32,768 tokens + WikiText-2 32,768     eval 0.71 s   16 s of a 134 s run (12 %)
    v3: the mixture, 105,216 + WikiText-2 32,768                    eval 1.45 s   32 s of a 142 s run (22 %)
    v3 with WikiText-2 at 131,072 too (train.extra_eval_tokens)     eval 2.64 s   58 s of a 175 s run (33 %)

so the extra sets keep 32,768 tokens (repro/configs/tiny.yaml).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from config import RunConfig, load_config
from model.summary import num_params

PROXY = Path("repro/configs/tiny.yaml")
TOKENS_PER_PARAM = 10.5  # the target; every run of every comparison ends at ≥ MIN_TOKENS_PER_PARAM
MIN_TOKENS_PER_PARAM = 10.0
MIN_STEPS = 1000
MAX_PASSES = 4
WARMUP_FRAC = 0.05  # docs/paper.md §3.1: [U]; the repository's 0.12B config warms up 1,000 of 20,000 steps
EVALS = 20  # evaluations per run: the Δ-loss curves' points
CHECKPOINTS = 4  # per run: a stopped reproduction loses at most a quarter of a run
HEAD_DIM = 32
SEQ_LEN = 256  # repro/configs/tiny.yaml's data.seq_len


@dataclass(frozen=True)
class Shape:
    """A proxy model: width, depth and, for Llama-MoE, the routed experts (top_k = n_experts / 4, with one shared
    expert; expert hidden int(2d/3) and shared hidden int(8d/3) as the paper's, docs/paper.md §2.2)."""
    d_model: int
    n_layers: int
    n_experts: Optional[int] = None

    @property
    def label(self) -> str:
        moe = f" E{self.n_experts}" if self.n_experts else ""
        return f"d{self.d_model} L{self.n_layers}{moe}"

    def overrides(self) -> tuple[str, ...]:
        out = [f"model.d_model={self.d_model}", f"model.n_heads={max(1, self.d_model // HEAD_DIM)}",
               f"model.n_layers={self.n_layers}"]
        if self.n_experts:
            out += [f"model.moe.n_experts={self.n_experts}", f"model.moe.top_k={max(1, self.n_experts // 4)}"]
        return tuple(out)


DENSE = Shape(64, 4)  # Llama-0.12B's proxy: Figs. 1, 5, 8 and 9, and a rung of Fig. 6
# Fig. 6: compute spans (540k / 82k)² ≈ 43× at one tokens-per-parameter ratio; width and depth both grow, as in
# the paper's ladder (docs/paper.md §2.1).
DENSE_LADDER = (Shape(32, 4), Shape(64, 2), DENSE, Shape(96, 4))
MOE = Shape(64, 2, 8)  # MoE-0.5B's proxy (Figs. 8, 9): two MoE layers hold about the dense proxy's N
MOE_LADDER = (Shape(32, 2, 8), MOE, Shape(96, 2, 8))  # Fig. 7: a width ladder


# The proxy of each paper size (docs/paper.md §2.1, §2.2, keyed by d_model), for `repro.reproduce FIG --scale tiny`:
# N grows with the paper's N and the largest stays within MAX_PASSES (dense 1B: 1.31M, 3.95 passes).
DENSE_SIZES = {768: DENSE, 1024: Shape(96, 4), 1280: Shape(96, 6), 1536: Shape(128, 4), 1792: Shape(128, 6)}
MOE_SIZES = {640: MOE_LADDER[0], 768: MOE, 960: Shape(64, 3, 8), 1024: MOE_LADDER[2], 1280: Shape(96, 3, 8)}


def paper_shape(cfg: RunConfig) -> Shape:
    """The proxy of a paper run: its size's entry above; another width gets d_model/12 rounded to a multiple of 32,
    4 layers (2 for MoE, a quarter of the routed experts)."""
    table = DENSE_SIZES if cfg.model.moe is None else MOE_SIZES
    if cfg.model.d_model in table:
        return table[cfg.model.d_model]
    d = max(HEAD_DIM, HEAD_DIM * round(cfg.model.d_model / 12 / HEAD_DIM))
    if cfg.model.moe is None:
        return Shape(d, DENSE.n_layers)
    return Shape(d, MOE.n_layers, max(4, cfg.model.moe.n_experts // 4))


@dataclass(frozen=True)
class Sizing:
    """The steps and batch of one proxy run, and the ratios they give."""
    shape: Shape
    compute_params: int  # N of the baseline strategy at this shape
    rows: int  # sequences per optimizer step (global_batch = micro_batch)
    steps: int
    warmup: int
    train_tokens: int  # in the corpus (one pass)

    @property
    def tokens(self) -> int:
        return self.steps * self.rows * SEQ_LEN

    @property
    def passes(self) -> float:
        return self.tokens / self.train_tokens

    def overrides(self) -> tuple[str, ...]:
        every = max(1, self.steps // EVALS)
        return (*self.shape.overrides(), f"train.global_batch={self.rows}", f"train.micro_batch={self.rows}",
                f"train.steps={self.steps}", f"schedule.warmup_steps={self.warmup}", f"train.eval_every={every}",
                f"train.ckpt_every={math.ceil(self.steps / CHECKPOINTS)}")


def compute_params(cfg: RunConfig) -> int:
    """N of the compute axis: every parameter but the input embedding (total, not activated, for MoE)."""
    return num_params(_meta_model(cfg), exclude_embedding=True)


def total_params(cfg: RunConfig) -> int:
    """Every parameter, the input embedding included: the other way to count N, beside compute_params."""
    return num_params(_meta_model(cfg))


def _meta_model(cfg: RunConfig):
    """The run's model on the meta device: its shapes, no memory."""
    import torch

    from config import resolve_vocab
    from model.llama import Llama
    with torch.device("meta"):
        return Llama(resolve_vocab(cfg))


def corpus_tokens(cfg: RunConfig) -> int:
    """Training tokens of the proxy's corpus: from the prepared dir when it is there, else the count measured when
    this proxy was chosen (`python -m data.prepare --source builtin:pd_english --tokenizer bpe:1024`)."""
    from data.shards import DataError, load_meta
    try:
        return load_meta(cfg.data.dir).splits["train"].tokens
    except (DataError, FileNotFoundError, KeyError):
        return BUILTIN_BPE1024_TRAIN_TOKENS


def corpus_split_tokens(cfg: RunConfig) -> Optional[tuple[int, int]]:
    """(train, val) tokens of a run's corpus: from the prepared dir when it is there, else, for the proxy's own corpus,
    the counts measured when its runs were made (so a page rewritten from archived runs says the same); None for
    another corpus that is not prepared here."""
    from data.shards import DataError, load_meta
    try:
        splits = load_meta(cfg.data.dir).splits
        return splits["train"].tokens, splits["val"].tokens
    except (DataError, FileNotFoundError, KeyError):
        return (BUILTIN_BPE1024_TRAIN_TOKENS, BUILTIN_BPE1024_VAL_TOKENS) if _is_proxy_corpus(cfg) else None


# builtin:pd_english in bpe:1024, val_frac 0.02 (data_cache/pd_english_bpe1024/meta.json when these runs were made)
BUILTIN_BPE1024_TRAIN_TOKENS, BUILTIN_BPE1024_VAL_TOKENS = 3_490_345, 105_578
# ... and by source, as data.composition.composition reads that dir (tests/test_data_evalset.py prepares it again and
# compares): the val split stores its 23 Shakespeare documents before its 29 King James chapters
BUILTIN_BPE1024_SOURCES = {"names": ["shakespeare", "kjv"],
                           "train": {"docs": [766, 1160], "tokens": [2_113_207, 1_377_138]},
                           "val": {"docs": [23, 29], "tokens": [67_181, 38_397],
                                   "runs": [[0, 23, 67_181], [1, 29, 38_397]]}}


def _is_proxy_corpus(cfg: RunConfig) -> bool:
    d = cfg.data
    return (d.source, d.tokenizer, d.val_frac, d.max_tokens) == ("builtin:pd_english", "bpe:1024", 0.02, None)


def corpus_composition(cfg: RunConfig):
    """The run's corpus by source (data/composition.py's Composition): from the prepared dir when it is there, else,
    for the proxy's own corpus, the counts measured when its runs were made; None for a corpus that names no sources
    or is not prepared here."""
    from data.builtin import BuiltinCorpusError
    from data.composition import Composition, composition
    from data.shards import DataError
    try:
        return composition(cfg.data.dir)
    except (DataError, FileNotFoundError, KeyError, BuiltinCorpusError):  # not here, or its corpus not installed
        return Composition.from_dict(BUILTIN_BPE1024_SOURCES) if _is_proxy_corpus(cfg) else None


def size(figure_config: Path, shape: Shape, overrides: tuple[str, ...] = (), horizon: float = 1.0) -> Sizing:
    """Steps and batch for `shape`: N from the baseline strategy at that shape (a figure run's own config with
    configs/scale/baseline.yaml and the default FFN width over it), TOKENS_PER_PARAM × N tokens in ≥ MIN_STEPS steps of as many rows of
    SEQ_LEN as that allows (at least one). `horizon` multiplies the tokens by training more steps of the same batch
    (warmup, evaluations and checkpoints keep their share of the steps): a longer run of the same experiment, not a
    larger batch, which would change the number of updates and the lr that suits them."""
    # The strategy's own keys stay the baseline's: an override of them (optim.scale_wd_invariant=false) changes the
    # run's strategy, not the sizes its proxy is measured against.
    sizing = [o for o in overrides if not o.startswith(("model.scale.", "optim.scale_wd_invariant="))]
    base = load_config([figure_config, PROXY, Path("configs/scale/baseline.yaml")],
                       [*shape.overrides(), "model.d_ffn=null", *sizing])  # the default FFN (Fig. 10's + 8 aside)
    n = compute_params(base)
    target = TOKENS_PER_PARAM * n
    rows = max(1, math.floor(target / (MIN_STEPS * SEQ_LEN)))
    steps = math.ceil(horizon * target / (rows * SEQ_LEN))
    return Sizing(shape, n, rows, steps, max(1, round(WARMUP_FRAC * steps)), corpus_tokens(base))


def run_overrides(figure_config: Path, cfg: RunConfig, shape: Optional[Shape] = None, steps_factor: float = 1.0,
                  overrides: tuple[str, ...] = (), horizon: float = 1.0) -> tuple[str, ...]:
    """The key=value overrides that make the paper run `cfg` (from `figure_config`) its proxy at `shape` (default
    `paper_shape`), `horizon` times the tokens (`size`). `steps_factor` keeps a run's length relative to its panel's reference (Fig. 1's 1.4× run trains
    1.4× the reference's steps); a d_ffn the run sets keeps its offset from int(8d/3) (Fig. 10's Llama-large: + 8)."""
    shape = shape or paper_shape(cfg)
    sizing = size(figure_config, shape, overrides, horizon)
    out = [f"train.steps={round(sizing.steps * steps_factor)}" if o.startswith("train.steps=") else o
           for o in sizing.overrides()]
    if cfg.model.d_ffn is not None:
        d = shape.d_model
        out.append(f"model.d_ffn={int(8 * d / 3) + cfg.model.d_ffn - int(8 * cfg.model.d_model / 3)}")
    return tuple(out)
