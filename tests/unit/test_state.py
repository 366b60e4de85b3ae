"""The binder's decision table for a single Pod (a unit of one), case by case."""

from __future__ import annotations

import dataclasses

import pytest

from slurmgate import contract, reasons
from slurmgate.binder import decide as state
from slurmgate.binder.podview import OVERDUE_AFTER, overdue
from slurmgate.slurm import (
    ENDED_STATES,
    ENDING_STATES,
    RELEASED_STATES,
    WAITING_STATES,
    JobInfo,
)
from slurmgate.timestamps import format_time

NOW = 1_000_000.0
NODES = {"n1": state.NodeRef("kwok-n1", False), "n2": state.NodeRef("kwok-n2", True)}


def job(st: str = "PENDING", nodes: tuple[str, ...] = (), reason: str = "None",
        preempt_time: int = 0) -> JobInfo:
    return JobInfo(job_id=7, name="k8s:x", state=st, reason=reason, nodes=nodes,
                   comment="slurmgate claim=c1 pod=default/p", partition="k8s",
                   submit_time=int(NOW) - 5, start_time=0, end_time=0,
                   preempt_time=preempt_time)


def pod(gated: bool = True, node: str | None = None, phase: str = "Pending",
        deleting: bool = False, **ann: str) -> dict:
    annotations = {contract.A_CLAIM: "c1", contract.A_JOB_ID: "7",
                   contract.A_SUBMITTED_AT: str(int(NOW) - 5)}
    annotations.update({getattr(contract, k): v for k, v in ann.items()})
    p: dict = {"metadata": {"name": "p", "namespace": "default", "uid": "u",
                            "annotations": annotations},
               "spec": {"schedulerName": contract.SCHEDULER_NAME,
                        "schedulingGates": [{"name": contract.GATE}] if gated else []},
               "status": {"phase": phase}}
    if node:
        p["spec"]["nodeName"] = node
    if deleting:
        p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return p


W = state.World(slurm_synced=True, now=NOW, node_for=NODES)


def decide(p: dict, j: JobInfo | None, w: state.World) -> state.Decision:
    return state.decide(state.Unit.single(p), lambda _claim: j, w)


@pytest.mark.parametrize("p,j,w,action,reason", [
    # gated, waiting on Slurm
    (pod(), job("PENDING", reason="Resources"), W, state.STATUS, "SlurmJobPending"),
    (pod(A_JOB_STATE="PENDING", A_JOB_REASON="Resources"), job("PENDING", reason="Resources"),
     W, state.NOTHING, ""),
    # allocated: bind where Slurm chose
    (pod(), job("RUNNING", ("n1",)), W, state.BIND, "Bound"),
    # crash between ungate and bind: still binds
    (pod(gated=False), job("RUNNING", ("n1",)), W, state.BIND, "Bound"),
    # allocated on a cordoned Node: never bind there
    (pod(), job("RUNNING", ("n2",)), W, state.RELEASE, "NodeCordoned"),
    # allocated on a Slurm node without a Kubernetes Node: wait, never ungate blindly
    (pod(), job("RUNNING", ("n9",)), W, state.WAIT, "NodeNotFound"),
    # preempted during GraceTime while still gated: do not bind into a node being taken back
    (pod(), job("RUNNING", ("n1",), preempt_time=5), W, state.EVICT, "SlurmJobPreempted"),
    # job cancelled before the Pod started
    (pod(), job("CANCELLED"), W, state.EVICT, "SlurmJobCancelled"),
    # fail-open admission left the submit to us
    (pod(A_JOB_ID="", A_JOB_STATE="SubmitPending"), None, W, state.SUBMIT, "SlurmJobSubmitted"),
    # job not listed yet, fresh: wait; Slurm not synced: wait
    (pod(), None, W, state.WAIT, ""),
    (pod(), None, dataclasses.replace(W, slurm_synced=False), state.WAIT, ""),
    # job gone for longer than the grace: resubmit (the Pod never ran)
    (pod(A_SUBMITTED_AT=str(int(NOW) - 600)), None, W, state.RELEASE, "SlurmJobVanished"),
    # bound and running: status only
    (pod(False, "kwok-n1"), job("RUNNING", ("n1",)), W, state.STATUS, ""),
    (pod(False, "kwok-n1", A_JOB_STATE="RUNNING", A_SLURM_NODE="n1"), job("RUNNING", ("n1",)),
     W, state.NOTHING, ""),
    # Slurm takes the node back: evict
    (pod(False, "kwok-n1"), job("RUNNING", ("n1",), preempt_time=5), W, state.EVICT,
     "SlurmJobPreempted"),
    (pod(False, "kwok-n1"), job("PREEMPTED", ("n1",)), W, state.EVICT, "SlurmJobPreempted"),
    (pod(False, "kwok-n1"), job("TIMEOUT", ("n1",)), W, state.EVICT, "SlurmJobTimeLimit"),
    # a placeholder never exits by itself: COMPLETING with no reason is a scancel (22.05)
    (pod(False, "kwok-n1"), job("COMPLETING", ("n1",)), W, state.EVICT, "SlurmJobCancelled"),
    (pod(False, "kwok-n1"), job("COMPLETED", ("n1",)), W, state.EVICT, "SlurmJobEnded"),
    (pod(False, "kwok-n1"), job("NODE_FAIL", ("n1",)), W, state.EVICT, "SlurmNodeFailed"),
    # never evict on an ambiguous Slurm view
    (pod(False, "kwok-n1"), None, dataclasses.replace(W, slurm_synced=False), state.NOTHING, ""),
    (pod(False, "kwok-n1"), None, W, state.RELEASE, "SlurmJobVanished"),
    # Pod finished: free the node
    (pod(False, "kwok-n1", phase="Succeeded"), job("RUNNING", ("n1",)), W, state.RELEASE,
     "SlurmJobReleased"),
    (pod(False, "kwok-n1", phase="Failed"), job("CANCELLED", ("n1",)), W, state.NOTHING, ""),
    # deleted while gated: cancel now; deleted while bound: wait until it is gone
    (pod(deleting=True), job("PENDING"), W, state.RELEASE, "SlurmJobReleased"),
    (pod(False, "kwok-n1", deleting=True), job("RUNNING", ("n1",)), W, state.NOTHING, ""),
])
def test_decide(p: dict, j: JobInfo | None, w: state.World, action: str, reason: str) -> None:
    d = decide(p, j, w)
    assert d.action == action, d
    assert d.reason == reason, d


def test_bind_targets_the_mapped_node_and_records_status() -> None:
    d = decide(pod(), job("RUNNING", ("n1",)), W)
    assert d.node == "kwok-n1"
    assert d.status[contract.A_SLURM_NODE] == "n1"
    assert d.status[contract.A_JOB_STATE] == "RUNNING"


def test_pending_status_carries_reason() -> None:
    d = decide(pod(), job("PENDING", reason="Priority"), W)
    assert d.status[contract.A_JOB_REASON] == "Priority"
    assert "Priority" in d.message


def test_end_reasons_name_states_that_end_a_job() -> None:
    assert set(state.END_REASONS) <= ENDED_STATES


def test_preempted_is_ended_for_slurm_but_still_killed_by_the_binder() -> None:
    assert "PREEMPTED" in ENDED_STATES and "PREEMPTED" in ENDING_STATES
    assert "PREEMPTED" not in RELEASED_STATES
    assert state.holds_node(job("PREEMPTED")) and not job("PREEMPTED").active
    assert WAITING_STATES.isdisjoint(ENDING_STATES)


@pytest.mark.parametrize("st,flags,reason,want", [
    # 22.05 (v0.0.38) says COMPLETING only; the reason tells a time limit
    ("COMPLETING", (), "TimeLimit", "SlurmJobTimeLimit"),
    ("COMPLETING", (), "None", "SlurmJobCancelled"),
    ("COMPLETING", (), "NodeDown", "SlurmNodeFailed"),
    # 24.11+ list the end state beside COMPLETING (recorded answers: tests/unit/fixtures)
    ("COMPLETING", ("COMPLETING", "TIMEOUT"), "TimeLimit", "SlurmJobTimeLimit"),
    ("COMPLETING", ("CANCELLED", "COMPLETING"), "None", "SlurmJobCancelled"),
    ("COMPLETING", ("COMPLETING", "NODE_FAIL"), "None", "SlurmNodeFailed"),
    ("TIMEOUT", ("TIMEOUT",), "TimeLimit", "SlurmJobTimeLimit"),
    ("CANCELLED", ("CANCELLED",), "None", "SlurmJobCancelled"),
    ("FAILED", ("FAILED",), "NonZeroExitCode", "SlurmJobEnded"),
])
def test_end_reason_from_what_slurm_says(st: str, flags: tuple[str, ...], reason: str,
                                         want: str) -> None:
    j = dataclasses.replace(job(st, ("n1",), reason=reason), state_flags=frozenset(flags))
    assert state.end_reason(j) == want
    assert decide(pod(False, "kwok-n1"), j, W).reason == want


@pytest.mark.parametrize("flags,failed,want", [
    # 22.05 shows a job whose node went DOWN as COMPLETING without a reason for a moment
    # before it requeues it (seen with squeue polled every 20 ms): the node list decides
    ((), frozenset({"n1"}), "SlurmNodeFailed"),
    ((), frozenset(), "SlurmJobCancelled"),
    ((), frozenset({"n2"}), "SlurmJobCancelled"),  # another node's failure says nothing
    # 24.11+ name the end state; a node down at the same time does not change it
    (("CANCELLED", "COMPLETING"), frozenset({"n1"}), "SlurmJobCancelled"),
])
def test_a_job_completing_without_a_reason_asks_the_node_list(
        flags: tuple[str, ...], failed: frozenset[str], want: str) -> None:
    p = pod(False, "kwok-n1", A_SLURM_NODE="n1")
    j = dataclasses.replace(job("COMPLETING", (), reason="None"), state_flags=frozenset(flags))
    assert state.needs_node_states(state.Unit.single(p), lambda _c: j) == (not flags)
    d = decide(p, j, dataclasses.replace(W, failed_nodes=failed))
    assert (d.action, d.reason) == (state.EVICT, want)
    assert ("lost its node" in d.message) == (want == "SlurmNodeFailed")
    # a Pod not on a Node yet needs no node list
    assert not state.needs_node_states(state.Unit.single(pod()), lambda _c: j)


def test_a_pod_naming_a_cancelled_duplicate_binds_to_its_claims_other_job() -> None:
    """Fail-open, slurmctld away: the webhook's unanswered submit lands late as job 7 beside the
    binder's own job 8, which the Pod names; 8 loses as the duplicate and is cancelled. The Pod
    binds to 7 at once, not after vanish_grace (47 s in CI on 22.05 and 26.05)."""
    p = pod(A_JOB_ID="8", A_SUBMITTED_AT=str(int(NOW) - 2))
    w = dataclasses.replace(W, submitted={"c1": (8, NOW - 2)})
    running = job("RUNNING", ("n1",))
    assert decide(p, running, w).action == state.WAIT  # 8 may still be on its way
    d = decide(p, running, dataclasses.replace(w, cancelled=frozenset({8})))
    assert d.action == state.BIND and d.status[contract.A_JOB_ID] == "7"


def _cond(d: state.Decision) -> dict:
    ((_, c),) = d.conditions
    return c


def test_waiting_pod_gets_a_false_condition_naming_job_reason_and_gate() -> None:
    d = decide(pod(), job("PENDING", reason="Resources"), W)
    c = _cond(d)
    assert (c["type"], c["status"], c["reason"]) == (contract.COND_ALLOCATED, "False", "Resources")
    assert "Slurm job 7" in c["message"] and contract.GATE in c["message"]
    # Slurm's long reasons become one word; the message keeps them whole
    c = _cond(decide(pod(), job("PENDING", reason="ReqNodeNotAvail, UnavailableNodes:n3"), W))
    assert c["reason"] == "ReqNodeNotAvail" and "UnavailableNodes:n3" in c["message"]
    assert _cond(decide(pod(), job("PENDING", reason="None"), W))["reason"] == "Pending"


def test_a_waiting_pod_shows_slurms_expected_start_and_loses_it_once_running() -> None:
    planned = dataclasses.replace(job("PENDING", reason="Resources"), start_time=int(NOW) + 600)
    d = decide(pod(), planned, W)
    when = "1970-01-12T13:56:40Z"  # NOW + 600, UTC
    assert d.action == state.STATUS and d.status[contract.A_EXPECTED_START] == when
    assert when in d.message and when in _cond(d)["message"]
    # no plan yet (start_time 0): no expected start, and nothing written for it
    d = decide(pod(), job("PENDING", reason="Resources"), W)
    assert d.status[contract.A_EXPECTED_START] == "" and "expects" not in _cond(d)["message"]
    # a plan that moves is written again; one that stays is not
    shown = pod(A_JOB_STATE="PENDING", A_JOB_REASON="Resources", A_EXPECTED_START=when)
    assert decide(shown, planned, W).action == state.NOTHING
    later = dataclasses.replace(planned, start_time=int(NOW) + 900)
    assert decide(shown, later, W).status[contract.A_EXPECTED_START] == "1970-01-12T14:01:40Z"
    # ...but a drift of seconds, as backfill plans again, costs no patch and no Event
    drift = dataclasses.replace(planned, start_time=int(NOW) + 620)
    assert decide(shown, drift, W).action == state.NOTHING
    shown["status"]["conditions"] = [_cond(decide(shown, planned, W))]
    assert decide(shown, drift, W).conditions == ()  # nor a condition write
    # running: a RUNNING job's start_time is its real start, never shown as expected
    d = decide(pod(A_EXPECTED_START=when), dataclasses.replace(
        job("RUNNING", ("n1",)), start_time=int(NOW)), W)
    assert d.action == state.BIND and d.status[contract.A_EXPECTED_START] == ""  # removed


def test_condition_written_only_when_it_changes() -> None:
    d = decide(pod(), job("PENDING", reason="Priority"), W)
    p = pod()
    p["status"]["conditions"] = [dict(_cond(d), lastTransitionTime="2026-01-01T00:00:00Z")]
    assert decide(p, job("PENDING", reason="Priority"), W).conditions == ()
    assert _cond(decide(p, job("PENDING", reason="Resources"), W))["reason"] == "Resources"


def test_bound_pod_condition_true_with_its_slurm_node() -> None:
    d = decide(pod(False, "kwok-n1", A_SLURM_NODE="n1"), job("RUNNING", ("n1",)), W)
    c = _cond(d)
    assert (c["status"], c["reason"]) == ("True", "Allocated")
    assert "n1" in c["message"] and "kwok-n1" in c["message"]


def test_submit_pending_pod_says_so_in_its_condition() -> None:
    d = decide(pod(A_JOB_ID="", A_JOB_STATE="SubmitPending"), None, W)
    assert d.action == state.SUBMIT
    assert _cond(d)["reason"] == reasons.COND_REASON_SUBMIT_PENDING


def test_no_condition_for_a_pod_being_evicted() -> None:
    assert decide(pod(False, "kwok-n1"), job("TIMEOUT", ("n1",)), W).conditions == ()


def test_pending_event_names_the_gate() -> None:
    d = decide(pod(), job("PENDING", reason="Priority"), W)
    assert d.reason == "SlurmJobPending" and contract.GATE in d.message


@pytest.mark.parametrize("failed,want", [(frozenset({"n1"}), "SlurmNodeFailed"),
                                         (frozenset(), "SlurmJobRequeued")])
def test_job_requeued_under_a_bound_pod(failed: frozenset[str], want: str) -> None:
    # 22.05 requeues the placeholder when its node fails (requeue=false is ignored there)
    p = pod(False, "kwok-n1", A_SLURM_NODE="n1")
    j = job("PENDING", reason="None")
    assert state.needs_node_states(state.Unit.single(p), lambda _c: j)
    d = decide(p, j, dataclasses.replace(W, failed_nodes=failed))
    assert (d.action, d.reason) == (state.EVICT, want)
    assert d.cancel is j  # the requeued job would only take a Node for a Pod that is gone
    assert not state.needs_node_states(state.Unit.single(pod()), lambda _c: j)


def test_a_single_pod_is_released_like_a_gang_of_one() -> None:
    # on its Node: evicted, its job left to Slurm until the Pod is gone (it still runs there)
    on_node = pod(False, "kwok-n1")
    d = decide(on_node, None, W)
    assert (d.evict, d.resubmit, d.clear, d.cancel) == ((on_node,), (), (), None)
    # gated, allocated on a cordoned Node: the job goes and a new one is submitted at once,
    # under the Pod's claim (a gang's waiting members are cleared for the group's next job)
    gated, allocated = pod(), job("RUNNING", ("n2",))
    d = decide(gated, allocated, W)
    assert (d.evict, d.resubmit, d.clear, d.cancel) == ((), (gated,), (), allocated)
    assert d.cancel_why == "resubmit"
    # finished first: its job is cancelled and the Pod told
    done = pod(False, "kwok-n1", phase="Succeeded")
    d = decide(done, job("RUNNING", ("n1",)), W)
    assert (d.evict, d.resubmit, d.members, d.cancel_why) == ((), (), (done,), "pod_finished")


def test_placeholder_that_failed_to_start_is_resubmitted_not_deleted() -> None:
    # e.g. "Job credential revoked" after a controller that lost its state reused a job id
    d = decide(pod(), job("FAILED", ("n1",), reason="NonZeroExitCode"), W)
    assert d.action == state.RELEASE and d.cancel is None and d.resubmit == (d.resubmit[0],)
    # once running, a failed job takes the Node back as before
    assert decide(pod(False, "kwok-n1"), job("FAILED", ("n1",)), W).action == state.EVICT


def test_a_newer_job_of_the_claim_not_listed_yet_is_waited_for() -> None:
    p = pod(A_JOB_ID="9")  # resubmitted as job 9; Slurm's list still shows the failed job 7
    assert decide(p, job("FAILED", ("n1",)), W).action == state.WAIT
    late = pod(A_JOB_ID="9", A_SUBMITTED_AT=str(int(NOW) - 600))  # ids restarted lower
    assert decide(late, job("PENDING"), W).action == state.STATUS


def test_a_bound_pod_whose_job_runs_elsewhere_is_evicted() -> None:
    # e.g. a pushed start Slurm's next answer contradicts, or a requeue and restart between
    # two polls: the Node would run the Pod beside someone else's job
    p = pod(False, "kwok-n1", "Running", A_SLURM_NODE="n1")
    assert decide(p, job("RUNNING", ("n1",)), W).action != state.EVICT
    d = decide(p, job("RUNNING", ("n2",)), W)
    assert d.action == state.EVICT and d.reason == reasons.EV_NODE_MISMATCH
    assert "n2" in d.message and "n1" in d.message
    # a Pod bound before the Slurm node was recorded is left alone (nothing to compare)
    assert decide(pod(False, "kwok-n1", "Running"), job("RUNNING", ("n2",)), W).action \
        != state.EVICT


def test_the_binders_own_submit_stands_until_the_pods_annotation_arrives() -> None:
    # Given back (GPU grace): job 7 cancelled and job 8 submitted under the same claim. The
    # end of 7 reached a poll before the watch brought the Pod naming 8: deciding on 7 would
    # evict a Pod that is only waiting for its new job (CI's test_gpus failure).
    lagging = pod(True)  # still names job 7
    ended = job("CANCELLED")
    w = dataclasses.replace(W, submitted={"c1": (8, NOW - 1)})
    assert state.decide(state.Unit.single(lagging), lambda _: ended, w).action == state.WAIT
    assert state.decide(state.Unit.single(lagging), lambda _: ended, W).action == state.EVICT
    # a record older than the vanish grace, or of an older job, does not hold it back
    stale = dataclasses.replace(W, submitted={"c1": (8, NOW - 120)})
    assert state.decide(state.Unit.single(lagging), lambda _: ended, stale).action == state.EVICT
    older = dataclasses.replace(W, submitted={"c1": (6, NOW - 1)})
    assert state.decide(state.Unit.single(lagging), lambda _: ended, older).action == state.EVICT


def test_a_pod_whose_job_was_given_back_waits_for_a_new_one() -> None:
    """Given back (a cordoned Node) and the new submit refused by the tenancy policy: the Pod
    says so (GivenBack) and still names job 7. Job 7's end is ours: the Pod is submitted again
    (held while the policy refuses), never evicted for it, nor bound into it while the cancel
    has not shown yet. Without that word the cancelled job would evict it."""
    given_back = pod(A_JOB_STATE=contract.JOB_STATE_GIVEN_BACK)
    for j in (job("CANCELLED"), job("COMPLETING", ("n2",)), job("RUNNING", ("n1",))):
        d = decide(given_back, j, W)
        assert (d.action, d.reason) == (state.SUBMIT, reasons.EV_JOB_SUBMITTED), j.state
    assert decide(pod(), job("CANCELLED"), W).action == state.EVICT
    # a newer job of the claim (the policy allowed it) is the Pod's own again
    newer = pod(A_JOB_ID="8", A_JOB_STATE="PENDING")
    assert decide(newer, dataclasses.replace(job("RUNNING", ("n1",)), job_id=8), W).action \
        == state.BIND
    # bound Pods are never covered by the word: their job's end takes the Node back
    bound_pod = pod(False, "kwok-n1", "Running", A_JOB_STATE=contract.JOB_STATE_GIVEN_BACK)
    assert decide(bound_pod, job("CANCELLED"), W).action == state.EVICT


def test_a_pod_is_overdue_only_well_past_its_expected_start_and_while_it_waits() -> None:
    p = pod(A_EXPECTED_START=format_time(NOW))
    assert not overdue(p, NOW + OVERDUE_AFTER - 1)  # a plan slips by minutes: not yet
    assert overdue(p, NOW + OVERDUE_AFTER + 1)
    assert not overdue(pod(), NOW + 10 * OVERDUE_AFTER)  # no plan, nothing to be late for
    bound_pod = pod(gated=False, node="kwok-n1", A_EXPECTED_START=format_time(NOW))
    assert not overdue(bound_pod, NOW + 10 * OVERDUE_AFTER)
