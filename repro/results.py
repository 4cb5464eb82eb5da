"""The measured small-scale reproduction of the paper's Figures 1 and 5–9: every run, then repro/pages/results.md.

    python -m repro.results                         # run what is missing (4 seeds each), then write the page
    python -m repro.results --page-only             # rewrite the page from the runs as they are, run nothing
    python -m repro.results --page-only --archive runs.jsonl.gz     # and keep what it read, to rewrite it later
    python -m repro.results --restore repro/archives/results_runs_v4.jsonl.gz     # continue from an archive's runs
    python -m repro.results --dry-run               # list the runs and their commands
    python -m repro.results --seeds 8 -- key=value     # more seeds; key=value after -- goes to every run
    python -m repro.results --seeds 12 --only 'fig6-ladder/* d64 L4'     # more seeds for one comparison's runs

Every run is a figure's run on the CPU proxy of `repro.reproduce --scale tiny` (repro/configs/tiny.yaml), in its
own process, with WikiText-2's test set as a second, eval-only validation set. Seeds change the init and the data
order; the curves of one comparison share each seed, so their differences are paired. A run needed by several
comparisons (Fig. 5's baseline is also Fig. 1's and the largest rung of Fig. 6's ladder) runs once. Runs go seed by
seed (every run of seed 0 first), so an interrupted reproduction already has whole comparisons at fewer seeds.

Re-running the command skips finished runs and resumes unfinished ones; a finished run whose saved config differs
from what the command would run now is an error, never silently reused. The CPU time of every run (user + system,
all its processes) accumulates in `<out-dir>/cpu_seconds.json` across invocations; the page states the total.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from strictconfig.config import ConfigError
from repro.comparisons import Plan
from repro.experiments import config_of
from repro.jobs import command
from repro.runner import (CpuLedger, archive, is_compact, plan_runs, prepare_wikitext, restore, run_all,
                          select_runs, unpack)

ROOT = Path(__file__).resolve().parent.parent
# Fig. 1's grid: 1.6e-2 since results v4 (the model without vectors was best at 8e-3, the edge of v3's grid)
DEFAULT_PAGE, DEFAULT_LRS = ROOT / "repro" / "pages" / "results.md", "2e-3,4e-3,8e-3,1.6e-2"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=4, help="runs per curve, seeds 0..N-1 (init and data order)")
    p.add_argument("--out-dir", default="runs/results", help="parent of the run directories")
    p.add_argument("--page", type=Path, default=DEFAULT_PAGE, help="the page to write; its plots "
                   "go to img/<its name>/ beside it (repro/pages/img/results/ for repro/pages/results.md)")
    p.add_argument("--lrs", default=DEFAULT_LRS, help="Fig. 1's lr grid, for both models")
    p.add_argument("--wikitext", type=Path, help="WikiText-2's raw test file (default: $SCALEVEC_WIKITEXT)")
    p.add_argument("--wikitext-dir", default="data_cache/wikitext2_bpe1024", help="its prepared eval-only set")
    p.add_argument("--jobs", type=int, default=1, help="runs at once, each with cores/jobs threads (2 on 2 cores: "
                   "1.2× the throughput, see repro/runner.py, run_all)")
    p.add_argument("--dry-run", action="store_true", help="print the runs' commands, run nothing")
    p.add_argument("--page-only", action="store_true", help="write the page from the runs as they are")
    p.add_argument("--archive", type=Path, metavar="DIR", help="then copy what the page reads (each finished run's "
                   "config.yaml and metrics.jsonl, the CPU ledger) to DIR: a .jsonl.gz names one compact file, "
                   "e.g. repro/archives/results_runs_v4.jsonl.gz")
    p.add_argument("--restore", type=Path, metavar="DIR", help="first copy an archive's finished runs (and their "
                   "CPU seconds) into --out-dir where it lacks them, e.g. to continue in a fresh checkout")
    p.add_argument("--only", nargs="+", metavar="CURVES", help="train only these curves' runs, each a pattern of "
                   "'<comparison>/<curve>' (fnmatch; a bare comparison key means all its curves), e.g. "
                   "'fig6-ladder/* d64 L4' for the dense headline rung; the page still reads every run there is")
    p.add_argument("overrides", nargs="*", help="key=value overrides for every run (after --)")
    args = p.parse_intermixed_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        p.error("--seeds and --jobs must be at least 1")
    try:
        lrs = tuple(float(x) for x in args.lrs.split(","))
    except ValueError as e:
        p.error(f"--lrs: {e}")
    try:
        return _run(args, lrs)
    except ConfigError as e:  # a run's config (the overrides): nothing was trained
        print(f"config error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:  # --restore / --archive / WikiText-2's source: named in the message
        print(f"error: {e}", file=sys.stderr)
        return 2


def rebuild_command(args: argparse.Namespace) -> str:
    """The command that writes the same page again from the runs' archive, for the page to print: the archive this
    invocation writes or restores from, else its --out-dir; the seeds, and the lr grid and page where not the
    defaults. Paths inside the repository are shown relative to it."""
    def shown(path) -> str:
        path = Path(path).resolve()
        return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)
    source = args.archive or args.restore or args.out_dir
    parts = ["python -m repro.results --page-only", f"--out-dir {shown(source)}", f"--seeds {args.seeds}"]
    if args.lrs != DEFAULT_LRS:
        parts.append(f"--lrs {args.lrs}")
    if Path(args.page).resolve() != DEFAULT_PAGE:
        parts.append(f"--page {shown(args.page)}")
    return " ".join(parts)


def _run(args: argparse.Namespace, lrs: tuple[float, ...]) -> int:
    """Plan, restore, train what is missing, write the page, archive: main's body, whose user errors main reports.
    `--out-dir` a compact archive (.jsonl.gz) writes the page from it alone, its runs unpacked into a temporary
    folder."""
    if not is_compact(args.out_dir):
        return _run_in(args, lrs, rebuild_command(args))
    if not args.page_only or args.archive or args.restore:
        print(f"error: --out-dir {args.out_dir} is a compact archive: it writes a page (--page-only) and nothing "
              "else; to train more, --restore it into a folder", file=sys.stderr)
        return 2
    if not Path(args.out_dir).is_file():
        raise FileNotFoundError(f"--out-dir {args.out_dir}: no such archive")
    rebuild = rebuild_command(args)
    with tempfile.TemporaryDirectory() as tmp:
        unpack(Path(args.out_dir), Path(tmp))
        return _run_in(argparse.Namespace(**{**vars(args), "out_dir": tmp}), lrs, rebuild)


def _run_in(args: argparse.Namespace, lrs: tuple[float, ...], rebuild: str) -> int:
    overrides = (f"data.val_sets=[{args.wikitext_dir}]", "log.wandb.mode=disabled", *args.overrides)
    out_dir = Path(args.out_dir)
    plan = Plan(args.seeds, lrs, overrides)
    uniques, where = plan_runs(plan, args.out_dir)
    if args.only:
        try:
            uniques = select_runs(uniques, where, args.only)
        except ValueError as e:  # a pattern that matches no curve: nothing was trained
            print(f"error: {e}", file=sys.stderr)
            return 2
    if args.dry_run:
        import shlex
        for u in uniques:
            print(shlex.join(["python", *command(u.job, "tiny", 1)[1:]]))
        return 0
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.restore:
        print(f"restored {restore(args.restore, out_dir)} runs from {args.restore}")
    ledger = CpuLedger(out_dir)
    c0, failed = ledger.total, []
    if not args.page_only:
        prepare_wikitext(config_of(uniques[0].job.argv).data, Path(args.wikitext_dir), args.wikitext)
        failed = run_all(uniques, out_dir, ledger, args.jobs)
    from repro.page import write_page
    write_page(plan, where, args.page, ledger.seconds, Path(args.wikitext_dir).name, rebuild)
    print(f"wrote {args.page}")
    if args.archive:
        print(f"archived {archive(uniques, out_dir, args.archive)} runs in {args.archive}")
    print(f"CPU time: {(ledger.total - c0) / 3600:.2f} h in this invocation, {ledger.total / 3600:.2f} h for all "
          f"{len(ledger.seconds)} runs")
    return 1 if failed else 0

if __name__ == "__main__":
    sys.exit(main())
