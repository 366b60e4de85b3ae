"""A Pod evicted because Slurm takes its Node back gets no more grace than Slurm leaves before
it gives the Node to the next job (issue 30: the invariant on real Nodes, where a Pod takes
its grace to stop)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from slurmgate import reasons
from slurmgate.binder import decide as state
from slurmgate.binder.actions import Actions
from slurmgate.binder.config import ReconcileSettings
from slurmgate.preemption import KUBELET_MIN_GRACE, STOP_MARGIN, evict_grace
from tests.unit.test_state import NOW, W, job, pod
from tests.unit.test_tenancy_enforcement import READY, FakeEvents, FakeJobs, FakeSlurm


def test_the_grace_left_before_slurm_frees_the_node() -> None:
    assert evict_grace(10, NOW + 5, NOW) == 5 - STOP_MARGIN
    assert evict_grace(3, NOW + 5, NOW) is None  # its own grace fits
    assert evict_grace(30, NOW, NOW) == KUBELET_MIN_GRACE  # never under the kubelet's floor
    assert evict_grace(KUBELET_MIN_GRACE, NOW - 60, NOW) is None


def test_when_slurm_frees_the_node() -> None:
    w = dataclasses.replace(W, kill_wait=5.0, grace_time={"k8s": 20})
    cancelled = dataclasses.replace(job("CANCELLED"), end_time=int(NOW) - 2)
    assert state.node_freed_at(cancelled, w) == NOW - 2 + 5
    untold = dataclasses.replace(job("COMPLETING"), end_time=0)
    assert state.node_freed_at(untold, w) == NOW + 5
    preempted = job("RUNNING", ("n1",), preempt_time=int(NOW) - 3)
    assert state.node_freed_at(preempted, w) == NOW - 3 + 20
    assert state.node_freed_at(job("RUNNING", ("n1",)), w) is None


def test_an_eviction_for_a_cancelled_job_carries_when_the_node_goes() -> None:
    w = dataclasses.replace(W, kill_wait=5.0)
    bound = pod(False, "kwok-n1", "Running", A_SLURM_NODE="n1")
    cancelled = dataclasses.replace(job("CANCELLED", ("n1",)), end_time=int(NOW))
    d = state.decide(state.Unit.single(bound), lambda _c: cancelled, w)
    assert d.action == state.EVICT and d.stop_by == NOW + 5


class RecordingKube:
    def __init__(self) -> None:
        self.created: list[tuple[str, dict[str, Any]]] = []

    async def create(self, path: str, body: dict[str, Any]) -> None:
        self.created.append((path, body))

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> None:
        pass


async def test_the_eviction_asks_for_the_shorter_grace_and_says_why() -> None:
    kube, events = RecordingKube(), FakeEvents()
    act = Actions(kube, FakeSlurm(), events, FakeJobs(), None,  # type: ignore[arg-type]
                  ReconcileSettings(), lambda: READY)
    p = pod(False, "kwok-n1", "Running")
    p["spec"]["terminationGracePeriodSeconds"] = 10
    await act.evict(p, reasons.EV_JOB_CANCELLED, "job 7 cancelled", {}, time.time() + 5)
    ((_, body),) = kube.created
    # 5 s left less the margin, one second less when the clock ticked past the whole second
    assert body["deleteOptions"]["gracePeriodSeconds"] in (int(5 - STOP_MARGIN) - 1,
                                                           int(5 - STOP_MARGIN))
    assert "gets" in events.sent[0][2] and "asked for 10s" in events.sent[0][2]
    await act.evict(p, reasons.EV_JOB_CANCELLED, "job 7 cancelled", {}, None)
    assert "gracePeriodSeconds" not in kube.created[1][1]["deleteOptions"]
