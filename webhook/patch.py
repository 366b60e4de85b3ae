"""The JSON Patch that gates a marked Pod and records its Slurm job."""

from __future__ import annotations

from typing import Any

from slurmgate import contract
from slurmgate.kube import pointer_escape


def gate_pod(pod: dict[str, Any], annotations: dict[str, str],
             drop: tuple[str, ...] = (), labels: dict[str, str] | None = None,
             grace: int | None = None) -> list[dict[str, Any]]:
    """Ops that add our gate (once), set our schedulerName, tolerate the Slurm Nodes' taint
    (once), write `annotations` and `labels`, drop `drop`, and set
    terminationGracePeriodSeconds to `grace` (webhook/grace.py) unless it is None.

    Built directly (no deep copy and diff: this is on the admission hot path), and right
    whether the Pod already has gates, annotations, or neither.
    """
    ops: list[dict[str, Any]] = []
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        ops.append({"op": "add", "path": "/metadata", "value": {}})
        meta = {}
    have = meta.get("annotations")
    if not isinstance(have, dict):
        ops.append({"op": "add", "path": "/metadata/annotations",
                    "value": {k: v for k, v in annotations.items() if v}})
    else:
        for key in drop:
            if key in have and key not in annotations:
                ops.append({"op": "remove", "path": f"/metadata/annotations/{pointer_escape(key)}"})
        for key, value in annotations.items():
            # "" is how our status says "none": not written where the Pod has no such key
            if have.get(key) != value and (value or key in have):
                ops.append({"op": "add", "path": f"/metadata/annotations/{pointer_escape(key)}",
                            "value": value})
    if labels:
        have_labels = meta.get("labels")
        if not isinstance(have_labels, dict):
            ops.append({"op": "add", "path": "/metadata/labels", "value": dict(labels)})
        else:
            ops.extend({"op": "add", "path": f"/metadata/labels/{pointer_escape(k)}", "value": v}
                       for k, v in labels.items() if have_labels.get(k) != v)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        ops.append({"op": "add", "path": "/spec", "value": {}})
        spec = {}
    if grace is not None and spec.get("terminationGracePeriodSeconds") != grace:
        # "add" replaces a member that exists (RFC 6902), as it must: the apiserver set 30
        ops.append({"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": grace})
    if spec.get("schedulerName") != contract.SCHEDULER_NAME:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": contract.SCHEDULER_NAME})
    gates = spec.get("schedulingGates")
    if not isinstance(gates, list):
        ops.append({"op": "add", "path": "/spec/schedulingGates",
                    "value": [{"name": contract.GATE}]})
    elif not any(isinstance(g, dict) and g.get("name") == contract.GATE for g in gates):
        ops.append({"op": "add", "path": "/spec/schedulingGates/-",
                    "value": {"name": contract.GATE}})
    tolerations = spec.get("tolerations")
    if not isinstance(tolerations, list):
        ops.append({"op": "add", "path": "/spec/tolerations", "value": [contract.TOLERATION]})
    elif not any(_covers(t) for t in tolerations):
        ops.append({"op": "add", "path": "/spec/tolerations/-", "value": contract.TOLERATION})
    return ops


def _covers(t: Any) -> bool:
    """The Pod already tolerates our taint (it says so itself, or tolerates everything)."""
    if not isinstance(t, dict) or t.get("effect") not in (None, "", contract.TAINT_EFFECT):
        return False
    if t.get("key") in (None, ""):
        return t.get("operator") == "Exists"
    return t.get("key") == contract.TAINT_KEY and (
        t.get("operator") == "Exists" or t.get("value") == contract.TAINT["value"]) and (
        t.get("tolerationSeconds") is None)
