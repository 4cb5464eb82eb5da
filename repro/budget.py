"""The page's CPU budget, split by where each run came from (issue 52, item 7.7): runs reused unchanged from the
previous page's archive, runs new here, and CPU time spent on runs the page does not read.

The runner's ledger (repro/runner.py, CpuLedger) keeps CPU seconds per run directory name, summed over every
invocation. A run restored from an archive keeps its seconds, and retraining it under the same name adds to them. So
against the previous archive: a run whose files are that archive's own is reused; where the ledger descends from that
archive's (it holds every entry of it), a retrained run's seconds start with the old run's, which were discarded.
Without the previous archive the ledger can only tell the runs the page reads from those it does not.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from repro.measure import Results
from repro.runner import ARCHIVED, CpuLedger, is_compact, unpack

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Part:
    runs: int
    seconds: float

    @property
    def hours(self) -> str:
        return f"{self.seconds / 3600:.2f}"


@dataclass(frozen=True)
class Budget:
    total: float  # every entry of the ledger
    read: Part  # the runs the page reads, with a ledger entry
    unread: Part  # ledger entries of runs the page does not read
    reused: Optional[Part]  # None: no previous archive to tell reused from new
    new: Optional[Part]
    retrained: Part  # the previous page's training of runs retrained since under the same name
    unledgered: list[str]  # runs the page reads that have no ledger entry


def past_runs(archive: Path) -> tuple[dict[str, float], dict[str, tuple[str, ...]]]:
    """A previous archive's ledger and each of its runs' files (ARCHIVED), a compact file or a folder."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(archive)
        if is_compact(root):
            unpack(root, Path(tmp))
            root = Path(tmp)
        runs = {p.name: tuple((p / f).read_text() for f in ARCHIVED) for p in root.iterdir()
                if p.is_dir() and all((p / f).is_file() for f in ARCHIVED)}
        return CpuLedger(root).seconds, runs


def budget(res: Results, cpu: dict[str, float], archive: Optional[Path]) -> Budget:
    """`cpu`: the ledger's seconds per run name; `archive`: the previous page's runs (None or missing: not known)."""
    loaded = {r.path.name: r for r in res.loaded}
    unledgered = sorted(n for n in loaded if n not in cpu)
    mine = [n for n in loaded if n in cpu]
    read = Part(len(mine), sum(cpu[n] for n in mine))
    unread = Part(sum(n not in loaded for n in cpu), sum(s for n, s in cpu.items() if n not in loaded))
    none = Part(0, 0.0)
    if archive is None or not Path(archive).exists():
        return Budget(sum(cpu.values()), read, unread, None, None, none, unledgered)
    old_cpu, old_runs = past_runs(Path(archive))
    descends = bool(old_cpu) and set(old_cpu) <= set(cpu)
    reused, new, retrained = [], [], []  # (name, seconds)
    for name in mine:
        files = tuple((loaded[name].path / f).read_text() for f in ARCHIVED)
        if old_runs.get(name) == files:
            reused.append((name, cpu[name]))
        elif descends and name in old_cpu and cpu[name] >= old_cpu[name]:
            retrained.append((name, old_cpu[name]))
            new.append((name, cpu[name] - old_cpu[name]))
        else:
            new.append((name, cpu[name]))
    part = lambda xs: Part(len(xs), sum(s for _, s in xs))  # noqa: E731
    return Budget(sum(cpu.values()), read, unread, part(reused), part(new), part(retrained), unledgered)


def budget_text(b: Budget, past: str) -> str:
    """The page's budget in a few short sentences; `past` names the previous page ("v3")."""
    text = (f"The runner's ledger holds **{b.total / 3600:.2f} CPU-hours**: user + system time of every run's "
            "process, summed over every invocation.")
    if b.reused is None:
        text += (f" Of them, {b.read.hours} went to the {b.read.runs} runs this page reads and {b.unread.hours} to "
                 f"{b.unread.runs} runs it does not read (discarded). Without {past}'s archive the ledger cannot tell "
                 f"runs reused from {past} from new ones.")
    else:
        trained = f"{b.new.hours} to the {b.new.runs} runs trained for this page"
        text += (f" Of them, {b.reused.hours} went to the {b.reused.runs} runs reused unchanged from {past} (the same "
                 f"files as its archive), and {trained}." if b.reused.runs else
                 f" No run is reused unchanged from {past}'s archive; {trained}.")
        discarded = b.unread.seconds + b.retrained.seconds
        parts = ([f"{b.unread.hours} to {b.unread.runs} runs this page does not read"] if b.unread.runs else []) + (
            [f"{b.retrained.hours} to {past}'s first training of {b.retrained.runs} runs retrained since under the "
             "same name"] if b.retrained.runs else [])
        if parts:
            text += f" {discarded / 3600:.2f} went to runs discarded: " + ", and ".join(parts) + "."
    if b.unledgered:
        one = len(b.unledgered) == 1
        text += (f" {len(b.unledgered)} {'run' if one else 'runs'} ({', '.join(b.unledgered)}) "
                 f"{'has' if one else 'have'} no entry in the ledger, so {'its' if one else 'their'} time is not in it.")
    return text


def budget_sentences(res: Results, cpu: dict[str, float], past: str, archive: Optional[str]) -> str:
    """The budget against the previous page `past`, whose archive (from the repository's root) may be None."""
    return budget_text(budget(res, cpu, ROOT / archive if archive else None), past)
