"""The golden loss curves (tests/golden.py, tests/golden/*.json) replayed: every recorded value of every case within
the float64 reduction-order bound below, on any x86 CPU and torch version; a changed corpus or command is reported as
such, not as drift. Regenerate after a change meant to move numbers: python tests/golden.py --write (a commit of its
own that says why)."""
from __future__ import annotations

import dataclasses

import itertools
import statistics
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

import golden
from config import load_config
from data.config import DataConfig
from golden import CASES, Case
from test_train import U32, U64, drift_tol

# ------------------------------------------------------------------------------------------------------ bound

# What differs between two machines (or torch versions) running the same float64 case is the order of each
# reduction: SIMD width and MKL's kernel choice (GEMM blocking), thread splits, gloo's summation. A sum of n terms
# in another order differs by ≤ n·u₆₄·Σ|terms| (u₆₄ = 2⁻⁵³). The longest reduction here has K = REDUCTION_TERMS = 1024
# terms (vocab 320 in each logsumexp, 256 tokens per step in each weight gradient, 1024 eval tokens, d_ffn 64,
# Newton–Schulz on block matrices ≤ 64 × 32), with Σ|terms| ≲ |result| for the losses (positive terms).
#  - A value computed from the same weights (step 0's eval, step 1's train loss) is ≤ K·u₆₄ apart, relative.
#  - After s updates the weights themselves are ≤ drift_tol(s) apart (tests/test_train.py): each step's gradients
#    differ by ≲ K·u₆₄, and AdamW's update lr·m̂/(√v̂ + ε) has slope ≤ lr/ε in g (Muon's normalized update is no
#    steeper), so s steps move the weights apart by ≲ s·(lr/ε)·K·u₆₄, to first order; a loss, grad norm or val loss
#    taken from those weights moves by as much, relative.
# Together (1 + s·lr/ε)·K·u₆₄: 1.1e-13 from the initial weights, 3.4e-8 after one update, 6.8e-7 after all 20
# (lr 3e-3, ε 1e-8). That is four orders below one lr-sized change (a step's move of the loss, one setting of the
# matrix: test_bound_is_far_below_real_changes checks it on the golden files), and a 1e-6 relative move of any
# recorded value fails. It is a worst case: AVX-512 against AVX2 kernels, MKL's other code path (MKL_CBWR=COMPATIBLE)
# and torch 2.11 against 2.13 moved no value by more than 2.5e-15 on one AMD EPYC. The discontinuity of a MoE's
# top-k choice is outside it: a token's choice flips only on a tie within these ~1e-15, and the exact loads
# (golden.EXACT_KEYS) report a flip as such.
REDUCTION_TERMS = 1024
# terms (vocab 320 in each logsumexp, 256 tokens per step in each weight gradient, 1024 eval tokens, d_ffn 64,
# Newton–Schulz on matrices ≤ 64 × 320), with Σ|terms| ≲ |result| for the losses (positive terms).
#  - A value computed from the same weights (step 0's eval, step 1's loss) is ≤ K·u₆₄ apart (relative).
#  - After s optimizer steps the weights themselves are ≤ drift_tol(s) apart (tests/test_train.py): each step's
#    gradients differ by ≲ K·u₆₄, and AdamW's update lr·m̂/(√v̂ + ε) has slope ≤ lr/ε in g (Muon's normalized update
#    is no steeper), so s steps move the weights apart by ≲ s·(lr/ε)·K·u₆₄, to first order; a loss, grad norm or
#    val loss taken from those weights moves by as much, relative.
# Together: (1 + s·lr/ε)·K·u₆₄, 3.4e-8 after one step and 6.8e-7 after 20 (lr 3e-3, ε 1e-8). That is four orders
# below one lr-sized change (a step's move of the loss, one setting of the matrix: test_bound_is_far_below_real_changes
# checks it on the golden files themselves), and a 1e-6 relative move of any recorded value fails.
REDUCTION_TERMS = 1024


def value_tol(step: int, lr: float, eps: float) -> float:
    """Relative bound on |replay − golden| of a float64 value computed from the weights after `step` steps."""
    return REDUCTION_TERMS * U64 + drift_tol(step, REDUCTION_TERMS, lr, eps)


# The logged gradient norm is float32 (optim/clip.py rounds the global norm): two machines whose float64 norms sit on
# either side of a float32 rounding boundary log values one float32 ulp (≤ 2·u₃₂ relative) apart.
def grad_norm_tol(step: int, lr: float, eps: float) -> float:
    return value_tol(step, lr, eps) + 2 * U32


# lr is the schedule's closed form of the step (optim/schedule.py): no data, no reduction, a handful of float64
# roundings and one libm cos (≤ 1 ulp), so 16·u₆₄.
LR_TOL = 16 * U64


@dataclass(frozen=True)
class Bounds:
    lr: float  # the case's peak lr and AdamW ε: the slope lr/ε of the drift term
    eps: float

    def of(self, kind: str, key: str, step: int) -> float:
        """The bound of a value recorded at `step`: a train record's loss and grad norm are taken from the weights
        after step − 1 updates (step 1's from the initial weights), an eval record's after `step`."""
        updates = step - 1 if kind == "train" else step
        if key == "lr":
            return LR_TOL
        if key == "grad_norm":
            return grad_norm_tol(updates, self.lr, self.eps)
        return value_tol(updates, self.lr, self.eps)


def case_bounds(argv: list[str]) -> Bounds:
    """The bound's lr and ε from the case's own resolved config (configs, then overrides)."""
    cfg = load_config([b for a, b in zip(argv, argv[1:]) if a == "--config"], [a for a in argv if "=" in a])
    return Bounds(lr=cfg.optim.lr, eps=cfg.optim.eps)


# ------------------------------------------------------------------------------------------------------ comparison


@dataclass(frozen=True)
class Drift:
    """One recorded value beyond its bound."""
    kind: str  # train | eval
    step: int
    key: str
    got: float
    want: float
    bound: float

    def __str__(self) -> str:
        rel = abs(self.got - self.want) / abs(self.want) if self.want else float("inf")
        return (f"{self.kind} step {self.step} {self.key}: got {self.got!r}, golden {self.want!r}, "
                f"|Δ|/|golden| = {rel:.2e} > bound {self.bound:.2e}")


@dataclass
class Comparison:
    drifts: list[Drift]
    exact: list[str]  # exact keys (batch digest, MoE loads) that differ
    worst: dict[str, tuple[float, int]]  # per key: the largest |Δ|/|golden| and its step
    worst_ratio: float  # the largest |Δ| / (bound·|golden|) over all values


def compare(want: dict, got: dict, bounds: Bounds) -> Comparison:
    drifts, exact, worst, worst_ratio = [], [], {}, 0.0
    for kind in ("train", "eval"):
        for w, g in zip(want[kind], got[kind]):
            for key, wv in w.items():
                gv = g.get(key)
                if key == "step":
                    continue
                if golden.EXACT_KEYS.fullmatch(key):
                    if gv != wv:
                        exact.append(f"{kind} step {w['step']} {key}: got {gv!r}, golden {wv!r}")
                    continue
                bound = bounds.of(kind, key, w["step"])
                diff = abs(gv - wv)
                rel = diff / abs(wv) if wv else (0.0 if diff == 0 else float("inf"))
                if rel >= worst.get(key, (-1.0, 0))[0]:
                    worst[key] = (rel, w["step"])
                worst_ratio = max(worst_ratio, rel / bound)
                if diff > bound * abs(wv):
                    drifts.append(Drift(kind, w["step"], key, gv, wv, bound))
    return Comparison(drifts, exact, worst, worst_ratio)


def data_difference(want: dict, got: dict) -> str:
    """Which parts of two data fingerprints (golden.data_fingerprint) differ, in words."""
    def say(v) -> str:
        return f"{v['tokens']} tokens, sha256 {v['sha256'][:12]}…" if isinstance(v, dict) else str(v)
    return "; ".join(f"{k}: {say(want.get(k))} in the golden file, {say(got.get(k))} here"
                     for k in sorted(set(want) | set(got)) if want.get(k) != got.get(k))


def shape(curve: dict) -> dict:
    """Which steps and keys a curve records."""
    return {kind: [(r["step"], sorted(r)) for r in curve[kind]] for kind in ("train", "eval")}


# ------------------------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def golden_data(tmp_path_factory) -> DataConfig:
    return golden.build_data(tmp_path_factory.mktemp("golden_data"))


@pytest.fixture(scope="module")
def data_print(golden_data) -> dict:
    return golden.data_fingerprint(golden_data)


@pytest.fixture(scope="module")
def replay(request, golden_data, tmp_path_factory) -> Callable[[Case], dict]:
    """A case's replayed curve, run once per session. The selected cases on the same number of ranks > 1 replay
    together, in one spawn (golden.run_cases)."""
    selected = {item.callspec.params["case"].name for item in request.session.items
                if hasattr(item, "callspec") and isinstance(item.callspec.params.get("case"), Case)}
    out = tmp_path_factory.mktemp("golden_runs")
    cache: dict[str, dict] = {}

    def get(case: Case) -> dict:
        if case.name not in cache:
            group = [case] if case.ranks == 1 else [
                c for c in (*CASES, *REFERENCE) if c.ranks == case.ranks and c.name not in cache
                and (c.name in selected or c == case)]
            cache.update(golden.run_cases(group, golden_data, out))
        return cache[case.name]

    return get


# ------------------------------------------------------------------------------------------------------ tests


def test_each_case_has_its_golden_file():
    own = {c.golden_name for c in CASES}
    assert all(c.golden_path.exists() for c in CASES), "missing golden files: run python tests/golden.py --write"
    assert {p.stem for p in golden.GOLDEN_DIR.glob("*.json")} == own, "a golden file of no case in tests/golden.py"
    for c in CASES:
        assert golden.load_golden(c)["format"] == golden.FORMAT


# Each case again on the reference model (train.fast_path=false: model/ as written, no fast/), held to the same
# golden file and bound: the fast path computes the reference's function.
REFERENCE = [dataclasses.replace(c, name=f"{c.name}_reference", overrides=(*c.overrides, "train.fast_path=false"),
                                 replays=c.golden_name) for c in CASES if not c.replays]


@pytest.mark.parametrize("case", CASES + REFERENCE, ids=lambda c: c.name)
def test_replay_matches_golden(case: Case, data_print, replay):
    want = golden.load_golden(case)
    where = (f"{case.name} (golden {case.golden_path.name}, written under torch {want['torch']} on "
             f"{want['cpu_capability']}, now {torch.__version__} on {torch.backends.cpu.get_cpu_capability()})")
    if data_print != want["data"]:
        pytest.fail(f"{where}: the data differs, so the losses were not compared "
                    f"({data_difference(want['data'], data_print)}). "
                    "The built-in corpus package, data.prepare or the BPE trainer changed the tokens the runs read "
                    "(tests/golden.py, build_data); if that is meant, regenerate in a commit of its own: "
                    "python tests/golden.py --write")
    argv = golden.portable_argv(case)
    if [a for a in argv if a != "train.fast_path=false"] != want["argv"]:
        pytest.fail(f"{where}: the case's command changed (tests/golden.py or tests/test_train.py's args_for):\n"
                    f"  golden: {' '.join(want['argv'])}\n  now:    {' '.join(argv)}\n"
                    "if that is meant, regenerate: python tests/golden.py --write")
    got = replay(case)
    assert shape(got) == shape(want), f"{where}: other steps or keys recorded than in the golden file"
    result = compare(want, got, case_bounds(argv))
    print(f"\n{case.name}: largest |Δ|/|golden| " + ", ".join(
        f"{k} {rel:.2e} (step {s})" for k, (rel, s) in result.worst.items()) + f"; at most {result.worst_ratio:.1e} "
        f"of the bound")
    problems = []
    if result.exact:
        problems.append(f"{len(result.exact)} value(s) that agree exactly on every machine differ (batch_digest: the "
                        "step read other tokens; moe loads: a token's expert choice changed):\n  "
                        + "\n  ".join(result.exact[:8]))
    if result.drifts:
        problems.append(f"{len(result.drifts)} value(s) moved beyond the float64 rounding bound:\n  "
                        + "\n  ".join(map(str, result.drifts[:8])))
    if problems:
        pytest.fail(f"{where}: " + "\n".join(problems) + "\nif the change is meant, regenerate in a commit of its own "
                    "that says why: python tests/golden.py --write")


def test_resume_is_bit_identical_to_the_uninterrupted_run(replay):
    """On one machine a resumed run is the uninterrupted one bit for bit (the replay above holds it to the golden file
    within the bound, as any other machine)."""
    for resumed in (c for c in CASES if c.replays):
        assert replay(resumed) == replay(golden.BY_NAME[resumed.replays]), resumed.name


# The bound is useless if real changes fit inside it. From the golden files alone: a step's move of the loss (the
# median over the curve: a step moves it by ~lr), and the distance between any two cases' curves (cases differ in one
# to three settings; two of them share the first step exactly: the same init and tokens, another optimizer), are each
# ≥ 1000× the bound at step 20, so a change the size of either cannot pass the replay.
SEPARATION = 1000


def test_bound_is_far_below_real_changes():
    curves = {c.golden_name: golden.load_golden(c) for c in CASES}
    # the largest bound of a loss anywhere in the matrix: after the last step
    bound = max(case_bounds(g["argv"]).of("eval", "val_loss", golden.STEPS) for g in curves.values())
    for name, g in curves.items():
        loss = [r["loss"] for r in g["train"]]
        move = statistics.median(abs(b - a) / a for a, b in zip(loss, loss[1:]))
        assert move >= SEPARATION * bound, (name, move, bound)
    for (a, ga), (b, gb) in itertools.combinations(curves.items(), 2):
        apart = max(abs(x["loss"] - y["loss"]) / x["loss"] for x, y in zip(ga["train"], gb["train"]))
        assert apart >= SEPARATION * bound, (a, b, apart, bound)
