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
    assert d.action == decide.CANCEL and d.cancel == pending
    # once the job has really ended, the claim is forgotten
    idx.forget_gone(req, lambda _: dataclasses.replace(completing, state="CANCELLED"))
    assert idx.job_changed(claim) is None and req not in idx.gone_claims
