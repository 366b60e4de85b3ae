"""bench/attribution.py: the per-Pod split of Slurm allocated -> bound, fed from files."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

from bench.attribution import (
    NOTICED_TO_BOUND,
    attribute,
    binder_binds,
    slurm_allocations,
    slurm_running,
    slurm_submit_time,
)

NS = "bench-sg-100"


def local_epoch(stamp: str) -> float:
    # slurmctld logs local time; a naive datetime's timestamp() is local time too
    return dt.datetime.fromisoformat(stamp).timestamp()


def test_allocations_from_sched_and_backfill_lines(tmp_path: Path) -> None:
    log = tmp_path / "ctld.log"
    log.write_text(
        "[2026-12-03T16:25:55.900] _slurm_rpc_submit_batch_job: JobId=32 InitPrio=1\n"
        "[2026-12-03T16:25:56.000] sched: Allocate JobId=32 NodeList=n32 #CPUs=8 "
        "Partition=k8s\n"
        "[2026-12-03T16:25:56.250] sched/backfill: _start_job: Started JobId=33 in k8s on n33\n"
        "[2026-12-03T16:25:56.300] _job_complete: JobId=31 done\n")
    got = slurm_allocations(log)
    assert got == {32: local_epoch("2026-12-03T16:25:56.000"),
                   33: local_epoch("2026-12-03T16:25:56.250")}
    assert round(got[33] - got[32], 3) == 0.25


def test_allocations_first_wins_and_offset_skips_earlier_bytes(tmp_path: Path) -> None:
    log = tmp_path / "ctld.log"
    before = "[2026-12-03T16:00:00.000] sched: Allocate JobId=7 NodeList=n1 #CPUs=8 Partition=k8s\n"
    log.write_text(before)
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write("[2026-12-03T16:25:56.000] sched: Allocate JobId=32 NodeList=n32 #CPUs=8 "
                "Partition=k8s\n")
        # requeued and started again later: a different decision, not the one we time
        f.write("[2026-12-03T16:26:10.500] sched/backfill: _start_job: Started JobId=32 in k8s "
                "on n5\n")
        f.write("[2026-12-03T16:26:11.0")  # a line slurmctld is still writing
    assert slurm_allocations(log, offset) == {32: local_epoch("2026-12-03T16:25:56.000")}
    assert set(slurm_allocations(log)) == {7, 32}


def bound_line(pod: str, **fields: Any) -> str:
    doc = {"ts": "2026-12-03T16:25:56Z", "level": "info", "msg": "pod bound", "pod": pod,
           "node": "kwok-n1", "job": 32, "slurm_node": "n1", "t_poll": 100.0,
           "t_noticed": 100.01, "t_start": 100.02, "t_ungated": 100.03, "t_bound": 100.05}
    doc.update(fields)
    return json.dumps(doc) + "\n"


def test_binder_binds_filters_namespace_and_skips_garbage(tmp_path: Path) -> None:
    log = tmp_path / "binder.log"
    log.write_text(
        bound_line(f"{NS}/sg-0")
        # a longer namespace with the same start is another burst's
        + bound_line("bench-sg-1000/sg-1")
        + bound_line("bench-ks-100/ks-1")
        + json.dumps({"msg": "reconcile", "pod": f"{NS}/sg-2"}) + "\n"
        + 'Traceback: log.info("pod bound", extra=kv(pod=key_of(pod))\n'
        + '"pod bound"\n'  # valid JSON, not an object
        + json.dumps({"msg": "bind failed", "why": "pod bound", "pod": f"{NS}/sg-3"}) + "\n"
        + bound_line(f"{NS}/sg-4")[:40] + "\n")  # cut short by a crash
    got = binder_binds(log, NS)
    assert set(got) == {"sg-0"}
    assert got["sg-0"]["job"] == 32 and got["sg-0"]["t_bound"] == 100.05


def test_binder_binds_reads_from_offset(tmp_path: Path) -> None:
    log = tmp_path / "binder.log"
    log.write_text(bound_line(f"{NS}/old"))
    offset = log.stat().st_size
    with log.open("a") as f:
        f.write(bound_line(f"{NS}/new"))
    assert set(binder_binds(log, NS, offset)) == {"new"}


def test_attribute_only_steps_with_both_ends() -> None:
    binds: dict[str, dict[str, Any]] = {
        # everything known: allocated by Slurm, watched Running by the bench
        "a": {"job": 1, "t_poll": 10.1, "t_noticed": 10.2, "t_start": 10.25,
              "t_ungated": 10.3, "t_bound": 10.4},
        # the binder had no poll times (0.0: noticed_wall did not have the job); no allocation
        # in the log and never seen Running
        "b": {"job": 2, "t_poll": 0.0, "t_noticed": 0.0, "t_start": 20.0,
              "t_ungated": 20.1, "t_bound": 20.3},
        # a job id that is not an int is not looked up
        "c": {"job": "3", "t_start": 30.0, "t_ungated": 30.05, "t_bound": 30.1},
    }
    got = attribute({1: 10.0, 2: 19.0, 3: 29.0}, binds, {"a": 10.9}, {1: 10.05})
    assert got["Slurm allocated -> binder noticed"]["n"] == 1
    assert got["Slurm allocated -> binder noticed"]["p50_ms"] == 200.0
    assert got["Slurm allocated -> hook done, RUNNING"]["p50_ms"] == 50.0
    assert got["Slurm RUNNING -> binder noticed"]["p50_ms"] == 150.0
    assert got["bound -> kubelet (kwok) Running"]["n"] == 1
    assert got["bound -> kubelet (kwok) Running"]["p50_ms"] == 500.0
    assert got[NOTICED_TO_BOUND]["n"] == 1
    assert got[NOTICED_TO_BOUND]["p50_ms"] == 200.0
    # b and a have both ends of the total (b through its own allocation), c has none
    assert got["Slurm allocated -> bound (total)"]["n"] == 2
    assert got["gate patch"]["n"] == 3
    assert got["Binding"]["n"] == 3


def test_attribute_leaves_out_steps_nobody_has() -> None:
    got = attribute({}, {"a": {"job": 1, "t_ungated": 1.0, "t_bound": 1.5}}, {})
    assert set(got) == {"Binding"}
    assert attribute({}, {}, {}) == {}


def test_slurm_running_reads_the_end_of_the_slurmctld_hook(tmp_path: Path) -> None:
    log = tmp_path / "ctld.log"
    log.write_text("[2026-12-03T16:37:12.351] prolog_running_decr: Configuration for JobId=3 "
                   "is complete\n[2026-12-03T16:37:12.000] sched: Allocate JobId=4 NodeList=n4 "
                   "#CPUs=8 Partition=k8s\n")
    got = slurm_running(log)
    assert set(got) == {3}
    assert slurm_allocations(log)[4] < got[3]


def test_slurmctlds_own_time_on_each_submit(tmp_path: Path) -> None:
    """The `usec=` of slurmctld's submit line, as 22.05-24.11 and 26.05 (with its SLUID) write
    it; the first line of a job wins and the offset skips earlier bytes."""
    log = tmp_path / "ctld.log"
    log.write_text(
        "[2026-12-07T22:07:50.479] _slurm_rpc_submit_batch_job: JobId=1 InitPrio=10000 usec=393\n"
        "[2026-12-07T23:26:12.383] _slurm_rpc_submit_batch_job: JobId=2 SLUID=s5X1M99D8GWZ00 "
        "InitPrio=10000 usec=226518\n"
        "[2026-12-07T23:26:13.000] _slurm_rpc_submit_batch_job: JobId=2 InitPrio=1 usec=9\n"
        "[2026-12-07T23:26:13.100] sched: Allocate JobId=2 NodeList=n4 #CPUs=8 Partition=k8s\n")
    assert slurm_submit_time(log) == {1: 0.000393, 2: 0.226518}
    first = len(log.read_bytes().splitlines(keepends=True)[0])
    assert slurm_submit_time(log, first) == {2: 0.226518}
