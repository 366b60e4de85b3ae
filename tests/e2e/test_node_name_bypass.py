"""A Pod created with `spec.nodeName` already set bypasses every scheduler (no gate, no
Binding): here it names the Node of a Slurm node that runs an ordinary Slurm job (issue 30).

- A plain (unmarked) Pod never reaches our webhook (its objectSelector), so nothing of ours
  stops it; the Node's taint does. docs/operator-guide.md "Slurm's Nodes are tainted": every Slurm
  Node
  carries `slurmgate.io/slurm-managed=true:NoExecute` (the local cluster taints its kwok
  Nodes, cluster/local.py _node_objects), and "a plain Pod already running when the taint is
  added is evicted by Kubernetes' taint manager (NoExecute, Event `TaintManagerEviction`)".
  A Pod bound at creation to a Node that already has the taint is the same case for the taint
  eviction controller of kube-controller-manager (run here with `--controllers=*`): it deletes
  every Pod on the Node that does not tolerate a NoExecute taint, at once when no
  tolerationSeconds applies, with the Event "Marking for deletion Pod <ns>/<name>".
  kwok, standing in for the kubelet, sets such a Pod Running and removes it once deleted.
- A marked Pod is refused at admission before anything is submitted
  (webhook/admission.py _admit_marked: `NodeNameSet`, "spec.nodeName is set: Slurm chooses
  the Node for this Pod; remove spec.nodeName or the slurmgate.io/scheduler label").

Either way the Slurm job keeps its node, untouched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract
from tests.e2e.conftest import Kubectl, marked_pod, slurm_cli, squeue, wait_until
from tests.e2e.faultkit import scancel_quiet

pytestmark = pytest.mark.e2e


@pytest.fixture
def slurm_held(local: Local, ns: str) -> Iterator[tuple[str, str]]:
    """(job id, Slurm node) of an ordinary batch job in partition hpc, RUNNING on one node;
    cancelled afterwards (before `ns` waits for an empty Slurm)."""
    out = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "hpc",
                    "--exclusive", "-N1", "--mem=1000", "-J", "hpc-held", "--wrap", "sleep 600")
    job = out.strip().split(";")[0]
    try:
        node = wait_until("hpc job RUNNING", lambda: next((
            r["nodes"] for r in squeue(local) if r["id"] == job and r["state"] == "RUNNING"),
            ""), 60)
        yield job, node
    finally:
        scancel_quiet(local, job)


def _still_running(local: Local, job: str, slurm_node: str) -> None:
    (row,) = [r for r in squeue(local) if r["id"] == job]
    assert (row["state"], row["nodes"]) == ("RUNNING", slurm_node), row


def _pinned(pod: dict[str, Any], node: str) -> dict[str, Any]:
    pod["spec"]["nodeName"] = node
    return pod


def _gone(admin: Kubectl, ns: str, name: str) -> bool:
    p = admin.run("get", "pod", name, "-n", ns, "-o", "json", check=False)
    if p.returncode == 0:
        return False
    assert "NotFound" in p.stderr, p.stderr  # not an API server away: the Pod is gone
    return True


def test_plain_pod_with_node_name_on_a_slurm_node_is_evicted_by_the_taint(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str,
        slurm_held: tuple[str, str]) -> None:
    job, slurm_node = slurm_held
    node = k8s_node_name(slurm_node)
    # by key, value and effect: a taint put back with `kubectl taint` (test_slurm_nodes) may
    # carry more fields (timeAdded) than contract.TAINT
    assert any({k: t.get(k) for k in contract.TAINT} == contract.TAINT
               for t in admin.get("node", node)["spec"].get("taints") or [])
    plain = marked_pod("bypass")
    plain["metadata"]["labels"] = {"app": "bypass"}  # not ours: the webhook never sees it
    created = json.loads(admin.apply(_pinned(plain, node), "-n", ns, "-o", "json").stdout)
    # stored bound, as asked: no gate, no scheduler, no toleration of the Slurm taint
    assert created["spec"]["nodeName"] == node
    assert not created["spec"].get("schedulingGates")
    assert not any(t.get("key") in (contract.TAINT_KEY, None)
                   for t in created["spec"].get("tolerations") or []), created["spec"]
    wait_until("the Pod deleted from the Slurm node's Node", lambda: _gone(
        admin, ns, "bypass"), 60)
    # the controller may also say "Cancelling deletion of Pod ..." (same reason) when a status
    # update of the Pod reached it while its delete was in flight: the marking is what counts
    marking = f"Marking for deletion Pod {ns}/bypass"
    wait_until("a TaintManagerEviction Event marking the Pod for deletion", lambda: marking in {
        e["message"] for e in admin.items("events", ns=ns)
        if e["reason"] == "TaintManagerEviction" and e["involvedObject"]["name"] == "bypass"},
        15)
    _still_running(local, job, slurm_node)


def test_marked_pod_with_node_name_is_refused_before_any_submit(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str,
        slurm_held: tuple[str, str]) -> None:
    job, slurm_node = slurm_held
    p = admin.apply(_pinned(marked_pod("pinned"), k8s_node_name(slurm_node)), "-n", ns,
                    check=False)
    assert p.returncode != 0, p.stdout
    assert "NodeNameSet" in p.stderr, p.stderr
    assert ("slurmgate: spec.nodeName is set: Slurm chooses the Node for this Pod; remove "
            "spec.nodeName or the slurmgate.io/scheduler label") in p.stderr, p.stderr
    assert _gone(admin, ns, "pinned")
    # refused before the submit: no placeholder job for it, and the batch job kept its node
    assert not [r for r in squeue(local) if f"pod={ns}/" in r["comment"]]
    _still_running(local, job, slurm_node)
