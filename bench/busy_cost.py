"""What slurmgate costs a busy site, from two samples around a window (bench/busy.py): its
requests, bytes and latency to slurmrestd by method and endpoint (its own Prometheus
counters), the CPU of Slurm's daemons and of slurmgate's processes (/proc), and what the
binder's rare whole lists cost, amortized. The arithmetic is pure, so the unit tests feed it
real scrapes and numbers."""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench import util
from bench.stats import hist_lat
from cluster import proc

Samples = list[tuple[str, dict[str, str], float]]
# Slurm's side of the bill: slurmctld, its script runner (the prolog/epilog hooks of every job)
# and slurmrestd; SITE_TOTAL is "slurmrestd + slurmctld" of the issue, slurmscriptd included
SITE = ("slurmctld", "slurmscriptd", "slurmrestd")
SITE_TOTAL = "slurmrestd+slurmctld"


def _series(samples: Samples, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for name, labels, v in samples:
        if name == metric:
            key = tuple(sorted(labels.items()))
            out[key] = out.get(key, 0.0) + v
    return out


def counter_delta(before: Samples, after: Samples, metric: str) -> dict[tuple[tuple[str, str],
                                                                              ...], float]:
    """Per label set, how much a counter grew (a series new in `after` counts from 0)."""
    was = _series(before, metric)
    return {k: v - was.get(k, 0.0) for k, v in _series(after, metric).items()
            if v - was.get(k, 0.0) > 0}


def rest_by_endpoint(before: Samples, after: Samples, component: str,
                     seconds: float) -> dict[str, dict[str, Any]]:
    """slurmgate_<component>_slurmrestd_* between two scrapes: per endpoint the requests (and
    by "METHOD status"), per second and per minute, bytes per second, and p50/p99 of the
    request-time histogram; under "methods" the same per HTTP method (the histogram's `method`
    label: a cancel, DELETE job/{id}, is told apart from a single-job read, GET job/{id}; the
    bytes are counted per endpoint only). "all" sums the endpoints."""
    p = f"slurmgate_{component}_slurmrestd"
    out: dict[str, dict[str, Any]] = {}

    def row(ep: str) -> dict[str, Any]:
        return out.setdefault(ep, {"requests": 0.0, "by": {}, "bytes": 0.0})

    for key, n in counter_delta(before, after, f"{p}_requests_total").items():
        lab = dict(key)
        ep = lab.get("endpoint", "")
        r = row(ep)
        r["requests"] += n
        how = f"{lab.get('method', '')} {lab.get('status', '')}"
        r["by"][how] = r["by"].get(how, 0.0) + n
    for key, n in counter_delta(before, after, f"{p}_response_bytes_total").items():
        row(dict(key).get("endpoint", ""))["bytes"] += n
    total = {"requests": 0.0, "by": {}, "bytes": 0.0}
    hist = f"{p}_request_seconds"
    for ep, r in out.items():
        h = util.hist_delta(util.histogram(after, hist, endpoint=ep),
                            util.histogram(before, hist, endpoint=ep))
        r.update(hist_lat(h))
        r["methods"] = {}
        methods = sorted({how.split(" ", 1)[0] for how in r["by"]})
        for method in methods:
            hm = util.hist_delta(util.histogram(after, hist, method=method, endpoint=ep),
                                 util.histogram(before, hist, method=method, endpoint=ep))
            if not util.hist_count(hm) and len(methods) == 1:
                hm = h  # a histogram without the method label: one method, so it is this
            r["methods"][method] = {
                "requests": sum(v for how, v in r["by"].items()
                                if how.split(" ", 1)[0] == method), **hist_lat(hm)}
        total["requests"] += r["requests"]
        total["bytes"] += r["bytes"]
    out = dict(sorted(out.items(), key=lambda kv: -kv[1]["requests"]))
    if out:
        out["all"] = total
    for r in out.values():
        for x in (r, *r.get("methods", {}).values()):
            x["per_s"] = round(x["requests"] / seconds, 3) if seconds > 0 else math.nan
            x["per_min"] = round(60 * x["requests"] / seconds, 1) if seconds > 0 else math.nan
        r["bytes_per_s"] = round(r["bytes"] / seconds, 1) if seconds > 0 else math.nan
    return out


def cpu_delta_by_role(before: dict[str, dict[int, float]], after: dict[str, dict[int, float]]
                      ) -> dict[str, float]:
    """CPU seconds each role spent between two samples of {role: {pid: cpu s}}: a process
    that appeared in between (a worker) counts from 0; one that is gone no longer counts."""
    return {role: round(sum(v - before.get(role, {}).get(pid, 0.0)
                            for pid, v in pids.items()), 3)
            for role, pids in after.items()}


def pct_of_core(cpu_s: dict[str, float], seconds: float) -> dict[str, float]:
    """CPU seconds over a window as % of one core, with SITE_TOTAL over the SITE daemons."""
    out = {k: round(100 * v / seconds, 2) for k, v in cpu_s.items()}
    if any(k in cpu_s for k in SITE):
        out[SITE_TOTAL] = round(100 * sum(cpu_s.get(k, 0.0) for k in SITE) / seconds, 2)
    return out


def site_cost(stopped: dict[str, float], running: dict[str, float]) -> dict[str, float]:
    """What slurmgate adds to Slurm's daemons: % of a core with it running minus the same
    background with it stopped (pct_of_core of each window), per daemon and in total."""
    keys = [*SITE, SITE_TOTAL]
    return {k: round(running.get(k, 0.0) - stopped.get(k, 0.0), 2) for k in keys
            if k in running or k in stopped}


# sdiag's "Remote Procedure Call statistics by user" lines (the same on 22.05 to 26.05):
#   "\troot            (       0) count:1234   ave_time:210    total_time:259140" (microseconds)
_RPC_USER_LINE = re.compile(
    r"^\s*(\S+)\s*\(\s*(\d+)\)\s*count:(\d+)\s+ave_time:\d+\s+total_time:(\d+)")
# slurmgate's RPCs reach slurmctld as this user (slurmrestd's token, cluster/slurm.py); the
# background's are its tenants' (bench/busy_load.py), its churn's cancels root's too
RPC_USER = "root"


def rpcs_by_user(sdiag: str) -> dict[str, tuple[int, float]]:
    """user -> (RPCs, seconds slurmctld spent on them) from sdiag's per-user section: its own
    account of whose requests took its time, whatever else the busy site makes it do."""
    out: dict[str, tuple[int, float]] = {}
    in_users = False
    for line in sdiag.splitlines():
        if "statistics by user" in line:
            in_users = True
            continue
        if in_users:
            m = _RPC_USER_LINE.match(line)
            if m is None:
                if line.strip():
                    break  # the next section
                continue
            out[m[1]] = (int(m[3]), int(m[4]) / 1e6)
    return out


def rpc_delta(before: dict[str, tuple[int, float]], after: dict[str, tuple[int, float]],
              user: str, seconds: float, reads: int = 1) -> dict[str, float] | None:
    """`user`'s RPCs between two sdiag reads and slurmctld's time on them, % of a core; `reads`
    (sdiag's own REQUEST_STATS_INFO, one a read) taken off the count. None without both."""
    if user not in after or seconds <= 0:
        return None
    n0, t0 = before.get(user, (0, 0.0))
    n1, t1 = after[user]
    if n1 < n0:  # slurmctld restarted: its counters started again
        return None
    rpcs = max(0, n1 - n0 - reads)
    return {"rpcs": rpcs, "seconds": round(t1 - t0, 4),
            "pct": round(100 * (t1 - t0) / seconds, 3), "per_min": round(60 * rpcs / seconds, 1)}


# The binder's whole lists (GET jobs, read at start and every BINDER_FULL_LIST_INTERVAL; GET
# nodes, its node drift check): the Slurm daemons that serve them. slurmscriptd runs job hooks
# and has no part in a list.
LIST_DAEMONS = ("slurmctld", "slurmrestd")


def background_rate(cpu_s: dict[str, float], seconds: float) -> float:
    """CPU seconds a second that LIST_DAEMONS spent over a window (the stopped one: the
    background and its churn alone), to take off a list's own measurement."""
    return sum(cpu_s.get(d, 0.0) for d in LIST_DAEMONS) / seconds if seconds > 0 else 0.0


def list_cost(runs: list[dict[str, Any]], interval_s: float,
              background_per_s: float = 0.0) -> dict[str, Any]:
    """One whole list, from `runs` of it (each: wall_s, answer_s, bytes, cpu_s {daemon: s}):
    the median of each figure; Slurm's CPU (LIST_DAEMONS) as sampled and net of what the
    background spends over the same wall time; that net amortized over `interval_s` as % of
    one core (what a list every `interval_s` adds to the site on average)."""
    if not runs:
        return {"runs": 0}
    med = statistics.median
    cpu = [sum(r["cpu_s"].get(d, 0.0) for d in LIST_DAEMONS) for r in runs]
    net = [max(0.0, c - background_per_s * r["wall_s"]) for c, r in zip(cpu, runs, strict=True)]
    return {
        "runs": len(runs),
        "wall_ms": round(1000 * med(r["wall_s"] for r in runs), 1),
        "answer_ms": round(1000 * med(r["answer_s"] for r in runs), 1),
        "bytes": med(r["bytes"] for r in runs),
        "slurm_cpu_s": round(med(cpu), 3),
        "slurm_cpu_s_net": round(med(net), 3),
        "by_daemon": {d: round(med(r["cpu_s"].get(d, 0.0) for r in runs), 3)
                      for d in LIST_DAEMONS},
        "background_cpu_per_s": round(background_per_s, 4),
        "interval_s": interval_s,
        "amortized_pct": round(100 * med(net) / interval_s, 3) if interval_s > 0 else math.nan,
        "samples": runs,
    }


# --------------------------------------------------------------------------- /proc readers


def proc_cpu(pid: int) -> float:
    """utime + stime + the children it waited for (a slurmscriptd's hooks), in seconds."""
    data = Path(f"/proc/{pid}/stat").read_text()
    f = data[data.rindex(")") + 2:].split()
    return sum(int(x) for x in f[11:15]) / util.CLK_TCK


def children(pid: int, stats: dict[int, tuple[str, list[str]]] | None = None) -> dict[int, str]:
    """Direct children of pid: {pid: command}."""
    stats = stats if stats is not None else proc.proc_stats()
    return {p: comm for p, (comm, f) in stats.items() if int(f[1]) == pid}


@dataclass
class Watched:
    """The processes a window samples: Slurm's daemons by name, and slurmgate's by role (each
    with its children: the binder's JSON parse workers)."""
    site: dict[str, int]
    ours: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, slurm_pids: dict[str, int], ours: dict[str, int]) -> Watched:
        site = {k: slurm_pids[k] for k in ("slurmctld", "slurmrestd") if k in slurm_pids}
        if "slurmctld" in site:
            for pid, comm in children(site["slurmctld"]).items():
                if comm.startswith("slurmscriptd"):
                    site["slurmscriptd"] = pid
        return cls(site, dict(ours))

    def cpu(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        stats = proc.proc_stats() if self.ours else {}
        for role, pid in self.site.items():
            out[role] = _cpu_of([pid])
        for role, pid in self.ours.items():
            out[role] = _cpu_of([pid, *children(pid, stats)])
        return out

    def rss(self) -> dict[str, float]:
        """RSS MiB of each of ours, its children (workers) summed apart as `<role>_workers`."""
        out: dict[str, float] = {}
        for role, pid in self.ours.items():
            kids = list(children(pid))
            out[role] = round(_rss([pid]), 1)
            out[f"{role}_workers"] = round(_rss(kids), 1)
        for role, pid in self.site.items():
            out[role] = round(_rss([pid]), 1)
        return out


def _cpu_of(pids: list[int]) -> dict[int, float]:
    out = {}
    for p in pids:
        try:
            out[p] = proc_cpu(p)
        except (OSError, ValueError, IndexError):
            continue
    return out


def _rss(pids: list[int]) -> float:
    total = 0.0
    for p in pids:
        try:
            total += util.rss_mib(p)
        except OSError:
            continue
    return total
