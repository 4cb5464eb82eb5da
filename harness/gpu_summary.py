"""summary.md of harness/gpu_check.sh (`python -m harness.gpu_check summary OUT --logs LOGS`): the parts' exit codes,
seconds and limits, then one section per result JSON in OUT (docs/benchmarks.md, "The GPU check")."""
from __future__ import annotations

import json
from pathlib import Path


def _bench_lines(b: dict) -> list[str]:
    lines = [f"{b['device']} · torch {b['torch']} · batch {b['batch'][0]}×{b['batch'][1]} · vocab {b['vocab']} · "
             f"compile {b['compile']} · dtype {b['dtype']} · {b['steps']} timed steps after {b['warmup']} · "
             f"memory: {b['memory']}", ""]
    lines += ["| design | params | activated | ms/step | ± sd | tok/s | MFU | peak MiB | time × | mem × |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def f(v, fmt):
        return "-" if v is None else format(v, fmt)
    for r in b["rows"]:
        lines.append(f"| {r['design']} | {r['params']:,} | {r['activated']:,} | {r['ms_per_step']:.1f} | "
                     f"{r['ms_sd']:.1f} | {r['tok_per_s']:.0f} | "
                     f"{'-' if r['mfu'] is None else format(100 * r['mfu'], '.1f') + '%'} | "
                     f"{f(r['peak_mem_mib'], '.0f')} | {r['time_ratio']:.3f} | {f(r['mem_ratio'], '.3f')} |")
    return lines + [f"note: {n}" for n in b.get("notes", [])] + [""]


def _moe_lines(m: dict) -> list[str]:
    err = m["rel_err_to_loop"]
    lines = [f"{m['device']} · torch {m['torch']} · {m['config']} · {m['dtype']} · {m['tokens']:,} tokens → "
             f"{m['rows']:,} rows, {m['n_experts']} experts top-{m['top_k']}, d {m['d_model']}, expert hidden "
             f"{m['expert_dim_padded']} · eager, median of {m['iters']} after {m['warmup']} · grouped GEMM taken by "
             f"grouped / loop: {m['grouped_path']}", "", "| what | grouped ms | loop ms | loop / grouped | rel. error |",
             "|---|---:|---:|---:|---:|"]
    for what, label, e in (("layer", "MoE FFN forward + backward", f"out {err['output']:.1e}, grad in "
                            f"{err['grad_input']:.1e}, grad W {err['grad_gate_weight']:.1e}"),
                           ("gemm", "expert GEMM (gate_proj)", f"{err['gemm']:.1e}")):
        r = m[what]
        lines.append(f"| {label} | {r['grouped_ms']:.3f} | {r['loop_ms']:.3f} | {r['loop_over_grouped']:.2f} | {e} |")
    return lines + [""]


def _sync_lines(s: dict) -> list[str]:
    lines = [f"{s['device']} · torch {s['torch']} · detector: {s['detector'] or 'none on CPU (counts are -)'}"
             + ("" if s.get("detector_sees_item", True) else " · **it did not see a deliberate .item(): counts are "
                                                              "not evidence**"), "",
             "| run | steps | log.every | reached | syncs | seconds | last record: loss, tok/s, MFU | last eval |",
             "|---|---:|---:|---:|---:|---:|---|---|"]
    for r in s["runs"]:
        t = r.get("last_train") or {}
        rec = (f"{t['loss']:.3f}, {t['tok_per_s']:,.0f}, " + ("-" if t.get("mfu") is None else f"{100 * t['mfu']:.1f}%")
               if t.get("loss") is not None else "-")
        evals = ", ".join(f"{k} {v:.3f}" for k, v in (r.get("last_eval") or {}).items() if k != "step")
        lines.append(f"| {r['name']} | {r['steps']} | {r['log_every']} | {r['reached']} | "
                     f"{'-' if r['syncs'] is None else r['syncs']} | {r['seconds']} | {rec} | {evals or '-'} |")
    lines.append("")
    if "syncs_per_nonlog_step" in s:
        lines.append(f"**host syncs per non-logging step: {s['syncs_per_nonlog_step']:g}** ((B − A) / {s['every']}; "
                     "target 0)" + (f"; a logging step adds {s['extra_syncs_per_log_step']} (C − B)"
                                    if "extra_syncs_per_log_step" in s else ""))
        lines += [""] + [f"- `{site}`: {n:g} per non-logging step" for site, n in s["nonlog_sites"].items()]
    if s.get("cut"):
        lines.append(f"cut: {s['cut']}")
    return lines + [""]


def _profile_lines(path: Path) -> list[str]:
    """The category table of bench/profile.py's report (its first table); the ops are in logs.tar.gz."""
    if not path.is_file():
        return []
    head = path.read_text().split("\n\nOps whose", 1)[0].strip()
    return ["### Where the step's time goes", "", head, "", "_per op: profile_0.12b.md in logs.tar.gz_", ""]


def summary(out: Path, logs: Path) -> Path:
    """out/summary.md from logs/status.tsv, logs/env.log and the JSON results in out."""
    lines = ["# GPU check", ""]
    env = logs / "env.log"
    if env.is_file():
        lines += ["```", env.read_text().strip(), "```", ""]
    lines += ["## Parts (rc 124/137: cut by its time limit; logs in logs.tar.gz)", "",
              "| part | rc | seconds | limit s |", "|---|---:|---:|---:|"]
    status = logs / "status.tsv"
    rows = status.read_text().splitlines()[1:] if status.is_file() else []
    lines += ["| " + " | ".join(row.split("\t")) + " |" for row in rows] + [""]
    sections = [("MoE: grouped GEMM vs the per-expert loop", _moe_lines, "moe_gemm.json"),
                ("Bench dense 0.12B", _bench_lines, "bench_0.12b.json"),
                ("train.loss_chunk_tokens on the 0.12B step", _bench_lines, "loss_chunk.json"),
                ("Host syncs of a 0.12B training run", _sync_lines, "sync.json"),
                ("Bench dense 1B", _bench_lines, "bench_1b.json")]
    for title, fmt, name in sections:
        try:
            body = fmt(json.loads((out / name).read_text()))
        except (OSError, ValueError, KeyError, TypeError):  # a part that failed or was cut before writing it all
            body = [f"_no {name} (the part failed or was cut; see its log in logs.tar.gz)_", ""]
        lines += [f"## {title}", ""] + body
        if name == "bench_0.12b.json":
            lines += _profile_lines(logs / "profile_0.12b.md")
    (out / "summary.md").write_text("\n".join(lines))
    return out / "summary.md"
