"""The short comparison printed once every Slurm release has had its run: per release and burst
what issue 15's targets judge (makespan overhead, RUNNING noticed -> bound, admission ratio),
then each release's verdicts. Reads only the results dicts suite.py wrote, so unit tests can
feed it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.attribution import NOTICED_TO_BOUND
from bench.report import admission_ratio, targets
from bench.stats import fmt


def _burst(b: dict[str, Any]) -> dict[str, Any]:
    o = b["ours"]
    nb = (o.get("attribution") or {}).get(NOTICED_TO_BOUND) or {}
    return {"size": b["size"], "churn": bool(o.get("churn")),
            "makespan_overhead": b["overhead"]["makespan"],
            "noticed_to_bound_p50_ms": nb.get("p50_ms"),
            "noticed_to_bound_p99_ms": nb.get("p99_ms"),
            "noticed_to_bound_n": nb.get("n")}


def summarize(started: str, runs: list[tuple[str, int, dict[str, Any], Path]]) -> dict[str, Any]:
    """runs: (Slurm release, exit code, its results, its JSON file), in the order they ran."""
    out: list[dict[str, Any]] = []
    for version, code, r, path in runs:
        adm = admission_ratio(r)
        out.append({
            "slurm_version": version, "exit": code, "file": str(path),
            "error": r.get("error"), "nodes": r.get("nodes"),
            "admission_p99_ratio": adm[2] if adm else None,
            "bursts": [_burst(b) for b in r.get("bursts", [])],
            # suite.py stores them; recomputed only for results from elsewhere (tests)
            "targets": r.get("targets") or targets(r),
        })
    return {"started": started, "versions": out}


def _x(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{fmt(v)}x"


def _ms(v: Any) -> str:
    return "-" if v is None else fmt(v)


def summary_table(summary: dict[str, Any]) -> str:
    vs = summary["versions"]
    lines = [f"summary of {len(vs)} Slurm release(s)  {summary['started']}", "",
             f"{'Slurm':7}{'burst':>7}{'nodes':>7}{'makespan':>10}  "
             f"{'RUNNING noticed -> bound':>24}{'':>9}  {'admission p99':>16}",
             f"{'':7}{'':>7}{'':>7}{'overhead':>10}  {'p50 ms':>24}{'p99 ms':>9}  "
             f"{'marked/unmarked':>16}"]
    for v in vs:
        rows = v["bursts"] or [None]
        for b in rows:
            size = "-" if b is None else f"{b['size']}{'*' if b['churn'] else ''}"
            lines.append(
                f"{v['slurm_version']:7}{size:>7}{fmt(v['nodes'] or '-'):>7}"
                f"{_x(None if b is None else b['makespan_overhead']):>10}  "
                f"{_ms(None if b is None else b['noticed_to_bound_p50_ms']):>24}"
                f"{_ms(None if b is None else b['noticed_to_bound_p99_ms']):>9}  "
                f"{_x(v['admission_p99_ratio']):>16}")
    if any(b["churn"] for v in vs for b in v["bursts"]):
        lines.append("(* more Pods than nodes: run with churn, a throughput figure)")
    for v in vs:
        lines.append("")
        lines.append(f"targets, Slurm {v['slurm_version']}"
                     + (f"  (exit {v['exit']}: {v['error']})" if v["exit"] or v["error"] else ""))
        for k, verdict in v["targets"].items():
            lines.append(f"  {k:58} {verdict}")
    return "\n".join(lines)
