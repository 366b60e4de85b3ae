"""Small helpers for the benchmarks: percentiles, /proc readers, Prometheus text parsing."""

from __future__ import annotations

import asyncio
import math
import os
import re
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from cluster import proc

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(q / 100 * len(s)) - 1))
    return s[k]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"n": len(values), "p50": pct(values, 50), "p95": pct(values, 95),
            "p99": pct(values, 99), "max": max(values) if values else math.nan}


def until_phase(phase: float, now: float | None = None) -> float:
    """Seconds from `now` (wall clock) until the clock's fraction of a second is next `phase`."""
    if not 0 <= phase < 1:
        raise ValueError(f"phase is a fraction of a second in [0, 1), not {phase}")
    t = time.time() if now is None else now
    return (phase - t % 1.0) % 1.0


async def at_phase(phase: float | None) -> None:
    """Return when the wall clock's fraction of a second is `phase` (None: at once).

    slurmctld allocates pending jobs on a one-second tick that falls on whole seconds of the
    wall clock (its log shows .000-.006); two bursts started at the same phase wait alike for
    it, so their makespans compare what differs, not where in the second each began."""
    if phase is not None:
        await asyncio.sleep(until_phase(phase))


def cpu_seconds(pid: int) -> float:
    """utime + stime of one process, in seconds."""
    data = Path(f"/proc/{pid}/stat").read_text()
    f = data[data.rindex(")") + 2:].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK


# A Python process is named by what it runs: the binder, the webhook and the bench itself all
# show as "python", and in a big burst their shares are the question
PY_ROLES = (("slurmgate.binder", "python:binder"), ("slurmgate.webhook", "python:webhook"),
            ("bench.", "python:bench"), ("multiprocessing", "python:worker"))


def python_role(cmdline: str, parent_role: str | None = None) -> str:
    """The name a Python process's CPU is reported under, from its command line; a
    multiprocessing child takes its parent's role (the binder's JSON parse worker)."""
    for needle, role in PY_ROLES:
        if needle in cmdline:
            if role == "python:worker" and parent_role and parent_role != "python":
                return f"{parent_role}-worker"
            return role
    return "python"


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def cpu_by_command() -> dict[tuple[int, str], float]:
    """(pid, command) -> utime + stime (children that were waited for included: a slurmd's
    hooks and steps count for it) of every process on the host; Python processes by role."""
    stats = proc.proc_stats()
    roles = python_roles(stats)
    return {(pid, roles.get(pid, comm)): sum(int(x) for x in f[11:15]) / CLK_TCK
            for pid, (comm, f) in stats.items()}


def python_roles(stats: dict[int, tuple[str, list[str]]]) -> dict[int, str]:
    """pid -> role (python_role) of every Python process in `stats` (proc.proc_stats())."""
    cmdlines = {pid: cmdline(pid) for pid, (comm, _) in stats.items()
                if comm.startswith("python")}
    roles = {pid: python_role(cmd) for pid, cmd in cmdlines.items()}
    for pid, role in roles.items():  # workers after their parents are named
        if role == "python:worker":
            roles[pid] = python_role(cmdlines[pid], roles.get(int(stats[pid][1][1])))
    return roles


def cpu_delta(before: dict[tuple[int, str], float],
              after: dict[tuple[int, str], float]) -> dict[str, float]:
    """CPU seconds spent between two cpu_by_command() samples, by command, largest first
    (processes that started and ended in between are not seen)."""
    by: dict[str, float] = {}
    was = {pid: v for (pid, _), v in before.items()}  # a kworker renames itself as it works
    for (pid, comm), v in after.items():
        name = comm.split("/")[0]
        by[name] = by.get(name, 0.0) + v - was.get(pid, 0.0)
    return {k: round(v, 2) for k, v in sorted(by.items(), key=lambda kv: -kv[1]) if v >= 0.05}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def pss_mib(pid: int) -> float:
    """Proportional set size (shared pages split between sharers): fair for many slurmd."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def total_rss(pids: Iterable[int]) -> tuple[float, float]:
    """(sum RSS MiB, sum PSS MiB) of the live pids."""
    rss = pss = 0.0
    for p in pids:
        try:
            rss += rss_mib(p)
            pss += pss_mib(p)
        except OSError:
            pass
    return rss, pss


def mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return math.nan


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


# label values may hold braces (endpoint="job/{id}"): a quoted value is read whole
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_prom(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(2) or ""))
        try:
            out.append((m.group(1), labels, float(m.group(3))))
        except ValueError:
            continue
    return out


def prom_sum(samples: list[tuple[str, dict[str, str], float]], metric: str, /,
             **match: str) -> float:
    return sum(v for n, lab, v in samples
               if n == metric and all(lab.get(k) == want for k, want in match.items()))


def histogram(samples: list[tuple[str, dict[str, str], float]], metric: str, /,
              **match: str) -> dict[float, float]:
    """Cumulative bucket counts {le: count}, summed over series that match."""
    out: dict[float, float] = {}
    for n, lab, v in samples:
        if n != f"{metric}_bucket" or not all(lab.get(k) == w for k, w in match.items()):
            continue
        le = math.inf if lab["le"] == "+Inf" else float(lab["le"])
        out[le] = out.get(le, 0.0) + v
    return out


def hist_delta(after: dict[float, float], before: dict[float, float]) -> dict[float, float]:
    return {le: c - before.get(le, 0.0) for le, c in after.items()}


def hist_quantile(h: dict[float, float], q: float) -> float:
    """Prometheus histogram_quantile (linear interpolation inside the bucket)."""
    if not h:
        return math.nan
    les = sorted(h)
    total = h[les[-1]]
    if total <= 0:
        return math.nan
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le in les:
        c = h[le]
        if c >= rank:
            if le == math.inf:
                return prev_le
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return les[-2] if len(les) > 1 else math.nan


def hist_count(h: dict[float, float]) -> float:
    return h.get(math.inf, 0.0)


class Stopwatch:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self) -> float:
        return time.monotonic() - self.t0


def use_own_cluster(run_dir: Path, port_offset: int) -> bool:
    """Point cluster.local (it reads these at import time: call before importing it) at a
    cluster of the bench's own, never the default one `make cluster-up` and the tests use.
    False, with a message, when that would still be the default run dir or ports."""
    os.environ.setdefault("SLURMGATE_PORT_OFFSET", str(port_offset))
    os.environ["SLURMGATE_RUN_DIR"] = str(run_dir)
    if run_dir.resolve() == Path("/tmp/slurmgate") or os.environ["SLURMGATE_PORT_OFFSET"] == "0":
        print("refusing to run on the default cluster's run dir or ports", file=sys.stderr)
        return False
    return True
