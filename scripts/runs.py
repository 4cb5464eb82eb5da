"""Reading run directories the way every script does: the resolved `config.yaml` and `metrics.jsonl`, never wandb.

    run = load_run(Path("runs/0.12b+unified"))
    run.final_val_loss, run.final_tokens, run.strategy, run.finished
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from config import RunConfig, load_config, strategy_name


def read_metrics(run: Path) -> list[dict]:
    path = Path(run) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run} a run directory?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    def final_tokens(self) -> int:
        return self.final_eval["tokens"] if self.final_eval else 0

    @property
    def finished(self) -> bool:
        return self.final_eval is not None and self.final_eval["step"] >= self.cfg.train.steps

    @property
    def strategy(self) -> str:
        return strategy_name(self.cfg)


def load_run(path: Path) -> Run:
    path = Path(path)
    if not (path / "config.yaml").exists():
        raise FileNotFoundError(f"{path}/config.yaml does not exist: is {path} a run directory?")
    return Run(path, load_config(path / "config.yaml"), read_metrics(path))
