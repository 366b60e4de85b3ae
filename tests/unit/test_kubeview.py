"""The typed views of Pods and Nodes: every missing, null or malformed level reads as empty (what
the `.get(...) or {}` chains they replace did), and the chains do not come back."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from slurmgate import contract
from slurmgate.kubeview import NodeView, ObjectView, PodView

ROOT = Path(__file__).resolve().parents[2]


def pod() -> dict:
    return {"metadata": {"name": "w", "namespace": "ml", "uid": "u1", "resourceVersion": "7",
                         "labels": {"a": "b"}, "annotations": {contract.A_JOB_ID: "3"},
                         "creationTimestamp": "2026-12-07T03:00:00Z",
                         "deletionTimestamp": "2026-12-07T03:05:00Z",
                         "ownerReferences": [{"kind": "Job", "name": "j"}, "junk"]},
            "spec": {"nodeName": "kwok-n1", "terminationGracePeriodSeconds": 90,
                     "schedulingGates": [{"name": contract.GATE}, {"name": "other"}]},
            "status": {"phase": "Running", "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": contract.COND_ALLOCATED, "status": "True"}]}}


def test_a_pod_reads_as_its_fields() -> None:
    v = PodView(pod())
    assert (v.name, v.namespace, v.key, v.uid, v.resource_version) == ("w", "ml", "ml/w", "u1",
                                                                      "7")
    assert v.labels == {"a": "b"} and v.annotations == {contract.A_JOB_ID: "3"}
    assert v.created == "2026-12-07T03:00:00Z" and v.deleting
    assert v.owner_references == [{"kind": "Job", "name": "j"}]  # "junk" is no reference
    assert (v.node_name, v.bound, v.gated, v.gates) == ("kwok-n1", True, True,
                                                        [contract.GATE, "other"])
    assert (v.phase, v.finished, v.grace_seconds) == ("Running", False, 90)
    assert v.condition(contract.COND_ALLOCATED) == {"type": contract.COND_ALLOCATED,
                                                    "status": "True"}
    assert v.condition("Nope") is None


@pytest.mark.parametrize("raw", [
    {}, None, "a string", {"metadata": None, "spec": None, "status": None},
    {"metadata": {"annotations": None, "labels": [], "ownerReferences": {}},
     "spec": {"schedulingGates": None, "terminationGracePeriodSeconds": True},
     "status": {"conditions": "x"}},
])
def test_missing_null_or_malformed_levels_read_as_empty(raw: object) -> None:
    v = PodView(raw)  # type: ignore[arg-type]
    assert (v.name, v.namespace, v.uid, v.node_name, v.phase) == ("", "", "", "", None)
    assert (v.labels, v.annotations, v.owner_references, v.gates, v.conditions) == (
        {}, {}, [], [], [])
    assert not (v.bound or v.gated or v.deleting or v.finished)
    assert v.grace_seconds == 30  # Kubernetes' default; a bool is no number of seconds


def test_finished_phases() -> None:
    for phase, done in (("Succeeded", True), ("Failed", True), ("Pending", False)):
        assert PodView({"status": {"phase": phase}}).finished is done


def test_a_node_reads_as_its_fields() -> None:
    n = NodeView({"metadata": {"name": "kwok-n1", "labels": {contract.NODE_LABEL: "n1"}},
                  "spec": {"unschedulable": True, "taints": [{"key": contract.TAINT_KEY}, 3]},
                  "status": {"allocatable": {"cpu": "4"},
                             "conditions": [{"type": "Ready", "status": "False"}]}})
    assert (n.name, n.slurm_node, n.unschedulable, n.ready) == ("kwok-n1", "n1", True, "False")
    assert n.taints == [{"key": contract.TAINT_KEY}] and n.allocatable == {"cpu": "4"}
    bare = NodeView({"metadata": {"name": "x"}})
    assert (bare.slurm_node, bare.unschedulable, bare.ready, bare.taints) == (
        None, False, "Unknown", [])
    assert ObjectView(None).spec == {}


CHAIN = re.compile(r'\.get\("(?:metadata|spec|status)"\) or \{\}')
# these read input they validate (a malformation gets its own denial, which a view would hide)
# or objects that are no Pod or Node (a List's metadata, a Lease)
VALIDATING = {"slurmgate/podrequest.py", "slurmgate/kube.py", "binder/leader.py",
              "webhook/decide.py", "webhook/admission.py"}


def test_pods_and_nodes_are_read_through_the_views() -> None:
    found = [f"{p.relative_to(ROOT)}:{i}"
             for top in ("slurmgate", "binder", "webhook", "certs")
             for p in sorted((ROOT / top).rglob("*.py")) if not p.is_symlink()
             and not any((ROOT / q).is_symlink() for q in p.relative_to(ROOT).parents)
             and str(p.relative_to(ROOT)) not in VALIDATING | {"slurmgate/kubeview.py"}
             for i, line in enumerate(p.read_text().splitlines(), 1) if CHAIN.search(line)]
    assert not found, f"read these through slurmgate.kubeview (PodView, NodeView): {found}"
