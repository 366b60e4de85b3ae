"""Every Pod respects Slurm's Nodes, and users see Slurm's decision in kubectl.

- Slurm's Nodes carry the slurmgate.io/slurm-managed taint (NoExecute): a plain Pod never lands
  beside a Slurm job, and one already running when the taint is added is evicted.
- A gated Pod shows the SlurmAllocated condition (False with Slurm's reason, True once bound);
  `kubectl describe` lists it and `kubectl wait` waits on it.
- The eviction Event says what ended the job: time limit, scancel, node failure.
"""

from __future__ import annotations

from typing import Any

import pytest

from cluster import slurm_faults
from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract, reasons
from tests.e2e.conftest import (
    Kubectl,
    WaitTimeout,
    job_id_of,
    marked_pod,
    slurm_cli,
    squeue,
    wait_until,
)
from tests.e2e.faultkit import events_of, filler_job, pods, wait_bound, wait_gated_pending

pytestmark = pytest.mark.e2e
TAINT = f"{contract.TAINT_KEY}={contract.TAINT['value']}:{contract.TAINT_EFFECT}"


def plain_pod(name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def condition(admin: Kubectl, ns: str, name: str) -> dict[str, Any] | None:
    for c in admin.get("pod", name, ns)["status"].get("conditions") or []:
        if c["type"] == contract.COND_ALLOCATED:
            return dict(c)
    return None


def job_of(admin: Kubectl, ns: str, name: str) -> str:
    return job_id_of(admin, name, ns)


def test_plain_pod_never_lands_on_a_slurm_node(local: Local, admin: Kubectl, bridge: Bridge,
                                               ns: str) -> None:
    nodes = local.slurm.nodes
    for name in (k8s_node_name(n) for n in nodes):
        taints = admin.get("node", name)["spec"].get("taints") or []
        assert contract.TAINT in taints, (name, taints)
    # every Node taken by Slurm: placeholders on all but one, a real sbatch job on the last
    for i in range(len(nodes) - 1):
        admin.apply(marked_pod(f"p{i}"), "-n", ns)
    for i in range(len(nodes) - 1):
        wait_bound(admin, ns, f"p{i}")
    filler = filler_job(local)
    # it asks for Slurm's Nodes (the in-cluster mode also has a plain real Node, where a plain
    # Pod rightly goes): only the taint can keep it off them
    wants_slurm_nodes = plain_pod("plain")
    wants_slurm_nodes["spec"]["affinity"] = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": contract.NODE_LABEL, "operator": "Exists"}]}]}}}
    admin.apply(wants_slurm_nodes, "-n", ns)
    failed = wait_until("the scheduler says why the plain Pod waits", lambda: [
        e for e in events_of(admin, ns, "FailedScheduling")
        if e["involvedObject"]["name"] == "plain"], 60)
    # kube-scheduler 1.32 does not name the key: "4 node(s) had untolerated taint(s)"
    assert f"{len(nodes)} node(s) had untolerated taint" in failed[0]["message"], failed[0]
    # A Node frees up: a marked Pod gets it through Slurm; the plain Pod still gets nothing.
    slurm_cli(local, "scancel", filler)
    admin.apply(marked_pod("next"), "-n", ns)
    freed = wait_bound(admin, ns, "next")
    plain = admin.get("pod", "plain", ns)
    assert not plain["spec"].get("nodeName"), (plain["spec"].get("nodeName"), freed)
    assert plain["status"].get("phase") == "Pending"


def test_plain_pod_running_when_the_taint_is_added_is_evicted(local: Local, admin: Kubectl,
                                                              bridge: Bridge, ns: str) -> None:
    node = k8s_node_name(local.slurm.nodes[-1])
    admin.run("taint", "nodes", node, f"{contract.TAINT_KEY}-")
    try:
        admin.apply(plain_pod("early", node), "-n", ns)
        wait_until("the plain Pod Running on the untainted Node", lambda: admin.get(
            "pod", "early", ns)["status"].get("phase") == "Running", 60)
    finally:
        admin.run("taint", "nodes", node, TAINT, "--overwrite")
    wait_until("the plain Pod evicted by the taint (NoExecute)",
               lambda: "early" not in pods(admin, ns), 60)
    assert any(e["involvedObject"]["name"] == "early" for e in events_of(
        admin, ns, "TaintManagerEviction")), "no TaintManagerEviction Event"


def test_gated_pod_shows_slurms_decision_as_a_condition(local: Local, admin: Kubectl,
                                                        bridge: Bridge, ns: str) -> None:
    n = len(local.slurm.nodes)
    for i in range(n):
        admin.apply(marked_pod(f"p{i}"), "-n", ns)
    for i in range(n):
        wait_bound(admin, ns, f"p{i}")
    admin.apply(marked_pod("waiting"), "-n", ns)
    wait_gated_pending(admin, ns, "waiting")
    cond = wait_until("the SlurmAllocated condition, False", lambda: (
        c := condition(admin, ns, "waiting")) and c["status"] == "False" and c, 30)
    job_id = job_of(admin, ns, "waiting")
    assert cond["reason"] in ("Resources", "Priority", "Pending"), cond
    assert f"Slurm job {job_id}" in cond["message"] and contract.GATE in cond["message"]
    describe = admin.run("describe", "pod", "waiting", "-n", ns).stdout
    conditions = describe.split("Conditions:", 1)[1].split("Volumes:", 1)[0]
    assert any(line.split()[:2] == [contract.COND_ALLOCATED, "False"]
               for line in conditions.splitlines()), conditions
    pending = [e for e in events_of(admin, ns, "SlurmJobPending")
               if e["involvedObject"]["name"] == "waiting"]
    assert pending and contract.GATE in pending[-1]["message"], pending
    # the bound Pods say True; freeing a Node lets `kubectl wait` return for the waiting one
    assert (condition(admin, ns, "p0") or {}).get("status") == "True"
    admin.run("delete", "pod", "p0", "-n", ns, "--wait=false")
    admin.run("wait", f"--for=condition={contract.COND_ALLOCATED}", "pod/waiting", "-n", ns,
              "--timeout=90s")
    cond = condition(admin, ns, "waiting")
    assert cond is not None and cond["reason"] == reasons.COND_REASON_ALLOCATED, cond
    node = admin.get("pod", "waiting", ns)["spec"]["nodeName"]
    assert node in cond["message"], cond


def _eviction_reasons(admin: Kubectl, ns: str, name: str) -> list[str]:
    return [e["reason"] for e in admin.items("events", ns=ns)
            if e["involvedObject"]["name"] == name and e["type"] == "Warning"]


def test_time_limit_and_scancel_named_in_the_eviction(local: Local, admin: Kubectl,
                                                      bridge: Bridge, ns: str) -> None:
    admin.apply(marked_pod("timed", annotations={contract.A_TIME_LIMIT: "1"}), "-n", ns)
    admin.apply(marked_pod("cancelled"), "-n", ns)
    wait_bound(admin, ns, "timed")
    wait_bound(admin, ns, "cancelled")
    slurm_cli(local, "scancel", job_of(admin, ns, "cancelled"))
    wait_until("the scancelled Pod evicted as SlurmJobCancelled", lambda: "SlurmJobCancelled"
               in _eviction_reasons(admin, ns, "cancelled"), 60)
    # Slurm enforces a 1-minute limit on its next time check (about 90 s here)
    wait_until("the timed-out Pod evicted as SlurmJobTimeLimit", lambda: "SlurmJobTimeLimit"
               in _eviction_reasons(admin, ns, "timed"), 180, interval=1.0)
    for name in ("timed", "cancelled"):
        assert "SlurmJobEnded" not in _eviction_reasons(admin, ns, name)
        wait_until(f"{name} gone", lambda n=name: n not in pods(admin, ns), 60)


def test_node_failure_named_in_the_eviction(local: Local, admin: Kubectl, bridge: Bridge,
                                            ns: str) -> None:
    """The node dies (its slurmd killed) and is marked DOWN, as a health check would. 24.11+ end
    the job NODE_FAIL; 22.05 requeues it (it ignores requeue=false): both say SlurmNodeFailed."""
    admin.apply(marked_pod("victim"), "-n", ns)
    node = wait_bound(admin, ns, "victim")
    slurm_node = admin.get("pod", "victim", ns)["metadata"]["annotations"][contract.A_SLURM_NODE]
    assert node == k8s_node_name(slurm_node)
    job_id = job_of(admin, ns, "victim")
    # The binder may bind on the start push, which slurmctld sends from its prolog before
    # slurmd has launched the job: the node is failed only once the job really runs there.
    wait_until("the job RUNNING on its node", lambda: any(
        r["id"] == job_id and r["state"] == "RUNNING" and r["nodes"] == slurm_node
        for r in squeue(local)), 30)
    daemon = f"slurmd-{slurm_node}"
    slurm_faults.kill_daemon(local.slurm.run_dir, daemon)
    try:
        slurm_cli(local, "scontrol", "update", f"nodename={slurm_node}", "state=down",
                  "reason=e2e node failure")
        try:
            wait_until("the Pod evicted as SlurmNodeFailed", lambda: "SlurmNodeFailed"
                       in _eviction_reasons(admin, ns, "victim"), 60)
        except WaitTimeout as e:  # which reason it was evicted with, if not this one
            raise AssertionError(f"{e}; Warning Events: {_eviction_reasons(admin, ns, 'victim')}"
                                 ) from None
        # the job does not come back for a Pod that is gone
        wait_until("the job gone from the queue", lambda: not any(
            r["id"] == job_id and r["state"] in ("PENDING", "RUNNING")
            for r in squeue(local)), 30)
    finally:
        local.slurm.pids[daemon] = slurm_faults.start_daemon(local.slurm.run_dir, daemon)
