"""Issue 29's "done when" as verdicts on a busy-site run (bench/busy.py): each figure at the
largest N, against its limit, the smallest N or the floors of the same run. The report's
tables are bench/busy_report.py."""

from __future__ import annotations

from typing import Any

from bench.busy_cost import SITE_TOTAL
from bench.busy_report import (
    ONE,
    call,
    get,
    num,
    number,
    read_versus_direct,
    rest_total,
    rpc_pct_over_direct,
    with_whole_lists,
    worst_read,
)


def _check(value: float | None, limit: float, applies: bool = True) -> dict[str, Any]:
    ok = None if value is None or not applies else value <= limit
    return {"value": None if value is None else round(value, 3), "limit": limit, "ok": ok}


def _frac(a: Any, b: Any) -> float | None:
    x, y = number(a), number(b)
    return None if x is None or not y else x / y


def targets(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Issue 29's "done when", at the largest N measured against its smallest (the quiet
    site) and the floors of the same run: value, limit, ok (None: not measured)."""
    segs = [s for s in results.get("by_n") or [] if isinstance(s, dict) and "pods" in s]
    if not segs:
        return {}
    first, last = segs[0], segs[-1]
    reads = [w[1] for k in ("idle", "pods") if (w := worst_read(last.get(k)))]
    rb = ("latency_hook", "running_to_bound", "p99_ms")
    newer = results.get("slurm_version") != "22.05"  # "within 1 s p99 on 24.11+"
    idle_lists = number(get(last, "idle", "rest", "binder", "jobs", "requests"))
    with_lists = _check(with_whole_lists(last), 2.0)
    if idle_lists:
        with_lists["note"] = (f"the idle window held {num(idle_lists)} whole job list(s): "
                              "counted there over the window and again amortized")
    return {
        # what a window measures, and with the binder's whole lists amortized over their
        # intervals (a 30 s window rarely holds one: they come every 300 s)
        "added_cpu_idle_pct": _check(number(get(last, "cost", "idle", SITE_TOTAL)), 2.0),
        "added_cpu_idle_with_whole_lists_pct": with_lists,
        # over the same jobs made directly where the run has them: Slurm scheduling and
        # running 16 jobs is any client's cost, what slurmgate adds to it is the target's
        "added_cpu_pods_in_flight_pct": _check(number(
            get(last, "cost", "pods_over_direct", SITE_TOTAL)
            if get(last, "cost", "pods_over_direct") else
            get(last, "cost", "pods", SITE_TOTAL)), 5.0),
        "ctld_rpc_time_pods_in_flight_over_direct_pct": _check(rpc_pct_over_direct(last), 5.0),
        "slowest_read_p99_ms": _check(max(reads) if reads else None, 20.0),
        # the same read made directly in the same run: what any client of this Slurm gets
        "state_read_p99_vs_direct": _check(_frac(get(read_versus_direct(last)[0], "p99_ms"),
                                                 get(read_versus_direct(last)[1], "p99_ms")),
                                           1.2),
        # like with like: POST job/submit and DELETE job/{id} (not the binder's single-job
        # reads, GET job/{id}, which share the endpoint)
        "submit_p99_vs_direct": _check(_frac(get(call(last, "webhook", "POST", "job/submit",
                                                      ONE), "p99_ms"),
                                             get(last, "floor", "submit_binned", "p99_ms")),
                                       1.2),
        "cancel_p99_vs_direct": _check(_frac(get(call(last, "binder", "DELETE", "job/{id}",
                                                      ONE), "p99_ms"),
                                             get(last, "floor", "cancel_binned", "p99_ms")),
                                       1.2),
        "idle_requests_per_min": _check(rest_total(last.get("idle"), "per_min"), 6.0),
        # bound Pods are not in flight; in a GraceTime partition each is read whole every
        # tenth of it (preemption shows nowhere else), which is reported, not held to 6
        "idle_bound_no_gracetime_requests_per_min": _check(
            rest_total(last.get("idle_bound_nograce"), "per_min"), 6.0),
        "running_to_bound_p99_vs_smallest_n": _check(_frac(get(last, *rb), get(first, *rb)),
                                                     1.2),
        "binder_rss_peak_vs_smallest_n": _check(_frac(get(last, "rss_peak_mib", "binder"),
                                                      get(first, "rss_peak_mib", "binder")),
                                                1.2),
        "hook_off_start_noticed_p99_ms": _check(
            number(get(last, "latency_nohook", "running_to_noticed", "p99_ms")), 1000.0, newer),
    }
