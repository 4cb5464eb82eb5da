"""The magnitudes that only meet a Norm (results v4, item 7): under DNP an input-side vector feeds its branch's inner
Norm, so its magnitude β gets no gradient but through the Norm's eps. For every such vector of a run's last checkpoint
this prints its magnitude, the step Adam takes on it, and how close its branch's Norm input comes to eps.

    python -m repro.magnitudes RUN_DIR [RUN_DIR ...] [--tokens 4096]

Adam's step on β is −lr·m̂/(√v̂ + eps) (bias-corrected moments, from the checkpoint's optimizer state): a gradient
of any size whose sign holds moves β by up to lr a step, so |m̂/√v̂| near 1 means β moves at nearly the full lr
although its gradient is eps-sized; a negative ratio grows β. The Norm input's mean square is read on the first
`--tokens` tokens of the validation split (per token, and per head where the Norm is per head); eps / median says
how much eps weighs in that Norm (the Norm is scale-invariant only while it is ≪ 1).

Where Adam's step comes from: the true gradient of each β, in float64 on `--batches` training batches of the run's
micro-batch (their mean over their rms is what m̂/√v̂ estimates if the steps follow the gradient), and the error of
the same gradient computed in fp32 and in bf16 (the model cast, as mixed precision computes), as a fraction of the
true gradient's rms. An error near or above 1 means that precision's gradient is mostly rounding: Adam divides out its
size and steps on its sign, which the gradient no longer sets.
"""
from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from model.llama import Llama
from model.scaling import Norm
from model.vectors import ScaleVector


@dataclass(frozen=True)
class Site:
    """An input-side vector whose every reader normalizes its output, and those readers' inner Norms."""
    name: str  # "layers.0.attn.q_proj", "layers.0 ffn_norm" (a norm's shared γ), "norm" (the LM head's)
    vector: ScaleVector
    norms: tuple[Norm, ...]


def sites(model: Llama) -> list[Site]:
    """Llama.invariant_magnitudes' vectors, named, with their readers' inner Norms (OR and ER: direct vectors have
    no separate magnitude)."""
    names = {id(m): n for n, m in model.named_modules()}
    out = []
    for norm, branches in model.norm_groups():
        if norm.scale is not None and all(b.inner is not None for b in branches):
            out.append(Site(names[id(norm)], norm.scale, tuple(b.inner for b in branches)))
        out += [Site(names[id(b)], b.in_scale, (b.inner,)) for b in branches
                if b.in_scale is not None and b.inner is not None]
    return [s for s in out if s.vector.reparam != "direct"]


def adam_ratio(flat: dict[str, torch.Tensor], param: str, entries: slice, betas: tuple[float, float],
               eps: float) -> list[float]:
    """m̂/(√v̂ + eps) of a parameter's entries, from a checkpoint's optimizer state (runtime/checkpoint.py,
    checkpoint_tensors keys: ".optim.state.<param>.exp_avg" …)."""
    state = f".optim.state.{param}."
    t = float(flat[state + "step"].flatten()[0])
    m = flat[state + "exp_avg"].flatten()[entries].double() / (1 - betas[0] ** t)
    v = flat[state + "exp_avg_sq"].flatten()[entries].double() / (1 - betas[1] ** t)
    return (m / (v.sqrt() + eps)).tolist()


def mean_squares(model: Llama, norms: list[Norm], tokens: torch.Tensor) -> dict[int, torch.Tensor]:
    """Each Norm's input mean square over its groups (its logical width), per token, on one forward of `tokens`."""
    seen: dict[int, list[torch.Tensor]] = {id(n): [] for n in norms}

    def hook(norm: Norm, args) -> None:
        x = args[0].detach().double()
        if norm.group != norm.dim:
            ms = x.unflatten(-1, (-1, norm.group)).pow(2).mean(-1)
        else:
            ms = x.pow(2).sum(-1) / (norm.logical or norm.dim)
        seen[id(norm)].append(ms.flatten())

    handles = [n.register_forward_pre_hook(hook) for n in norms]
    try:
        with torch.no_grad():
            model(tokens)
    finally:
        for h in handles:
            h.remove()
    return {k: torch.cat(v) for k, v in seen.items() if v}


def beta_entries(v: ScaleVector) -> tuple[torch.Tensor, slice]:
    """The parameter that holds a vector's β (the reference model's: its own) and its entries there."""
    return v.beta, slice(None)


def beta_grads(model: Llama, batches: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Each site's ∂L/∂β per batch, (batches, entries) in float64, computed in the model's own dtype: the next-token
    loss of each (rows, seq + 1) batch, as training computes it."""
    params = {s.name: beta_entries(s.vector) for s in sites(model)}
    names = list(params)
    out: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    for tokens in batches:
        model.zero_grad(set_to_none=True)
        logits = model(tokens[:, :-1])  # (rows, seq, vocab)
        if logits.dtype == torch.bfloat16:  # the loss in fp32, as training's head computes it
            logits = logits.float()
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        for n in names:
            param, entries = params[n]
            out[n].append(param.grad.flatten()[entries].double().clone())
    return {n: torch.stack(v) for n, v in out.items()}


def gradient_columns(model: Llama, found: list[Site], batches: list[torch.Tensor]) -> dict[str, str]:
    """Per site: the true gradient's mean/rms over the batches (float64), and the fp32 and bf16 gradients' rms error
    over the true gradient's rms, entry 0 (the first of a per-head β)."""
    exact = beta_grads(copy.deepcopy(model).double(), batches)
    rounded = {dt: beta_grads(copy.deepcopy(model).to(dt), batches) for dt in (torch.float32, torch.bfloat16)}
    out = {}
    for s in found:
        g = exact[s.name][:, 0]
        rms = g.pow(2).mean().sqrt().item()
        errs = [(rounded[dt][s.name][:, 0] - g).pow(2).mean().sqrt().item() / rms if rms > 0 else float("inf")
                for dt in (torch.float32, torch.bfloat16)]
        out[s.name] = (f"{g.mean().item() / rms if rms > 0 else 0.0:+.2f} | {rms:.2g} | {errs[0]:.2g} | "
                       f"{errs[1]:.2g}")
    return out


def training_batches(cfg, n: int, seed: int = 0) -> list[torch.Tensor]:
    """`n` batches of the run's micro-batch rows, each row seq_len + 1 tokens at a random offset of the first training
    shard (the same offsets for every precision)."""
    from data.shards import load_meta, open_shard
    meta = load_meta(cfg.data.dir)
    data = open_shard(Path(cfg.data.dir) / meta.splits["train"].shards[0].file)
    seq, rows = cfg.data.seq_len, cfg.train.micro_batch
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(data) - seq - 1, (n, rows), generator=g).tolist()
    return [torch.stack([torch.from_numpy(data[s: s + seq + 1].astype("int64")) for s in row]) for row in starts]


def report(run_dir: Path, n_tokens: int, n_batches: int = 32) -> list[str]:
    """A markdown table of the run's last checkpoint: each site's magnitude, Adam's ratio, its Norm input's mean
    square against eps."""
    from config import resolve_vocab
    from data.shards import load_meta, open_shard
    from runs import load_run
    from runtime.checkpoint import checkpoint_tensors, latest_checkpoint, load_model_weights
    run = load_run(run_dir)
    cfg = run.cfg
    meta = load_meta(cfg.data.dir)
    model = Llama(resolve_vocab(cfg, n_vocab=meta.tokenizer["n_vocab"])).float()
    ckpt = latest_checkpoint(Path(run_dir) / "checkpoints")
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir} has no complete checkpoint")
    load_model_weights(model, ckpt)
    model.eval()
    val = open_shard(Path(cfg.data.dir) / meta.splits["val"].shards[0].file)
    seq = cfg.data.seq_len
    rows = max(1, min(n_tokens, len(val)) // seq)
    tokens = torch.from_numpy(val[: rows * seq].astype("int64")).view(rows, seq)
    found = sites(model)
    ms = mean_squares(model, [n for s in found for n in s.norms], tokens)
    flat = checkpoint_tensors(ckpt)
    params = {id(p): n for n, p in model.named_parameters()}
    grads = gradient_columns(model, found, training_batches(cfg, n_batches))
    out = [f"{run_dir} at {ckpt.name}: {rows * seq:,} validation tokens; the gradients on {n_batches} training batches "
           f"of {cfg.train.micro_batch} × {seq} tokens", "",
           "| site | β (OR) or e^β (ER) | Adam m̂/√v̂ | Norm input mean square: median, 1st percentile | eps | "
           "eps / median | ∂L/∂β mean/rms (fp64) | ∂L/∂β rms | fp32 error / rms | bf16 error / rms |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for s in found:
        v = s.vector
        beta, entries = beta_entries(v)
        ratio = adam_ratio(flat, params[id(beta)], entries, tuple(cfg.optim.betas), cfg.optim.eps)
        square = torch.cat([ms[id(n)] for n in s.norms if id(n) in ms])
        med, low = square.median().item(), square.quantile(0.01).item()
        eps = s.norms[0].eps
        mag = ", ".join(f"{x:.4g}" for x in v.magnitude().flatten().tolist()[:4])
        out.append(f"| {s.name} | {mag} | {', '.join(f'{r:+.2f}' for r in ratio[:4])} | {med:.3g}, {low:.3g} | "
                   f"{eps:g} | {eps / med:.3g} | {grads[s.name]} |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run directories (config.yaml, checkpoints/)")
    p.add_argument("--tokens", type=int, default=4096, help="validation tokens of the forward that reads the Norms")
    p.add_argument("--batches", type=int, default=32, help="training batches (the run's micro-batch) of the "
                   "gradient columns, each trained on in fp64, fp32 and bf16")
    args = p.parse_args(argv)
    if args.batches < 2:
        p.error(f"--batches {args.batches}: the gradient's mean/rms needs at least 2 batches")
    for run_dir in args.runs:
        try:
            print("\n".join(report(run_dir, args.tokens, args.batches)))
        except FileNotFoundError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
