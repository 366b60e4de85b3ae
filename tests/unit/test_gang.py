"""Gang decisions over a whole group."""

from __future__ import annotations

import dataclasses

import pytest

from slurmgate import contract
from slurmgate.binder import decide as gang
from slurmgate.binder import decide as state
from slurmgate.slurm import ENDING_STATES, JobInfo

NOW = 2_000_000_000.0
NODES = {f"n{i}": state.NodeRef(f"kwok-n{i}", False) for i in range(1, 5)}
W = state.World(slurm_synced=True, now=NOW, node_for=NODES)


def member(i: int, claim: str | None = None, node: str | None = None, size: int = 3,
           phase: str = "Pending", deleting: bool = False) -> dict:
    ann = {contract.A_GROUP: "g", contract.A_GROUP_SIZE: str(size),
           contract.A_GROUP_INDEX: str(i), contract.A_SUBMITTED_AT: str(int(NOW) - 5)}
    if claim:
        ann[contract.A_CLAIM] = claim
        ann[contract.A_JOB_ID] = "9"
    p: dict = {"metadata": {"name": f"m{i}", "namespace": "ns", "uid": f"u{i}",
                            "annotations": ann, "creationTimestamp": "2033-05-18T03:33:00Z"},
               "spec": {"schedulingGates": [] if node else [{"name": contract.GATE}]},
               "status": {"phase": phase}}
    if node:
        p["spec"]["nodeName"] = node
    if deleting:
        p["metadata"]["deletionTimestamp"] = "x"
    return p


def job(st: str, nodes: tuple[str, ...] = (), preempt: int = 0) -> JobInfo:
    return JobInfo(job_id=9, name="k8s:ns/group:g", state=st, reason="Resources", nodes=nodes,
                   comment="slurmgate claim=c group=ns/g", partition="k8s",
                   submit_time=int(NOW) - 5, start_time=0, end_time=0, preempt_time=preempt)


def decide_group(members: list[dict], job_of, w: state.World,
                 timeout: float = 300.0) -> state.Decision:
    return state.decide(state.Unit(tuple(members), gang=True), job_of,
                        dataclasses.replace(w, group_timeout=timeout))


def jobs(j: JobInfo | None):
    return lambda claim: j if claim == "c" else None


def test_incomplete_group_waits_then_complete_group_submits_in_rank_order() -> None:
    assert decide_group([member(0), member(1)], jobs(None), W).action == gang.WAIT
    d = decide_group([member(2), member(0), member(1)], jobs(None), W)
    assert d.action == gang.SUBMIT
    assert [m["metadata"]["name"] for m in d.members] == ["m0", "m1", "m2"]


def test_group_incomplete_past_timeout_is_reported() -> None:
    late = state.World(slurm_synced=True, now=NOW + 3600, node_for=NODES)
    d = decide_group([member(0)], jobs(None), late, timeout=10)
    assert d.action == gang.WAIT and d.reason == "GroupIncomplete"
    assert decide_group([member(0)], jobs(None), W, timeout=60).reason == ""


def test_no_member_binds_until_whole_job_allocated() -> None:
    ms = [member(i, "c") for i in range(3)]
    assert decide_group(ms, jobs(job("PENDING")), W).action == gang.STATUS
    d = decide_group(ms, jobs(job("RUNNING", ("n3", "n1", "n4"))), W)
    assert d.action == gang.BIND
    # rank i -> the job's i-th node, in Slurm's order
    assert [(m["metadata"]["name"], node, sn) for m, node, sn in d.binds] == [
        ("m0", "kwok-n3", "n3"), ("m1", "kwok-n1", "n1"), ("m2", "kwok-n4", "n4")]


def test_member_deleted_releases_group() -> None:
    ms = [member(0, "c", "kwok-n1"), member(1, "c", "kwok-n2"),
          member(2, "c", "kwok-n3", deleting=True)]
    d = decide_group(ms, jobs(job("RUNNING", ("n1", "n2", "n3"))), W)
    assert d.action == gang.RELEASE and d.reason == "GroupReleased"
    assert {m["metadata"]["name"] for m in d.evict} == {"m0", "m1"}
    assert d.cancel is None  # not while members still run on its nodes


def test_released_gated_members_wait_again_and_job_cancelled() -> None:
    ms = [member(0, "c"), member(1, "c"), member(2, "c", phase="Failed")]
    d = decide_group(ms, jobs(job("PENDING")), W)
    assert d.action == gang.RELEASE
    assert {m["metadata"]["name"] for m in d.clear} == {"m0", "m1"}
    assert d.cancel is not None and d.cancel.job_id == 9


def test_last_members_gone_job_cancelled() -> None:
    ms = [member(2, "c", phase="Failed")]
    d = decide_group(ms, jobs(job("RUNNING", ("n1", "n2", "n3"))), W)
    assert d.action == gang.RELEASE and d.cancel is not None


def test_preempted_group_job_evicts_every_member() -> None:
    ms = [member(i, "c", f"kwok-n{i + 1}") for i in range(3)]
    d = decide_group(ms, jobs(job("RUNNING", ("n1", "n2", "n3"), preempt=5)), W)
    assert d.action == gang.EVICT and d.reason == "SlurmJobPreempted"
    assert len(d.evict) == 3


def test_cordoned_node_in_allocation_sends_group_back() -> None:
    w = state.World(slurm_synced=True, now=NOW,
                    node_for={**NODES, "n2": state.NodeRef("kwok-n2", True)})
    ms = [member(i, "c") for i in range(3)]
    d = decide_group(ms, jobs(job("RUNNING", ("n1", "n2", "n3"))), w)
    assert d.action == gang.RELEASE and d.reason == "NodeCordoned"
    assert d.cancel is not None and len(d.clear) == 3


def test_all_bound_running_is_steady() -> None:
    ms = [member(i, "c", f"kwok-n{i + 1}") for i in range(3)]
    assert decide_group(ms, jobs(job("RUNNING", ("n1", "n2", "n3"))), W).action == \
        gang.NOTHING


def test_members_succeeding_do_not_evict_peers_and_last_one_frees_the_job() -> None:
    ms = [member(0, "c", "kwok-n1", phase="Succeeded"), member(1, "c", "kwok-n2"),
          member(2, "c", "kwok-n3")]
    j = job("RUNNING", ("n1", "n2", "n3"))
    assert decide_group(ms, jobs(j), W).action == gang.NOTHING
    done = [member(i, "c", f"kwok-n{i + 1}", phase="Succeeded") for i in range(3)]
    d = decide_group(done, jobs(j), W)
    assert d.action == gang.RELEASE and d.cancel is not None and not d.evict


def test_timed_out_group_job_gives_the_same_reason_as_a_single_pod() -> None:
    # Gangs used to say SlurmJobEnded here; both paths now share state.end_reason().
    ms = [member(i, "c", f"kwok-n{i + 1}") for i in range(3)]
    d = decide_group(ms, jobs(job("TIMEOUT", ("n1", "n2", "n3"))), W)
    assert d.action == gang.EVICT and d.reason == "SlurmJobTimeLimit"


@pytest.mark.parametrize("st", sorted(ENDING_STATES))
def test_group_and_single_pod_end_reasons_agree(st: str) -> None:
    ms = [member(i, "c", f"kwok-n{i + 1}") for i in range(3)]
    j = job(st, ("n1", "n2", "n3"))
    d = decide_group(ms, jobs(j), W)
    assert d.action == gang.EVICT and d.reason == state.end_reason(j)


def test_incomplete_group_members_show_group_pending() -> None:
    d = decide_group([member(0), member(1)], jobs(None), W)
    assert d.action == gang.WAIT
    assert [c["reason"] for _, c in d.conditions] == ["GroupPending"] * 2
    assert "all 3 members of group g" in d.conditions[0][1]["message"]


def test_group_job_requeued_after_node_failure_releases_the_group() -> None:
    ms = [member(i, "c", f"kwok-n{i + 1}") for i in range(3)]
    for i, m in enumerate(ms):
        m["metadata"]["annotations"][contract.A_SLURM_NODE] = f"n{i + 1}"
    w = dataclasses.replace(W, failed_nodes=frozenset({"n2"}))
    d = decide_group(ms, jobs(job("PENDING")), w)
    assert (d.action, d.reason) == (gang.RELEASE, "SlurmNodeFailed")
    assert len(d.evict) == 3 and d.cancel is None  # cancelled once no member runs


def test_group_job_completing_without_a_reason_on_a_failed_node_says_so() -> None:
    # 22.05's moment between a node going DOWN and the requeue: COMPLETING, reason None
    ms = [member(i, "c", f"kwok-n{i + 1}") for i in range(3)]
    for i, m in enumerate(ms):
        m["metadata"]["annotations"][contract.A_SLURM_NODE] = f"n{i + 1}"
    j = dataclasses.replace(job("COMPLETING"), reason="None")
    down = decide_group(ms, jobs(j), dataclasses.replace(W, failed_nodes=frozenset({"n3"})))
    assert (down.action, down.reason, len(down.evict)) == (gang.EVICT, "SlurmNodeFailed", 3)
    assert decide_group(ms, jobs(j), W).reason == "SlurmJobCancelled"


def test_members_whose_claim_has_not_reached_the_watch_have_not_left() -> None:
    # The binder submitted job 9 under claim c for all three; a poll shows the job before the
    # watch brings the claim on m2 (CI saw the group released and resubmitted for this).
    ms = [member(0, "c"), member(1, "c"), member(2)]
    just = dataclasses.replace(W, submitted={"c": (9, NOW - 0.1)})
    assert decide_group(ms, jobs(job("PENDING")), just).action == gang.WAIT
    assert decide_group(ms, jobs(job("RUNNING", ("n1", "n2", "n3"))), just).action == gang.WAIT
    # without our record of that submit (another binder made it), a member without the claim
    # has left: the group is released, as before
    assert decide_group(ms, jobs(job("PENDING")), W).action == gang.RELEASE
    # so it has when it was deleted meanwhile, or when the submit is long past
    gone = [member(0, "c"), member(1, "c"), member(2, deleting=True)]
    assert decide_group(gone, jobs(job("PENDING")), just).action == gang.RELEASE
    late = dataclasses.replace(just, now=NOW + W.vanish_grace + 1)
    assert decide_group(ms, jobs(job("PENDING")), late).action == gang.RELEASE


def test_a_member_whose_node_the_group_job_left_sends_the_group_back_naming_it() -> None:
    # a restarted slurmctld started the job again on n1,n2 after it ran on n1,n3: the member
    # on n3 would share that node; every member reads who is astray, not its own node
    ms = [member(i, "c", f"kwok-n{n}", size=2) for i, n in enumerate((1, 3))]
    for m, n in zip(ms, ("n1", "n3"), strict=True):
        m["metadata"]["annotations"][contract.A_SLURM_NODE] = n
    d = decide_group(ms, jobs(job("RUNNING", ("n1", "n2"))), W)
    assert d.action == gang.EVICT and len(d.evict) == 2
    assert d.message.startswith("Slurm job 9 runs on n1,n2, not on n3 member m1 was bound "
                                "for; the group goes")
    assert decide_group(ms, jobs(job("RUNNING", ("n1", "n3"))), W).action != gang.EVICT
