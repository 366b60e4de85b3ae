"""The JSON Patch that gates a marked Pod and records its Slurm job."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch

from slurmgate import contract


def gate_pod(pod: dict[str, Any], annotations: dict[str, str],
             drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Ops that add our gate (once), set our schedulerName, write `annotations`, drop `drop`.

    Built by diffing against a mutated copy, so it is right whether the Pod already has gates,
    annotations, or neither.
    """
    mutated = copy.deepcopy(pod)
    meta = mutated.setdefault("metadata", {})
    if not isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {}
    for key in drop:
        meta["annotations"].pop(key, None)
    meta["annotations"].update(annotations)
    spec = mutated.setdefault("spec", {})
    spec["schedulerName"] = contract.SCHEDULER_NAME
    gates = spec.get("schedulingGates")
    if not isinstance(gates, list):
        gates = spec["schedulingGates"] = []
    if not any(isinstance(g, dict) and g.get("name") == contract.GATE for g in gates):
        gates.append({"name": contract.GATE})
    return list(jsonpatch.make_patch(pod, mutated))
