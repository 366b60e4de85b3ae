"""The chaos run's floors: a run with no violations still fails when it created or bound too
few Pods, or never injected one of its faults (a try that found nothing to kill does not
count); a healthy round's figures pass."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench.chaos import FAULTS, floor, report
from bench.chaos.churn import ChurnStats
from bench.chaos.faults import Injected

FLOOR = floor.Floor(faults=FAULTS)


def summary(injected: list[Injected] | None = None, created: int = 66, bound: int = 40,
            violations: int = 0) -> dict[str, Any]:
    """report.summary of a run: by default the figures of a healthy short round on 26.05
    (66 created, every fault injected once), 40 of the Pods bound."""
    obs = SimpleNamespace(convergence=[], bound={f"chaos/p{i}" for i in range(bound)},
                          violations=[SimpleNamespace(t=0.0, rule="node shared", detail="x")]
                          * violations,
                          slurm_view_only=[], double_bookings={}, samples=366, unobservable=5)
    churn = ChurnStats(created=created, deleted=created - 6, create_failed=4)
    if injected is None:
        injected = [Injected(name, 0.0, 1.0, detail=name) for name in FAULTS]
    s = report.summary("26.05", 7, 10.0, churn, injected, obs)  # type: ignore[arg-type]
    s["floors_missed"] = floor.missed(s, FLOOR)
    return s


def test_a_healthy_round_passes() -> None:
    s = summary()
    assert s["floors_missed"] == [] and floor.failures(s) == []
    # exactly at the floor passes too
    assert summary(created=FLOOR.pods_created, bound=FLOOR.pods_bound)["floors_missed"] == []


def test_a_run_short_of_pods_created_or_bound_fails() -> None:
    short = summary(created=12, bound=5)  # e.g. the churn thread died a minute in
    assert short["floors_missed"] == [
        "Pods created: 12, under the floor of 30 (creates refused 4)",
        "Pods bound: 5 of 12 created, under the floor of 7"]
    assert floor.failures(short) == [f"floor missed: {m}" for m in short["floors_missed"]]
    # a binder that binds nothing: the churn alone looks healthy
    assert summary(bound=0)["floors_missed"] == [
        "Pods bound: 0 of 66 created, under the floor of 7"]


def test_a_fault_kind_never_injected_fails_the_run() -> None:
    # the round was cut short before slurmd's turn: never tried
    cut = [Injected(n, 0.0, 1.0) for n in FAULTS if n != "slurmd"]
    assert summary(cut)["floors_missed"] == ["fault slurmd: never injected (never tried)"]
    # tried three times, each finding nothing to kill: not injected, and said why
    nothing = "no parse worker running under binder (not spawned yet)"
    skipped = [
        *(Injected(n, 0.0, 1.0) for n in FAULTS if n != "parse-worker"),
        *(Injected("parse-worker", 0.0, 0.0, skipped=nothing) for _ in range(3))]
    s = summary(skipped)
    assert "parse-worker" not in s["faults"] and s["faults_skipped"] == {
        "parse-worker": [nothing] * 3}
    assert s["floors_missed"] == [f"fault parse-worker: never injected (skipped 3 time(s): "
                                  f"{nothing})"]
    assert floor.failures(s)
    # skipped once, then injected on the retry: counts
    retried = [*skipped[:-2], Injected("parse-worker", 0.0, 0.0, detail="parse worker pid 9")]
    assert summary(retried)["floors_missed"] == []
    # a try that failed (killed, not brought back) is not an injection either
    failed = [*(Injected(n, 0.0, 1.0) for n in FAULTS if n != "etcd"),
              Injected("etcd", 0.0, 1.0, error="NotReady: etcd")]
    s = summary(failed)
    assert s["floors_missed"] == ["fault etcd: never injected (failed 1 time(s))"]
    assert "not restored: etcd: NotReady: etcd" in floor.failures(s)


def test_violations_and_errors_fail_whatever_the_floor() -> None:
    assert floor.failures(summary(violations=2)) == ["2 violation(s): node shared"]
    died = {"slurm_version": "24.11", "error": "ClusterError: no slurmctld", "violations": []}
    assert floor.failures(died) == ["the run itself failed: ClusterError: no slurmctld"]


def test_the_table_says_which_floor_was_missed() -> None:
    s = summary(created=12)
    s["replay"] = "python -m bench.chaos --seed 7"
    text = report.table(s)
    assert "replay: python -m bench.chaos --seed 7" in text
    assert "FLOOR MISSED: Pods created: 12, under the floor of 30" in text
    assert "FLOOR MISSED" not in report.table(summary())
