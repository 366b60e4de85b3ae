"""The chaos run's rules on hand-made snapshots: each one fires on a violation and stays quiet
on the legitimate states next to it (the two-read race, a Pod's own job, a terminating Pod)."""

from __future__ import annotations

import dataclasses
import threading
from datetime import datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.chaos import invariants as inv
from bench.chaos.observe import LIMITS, Durations, Observer
from bench.chaos.reads import parse_squeue, starts_in_log
from slurmgate import contract

K8S = {"n1": "kwok-n1", "n2": "kwok-n2"}
T = 1_000_000.0


def job(i: int, state: str = "RUNNING", nodes: tuple[str, ...] = ("n1",), start: float = T - 10,
        claim: str | None = "c1", partition: str = "k8s") -> inv.Job:
    comment = contract.job_comment(claim, "ns", "p") if claim else ""
    return inv.Job(i, state, nodes, start, partition, f"j{i}", comment)


def pod(name: str = "p", node: str | None = "kwok-n1", claim: str | None = "c1",
        phase: str = "Running", terminating: bool = False) -> inv.PodView:
    return inv.PodView(f"ns/{name}", f"uid-{name}", node, phase, terminating, claim,
                       node is None)


def running(jobs: list[inv.Job]) -> list[inv.JobProc]:
    """What the nodes run when slurmctld's view is right: a process per job on each node."""
    return [inv.JobProc(100 + j.job_id, j.job_id, n, j.start, j.name) for j in jobs
            if j.state in inv.ON_NODE_STATES and j.start for n in j.nodes]


def snap(pods: list[inv.PodView], jobs: list[inv.Job],
         procs: list[inv.JobProc] | None = None) -> inv.Snapshot:
    return inv.Snapshot(T, T + 0.2, tuple(pods), tuple(jobs),
                        tuple(running(jobs) if procs is None else procs))


def test_a_batch_job_beside_a_bound_pod_is_sharing_even_while_the_pod_terminates() -> None:
    batch = job(7, claim=None, partition="scavenger")
    assert inv.sharing(snap([pod()], [job(1), batch]), K8S)
    assert inv.sharing(snap([pod(terminating=True)], [batch]), K8S)
    assert not inv.sharing(snap([pod(phase="Succeeded")], [batch]), K8S)  # its containers ended
    assert not inv.sharing(snap([pod(node="kwok-n2")], [batch]), K8S)


def test_sharing_needs_the_job_to_have_started_before_the_pods_were_read() -> None:
    # started after the Pod list: the Pod may have left in between (no proof of overlap)
    late = job(7, claim=None, start=T + 0.1)
    assert not inv.sharing(snap([pod()], [late]), K8S)
    assert inv.sharing(snap([pod()], [job(7, claim=None, start=T - 0.5)]), K8S)
    assert not inv.sharing(snap([pod()], [job(7, claim=None, state="PENDING", start=0)]), K8S)


def test_a_pods_own_job_and_gang_are_not_sharing_but_another_claims_job_is() -> None:
    gang = job(3, nodes=("n1", "n2"), claim="g")
    assert not inv.sharing(snap([pod("a", "kwok-n1", "g"), pod("b", "kwok-n2", "g")], [gang]),
                           K8S)
    assert inv.sharing(snap([pod("a", "kwok-n1", "other")], [gang]), K8S)


def test_what_the_node_runs_decides_not_what_slurmctld_believes() -> None:
    # slurmctld restarted from a state saved before job 7 ended: squeue shows it on n1 for
    # minutes, but nothing of it runs there. Reported, not a violation.
    ghost = job(7, claim=None, partition="hpc")
    s = snap([pod()], [ghost], procs=[])
    assert not inv.sharing(s, K8S)
    assert inv.slurm_view_sharing(s, K8S) == [
        "Node kwok-n1 holds Pod ns/p while squeue shows job 7 (hpc j7, RUNNING) on n1"]
    # the other way: slurmctld lost a job that runs (started before the crash). Its process
    # beside another Pod is sharing; beside the Pod that names it as its job it is not.
    lost = [inv.JobProc(900, 9, "n1", T - 3)]
    assert inv.sharing(snap([pod()], [], procs=lost), K8S) == [
        "Node kwok-n1 holds Pod ns/p while job 9 (not in squeue) runs on n1 (pid 900)"]
    own = inv.PodView("ns/p", "uid-p", "kwok-n1", "Running", False, "c1", False, job_id=9)
    assert not inv.sharing(snap([own], [], procs=lost), K8S)


def test_a_placeholder_slurm_no_longer_has_there_is_a_stray_not_a_sharing() -> None:
    # slurmd was down when Slurm ended job 9 (or slurmctld lost its start in a crash): its
    # placeholder still sleeps on n1 until Slurm kills it, and the node already runs a Pod
    stray = [inv.JobProc(900, 9, "n1", T - 3, "k8s:ns/old")]
    s = snap([pod()], [job(1)], procs=running([job(1)]) + stray)
    assert not inv.sharing(s, K8S)
    assert [lo.key for lo in inv.leftovers(s, K8S)] == ["9@n1 beside ns/p"]
    assert inv.leftovers(s, K8S)[0].kind == inv.STRAY
    # the same process while Slurm still has job 9 on n1 is a double allocation
    still = dataclasses.replace(job(9, claim="c9"), name="k8s:ns/old")
    assert inv.sharing(snap([pod()], [job(1), still], procs=stray), K8S)
    assert not inv.leftovers(snap([pod()], [job(1), still], procs=stray), K8S)
    # and a batch job's leftover is a workload beside the Pod, whatever Slurm says
    batch = [inv.JobProc(901, 10, "n1", T - 3, "chaos-scavenger")]
    assert inv.sharing(snap([pod()], [job(1)], procs=batch), K8S)
    assert not inv.leftovers(snap([pod()], [job(1)], procs=batch), K8S)


STRAY_9 = inv.JobProc(900, 9, "n1", T - 3, "k8s:ns/old")


def _stray_beside(pod_job: inv.Job, **snapshot: object) -> inv.Leftover:
    s = dataclasses.replace(snap([pod()], [pod_job], procs=[*running([pod_job]), STRAY_9]),
                            **snapshot)
    (lo,) = inv.leftovers(s, K8S)
    return lo


def test_a_stray_is_slurms_own_when_slurm_gave_the_node_out_after_losing_its_job() -> None:
    # n1's slurmd SIGKILLed while placeholder 9 ran (Slurm ended the job without the node),
    # and squeue has the Pod's own job 1 holding n1: Slurm ran both there
    lo = _stray_beside(job(1), slurmd_kills=(("n1", T - 2),))
    assert lo.slurms_own
    assert any("slurmd on n1 was SIGKILLed" in e for e in lo.evidence)
    assert any("the Pod's own job 1 (j1, RUNNING) holds n1" in e for e in lo.evidence)
    assert "squeue: no job 9" in lo.evidence
    # so does a controller restarted after the placeholder started (its start not saved)
    lo = _stray_beside(job(1), ctld_since=T - 2)
    assert lo.slurms_own and any("slurmctld started again" in e for e in lo.evidence)


def test_a_stray_nothing_explains_is_counted() -> None:
    # no restart and no slurmd kill on its node while it ran: nothing the run did explains
    # Slurm losing job 9, so it is not proven Slurm's own
    for kills in [(), (("n2", T - 2),), (("n1", T - 5),)]:  # none, another node's, before it
        lo = _stray_beside(job(1), slurmd_kills=kills)
        assert not lo.slurms_own, kills
        assert any("explains Slurm losing job 9" in e for e in lo.evidence)
    assert not _stray_beside(job(1), ctld_since=T - 4).slurms_own  # restarted before it


def test_a_stray_beside_a_pod_slurm_never_put_there_is_counted() -> None:
    # the Pod's job is on n2 (or still pending), yet the Pod is bound on n1: whatever Slurm
    # lost, it did not give n1 out again; the Pod was bound where its job was not
    for pod_job in (job(1, nodes=("n2",)), job(1, state="PENDING", nodes=(), start=0)):
        lo = _stray_beside(pod_job, slurmd_kills=(("n1", T - 2),), ctld_since=T - 2)
        assert not lo.slurms_own, pod_job
        assert "squeue: no job of Pod ns/p holds n1" in lo.evidence


def test_a_batch_job_the_crashed_controller_lost_is_slurms_double_booking() -> None:
    # hpc job 36 started at T-3; slurmctld was SIGKILLed before saving that, started again at
    # T-2 on its old state, and gave n1 to the Pod's job: Slurm's overlap, judged apart
    lost = [inv.JobProc(936, 36, "n1", T - 3, "chaos-hpc")]
    crashed = dataclasses.replace(snap([pod()], [job(1)], procs=lost), ctld_since=T - 2)
    assert not inv.sharing(crashed, K8S)
    (lo,) = inv.leftovers(crashed, K8S)
    assert (lo.key, lo.kind, lo.slurms_own) == ("36@n1 beside ns/p", inv.LOST_IN_CRASH, True)
    # the id handed out again to another job (Slurm shows 36 elsewhere) changes nothing
    reused = dataclasses.replace(job(36, nodes=("n2",), claim="c36"), name="k8s:ns/q")
    again = dataclasses.replace(crashed, jobs=(job(1), reused))
    assert not inv.sharing(again, K8S)
    assert inv.leftovers(again, K8S)[0].slurms_own
    assert any("(the id handed out again)" in e for e in inv.leftovers(again, K8S)[0].evidence)
    # Slurm with no job of the Pod on n1: not proven, counted
    (lo,) = inv.leftovers(dataclasses.replace(crashed, jobs=()), K8S)
    assert not lo.slurms_own
    # started after the controller came back, it is a sharing like any other; and a batch
    # job's leftover is not excused by a slurmd kill (a workload beside the Pod)
    assert inv.sharing(dataclasses.replace(crashed, ctld_since=T - 4), K8S)
    killed = dataclasses.replace(crashed, ctld_since=0.0, slurmd_kills=(("n1", T - 2),))
    assert inv.sharing(killed, K8S) and not inv.leftovers(killed, K8S)


def _relocated(**changes: object) -> inv.Snapshot:
    """Pod p bound on n1 for its job 1, which Slurm had there when slurmctld was SIGKILLed at
    T-5; the controller, back on an older state, started job 1 again on n2 and gave n1 to job
    31 (another Pod's placeholder) at T-1."""
    jobs = [job(1, nodes=("n2",), start=T - 1), job(31, claim="c31", start=T - 1)]
    s = dataclasses.replace(snap([pod()], jobs), ctld_down_at=T - 5, ctld_since=T - 3,
                            placed_before_crash=frozenset({(1, "n1")}))
    return dataclasses.replace(s, **changes)


def test_a_pods_job_the_restarted_controller_placed_again_is_slurms_double_booking() -> None:
    s = _relocated()
    assert not inv.sharing(s, K8S)
    (lo,) = inv.relocated(s, K8S)
    assert (lo.key, lo.kind, lo.slurms_own) == ("31@n1 beside ns/p", inv.RELOCATED, True)
    assert any("Slurm had the Pod's job 1 on n1" in e for e in lo.evidence)
    assert any("job 1 (j1) is RUNNING on n2, no longer on n1" in e for e in lo.evidence)
    # the binder is held to evicting the Pod: it stands where its job no longer is
    assert inv.misplaced(s, K8S) == {"ns/p": "Pod ns/p on kwok-n1 while its job 1 is RUNNING "
                                             "on n2"}
    # not yet started again (pending) is the same story
    pending = _relocated(jobs=(job(1, "PENDING", nodes=(), start=0),
                               job(31, claim="c31", start=T - 1)))
    assert not inv.sharing(pending, K8S) and inv.relocated(pending, K8S)


def test_a_pod_beside_another_job_without_the_crash_story_is_sharing() -> None:
    unexcused = {
        # no sample nor log line had Slurm put job 1 on n1 before the crash
        "never placed there": _relocated(placed_before_crash=frozenset({(1, "n2")})),
        # no slurmctld crash at all
        "no crash": _relocated(ctld_down_at=0.0, ctld_since=0.0),
        # job 31's process started before the crash: that controller knew both jobs
        "started before": _relocated(procs=tuple(running([job(1, nodes=("n2",)),
                                                          job(31, claim="c31", start=T - 6)]))),
        # job 1 ended where it ran (squeue still lists n1): the Pod outstayed its job
        "ended there": _relocated(jobs=(job(1, "COMPLETED", start=T - 9),
                                        job(31, claim="c31", start=T - 1))),
    }
    for why, s in unexcused.items():
        assert inv.sharing(s, K8S) and not inv.relocated(s, K8S), why
    # a Pod whose job ended is not held to eviction by this rule, nor a Pod being evicted
    assert not inv.misplaced(unexcused["ended there"], K8S)
    assert not inv.misplaced(_relocated(pods=(pod(terminating=True),)), K8S)
    assert not inv.misplaced(snap([pod()], [job(1)]), K8S)  # on its job's node


def test_slurmctld_log_gives_each_jobs_last_start() -> None:
    # real lines of 24.11 (22.05 and 26.05 print the same two formats)
    log = ("[2026-12-07T15:54:05.051] sched/backfill: _start_job: Started JobId=21 in k8s on n3\n"
           "[2026-12-07T15:54:11.461] sched: Allocate JobId=30 NodeList=n[1,3] #CPUs=16 "
           "Partition=k8s\n"
           "[2026-12-07T15:54:17.285] Recovered JobId=30 Assoc=2\n"
           "[2026-12-07T15:54:18.291] sched/backfill: _start_job: Started JobId=30 in k8s on "
           "n[1-2]\n")
    starts = starts_in_log(log)
    assert set(starts) == {21, 30}
    assert starts[30][1] == ("n1", "n2") and starts[21][1] == ("n3",)
    assert starts[30][0] - starts[21][0] == pytest.approx(13.24)


def test_where_slurm_had_each_job_when_slurmctld_went_down(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "ctld.log").write_text(
        "[2026-12-07T15:54:11.461] sched: Allocate JobId=30 NodeList=n[1,3] #CPUs=16\n"
        "[2026-12-07T15:54:18.291] sched/backfill: _start_job: Started JobId=30 in k8s on n2\n")
    crash = datetime.fromisoformat("2026-12-07T15:54:13").timestamp()
    obs = Observer.__new__(Observer)
    obs.local = SimpleNamespace(slurm=SimpleNamespace(run_dir=tmp_path))  # type: ignore[assignment]
    # squeue last saw job 30 on n4 before the logged start, job 7 on n2
    obs.placements = {30: (crash - 10, ("n4",)), 7: (crash - 1, ("n2",))}
    # the log's start before the crash is the later: it wins; the one after is not counted
    assert obs._placed_at(crash) == {(30, "n1"), (30, "n3"), (7, "n2")}
    obs.placements[30] = (crash - 0.5, ("n4",))  # a sample after the logged start wins
    assert obs._placed_at(crash) == {(30, "n4"), (7, "n2")}


def _booking_observer() -> Observer:
    obs = Observer.__new__(Observer)  # the bookkeeping alone: no cluster behind it
    obs.double_bookings, obs.violations, obs.timeline = {}, [], []
    obs._reported, obs.lock = set(), threading.Lock()
    return obs


def test_a_double_booking_fails_the_run_unless_proven_at_some_sample() -> None:
    unproven = _stray_beside(job(1))
    proven = _stray_beside(job(1), slurmd_kills=(("n1", T - 2),))
    obs = _booking_observer()
    obs._double_booking(unproven, now=T)
    obs._double_booking(proven, now=T + 1)  # the next sample completes the proof
    obs.judge_double_bookings()
    assert not obs.violations
    rec = obs.double_bookings["9@n1 beside ns/p"]
    assert rec["slurms_own"] and rec["seen_s"] == 1.0
    assert any("slurmd on n1 was SIGKILLed" in e for e in rec["evidence"])  # kept, as proof
    # never proven: a violation dated at first sight, its observations in the detail
    obs = _booking_observer()
    obs._double_booking(unproven, now=T)
    obs._double_booking(unproven, now=T + 5)
    obs.judge_double_bookings()
    (v,) = obs.violations
    assert (v.rule, v.t) == ("double booking", T)
    assert "not proven Slurm's own" in v.detail and "squeue: no job 9" in v.detail
    assert not obs.double_bookings["9@n1 beside ns/p"]["slurms_own"]


def test_leaked_and_duplicate_jobs() -> None:
    assert inv.leaked_jobs(snap([], [job(1)])) == {"1": "job 1 (j1, RUNNING) has no Pod"}
    assert not inv.leaked_jobs(snap([pod()], [job(1)]))
    assert not inv.leaked_jobs(snap([], [job(1, state="COMPLETING")]))  # already let go
    assert not inv.leaked_jobs(snap([], [job(1, claim=None)]))  # not ours
    assert inv.duplicate_jobs(snap([pod()], [job(1), job(2, state="PENDING")]))
    assert not inv.duplicate_jobs(snap([pod()], [job(1, state="COMPLETING"), job(2)]))


def test_waiting_pods_need_a_job_and_a_running_job_needs_its_pod_bound() -> None:
    waiting = pod(node=None)
    assert inv.waiting_without_job(snap([waiting], []))
    assert not inv.waiting_without_job(snap([waiting], [job(1, state="PENDING")]))
    assert not inv.waiting_without_job(snap([pod(node=None, terminating=True)], []))
    assert inv.unbound_while_running(snap([waiting], [job(1)]))
    assert not inv.unbound_while_running(snap([waiting], [job(1, state="PENDING")]))


def test_a_vanished_pod_is_lost_only_without_an_event_of_ours() -> None:
    ours = {"involvedObject": {"uid": "u1"}, "reportingComponent": "slurmgate-binder"}
    theirs = {"involvedObject": {"uid": "u2"}, "reportingComponent": "kubelet"}
    assert inv.lost_pods({"ns/a": "u1", "ns/b": "u2"}, [ours, theirs]) == [
        "Pod ns/b vanished with no Event from slurmgate"]


def test_orphans_are_our_python_processes_under_init() -> None:
    py = "/venv/bin/python"
    procs = [inv.Proc(10, 1, f"{py} -c from multiprocessing.spawn import spawn_main"),
             inv.Proc(11, 9, f"{py} -c from multiprocessing.spawn import spawn_main"),
             inv.Proc(12, 1, "/bin/sh /run/hook/slurmgate-notify"),
             inv.Proc(13, 1, f"{py} -m slurmgate.binder")]
    assert sorted(inv.orphans(procs, py)) == ["10", "13"]


def test_durations_start_again_after_a_fault() -> None:
    d = Durations()
    assert d.update({"x": "."}, now=100.0, floor=0.0) == {"x": 0.0}
    assert d.update({"x": "."}, now=130.0, floor=0.0) == {"x": 30.0}
    assert d.update({"x": "."}, now=140.0, floor=135.0) == {"x": 5.0}  # a fault ended at 135
    assert d.update({}, now=150.0, floor=0.0) == {}
    assert d.update({"x": "."}, now=160.0, floor=0.0) == {"x": 0.0}  # gone, then back: anew


def test_settling_counts_from_first_sight_not_from_the_fault() -> None:
    # an item left over from before a fault ended keeps the cluster unsettled, though the
    # violation clock for it started again at the fault's end
    d = Durations()
    d.update({"x": "."}, now=100.0, floor=0.0)
    assert d.update({"x": "."}, now=110.0, floor=109.0) == {"x": 1.0}
    assert d.any_seen_by(109.0) and not d.any_seen_by(99.0)
    d.update({}, now=111.0, floor=109.0)
    assert not d.any_seen_by(111.0)


def _observer(ready: list[bool]) -> Observer:
    obs = Observer.__new__(Observer)  # the settling logic alone: no cluster behind it
    obs.durations = {rule: Durations() for rule in LIMITS}
    obs.ready_at = obs.clear_at = None
    obs.ready = lambda: ready[0]
    return obs


def test_settled_waits_for_readiness_then_for_what_the_fault_left() -> None:
    ready = [False]
    obs = _observer(ready)
    leftover = obs.durations["unbound while its job runs"]
    leftover.update({"ns/p": "."}, now=101.0, floor=100.0)  # seen just after the restore
    assert obs.settled(restored=100.0, now=102.0) is None  # the binder does not lead yet
    ready[0] = True
    assert obs.settled(restored=100.0, now=110.0) is None  # ready at 110; the Pod unbound
    assert obs.ready_at == 110.0
    leftover.update({}, now=111.0, floor=100.0)
    assert obs.settled(restored=100.0, now=111.0) is None  # too soon after readiness to tell
    # churn's own new items, first seen well after readiness, are not the fault's
    obs.durations["leaked job"].update({"7": "."}, now=113.5, floor=100.0)
    assert obs.settled(restored=100.0, now=114.0) == 11.0  # clear since the sample at 111


def test_squeue_rows_with_hostlists_and_no_start() -> None:
    out = ("12|RUNNING|n[1-2]|2026-12-04T21:00:00|k8s|k8s:ns/g|slurmgate claim=abc group=ns/g\n"
           "13|PENDING||N/A|scavenger|chaos-scavenger|\n")
    a, b = parse_squeue(out)
    assert a.nodes == ("n1", "n2") and a.claim == "abc" and a.start > 0
    assert b.nodes == () and b.start == 0.0 and b.claim is None
