"""Where the time between Slurm's decision and a bound Pod goes, Pod by Pod.

Every step is a pair of wall-clock times from one source each:
  Slurm allocated       slurmctld's log ("sched: Allocate JobId=..." or backfill's "Started
                        JobId=..."), millisecond timestamps; only the main scheduler logs its
                        starts at info, so backfilled jobs have no such line
  Slurm RUNNING         slurmctld's log "prolog_running_decr: Configuration for JobId=N is
                        complete": PrologSlurmctld (slurmgate's hook) has finished and Slurm
                        reports the job RUNNING; every job has it
  poll sent, noticed    the binder's "pod bound" log line (t_poll: the poll that first saw the
                        job RUNNING was sent; t_noticed: its answer parsed)
  bind started, ungated, bound
                        the same log line (the reconcile began; gate patch done; Binding done)
  kubelet Running       the bench's own watch (status.phase Running, written by kwok)
All on one host, so one clock; no cluster access here, so the unit tests can feed it files.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.stats import lat

# 22.05-26.05 all log these two at info; the timestamp is local time, iso8601_ms by default
# slurmctld's line for each start, the same from 22.05 to 26.05: "sched: Allocate JobId=30
# NodeList=n[1,3] ..." (the main scheduler) and "sched/backfill: _start_job: Started JobId=31 in
# k8s on n3" (backfill), with the nodes (bench/chaos/reads.py reads them)
ALLOC_LINE = re.compile(r"^\[(?P<ts>[0-9T:.\-]+)\] (?:sched: Allocate|sched/backfill: _start_job: "
                        r"Started) JobId=(?P<job>\d+)"
                        r"(?:\S* (?:NodeList=|in \S+ on )(?P<nodes>\S+))?")
_SUBMITTED = re.compile(r"^\[(?P<ts>[0-9T:.\-]+)\] _slurm_rpc_submit_batch_job: "
                        r"JobId=(?P<job>\d+)")
_RUNNING = re.compile(r"^\[(?P<ts>[0-9T:.\-]+)\] prolog_running_decr: Configuration for "
                      r"JobId=(?P<job>\d+) is complete")

STEPS = (  # (name, from, to)
    ("create sent -> Slurm has the job (admission)", "sent", "submitted"),
    ("Slurm has the job -> allocated", "submitted", "allocated"),
    ("Slurm allocated -> hook done, RUNNING", "allocated", "slurm_running"),
    ("Slurm allocated -> binder noticed", "allocated", "t_noticed"),
    ("Slurm RUNNING -> binder noticed", "slurm_running", "t_noticed"),
    ("poll sent -> RUNNING noticed (0: pushed)", "t_poll", "t_noticed"),
    ("noticed -> bind started (queue)", "t_noticed", "t_start"),
    ("gate patch", "t_start", "t_ungated"),
    ("Binding", "t_ungated", "t_bound"),
    ("bound -> kubelet (kwok) Running", "t_bound", "running"),
    (NOTICED_TO_BOUND := "RUNNING noticed -> bound", "t_noticed", "t_bound"),
    ("Slurm allocated -> bound (total)", "allocated", "t_bound"),
    ("Slurm RUNNING -> bound (total)", "slurm_running", "t_bound"),
)


def local_epoch(stamp: str) -> float:
    t = dt.datetime.fromisoformat(stamp)
    return time.mktime(t.timetuple()) + t.microsecond / 1e6


def _first_per_job(ctld_log: Path, offset: int, pattern: re.Pattern[str],
                   value: Callable[[re.Match[str]], float]) -> dict[int, float]:
    """job id -> value() of the first line from byte `offset` that `pattern` finds (its
    group `job`)."""
    out: dict[int, float] = {}
    with ctld_log.open("rb") as f:
        f.seek(offset)
        for raw in f:
            m = pattern.search(raw.decode("utf-8", "replace"))
            if m:
                out.setdefault(int(m["job"]), value(m))
    return out


def _stamp(m: re.Match[str]) -> float:
    return local_epoch(m["ts"])


def slurm_allocations(ctld_log: Path, offset: int = 0,
                      pattern: re.Pattern[str] = ALLOC_LINE) -> dict[int, float]:
    """job id -> when slurmctld allocated its nodes (the first time: a requeued job's later
    start is a different decision); reads from byte `offset`. Every pattern here is anchored
    at the line's start."""
    return _first_per_job(ctld_log, offset, pattern, _stamp)


def slurm_submits(ctld_log: Path, offset: int = 0) -> dict[int, float]:
    """job id -> when slurmctld accepted the job (the webhook's submit, at admission)."""
    return slurm_allocations(ctld_log, offset, _SUBMITTED)


# the same line ends with slurmctld's own time on that RPC, lock waits included:
# "_slurm_rpc_submit_batch_job: JobId=27 InitPrio=4294901734 usec=538"
_SUBMIT_USEC = re.compile(r"_slurm_rpc_submit_batch_job: JobId=(?P<job>\d+) .*usec=(?P<us>\d+)")


def slurm_submit_time(ctld_log: Path, offset: int = 0) -> dict[int, float]:
    """job id -> slurmctld's own seconds on the submit RPC that made it (its `usec=`):
    what a submit costs inside Slurm, whoever sent it, so a slow answer can be told apart from
    a slow client."""
    return _first_per_job(ctld_log, offset, _SUBMIT_USEC, lambda m: int(m["us"]) / 1e6)


def slurm_running(ctld_log: Path, offset: int = 0) -> dict[int, float]:
    """job id -> when slurmctld finished the job's PrologSlurmctld and called it RUNNING."""
    return slurm_allocations(ctld_log, offset, _RUNNING)


def binder_lines(binder_log: Path, msg: str, namespace: str,
                 offset: int = 0) -> Iterator[tuple[str, dict[str, Any]]]:
    """(Pod name, fields) of each binder log line `msg` about a Pod of `namespace`."""
    prefix = f"{namespace}/"
    needle = json.dumps(msg).encode()
    with binder_log.open("rb") as f:
        f.seek(offset)
        for raw in f:
            if needle not in raw:
                continue
            try:
                doc = json.loads(raw)
            except ValueError:  # stderr shares the file: tracebacks, a line cut by a crash
                continue
            if not isinstance(doc, dict) or doc.get("msg") != msg:
                continue
            pod = str(doc.get("pod", ""))
            if pod.startswith(prefix):
                yield pod[len(prefix):], doc


def binder_binds(binder_log: Path, namespace: str, offset: int = 0) -> dict[str, dict[str, Any]]:
    """Pod name -> the fields of its "pod bound" line (namespace `namespace`)."""
    return dict(binder_lines(binder_log, "pod bound", namespace, offset))


def attribute(allocated: dict[int, float], binds: dict[str, dict[str, Any]],
              running: dict[str, float],
              slurm_running: dict[int, float] | None = None,
              submitted: dict[int, float] | None = None,
              sent: dict[str, float] | None = None) -> dict[str, Any]:
    """p50/p99 of every step over the Pods that have both ends of it."""
    rows: dict[str, list[float]] = {name: [] for name, _, _ in STEPS}
    for pod, doc in binds.items():
        t: dict[str, float] = {k: float(v) for k, v in doc.items()
                               if k.startswith("t_") and isinstance(v, int | float) and v}
        job = doc.get("job")
        if isinstance(job, int) and job in allocated:
            t["allocated"] = allocated[job]
        if isinstance(job, int) and slurm_running and job in slurm_running:
            t["slurm_running"] = slurm_running[job]
        if isinstance(job, int) and submitted and job in submitted:
            t["submitted"] = submitted[job]
        if sent and pod in sent:
            t["sent"] = sent[pod]
        if pod in running:
            t["running"] = running[pod]
        for name, a, b in STEPS:
            if a in t and b in t:
                rows[name].append(t[b] - t[a])
    return {name: lat(v) for name, v in rows.items() if v}


def size_of(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
