"""bench/footprint.py's accounting, and what the scale vectors cost in it: the unified design's blocks save what the
baseline's save (plus one statistic per normalized row) once compiled, and its head holds less at once."""
from dataclasses import replace

import pytest
import torch

from fast import build_fast_model
from fast.head import FusedHeadLoss
from runtime.parallel import compile_blocks
from bench.footprint import saved_activations
from test_model import preset_model_cfg

TOKENS = (4, 32)


def saved(name: str, backend, **model):
    """(bytes saved per block, the head's peak) of one fp32 forward of `name` on TOKENS tokens, its blocks compiled
    by `backend` (None: eager). aot_eager_decomp_partition runs AOT autograd's min-cut partitioner, the one inductor
    uses, without generating code: what is saved is decided as in training, in seconds."""
    cfg = replace(preset_model_cfg(name, vocab_size=256), d_model=64, n_heads=4, n_layers=2, **model)
    torch.manual_seed(0)
    m = build_fast_model(cfg, seed=0)  # the training model's fast path
    if backend is not None:
        torch._dynamo.reset()
        compile_blocks(m, torch.device("cpu"), torch.float32, backend=backend)
        m.loss_fn = FusedHeadLoss(backend)
    x, y = (torch.randint(0, 256, TOKENS) for _ in range(2))
    return saved_activations(m, lambda: m(x, y, loss_chunk=TOKENS[0] * TOKENS[1]))  # one chunk: all rows


def test_the_ledger_counts_a_block_once_per_storage_and_not_its_parameters():
    blocks, head = saved("baseline", None)
    assert len(blocks) == 2 and blocks[0] == blocks[1] > 0  # two identical blocks
    n, d = TOKENS[0] * TOKENS[1], 64
    # eager baseline: well above the normalized inputs of attention and FFN and below ten (N, ffn) tensors
    assert 2 * n * d * 4 < blocks[0] < 10 * n * 4 * d * 4
    assert head > 0


def test_compiled_unified_blocks_save_what_the_baselines_save():
    """The weight fold and each branch's Norm → u → RoPE are recomputed in backward (fast/branches.py, recomputed):
    unified's blocks save at most 2 % more than the baseline's at these widths, where eager they save the folded
    weights and each branch's Norm output beside RoPE's — the test fails without the recompute."""
    base, _ = saved("baseline", "aot_eager_decomp_partition")
    unified, _ = saved("unified", "aot_eager_decomp_partition")
    eager_unified, _ = saved("unified", None)
    assert sum(unified) <= 1.02 * sum(base), (unified, base)
    assert sum(eager_unified) > 1.1 * sum(base), (eager_unified, base)


@pytest.mark.parametrize("backend", [None, "aot_eager_decomp_partition"])
def test_the_dnp_head_holds_less_at_once_than_the_baselines(backend):
    """The DNP head's chunk keeps no autograd graph over (chunk × vocabulary) (fast/head.py, _vocab_norm_core): at
    most its small (rows × d) and (vocabulary,) parts, where the baseline's chunk keeps its logits."""
    _, base = saved("baseline", backend)
    _, unified = saved("unified", backend)
    assert unified < base, (unified, base)
