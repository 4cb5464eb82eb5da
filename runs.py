"""Reading run directories the way every script does: the resolved `config.yaml` and `metrics.jsonl`, never wandb.

    run = load_run(Path("runs/0.12b+unified"))
    run.final_val_loss, run.final_tokens, run.strategy, run.finished, run.passes

An eval record carries `step`, `tokens`, `val_loss` and one `val_loss/<name>` per extra eval set; a run that evaluates
the training mixture (train.eval_sample=mixture) also `val_loss/<source>`, and what it read: `val_tokens`,
`val_tokens/<source>` and `val_share/<source>` (data/evalset.py). A train record carries `epoch`, the passes over the
training data done so far (train.py's loader counts them).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from config import RunConfig, load_saved_config, strategy_name


class MetricsError(ValueError):
    """A metrics.jsonl line that is not a JSON record, before its last line."""


def read_metrics(run: Path) -> list[dict]:
    """The records of a run's metrics.jsonl. A last line that does not parse is skipped: it is the one a running or
    killed run was writing (train.py drops it when the run resumes); a bad line before it is a damaged file."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: is {run} a run directory?")
    lines = [(i, line) for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if line.strip()]
    records = []
    for i, line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            bad = [k for k in NUMERIC if k in record and not _number(record[k])]
            if bad:
                raise MetricsError(f"{path}, line {i}: {bad[0]} is {record[bad[0]]!r}, not a number: the file was "
                                   "edited; repair or remove that line")
            records.append(record)
        elif i != lines[-1][0]:
            raise MetricsError(f"{path}, line {i}, is not a JSON record: the file is damaged; remove or repair that "
                               "line")
    return records


NUMERIC = ("step", "tokens", "loss", "val_loss")  # the keys every reader computes with


def _number(v) -> bool:
    return v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))


def series(records: list[dict], metric: str, x: str) -> tuple[list[float], list[float]]:
    """(x, metric) of every record that has both, in file order. `headroom`: the smallest `headroom/<layer>/<site>`
    of each eval record (how close the nearest DNP inner Norm is to its eps)."""
    if metric == HEADROOM:
        pts = [(r[x], min(v for k, v in r.items() if k.startswith(HEADROOM_PREFIX))) for r in records
               if x in r and any(k.startswith(HEADROOM_PREFIX) for k in r)]
    else:
        pts = [(r[x], r[metric]) for r in records if r.get(metric) is not None and x in r]
    return [p[0] for p in pts], [p[1] for p in pts]


HEADROOM, HEADROOM_PREFIX = "headroom", "headroom/"  # runtime/telemetry.py writes headroom/<layer>/<site>


@dataclass(frozen=True)
class LowestHeadroom:
    """The smallest headroom of a run over its evaluations and sites: where and when."""

    value: float
    site: str  # L3/attn.q_proj
    step: int


@dataclass
class Run:
    path: Path
    cfg: RunConfig
    records: list[dict]

    @property
    def evals(self) -> list[dict]:
        return [r for r in self.records if r.get("kind") == "eval"]

    @property
    def final_eval(self) -> Optional[dict]:
        return self.evals[-1] if self.evals else None

    @property
    def final_val_loss(self) -> Optional[float]:
        return self.final_eval["val_loss"] if self.final_eval else None

    @property
    def last_step(self) -> int:
        """The last step any record reached: a cut last eval line does not hide the train records before it."""
        return max((r["step"] for r in self.records if r.get("step") is not None), default=0)

    @property
    def final_tokens(self) -> int:
        return self.final_eval["tokens"] if self.final_eval else 0

    @property
    def finished(self) -> bool:
        return self.final_eval is not None and self.final_eval["step"] >= self.cfg.train.steps

    @property
    def passes(self) -> Optional[float]:
        """Passes over the training data at the last logged train step (None: no train record has `epoch`)."""
        done = [r["epoch"] for r in self.records if r.get("kind") == "train" and r.get("epoch") is not None]
        return done[-1] if done else None

    @property
    def lowest_headroom(self) -> Optional[LowestHeadroom]:
        """The run's smallest DNP inner-Norm headroom (None: no evaluation measured one, a design without DNP)."""
        found = [LowestHeadroom(v, k.removeprefix(HEADROOM_PREFIX), r["step"]) for r in self.evals
                 for k, v in r.items() if k.startswith(HEADROOM_PREFIX) and v is not None]
        return min(found, key=lambda h: h.value) if found else None

    @property
    def stopped_normalizing(self) -> bool:
        """Whether some inner Norm's headroom fell below the run's log.headroom_warn: a branch switched off."""
        low = self.lowest_headroom
        return low is not None and not low.value >= self.cfg.log.headroom_warn

    @property
    def strategy(self) -> str:
        return strategy_name(self.cfg)

    def curve(self, metric: str = "val_loss", from_tokens: int = 0) -> dict[int, float]:
        """tokens → metric at every evaluation from `from_tokens` on."""
        return {x: y for x, y in zip(*series(self.evals, metric, "tokens")) if x >= from_tokens}


def load_run(path: Path) -> Run:
    path = Path(path)
    if not (path / "config.yaml").exists():
        raise FileNotFoundError(f"{path}/config.yaml does not exist: is {path} a run directory?")
    return Run(path, load_saved_config(path / "config.yaml"), read_metrics(path))
