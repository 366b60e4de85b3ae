"""binder/index.py: which job ids are ours, as the Pods' annotations say."""

from __future__ import annotations

import dataclasses
from typing import Any

from slurmgate import contract
from slurmgate.binder import decide
from slurmgate.binder.index import Index, Request
from slurmgate.slurm import JobInfo


class Store:
    store: dict[str, Any] = {}


def pod(job: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {
        contract.A_CLAIM: "c" * 32, contract.A_JOB_ID: job}}, "spec": {}}


def test_a_resubmitted_pods_old_job_id_is_no_longer_ours() -> None:
    idx = Index(Store())  # type: ignore[arg-type]
    idx.pod_changed("ns/p", None, pod("53"))
    assert idx.comment_by_job[53].endswith(" pod=ns/p")
    idx.pod_changed("ns/p", pod("53"), pod("60"))  # a new placeholder job
    assert 53 not in idx.comment_by_job  # a lost-state controller may give 53 to anyone
    assert 60 in idx.comment_by_job
    idx.pod_changed("ns/p", pod("60"), None)
    assert idx.comment_by_job == {}


def test_a_deleted_pods_job_is_still_asked_about_for_a_while(monkeypatch: Any) -> None:
    """A Pod deleted before any poll read its job: only its id leads the poller to the job."""
    from slurmgate.binder import index
    now = [100.0]
    monkeypatch.setattr(index.time, "monotonic", lambda: now[0])
    idx = Index(Store())  # type: ignore[arg-type]
    idx.pod_changed("ns/p", None, pod("53"))
    idx.pod_changed("ns/p", pod("53"), None)
    assert 53 not in idx.comment_by_job and idx.recently_gone_jobs() == [53]
    now[0] += index.GONE_JOB_KEEP
    assert idx.recently_gone_jobs() == []


def test_a_deleted_pods_requeued_job_reaches_its_unit_and_is_cancelled() -> None:
    """Slurm 22.05 requeues a job under its id (a node failure): COMPLETING, then PENDING. The
    Pod was evicted meanwhile; its unit must still see the job come back, to cancel it then
    rather than leave it to the orphan sweep (a node held idle for the orphan grace)."""
    idx, claim = Index(Store()), "c" * 32  # type: ignore[arg-type]
    req = Request("ns", "p")
    idx.pod_changed("ns/p", None, pod("113"))
    idx.pod_changed("ns/p", pod("113"), None)  # evicted and gone
    completing = JobInfo(job_id=113, name="k8s:ns/p", state="COMPLETING", reason="None",
                         nodes=("n1",), comment=contract.job_comment(claim, "ns", "p"),
                         partition="k8s", submit_time=1, start_time=1, end_time=0, restarts=1)
    idx.forget_gone(req, lambda _: completing)
    assert idx.job_changed(claim) == req
    pending = dataclasses.replace(completing, state="PENDING", nodes=())
    d = decide.decide(idx.unit(req), lambda _: pending, decide.World(slurm_synced=True, now=2.0))
    assert d.action == decide.RELEASE and d.cancel == pending and d.resubmit == ()
    # once the job has really ended, the claim is forgotten
    idx.forget_gone(req, lambda _: dataclasses.replace(completing, state="CANCELLED"))
    assert idx.job_changed(claim) is None and req not in idx.gone_claims


def member(i: int, claim: str | None) -> dict[str, Any]:
    ann = {contract.A_GROUP: "g", contract.A_GROUP_SIZE: "2", contract.A_GROUP_INDEX: str(i)}
    if claim:
        ann |= {contract.A_CLAIM: claim, contract.A_JOB_ID: "122"}
    return {"metadata": {"name": f"g-{i}", "namespace": "ns", "uid": f"u{i}",
                         "annotations": ann}, "spec": {}}


def test_a_claim_taken_off_a_pod_is_no_longer_held_by_it() -> None:
    """A gang released while slurmctld crashed: the cancel of its job was lost, the job came
    back and ran. The gated member had gone back to GroupPending (claim taken off), yet the
    index still named it the claim's holder, so the orphan sweep never cancelled the job."""
    claim = "d" * 32
    store = Store()
    store.store = {"ns/g-0": member(0, claim), "ns/g-1": member(1, claim)}
    idx = Index(store)  # type: ignore[arg-type]
    idx.pod_changed("ns/g-0", None, member(0, claim))
    idx.pod_changed("ns/g-1", None, member(1, claim))
    job = JobInfo(job_id=122, name="k8s:ns/group:g", state="RUNNING", reason="None",
                  nodes=("n1", "n2"), comment=contract.group_comment(claim, "ns", "g"),
                  partition="k8s", submit_time=1, start_time=1, end_time=0)
    # the holder loses the claim: the other member, which still has it, holds it now
    holder = idx.key_by_claim[claim]
    other = "ns/g-1" if holder == "ns/g-0" else "ns/g-0"
    i = int(holder[-1])
    store.store[holder] = member(i, None)
    idx.pod_changed(holder, member(i, claim), member(i, None))
    assert idx.key_by_claim[claim] == other and holder not in idx.claim_by_key
    # the other one is deleted: nobody holds the claim, and its job is the sweep's
    del store.store[other]
    idx.pod_changed(other, member(1 - i, claim), None)
    assert list(idx.unclaimed({claim: job})) == [job]
