"""Node -> Slurm sync decisions, and that Node status heartbeats cost the binder nothing."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from slurmgate import contract
from slurmgate.binder.controller import Controller as Binder
from slurmgate.binder.nodesync import drain_reason, node_action
from slurmgate.binder.podview import NodeRef, node_ref
from slurmgate.slurm import JobInfo, NodeInfo

OURS = f"{contract.DRAIN_REASON_PREFIX} kwok-n1"


def knode(name: str = "kwok-n1", slurm: str = "n1", cordoned: bool = False,
          heartbeat: str = "2026-12-02T10:00:00Z") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {contract.NODE_LABEL: slurm},
                         "resourceVersion": heartbeat},
            "spec": {"unschedulable": True} if cordoned else {},
            "status": {"conditions": [{"type": "Ready", "status": "True",
                                       "lastHeartbeatTime": heartbeat}]}}


def snode(state: str = "IDLE", flags: tuple[str, ...] = (), reason: str = "") -> NodeInfo:
    return NodeInfo(name="n1", state=state, flags=frozenset(flags), cpus=4,
                    real_memory_mb=16000, partitions=("k8s",), reason=reason, features=(),
                    gres="")


@pytest.mark.parametrize(("cordoned", "sn", "want"), [
    (True, snode(), "drain"),
    (True, snode("ALLOCATED"), "drain"),
    (True, snode("IDLE", ("DRAIN",), OURS), None),
    (True, snode("IDLE", ("DRAIN",), "admin: bad DIMM"), None),
    (False, snode("IDLE", ("DRAIN",), OURS), "resume"),
    (False, snode("DRAINED", (), OURS), "resume"),
    (False, snode("IDLE", ("DRAIN",), "Kill task failed"), None),  # not ours: left alone
    (False, snode(), None),
])
def test_node_action(cordoned: bool, sn: NodeInfo, want: str | None) -> None:
    assert node_action(knode(cordoned=cordoned), sn) == want


def test_node_view_ignores_status() -> None:
    a, b = knode(), knode(heartbeat="2026-12-02T10:10:00Z")
    assert a != b and node_ref(a) == node_ref(b) == NodeRef("kwok-n1", False, 0, None, "n1")
    assert node_ref(knode(cordoned=True)) == NodeRef("kwok-n1", True, 0, None, "n1")
    assert node_ref(knode(slurm="n2")) == NodeRef("kwok-n1", False, 0, None, "n2")
    assert node_ref(None) is None


def binder_with_bound_pod() -> Binder:
    b = Binder(object(), object())  # type: ignore[arg-type]  # handlers touch neither
    b.jobs.by_claim["c1"] = JobInfo(job_id=7, name="x", state="RUNNING", reason="",
                                    nodes=("n1",), comment="", partition="k8s",
                                    submit_time=1, start_time=2, end_time=0)
    b.index.key_by_claim["c1"] = "ns/p"
    return b


def test_heartbeat_enqueues_nothing_cordon_does() -> None:
    b = binder_with_bound_pod()
    first = knode()
    b._on_node("kwok-n1", None, first)  # a new Node: index it, look at its Pods and its drain
    assert b.index.node_for["n1"].name == "kwok-n1"
    assert len(b.queue) == 1 and len(b.node_queue) == 1
    b.queue = type(b.queue)()
    b.node_queue = type(b.node_queue)()
    beat = knode(heartbeat="2026-12-02T10:10:00Z")
    b._on_node("kwok-n1", first, beat)
    assert len(b.queue) == 0 and len(b.node_queue) == 0
    cordon = copy.deepcopy(beat)
    cordon["spec"]["unschedulable"] = True
    b._on_node("kwok-n1", beat, cordon)
    assert b.index.node_for["n1"].unschedulable
    assert len(b.queue) == 1 and len(b.node_queue) == 1


def test_relabel_and_delete_move_the_index() -> None:
    b = binder_with_bound_pod()
    a = knode()
    b._on_node("kwok-n1", None, a)
    moved = knode(slurm="n2")
    b._on_node("kwok-n1", a, moved)
    assert "n1" not in b.index.node_for and b.index.node_for["n2"].name == "kwok-n1"
    b._on_node("kwok-n1", moved, None)
    assert not b.index.node_for and not b.index.slurm_of


class FakeSlurm:
    def __init__(self, nodes: list[NodeInfo]) -> None:
        self._nodes = nodes
        self.calls = 0
        self.one_by_one: list[str] = []

    async def nodes(self) -> list[NodeInfo]:
        self.calls += 1
        return self._nodes

    async def node(self, name: str) -> NodeInfo | None:
        self.one_by_one.append(name)
        return next((n for n in self._nodes if n.name == name), None)


def test_drift_check_is_one_list_call() -> None:
    fake = FakeSlurm([snode("IDLE", ("DRAIN",), OURS)] + [
        NodeInfo(name=f"n{i}", state="IDLE", flags=frozenset(), cpus=4, real_memory_mb=1,
                 partitions=(), reason="", features=(), gres="") for i in range(2, 200)])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    b.nodes.store = {f"kwok-n{i}": knode(f"kwok-n{i}", f"n{i}") for i in range(1, 200)}
    drifted = asyncio.run(b.nodesync.drifted())
    assert drifted == ["kwok-n1"]  # uncordoned but still drained by us: resume it
    assert fake.calls == 1


def test_between_whole_lists_the_drift_check_reads_only_nodes_it_may_act_on() -> None:
    def plain(i: int) -> NodeInfo:
        return NodeInfo(name=f"n{i}", state="IDLE", flags=frozenset(), cpus=4,
                        real_memory_mb=1, partitions=(), reason="", features=(), gres="")
    fake = FakeSlurm([snode("IDLE", ("DRAIN",), OURS)] + [plain(i) for i in range(2, 200)])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    b.nodes.store = {f"kwok-n{i}": knode(f"kwok-n{i}", f"n{i}") for i in range(1, 200)}
    b.nodes.store["kwok-n7"]["spec"]["unschedulable"] = True  # cordoned, not drained yet
    assert sorted(asyncio.run(b.nodesync.drifted())) == ["kwok-n1", "kwok-n7"]
    assert fake.calls == 1 and fake.one_by_one == []  # the first check: one whole list
    fake._nodes[0] = plain(1)  # we resumed n1; an admin drained nobody
    assert asyncio.run(b.nodesync.drifted()) == ["kwok-n7"]
    assert fake.calls == 1 and sorted(fake.one_by_one) == ["n1", "n7"]  # 2 of 199 nodes


def test_slurm_nodes_without_the_taint_are_counted() -> None:
    from slurmgate.binder import metrics
    fake = FakeSlurm([])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    tainted = knode("kwok-n2", "n2")
    tainted["spec"]["taints"] = [contract.TAINT]
    b.nodes.store = {"kwok-n1": knode(), "kwok-n2": tainted}
    asyncio.run(b.nodesync.drifted())
    assert metrics.UNTAINTED._value.get() == 1
    b.nodes.store["kwok-n1"]["spec"]["taints"] = [contract.TAINT]
    asyncio.run(b.nodesync.drifted())
    assert metrics.UNTAINTED._value.get() == 0


def test_failed_nodes_are_read_after_the_job_was_seen() -> None:
    """22.05 CI: a node list cached a moment before the node went DOWN made the requeue it
    caused look like a plain requeue (SlurmJobRequeued instead of SlurmNodeFailed)."""
    import dataclasses
    import time

    up = NodeInfo(name="n1", state="IDLE", flags=frozenset(), cpus=4, real_memory_mb=1,
                  partitions=(), reason="", features=(), gres="")
    fake = FakeSlurm([up])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    asyncio.run(b.nodesync.refresh())  # a fresh cache, from before the failure
    fake._nodes = [dataclasses.replace(up, state="DOWN")]
    assert asyncio.run(b.nodesync.failed_nodes(read_after=time.monotonic())) == {"n1"}
    calls = fake.calls
    # a caller that looked at its job before that read shares it
    assert asyncio.run(b.nodesync.failed_nodes(read_after=0.0)) == {"n1"}
    assert fake.calls == calls


def test_a_pod_whose_admission_submit_got_no_answer_has_its_job_looked_for_by_name() -> None:
    """Fail-open admitted it while Slurm was away: slurmrestd may still make the webhook's job
    beside the one the binder submits; no Pod names that job, so it is looked for by name."""
    import time as _time

    from slurmgate.binder import controller
    b = Binder(object(), FakeSlurm([]))  # type: ignore[arg-type]
    pod = knode()  # any object with metadata will do for the handler's annotation read
    pod["metadata"]["annotations"] = {contract.A_JOB_STATE: contract.JOB_STATE_SUBMIT_PENDING}
    pod["metadata"]["namespace"] = "ns"
    before = _time.monotonic()
    b._on_pod("ns/p", None, pod)
    name = f"{contract.JOB_NAME_PREFIX}ns/{pod['metadata']['name']}"
    assert b.jobs.finder.wanted.until[name] >= before + controller.UNANSWERED_SUBMIT_WATCH


def test_a_pod_the_binder_gave_a_new_job_has_its_early_start_applied() -> None:
    """The binder resubmitted (or submitted a group's job): the Pod already exists and only
    its annotation names the new job. A start slurmctld pushed before the watch brought that
    annotation is applied once it does, as for a new Pod."""
    b = Binder(object(), FakeSlurm([]))  # type: ignore[arg-type]

    def gated(job_id: str) -> dict[str, Any]:
        return {"metadata": {"name": "p", "namespace": "ns", "uid": "u1", "annotations": {
            contract.A_CLAIM: "c1", contract.A_JOB_ID: job_id}},
            "spec": {"schedulingGates": [{"name": contract.GATE}]}}

    b._on_pod("ns/p", None, gated("5"))
    assert b.jobs.pushed(9, "started", ("n1",)) == "early"  # no Pod names 9 yet
    b._on_pod("ns/p", gated("5"), gated("9"))
    assert b.jobs.by_claim["c1"].job_id == 9 and b.jobs.by_claim["c1"].state == "RUNNING"


HELD = f"{contract.DRAIN_STOPPING_PREFIX} on kwok-n1 (ns/p)"


@pytest.mark.parametrize(("cordoned", "sn", "stopping", "want"), [
    # a Pod of ours still stops on a node that failed: keep Slurm off it
    (False, snode("DOWN", (), "e2e node failure"), ["ns/p"], "drain"),
    (False, snode("IDLE", ("NOT_RESPONDING",)), ["ns/p"], "drain"),
    # drained already (ours or an admin's): nothing more
    (False, snode("DOWN", ("DRAIN",), HELD), ["ns/p"], None),
    (False, snode("DOWN", ("DRAIN",), "admin: PSU"), ["ns/p"], None),
    # back (slurmd registered) while the Pod still stops: the hold stays
    (False, snode("IDLE", ("DRAIN",), HELD), ["ns/p"], None),
    # the Pod gone: resumed once the node is back, never while it is still DOWN
    (False, snode("IDLE", ("DRAIN",), HELD), [], "resume"),
    (False, snode("DOWN", ("DRAIN",), HELD), [], None),
    # any other end keeps the node in Slurm through KillWait or GraceTime: no hold
    (False, snode("IDLE"), ["ns/p"], None),
    (False, snode("ALLOCATED"), ["ns/p"], None),
    # cordoned as well: the cordon keeps it drained after the Pod is gone
    (True, snode("IDLE", ("DRAIN",), HELD), [], None),
])
def test_node_held_while_a_pod_stops_after_a_node_failure(
        cordoned: bool, sn: NodeInfo, stopping: list[str], want: str | None) -> None:
    assert node_action(knode(cordoned=cordoned), sn, stopping) == want


def test_the_hold_says_whose_pods_and_keeps_the_reason_it_replaces() -> None:
    why = drain_reason("kwok-n1", snode("DOWN", (), "e2e node failure"), ["ns/a", "ns/b", "x/c"])
    assert why.startswith(contract.DRAIN_STOPPING_PREFIX)
    assert "ns/a, ns/b and 1 more" in why and why.endswith("was: e2e node failure")
    assert drain_reason("kwok-n1", snode(), []) == OURS  # a cordon's, as before


class DrainingSlurm(FakeSlurm):
    def __init__(self, nodes: list[NodeInfo]) -> None:
        super().__init__(nodes)
        self.drained: list[tuple[str, str]] = []

    async def drain(self, node: str, reason: str) -> None:
        self.drained.append((node, reason))


class ResumingSlurm(DrainingSlurm):
    def __init__(self, nodes: list[NodeInfo]) -> None:
        super().__init__(nodes)
        self.resumed: list[str] = []

    async def resume(self, node: str) -> None:
        self.resumed.append(node)


def bound_pod() -> dict[str, Any]:
    """A Pod of ours running on kwok-n1, its job's claim c1, its Slurm node n1."""
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u",
                         "labels": {contract.MARK_LABEL: contract.MARK_VALUE},
                         "annotations": {contract.A_CLAIM: "c1", contract.A_SLURM_NODE: "n1"}},
            "spec": {"nodeName": "kwok-n1"}, "status": {"phase": "Running"}}


@pytest.mark.parametrize("ending", ["NODE_FAIL", "COMPLETING"])
def test_evicting_from_a_failed_node_drains_it_first(ending: str) -> None:
    """COMPLETING too: its slurmd gone, the job only ends when the node registers again, and
    Slurm frees the node at that moment (CI, in-cluster, 26.05: no hold, a job beside the Pod)."""
    fake = DrainingSlurm([snode("DOWN", (), "e2e node failure")])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    b.nodes.store = {"kwok-n1": knode()}
    pod = bound_pod()
    b.pods.store = {"ns/p": pod}
    ended = JobInfo(job_id=7, name="x", state=ending, reason="NodeDown", nodes=("n1",),
                    comment="", partition="k8s", submit_time=1, start_time=2, end_time=3)
    b.jobs.by_claim["c1"] = ended
    assert b._stopping_on("kwok-n1") == ["ns/p"]
    asyncio.run(b.nodesync.settle("kwok-n1"))
    assert fake.one_by_one == ["n1"]  # one node's read, not the site's list
    ((node, reason),) = fake.drained
    assert node == "n1" and reason.startswith(f"{contract.DRAIN_STOPPING_PREFIX} on kwok-n1")
    # while its placeholder runs there, the Pod is not "stopping" and nothing is held
    b.jobs.by_claim["c1"] = JobInfo(job_id=7, name="x", state="RUNNING", reason="",
                                    nodes=("n1",), comment="", partition="k8s",
                                    submit_time=1, start_time=2, end_time=0)
    assert b._stopping_on("kwok-n1") == []


def test_a_held_node_is_resumed_as_it_returns_once_its_pods_are_gone() -> None:
    fake = ResumingSlurm([snode("DOWN", ("DRAIN",), HELD)])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    b.nodes.store = {"kwok-n1": knode()}  # no Pod of ours left on it
    asyncio.run(b.nodesync._reconcile("kwok-n1", fresh=True))
    assert fake.resumed == [] and len(b.node_queue) == 0  # still DOWN: not yet, look again
    assert "kwok-n1" in b.nodesync._fresh  # the next look reads that node alone
    fake._nodes = [snode("IDLE", ("DRAIN",), HELD)]  # its slurmd registered
    fake.one_by_one.clear()
    asyncio.run(b.nodesync._reconcile("kwok-n1"))
    assert fake.one_by_one == ["n1"] and fake.calls == 0 and fake.resumed == ["n1"]


def test_the_drift_check_asks_for_stopping_pods_only_where_they_can_matter() -> None:
    """Asking per Node would walk our Pods once per Node on every check (Nodes x Pods)."""
    held_down = NodeInfo(name="n2", state="DOWN", flags=frozenset({"DRAIN"}), cpus=4,
                         real_memory_mb=1, partitions=(), reason=HELD, features=(), gres="")
    fake = FakeSlurm([snode(), held_down] + [
        NodeInfo(name=f"n{i}", state="ALLOCATED", flags=frozenset(), cpus=4, real_memory_mb=1,
                 partitions=(), reason="", features=(), gres="") for i in range(3, 100)])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    b.nodes.store = {f"kwok-n{i}": knode(f"kwok-n{i}", f"n{i}") for i in range(1, 100)}
    asked: list[str] = []
    b.nodesync.stopping = lambda k: asked.append(k) or []  # type: ignore[func-returns-value]
    asyncio.run(b.nodesync.drifted())
    assert asked == ["kwok-n2"]


def test_a_pod_leaving_a_node_we_hold_looks_at_that_slurm_node_alone() -> None:
    fake = ResumingSlurm([snode("DOWN", (), "e2e node failure")])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    b.nodes.store = {"kwok-n1": knode()}
    pod = bound_pod()
    b.pods.store = {"ns/p": pod}
    b._on_pod("ns/p", None, pod)  # arrives on a Node whose Slurm node is fine so far
    b._on_pod("ns/p", pod, None)
    assert len(b.node_queue) == 0  # left a node we do not hold: no read at all (it would
    # meet its job's cancel in slurmctld's locks)
    b.pods.store = {"ns/p": pod}
    asyncio.run(b.nodesync.settle("kwok-n1"))  # its job ended NODE_FAIL: held
    assert fake.drained and b.nodesync._holding == {"kwok-n1"}
    fake._nodes = [snode("IDLE", ("DRAIN",), HELD)]
    fake.one_by_one.clear()
    b.pods.store = {}
    b._on_pod("ns/p", pod, None)
    assert len(b.node_queue) == 1
    asyncio.run(b.nodesync._reconcile("kwok-n1"))
    # the node is read alone, not in the site's node list, and the hold it kept is let go
    assert fake.one_by_one == ["n1"] and fake.calls == 0 and fake.resumed == ["n1"]
    assert b.nodesync._holding == set()


def test_an_eviction_while_the_placeholder_runs_on_the_node_reads_no_node() -> None:
    """A preemption's eviction (the job still in its GraceTime on the node) needs no hold:
    a PodDisruptionBudget's refusals would otherwise read the node on every retry."""
    fake = DrainingSlurm([snode("ALLOCATED")])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    b.nodes.store = {"kwok-n1": knode()}
    pod = bound_pod()
    # a job on its way out keeps no node that failed: Slurm frees it as its slurmd registers
    for state, unheld in (("RUNNING", False), ("COMPLETING", True), ("NODE_FAIL", True)):
        b.jobs.by_claim["c1"] = JobInfo(job_id=7, name="x", state=state, reason="",
                                        nodes=("n1",), comment="", partition="k8s",
                                        submit_time=1, start_time=2, end_time=0)
        assert b._unheld(pod) is unheld, state


def test_a_failed_look_before_an_eviction_is_tried_again_before_the_pods_go(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node read or drain that fails (slurmctld busy with the failure) must not leave the
    node unheld while the evicted Pods stop: it is tried again at once."""
    from slurmgate.binder import nodesync
    monkeypatch.setattr(nodesync, "SETTLE_RETRY", 0.01)

    class Flaky(DrainingSlurm):
        fails = 2

        async def node(self, name: str) -> NodeInfo | None:
            if self.fails:
                self.fails -= 1
                raise TimeoutError("slurmrestd took too long")
            return await super().node(name)

    fake = Flaky([snode("DOWN", (), "e2e node failure")])
    b = Binder(object(), fake)  # type: ignore[arg-type]
    b.nodes.store = {"kwok-n1": knode()}
    b.pods.store = {"ns/p": bound_pod()}
    asyncio.run(b.nodesync.settle("kwok-n1"))
    assert len(fake.drained) == 1 and len(b.node_queue) == 0
    fake.fails = 5  # never answers: the evictions go on, and the Node is looked at soon
    fake.drained.clear()
    asyncio.run(b.nodesync.settle("kwok-n1"))
    assert fake.drained == [] and "kwok-n1" in b.nodesync._fresh
