"""Kill soak: a 2-rank CPU run SIGKILLed at random moments (some while a checkpoint is being written) and restarted
with the same command each time (or on the other number of ranks), then compared with an uninterrupted run.

    python -m harness.soak --minutes 25 --out runs/soak      # the report in docs/reliability.md
    python -m harness.soak --episodes 1 --kills 2            # a short soak
    python -m harness.soak --episodes 1 --kills 2 --seq-len 64   # shorter sequences: tests/test_soak.py's

An episode is one training run: an uninterrupted reference (once per seed), then the same command under kills
until it reaches its last step. A kill is `SIGKILL` to the whole process group (torchrun and both ranks), as a
crashed machine or an OOM killer would do it: no handler runs, no file is closed. Three kinds take turns:

- during a checkpoint write: the soak waits until a `.tmp-step_*` folder exists and kills while it still does;
- at a random moment (anywhere: start-up, a step, an eval, a checkpoint);
- a rank-count change: a random moment as above, and the restart runs on the other number of ranks (2 → 1 or
  1 → 2, the micro-batch unchanged, so the accumulation doubles or halves), as a job requeued onto another
  allocation would. Only in even episodes: odd ones stay on 2 ranks (`kinds_of`).

Every restart must resume from the newest checkpoint that was complete (its COMPLETE marker written) when the
kill landed, never a partial one. At the end every step's `batch_digest` must equal the reference's (the same
tokens), and the killed run's losses (metrics.jsonl) and every parameter and optimizer tensor of its final
checkpoint must equal the reference's bit for bit — or, in an episode that changed its rank count, lie within the
fp64 reduction-order bounds LOSS_TOL, TENSOR_REL_TOL and OPTIM_ABS_TOL (another rank count sums in another order).
The report gives the kills survived, the kills during checkpoint writes, the rank changes, the steps recomputed (done
before a kill, redone after it), and the divergence (0 = bit-identical).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from runtime.checkpoint import checkpoint_tensors

REPO = Path(__file__).resolve().parents[1]
TMP_PREFIX = ".tmp-step_"
KINDS = ("checkpoint-write", "random", "rank-change")  # in turn, in even episodes


def kinds_of(episode: int) -> tuple[str, ...]:
    """Even episodes take all three kinds in turn; odd ones only the first two, so they stay on 2 ranks and must end
    bit-identical."""
    return KINDS if episode % 2 == 0 else KINDS[:2]
# The runs are fp64. Bit-exact resume holds in any dtype; fp64 is for the episodes that change their rank count,
# where only the order of the sums over rows changes (the loss, each gradient's sum over the step's 512 rows, the
# all-reduce): each differs by ≲ sqrt(n)·u relative, u = 2⁻⁵³ ≈ 1.1e-16, and 40 steps of training grow that to
# ~1e-14 in loss and weights (measured ≤ 2e-14, docs/reliability.md). The bounds are 1e4× that. fp32 cannot be
# bounded this way: Adam maps a gradient that cancels to ~1e-8, where fp32 rounding is a large part of it, to an
# update of ±lr·O(1), so an isolated weight can differ by whole steps (this soak in fp32: a weight tensor 1.7e-3 of
# its norm apart, the loss 4e-5).
LOSS_TOL = 1e-10
TENSOR_REL_TOL = 1e-10  # each weight tensor, relative to its norm
OPTIM_ABS_TOL = 1e-10  # optimizer moments, absolute: every entry is ≤ 1 (gradients are clipped to norm ≤ 1), and a
# relative bound would not hold for a scalar vector whose gradient sums many terms that nearly cancel


@dataclass
class Kill:
    episode: int
    kind: str  # checkpoint-write | random | rank-change
    at_step: int  # the last step logged before the kill
    during_write: bool  # a .tmp-step_* folder existed at the moment of the kill (and after it)
    ranks_after: int = 2  # the rank count the next launch ran on
    resumed_from: int = -1  # the step the next launch resumed from (-1: started from scratch)
    complete_before: list[int] = field(default_factory=list)  # complete checkpoints when the kill landed


@dataclass
class Episode:
    seed: int
    launches: int = 0
    kills: list[Kill] = field(default_factory=list)
    steps_recomputed: int = 0
    rank_changes: int = 0
    digests_equal: bool = False  # every step trained on the reference's tokens
    max_loss_diff: float = 0.0
    # Where the rank count changed: the steps last logged before that change (up to the step its launch resumed
    # from), all run on 2 ranks through the same-rank resumes before it, must match the reference bit for bit
    same_ranks_steps: int = 0
    max_loss_diff_same_ranks: float = 0.0
    differing_tensors: int = 0
    max_tensor_rel_diff: float = 0.0  # over the model's tensors
    max_optim_abs_diff: float = 0.0  # over the optimizer state's
    tensors: int = 0
    ok: bool = False


SEQ_LEN = 256  # configs/tiny_cpu.yaml's


def command(out: Path, name: str, seed: int, steps: int, ranks: int = 2, seq_len: int = SEQ_LEN) -> list[str]:
    """A tiny unified model on the built-in corpus, `ranks` ranks (2, or 1 after a rank-change kill; global batch
    8 of micro-batches of 2, each `seq_len` tokens), a checkpoint every 2 steps, fp64 eager (LOSS_TOL says why)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}",
            str(REPO / "train.py"), "--config", str(REPO / "configs" / "tiny_cpu.yaml"),
            "model.d_model=64", "model.n_heads=2", "model.n_layers=2", f"data.seq_len={seq_len}",
            f"train.steps={steps}", "train.global_batch=8", "train.micro_batch=2", "train.eval_every=1000000",
            "train.eval_tokens=4096",
            "train.ckpt_every=2", "train.keep_ckpts=2", "train.compile=false", "train.dtype=float64",
            "schedule.warmup_steps=2", f"train.seed={seed}", "train.device=cpu", "log.every=1",
            "log.wandb.mode=disabled", f"log.out_dir={out}", f"log.run_name={name}"]


def env(out: Path) -> dict:
    tmp = out / "tmp"  # torchrun's torchelastic_* folders stay out of the system temp dir (docs/design.md trap 3)
    tmp.mkdir(parents=True, exist_ok=True)
    return {**os.environ, "TMPDIR": str(tmp), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def launch(cmd: list[str], out: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen(cmd, cwd=REPO, env=env(out), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)  # its own process group: one killpg reaches every rank


def complete(ckpts: Path) -> list[int]:
    if not ckpts.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in ckpts.iterdir() if p.name.startswith("step_") and (p / "COMPLETE").is_file())


def tmp_dirs(ckpts: Path) -> set[str]:
    """The checkpoint saves in progress (or cut short: a killed save leaves its folder until the next prune)."""
    return {p.name for p in ckpts.iterdir() if p.name.startswith(TMP_PREFIX)} if ckpts.is_dir() else set()


def last_step(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip().endswith("}")]
    return max(steps, default=0)


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (torchrun starts each rank in a session of its own, so a process group is not
    enough to reach them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every rank at once: nothing gets to run a handler or finish a write."""
    pids = [proc.pid, *descendants(proc.pid)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids[1:]) and time.monotonic() < deadline:  # ranks reparented to init
        time.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def run_with_kills(out: Path, name: str, seed: int, steps: int, kills: int, rng: random.Random, episode: int,
                   deadline: float, seq_len: int = SEQ_LEN) -> Episode:
    ep = Episode(seed)
    ckpts, log = out / name / "checkpoints", out / f"{name}.log"
    ranks = 2
    pending: Kill | None = None
    while True:
        offset = log.stat().st_size if log.exists() else 0
        stale = tmp_dirs(ckpts)  # left by an earlier kill: not a save of this launch
        proc = launch(command(out, name, seed, steps, ranks, seq_len), out, log)
        ep.launches += 1
        if pending is not None:  # the previous kill: which checkpoint did this launch resume from?
            pending.resumed_from = resumed_step(log, offset, proc)
            if pending.resumed_from != (max(pending.complete_before) if pending.complete_before else -1):
                raise SystemExit(f"soak: launch {ep.launches} resumed from step {pending.resumed_from}, but the "
                                 f"newest complete checkpoint at the kill was {pending.complete_before}")
            ep.steps_recomputed += pending.at_step - max(pending.resumed_from, 0)
            pending = None
        if len(ep.kills) >= kills or time.monotonic() > deadline:
            if proc.wait() != 0:
                raise SystemExit(f"soak: the last launch of {name} failed (exit {proc.returncode}); see {log}")
            return ep
        kinds = kinds_of(episode)
        kind = kinds[len(ep.kills) % len(kinds)]
        seen = max([k.at_step for k in ep.kills], default=0)  # metrics.jsonl holds up to here until truncated
        killed = wait_and_kill(proc, "checkpoint-write" if kind == "checkpoint-write" else "random", ckpts, stale,
                               rng, seen, steps)
        if killed is None:  # the run finished before the kill
            return ep
        at_step, during = killed
        if kind == "rank-change":
            ranks = 3 - ranks  # 2 ↔ 1
            ep.rank_changes += 1
        pending = Kill(episode, kind, at_step, during, ranks_after=ranks, complete_before=complete(ckpts))
        ep.kills.append(pending)


def wait_and_kill(proc: subprocess.Popen, kind: str, ckpts: Path, stale: set[str], rng: random.Random,
                  seen: int, steps: int) -> tuple[int, bool] | None:
    """Kill `proc` at a random moment or during a checkpoint write; (last logged step, during a write) or None if
    the run ended first. A random moment is, one time in four, within the first seconds (start-up: imports, the
    process group, loading the checkpoint), else a random fraction of a second after a random step."""
    if kind == "random":
        if rng.random() < 0.25 or seen + 1 > steps - 2:
            until = time.monotonic() + rng.uniform(0.3, 2.5)
            while time.monotonic() < until:
                if proc.poll() is not None:
                    return None
                time.sleep(0.01)
        else:
            target = rng.randint(seen + 1, steps - 2)
            while last_step(ckpts.parent) < target:
                if proc.poll() is not None:
                    return None
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.2))
    else:
        while not tmp_dirs(ckpts) - stale:
            if proc.poll() is not None:
                return None
            time.sleep(0.002)
        time.sleep(rng.uniform(0.0, 0.02))
    saving = tmp_dirs(ckpts) - stale
    kill_group(proc)
    during = bool(saving & tmp_dirs(ckpts))  # the save's folder outlived the kill: the save was cut short
    return last_step(ckpts.parent), during


def resumed_step(log: Path, offset: int, proc: subprocess.Popen) -> int:
    """The step the launch (its output from `offset` on) resumed from, -1 if it started afresh."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
        for line in text.splitlines():  # log.every = 1: the first step a launch logs is the one after its start
            if line.startswith("eval step 0:"):
                return -1
            if line.startswith("resumed from ") and " at step " in line:  # also a resume at the last step (no step)
                return int(line.split(" at step ", 1)[1].split()[0])
            if line.startswith("step ") and "/" in line.split()[1]:
                first = int(line.split()[1].split("/")[0])
                return first - 1 if first > 1 else -1
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"soak: a launch neither resumed nor started training; see {log}")


def compare(ref: Path, run: Path, ep: Episode) -> None:
    """Fill `ep`'s comparison of two runs' metrics (digests, losses) and final checkpoints (model and optimizer),
    and whether it passes: bit-identical, or within the tolerances where the episode changed its rank count."""
    def train_records(path: Path) -> dict[int, dict]:
        recs = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
        return {r["step"]: r for r in recs if r.get("kind") == "train"}
    a, b = train_records(ref), train_records(run)
    ep.ok = False
    if a.keys() != b.keys():
        ep.max_loss_diff, ep.differing_tensors, ep.tensors = float("inf"), -1, -1
        return
    ep.digests_equal = all(a[s]["batch_digest"] == b[s]["batch_digest"] for s in a)
    ep.max_loss_diff = max(abs(a[s]["loss"] - b[s]["loss"]) for s in a)
    change = next((k for k in ep.kills if k.kind == "rank-change"), None)
    before = [s for s in a if change is not None and s <= change.resumed_from]
    ep.same_ranks_steps = len(before)
    ep.max_loss_diff_same_ranks = max((abs(a[s]["loss"] - b[s]["loss"]) for s in before), default=0.0)
    sa, sb = final_state(ref), final_state(run)
    ep.tensors = len(sa)
    if sa.keys() != sb.keys():
        ep.differing_tensors = -1
        return
    ep.differing_tensors = sum(not torch.equal(sa[k], sb[k]) for k in sa)
    ep.max_tensor_rel_diff = max(rel_diff(sa[k], sb[k]) for k in sa if k.startswith(".model."))
    ep.max_optim_abs_diff = max(abs_diff(sa[k], sb[k]) for k in sa if k.startswith(".optim."))
    if ep.rank_changes == 0:
        ep.ok = ep.digests_equal and ep.max_loss_diff == 0 and ep.differing_tensors == 0
    else:
        ep.ok = (ep.digests_equal and ep.max_loss_diff_same_ranks == 0 and ep.max_loss_diff <= LOSS_TOL
                 and ep.max_tensor_rel_diff <= TENSOR_REL_TOL
                 and ep.max_optim_abs_diff <= OPTIM_ABS_TOL)


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else float("inf")
    a, b = a.double(), b.double()
    return ((a - b).norm() / a.norm()).item() if a.norm() > 0 else (a - b).norm().item()


def abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if not a.is_floating_point():
        return 0.0 if torch.equal(a, b) else float("inf")
    return (a.double() - b.double()).abs().max().item()


def final_state(run: Path) -> dict[str, torch.Tensor]:
    step = complete(run / "checkpoints")[-1]
    return checkpoint_tensors(run / "checkpoints" / f"step_{step:08d}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=0, help="keep starting episodes until this much time passed")
    p.add_argument("--episodes", type=int, default=1, help="episodes when --minutes is 0")
    p.add_argument("--kills", type=int, default=8, help="kills per episode")
    p.add_argument("--steps", type=int, default=40, help="steps per run")
    p.add_argument("--seq-len", type=int, default=SEQ_LEN, help="tokens per sequence (global batch 8 sequences); "
                   "fewer make each step cheaper, e.g. 64 in tests/test_soak.py")
    p.add_argument("--seed", type=int, default=0, help="the soak's own random moments")
    p.add_argument("--out", type=Path, default=Path("runs/soak"))
    args = p.parse_args(argv)
    if args.seq_len < 1:
        p.error(f"--seq-len {args.seq_len}: must be ≥ 1")
    out = args.out.resolve()
    if out.exists() and any(out.iterdir()):
        print(f"soak: {out} is not empty; give a new --out (a soak starts every run from scratch)", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    t0 = time.monotonic()
    deadline = t0 + args.minutes * 60 if args.minutes else float("inf")
    episodes: list[Episode] = []
    while (time.monotonic() < deadline) if args.minutes else (len(episodes) < args.episodes):
        i = len(episodes)
        seed = i  # a new seed per episode: new init, new data order
        ref = out / f"reference-s{seed}"
        proc = launch(command(out, ref.name, seed, args.steps, seq_len=args.seq_len), out, out / f"{ref.name}.log")
        if proc.wait() != 0:
            print(f"soak: the reference run failed; see {out / ref.name}.log", file=sys.stderr)
            return 1
        name = f"killed-s{seed}"
        ep = run_with_kills(out, name, seed, args.steps, args.kills, rng, i,
                            deadline if args.minutes else float("inf"), args.seq_len)
        compare(ref, out / name, ep)
        episodes.append(ep)
        print(f"episode {i}: {len(ep.kills)} kills ({sum(k.during_write for k in ep.kills)} during a checkpoint "
              f"write, {ep.rank_changes} rank changes), {ep.launches} launches, {ep.steps_recomputed} steps "
              f"recomputed, digests {'equal' if ep.digests_equal else 'DIFFER'}, max |Δloss| {ep.max_loss_diff:.3g}, "
              f"{ep.differing_tensors} of {ep.tensors} tensors differ (weights: max relative "
              f"{ep.max_tensor_rel_diff:.3g}; optimizer: max absolute {ep.max_optim_abs_diff:.3g})"
              f"{'' if ep.ok else ' — DIVERGED'}", flush=True)
    kills = [k for e in episodes for k in e.kills]
    report = {
        "minutes": round((time.monotonic() - t0) / 60, 1), "episodes": len(episodes),
        "kills": len(kills), "kills_during_checkpoint_write": sum(k.during_write for k in kills),
        "rank_changes": sum(e.rank_changes for e in episodes),
        "launches": sum(e.launches for e in episodes), "steps_recomputed": sum(e.steps_recomputed for e in episodes),
        "partial_checkpoints_loaded": 0,  # every resume was checked against the newest complete one (above)
        "divergent_episodes": sum(not e.ok for e in episodes),
        "digests_equal": all(e.digests_equal for e in episodes),
        # bit-identical episodes (no rank change) and the others, apart: their criteria differ
        "max_loss_diff": max((e.max_loss_diff for e in episodes if not e.rank_changes), default=0.0),
        "max_loss_diff_rank_changed": max((e.max_loss_diff for e in episodes if e.rank_changes), default=0.0),
        "max_loss_diff_before_rank_change": max((e.max_loss_diff_same_ranks for e in episodes if e.rank_changes),
                                                default=0.0),
        "max_tensor_rel_diff_rank_changed": max((e.max_tensor_rel_diff for e in episodes if e.rank_changes),
                                                default=0.0),
        "max_optim_abs_diff_rank_changed": max((e.max_optim_abs_diff for e in episodes if e.rank_changes),
                                               default=0.0),
        "episodes_detail": [asdict(e) for e in episodes],
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"soak: {report['minutes']} min, {report['episodes']} episodes, {report['kills']} kills survived "
          f"({report['kills_during_checkpoint_write']} during a checkpoint write, {report['rank_changes']} onto "
          f"another rank count), {report['launches']} launches, {report['steps_recomputed']} steps recomputed, "
          f"partial checkpoints loaded: 0, every step's tokens equal: {report['digests_equal']}, divergent episodes: "
          f"{report['divergent_episodes']} (max |Δloss| {report['max_loss_diff']} without a rank change, "
          f"{report['max_loss_diff_rank_changed']:.3g} with one; there, weights within "
          f"{report['max_tensor_rel_diff_rank_changed']:.3g} relative, optimizer state within "
          f"{report['max_optim_abs_diff_rank_changed']:.3g})")
    return 0 if report["divergent_episodes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
