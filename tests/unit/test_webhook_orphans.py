"""The webhook cancels the job of a Pod refused after its submit (a ResourceQuota, a later
webhook): it finds admitted Pods by the claim label it wrote, against a fake API server."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch

from slurmgate import contract
from slurmgate.kube import KubeError
from slurmgate.slurm import JobInfo, SlurmUnavailable
from slurmgate.webhook import metrics
from slurmgate.webhook.admission import Admitter
from slurmgate.webhook.config import Settings
from slurmgate.webhook.orphans import GIVE_UP_AFTER, SETTLE, OrphanWatch
from tests.unit.fakes import FakeSubmit, marked_pod, node_map, review


class Kube:
    def __init__(self) -> None:
        self.pods: dict[str, list[str]] = {}  # namespace -> claim labels of stored Pods
        self.asked: list[tuple[str, str]] = []
        self.down = False

    async def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        if self.down:
            raise KubeError(503, "ServiceUnavailable", "API server away")
        ns = path.split("/")[4]
        claim = params["labelSelector"].split("=", 1)[1]
        self.asked.append((ns, claim))
        return [{"metadata": {"name": "p"}} for c in self.pods.get(ns, []) if c == claim], "1"


JOBS: dict[int, JobInfo] = {}  # what Slurm holds: job id -> its record


def slurm_job(i: int, claim: str, state: str = "PENDING") -> JobInfo:
    return JobInfo(job_id=i, name="x", state=state, reason="None", nodes=(),
                   comment=contract.job_comment(claim, "ns", "p"), partition="k8s",
                   submit_time=1, start_time=0, end_time=0)


def watch() -> tuple[OrphanWatch, Kube, list[int], list[float]]:
    kube, cancelled, now = Kube(), [], [1000.0]

    async def cancel(job_id: int) -> None:
        cancelled.append(job_id)

    async def job(job_id: int) -> JobInfo | None:
        return JOBS.get(job_id)
    return (OrphanWatch(kube, cancel, job, clock=lambda: now[0]),  # type: ignore[arg-type]
            kube, cancelled, now)


async def test_a_pod_never_stored_has_its_job_cancelled_after_the_settle_time() -> None:
    w, kube, cancelled, now = watch()
    kube.pods["ns"] = ["stored"]
    JOBS.update({7: slurm_job(7, "stored"), 8: slurm_job(8, "refused")})
    w.admitted("ns", "stored", 7)
    w.admitted("ns", "refused", 8)  # a ResourceQuota said no after our submit
    before = metrics.ORPHANS_CANCELLED._value.get()
    now[0] += SETTLE - 1
    assert await w.check_once() == 0 and kube.asked == []  # too early to tell
    now[0] += 1
    assert await w.check_once() == 1
    assert cancelled == [8] and metrics.ORPHANS_CANCELLED._value.get() == before + 1
    assert sorted(kube.asked) == [("ns", "refused"), ("ns", "stored")] and len(w) == 0
    assert await w.check_once() == 0 and cancelled == [8]  # each Pod looked for once


async def test_a_failed_look_is_retried_then_left_to_the_binder() -> None:
    w, kube, cancelled, now = watch()
    w.admitted("ns", "c", 9)
    kube.down = True
    now[0] += SETTLE
    assert await w.check_once() == 0 and len(w) == 1  # kept: the API server may come back
    now[0] += GIVE_UP_AFTER
    await w.check_once()
    assert len(w) == 0 and cancelled == []  # never cancelled on a guess


async def test_a_cancel_slurm_did_not_answer_is_retried() -> None:
    w, _, cancelled, now = watch()
    fails = [1]

    async def cancel(job_id: int) -> None:
        if fails:
            fails.pop()
            raise SlurmUnavailable("slurmrestd away")
        cancelled.append(job_id)
    w.cancel = cancel
    JOBS[10] = slurm_job(10, "c")
    w.admitted("ns", "c", 10)
    now[0] += SETTLE
    await w.check_once()
    assert cancelled == [] and len(w) == 1
    await w.check_once()
    assert cancelled == [10] and len(w) == 0


async def test_admission_labels_the_pod_with_its_claim_and_reports_the_job() -> None:
    seen: list[tuple[str, str, int]] = []
    nm = node_map()
    a = Admitter(FakeSubmit(), lambda: nm, Settings(),  # type: ignore[arg-type]
                 on_submitted=lambda ns, claim, job: seen.append((ns, claim, job)))
    pod = marked_pod()
    out = await a.review(review(pod))
    new = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(out["response"]["patch"])))
    claim = new["metadata"]["annotations"][contract.A_CLAIM]
    assert new["metadata"]["labels"][contract.CLAIM_LABEL] == claim
    assert new["metadata"]["labels"][contract.MARK_LABEL] == contract.MARK_VALUE  # kept
    assert seen == [(new["metadata"].get("namespace", "default"), claim, 101)]


async def test_an_id_slurm_gave_to_another_job_is_never_cancelled() -> None:
    """A controller that lost its state reuses ids: the Pod of claim a is gone, and its id
    now belongs to the next Pod's job (claim b). Only a job that still carries the claim is
    cancelled, and only while it is live."""
    w, _, cancelled, now = watch()
    w.admitted("ns", "a", 69)
    JOBS[69] = slurm_job(69, "b")
    w.admitted("ns", "gone", 70)
    JOBS[70] = slurm_job(70, "gone", state="CANCELLED")
    now[0] += SETTLE
    assert await w.check_once() == 0 and cancelled == [] and len(w) == 0
