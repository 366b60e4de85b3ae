"""Raw timings turned into the figures the bench reports (ms, percentiles, spreads, ratios),
and its stderr log line; no cluster access, so the report can use them too."""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any

from bench import util

if TYPE_CHECKING:  # at runtime harness would pull in cluster.*, which reads the env on import
    from bench.harness import Created


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ms(x: float) -> float:
    return round(x * 1000, 1) if not math.isnan(x) else math.nan


def lat(values: list[float]) -> dict[str, float]:
    s = util.summary(values)
    return {"n": s["n"], "p50_ms": ms(s["p50"]), "p95_ms": ms(s["p95"]),
            "p99_ms": ms(s["p99"]), "max_ms": ms(s["max"])}


def binned_lat(values: list[float], buckets: tuple[float, ...]) -> dict[str, float]:
    """`values` read as a Prometheus histogram with these buckets would be: a figure timed
    directly, at the resolution of the metric it is compared with (hist_lat)."""
    h = {le: float(sum(v <= le for v in values)) for le in (*buckets, math.inf)}
    return hist_lat(h)


def hist_lat(h: dict[float, float]) -> dict[str, float]:
    return {"n": util.hist_count(h), "p50_ms": ms(util.hist_quantile(h, 0.50)),
            "p95_ms": ms(util.hist_quantile(h, 0.95)),
            "p99_ms": ms(util.hist_quantile(h, 0.99))}


def spread(made: list[Created], done_at: dict[str, float]) -> dict[str, Any]:
    """create-sent -> done for every item; makespan and throughput."""
    per = [done_at[c.name] - c.t_send for c in made if c.ok and c.name in done_at]
    if not per:
        return {"done": 0}
    first = min(c.t_send for c in made)
    last = max(done_at[c.name] for c in made if c.name in done_at)
    r = lat(per)
    r.update(done=len(per), makespan_s=round(last - first, 2),
             per_s=round(len(per) / max(1e-9, last - first), 1))
    return r


def ratio(x: float | None, floors: list[float | None]) -> float:
    fl = [f for f in floors if f and not math.isnan(f)]
    if not x or not fl or math.isnan(x):
        return math.nan
    return round(x / max(fl), 2)


def fmt(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)
