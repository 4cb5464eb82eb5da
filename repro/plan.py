"""The paper-scale plan: every unique run of the paper's figures once, the data dir it reads and the command that
prepares it, and the compute per run, per figure and in all (repro/paper.py says how each number is counted).

    python -m repro.plan                       # the tables
    python -m repro.plan --seeds 3 --mfu 0.35
    python -m repro.plan --markdown            # for repro/README.md and docs/plan.md
    python -m repro.plan --json                # for tools

Runs whose resolved configs agree outside log.* are one run (Figs. 1, 5, 6 and 10's 0.12B baselines): it has one run
directory, named after its first figure's run, and `python -m repro.reproduce FIG` trains it there once for every
figure that reads it.
"""
from __future__ import annotations

import argparse
import json
import sys

from strictconfig.config import ConfigError
from repro.paper import DEFAULT_MFU, plan, render, to_json


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=1, help="runs per curve (multiplies runs and compute)")
    p.add_argument("--mfu", type=float, default=DEFAULT_MFU,
                   help=f"model FLOPs utilization of the H100s' bf16 dense peak, in (0, 1] (default {DEFAULT_MFU})")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--markdown", action="store_true", help="Markdown tables")
    out.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run, as repro.reproduce takes them")
    args = p.parse_args(argv)
    if args.seeds < 1:
        p.error(f"--seeds must be at least 1 (got {args.seeds})")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        p.error(f"{bad[0]!r} is not a key=value override (e.g. train.steps=100)")
    if not 0 < args.mfu <= 1:
        p.error(f"--mfu must lie in (0, 1] (got {args.mfu}): a fraction, 0.4 for 40 %")
    try:
        the_plan = plan(args.seeds, args.mfu, tuple(args.overrides))
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(to_json(the_plan), indent=1) if args.json else render(the_plan, args.markdown), end="" if not args.json else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
