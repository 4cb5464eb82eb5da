"""What the headroom probe adds to an evaluation: the probe (runtime/telemetry.py, `norm_headroom`: one eager forward
over one val window per rank, with hooks on DNP's inner Norms) against the evaluation it runs beside
(`Trainer.evaluate`: train.eval_tokens of val windows), timed in alternating rounds on one built model.

    python -m harness.headroom_cost                                        # the built-in default, configs/tiny_cpu.yaml
    python -m harness.headroom_cost --config configs/tiny_moe.yaml --repeats 7
    python -m harness.headroom_cost train.dtype=float32 train.compile=false

Prints, per part, the median [min–max] seconds over --repeats rounds and the probe's share of an evaluation. The
run directory is a temporary folder: nothing of a real run is touched.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", action="append", help="config file(s) (default: configs/tiny_cpu.yaml)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after one warm-up round")
    p.add_argument("overrides", nargs="*", help="dotted.key=value")
    args = p.parse_args(argv)
    from config import load_config
    from runtime.dist import init_distributed, shutdown
    from runtime.telemetry import norm_headroom
    from runtime.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config(args.config or ["configs/tiny_cpu.yaml"],
                          [*args.overrides, f"log.out_dir={out}", "log.wandb.mode=disabled"])
        info = init_distributed(cfg.train.device)
        try:
            trainer = Trainer.for_run(cfg, info)
            _, x, _, _ = next(trainer.eval_set("val").batches(1, info.rank, info.world_size))
            x = x.to(info.device)

            def probe() -> int:
                trainer.model.eval()
                sites = norm_headroom(trainer.model, x)
                trainer.model.train()
                return len(sites)

            parts = {"evaluate": trainer.evaluate, "probe": probe}
            times: dict[str, list[float]] = {name: [] for name in parts}
            for r in range(args.repeats + 1):
                for name, fn in (parts.items() if r % 2 else reversed(parts.items())):
                    t0 = time.perf_counter()
                    fn()
                    if info.device.type == "cuda":
                        torch.cuda.synchronize()
                    if r:  # round 0 warms up (compilation, the eval set's first read)
                        times[name].append(time.perf_counter() - t0)
            n_sites = probe()
            trainer.batches.close()
        finally:
            shutdown(info)
    print(f"{cfg.log.run_name or 'run'}: {n_sites} inner Norms, {trainer.precision.describe()}")
    for name, ts in times.items():
        print(f"  {name:<9} {statistics.median(ts):.3f} s [{min(ts):.3f}–{max(ts):.3f}] over {len(ts)} rounds")
    share = statistics.median(p / e for p, e in zip(times["probe"], times["evaluate"]))
    print(f"  probe / evaluate: {share:.3f} (median of the rounds' ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
