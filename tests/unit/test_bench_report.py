"""bench/report.py's verdicts against issue 15's targets, its table header, and the summary
across Slurm releases (bench/summary.py), from hand-made results."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.attribution import NOTICED_TO_BOUND
from bench.report import table, targets
from bench.summary import summarize, summary_table


def burst(size: int, makespan: float, p50: float | None = None, p99: float | None = None,
          churn: bool = False, idle: dict[str, Any] | None = None) -> dict[str, Any]:
    ours: dict[str, Any] = {"churn": churn, "attribution": {}}
    if p50 is not None and p99 is not None:
        ours["attribution"][NOTICED_TO_BOUND] = {"n": size, "p50_ms": p50, "p95_ms": p99,
                                                 "p99_ms": p99, "max_ms": p99}
    if idle is not None:
        ours["idle"] = idle
    return {"size": size, "ours": ours, "kube_scheduler": {}, "slurm": {},
            "overhead": {"p50": 1.0, "p99": 1.0, "makespan": makespan}}


def admission(marked_p99: float, unmarked_p99: float) -> dict[str, Any]:
    return {"marked": {"client_create": {"p99_ms": marked_p99}},
            "unmarked": {"client_create": {"p99_ms": unmarked_p99}}}


def test_makespan_limit_is_tighter_up_to_100_pods() -> None:
    t = targets({"bursts": [burst(100, 1.1), burst(100, 1.2), burst(500, 1.2)]})
    # one key per size: the later burst of a size overwrites the earlier
    assert t["[100] makespan overhead <= 1.15x"] == "1.2x MISSED"
    assert t["[500] makespan overhead <= 1.2x"] == "1.2x OK"
    assert targets({"bursts": [burst(100, 1.1)]})["[100] makespan overhead <= 1.15x"] == \
        "1.1x OK"
    assert targets({"bursts": [burst(100, 1.15)]})["[100] makespan overhead <= 1.15x"] == \
        "1.15x OK"
    assert targets({"bursts": [burst(500, 1.21)]})["[500] makespan overhead <= 1.2x"] == \
        "1.21x MISSED"


def test_missing_floor_is_missed_not_passed() -> None:
    t = targets({"bursts": [burst(100, math.nan)]})
    assert t["[100] makespan overhead <= 1.15x"].endswith("MISSED")


def test_noticed_to_bound_targets_by_size() -> None:
    t = targets({"bursts": [burst(20, 1.0, p50=70.0, p99=99.0),
                            burst(100, 1.0, p50=50.0, p99=151.0),
                            burst(500, 1.0, p50=900.0, p99=2000.0)]})
    assert t["[20] RUNNING noticed -> bound p99 <= 100 ms"] == "99.0 ms OK"
    assert "[20] RUNNING noticed -> bound p50 <= 50 ms" not in t  # too few Pods for a p50
    assert t["[100] RUNNING noticed -> bound p99 <= 150 ms"] == "151.0 ms MISSED"
    assert t["[100] RUNNING noticed -> bound p50 <= 50 ms"] == "50.0 ms OK"
    assert not any(k.startswith("[500] RUNNING") for k in t)  # no latency target past 100


def test_admission_ratio_verdict() -> None:
    key = "marked admission p99 <= 2x unmarked p99 (client, seq)"
    assert targets({"admission": admission(20.0, 10.0)})[key] == "20.0 / 10.0 ms = 2.0x OK"
    assert targets({"admission": admission(30.0, 10.0)})[key].endswith("= 3.0x MISSED")
    assert targets({"admission": admission(30.0, 0.0)})[key].endswith("MISSED")
    assert targets({}) == {}


def test_idle_verdict_spans_every_burst() -> None:
    quiet = {"bound_pods": 100, "reconciles": 0.0, "binder_cpu_s": 0.1}
    busy = {"bound_pods": 500, "reconciles": 3.0, "binder_cpu_s": 0.4}
    t = targets({"bursts": [burst(100, 1.0, idle=quiet)]})
    assert t["idle: 0 reconciles (100 .. 100 bound Pods)"].endswith("OK")
    t = targets({"bursts": [burst(100, 1.0, idle=quiet), burst(500, 1.0, idle=busy)]})
    assert t["idle: 0 reconciles (100 .. 500 bound Pods)"] == \
        "0 .. 3 (CPU s 0.1 .. 0.4) MISSED"


def results(version: str, *bursts: dict[str, Any], **extra: Any) -> dict[str, Any]:
    r: dict[str, Any] = {"started": "20261203-162556", "slurm_version": version,
                         "machine": {"cpus": 2, "mem_gib": 7.8}, "nodes": 500,
                         "concurrency": 32, "bursts": list(bursts),
                         "admission": admission(12.0, 8.0), **extra}
    r["targets"] = targets(r)
    return r


def test_table_header_names_the_release() -> None:
    r = results("24.11")
    del r["admission"]  # the table prints far more of it than these results hold
    assert table(r).splitlines()[0].startswith("slurmgate bench  Slurm 24.11  20261203-162556")
    r.update(burst_phase=0.5, slurmd_nice=19, submit_budget="0.1")
    assert table(r).splitlines()[1] == ("bursts start at .500 of a second (slurmctld's tick is "
                                        "on whole seconds); slurmd at nice 19; webhook "
                                        "SUBMIT_BUDGET 0.1 s")
    # a release whose probe found no nodes still gets its table
    del r["nodes"]
    r["slurm_version"] = "22.05"
    assert table(r).splitlines()[0].startswith("slurmgate bench  Slurm 22.05")


def test_summary_per_release_and_burst() -> None:
    ok = results("22.05", burst(100, 1.1, p50=12.5, p99=40.0),
                 burst(500, 1.3, p50=80.0, p99=300.0, churn=True))
    failed = results("26.05", error="ClusterError: slurmctld died")
    failed["bursts"] = []
    del failed["admission"]
    failed["targets"] = targets(failed)
    s = summarize("20261203-162556", [("22.05", 0, ok, Path("a.json")),
                                      ("26.05", 1, failed, Path("b.json"))])
    v22, v26 = s["versions"]
    assert v22["admission_p99_ratio"] == 1.5 and v26["admission_p99_ratio"] is None
    assert v22["bursts"][0] == {"size": 100, "churn": False, "makespan_overhead": 1.1,
                                "noticed_to_bound_p50_ms": 12.5,
                                "noticed_to_bound_p99_ms": 40.0, "noticed_to_bound_n": 100}
    assert v22["targets"]["[100] makespan overhead <= 1.15x"] == "1.1x OK"
    assert v26["exit"] == 1 and v26["bursts"] == [] and v26["file"] == "b.json"

    out = summary_table(s)
    rows = [line.split() for line in out.splitlines()]
    assert ["22.05", "100", "500", "1.1x", "12.5", "40.0", "1.5x"] in rows
    assert ["22.05", "500*", "500", "1.3x", "80.0", "300.0", "1.5x"] in rows
    assert ["26.05", "-", "500", "-", "-", "-", "-"] in rows
    assert "targets, Slurm 22.05" in out
    assert "targets, Slurm 26.05  (exit 1: ClusterError: slurmctld died)" in out
    assert any("[500] makespan overhead <= 1.2x" in line and line.endswith("1.3x MISSED")
               for line in out.splitlines())
    assert "(* more Pods than nodes" in out


def test_summary_recomputes_targets_when_absent() -> None:
    r = results("24.11", burst(100, 1.1))
    del r["targets"]
    (v,) = summarize("x", [("24.11", 0, r, Path("c.json"))])["versions"]
    assert v["targets"]["[100] makespan overhead <= 1.15x"] == "1.1x OK"
