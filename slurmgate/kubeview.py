"""Read-only, typed views of the Kubernetes objects slurmgate reads: a Pod and a Node as the API
server sends them (JSON dicts), field by field.

The API server leaves out empty fields and a webhook may see a Pod before defaulting, so every
level may be missing or null; a view reads each as empty (an empty string, dict, list or None),
once, here, instead of `(pod.get("metadata") or {}).get(...)` chains at every site. A view copies
nothing (the dict stays the truth, and what is written back is built from it), so wrapping a Pod
on every read costs one small object.

Why not a typed client's models (kubernetes, lightkube): slurmgate reads and writes these objects
as the JSON its aiohttp clients send and receive (watches, patches, AdmissionReviews);
converting every watched object into a model and back would cost a copy per event and a second
representation of the same Pod, for the dozen fields read here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmgate import contract

FINISHED_PHASES = ("Succeeded", "Failed")


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


class ObjectView:
    """What every object has: metadata."""

    __slots__ = ("raw",)

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        self.raw: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

    @property
    def meta(self) -> Mapping[str, Any]:
        return _map(self.raw.get("metadata"))

    @property
    def spec(self) -> Mapping[str, Any]:
        return _map(self.raw.get("spec"))

    @property
    def status(self) -> Mapping[str, Any]:
        return _map(self.raw.get("status"))

    @property
    def name(self) -> str:
        return str(self.meta.get("name") or "")

    @property
    def namespace(self) -> str:
        return str(self.meta.get("namespace") or "")

    @property
    def key(self) -> str:
        """namespace/name, the work queue's and the logs' name of a namespaced object."""
        return f"{self.meta.get('namespace')}/{self.meta.get('name')}"

    @property
    def uid(self) -> str:
        return str(self.meta.get("uid") or "")

    @property
    def resource_version(self) -> str:
        return str(self.meta.get("resourceVersion") or "")

    @property
    def labels(self) -> Mapping[str, str]:
        return _map(self.meta.get("labels"))

    @property
    def annotations(self) -> Mapping[str, str]:
        return _map(self.meta.get("annotations"))

    @property
    def owner_references(self) -> list[Mapping[str, Any]]:
        return [r for r in _list(self.meta.get("ownerReferences")) if isinstance(r, Mapping)]

    @property
    def deleting(self) -> bool:
        """The API server has been asked to delete it (deletionTimestamp set)."""
        return bool(self.meta.get("deletionTimestamp"))

    @property
    def created(self) -> str | None:
        """creationTimestamp as the API server wrote it (RFC 3339)."""
        return self.meta.get("creationTimestamp")

    @property
    def conditions(self) -> list[Mapping[str, Any]]:
        """status.conditions (a Pod's and a Node's alike)."""
        return [c for c in _list(self.status.get("conditions")) if isinstance(c, Mapping)]

    def condition(self, kind: str) -> Mapping[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == kind), None)


class PodView(ObjectView):
    __slots__ = ()

    @property
    def node_name(self) -> str:
        """The Node it is bound to ("" while unbound)."""
        return str(self.spec.get("nodeName") or "")

    @property
    def bound(self) -> bool:
        return bool(self.node_name)

    @property
    def gates(self) -> list[str]:
        return [str(g.get("name")) for g in _list(self.spec.get("schedulingGates"))
                if isinstance(g, Mapping)]

    @property
    def gated(self) -> bool:
        """It carries slurmgate's scheduling gate."""
        return contract.GATE in self.gates

    @property
    def phase(self) -> str | None:
        return self.status.get("phase")

    @property
    def finished(self) -> bool:
        return self.phase in FINISHED_PHASES

    @property
    def grace_seconds(self) -> int:
        """terminationGracePeriodSeconds (Kubernetes' default, 30, when unset)."""
        g = self.spec.get("terminationGracePeriodSeconds", 30)
        return g if isinstance(g, int) and not isinstance(g, bool) else 30



class NodeView(ObjectView):
    __slots__ = ()

    @property
    def unschedulable(self) -> bool:
        """Cordoned."""
        return bool(self.spec.get("unschedulable"))

    @property
    def slurm_node(self) -> str | None:
        """The Slurm node it is (label slurmgate.io/slurm-node); None: not a Slurm Node."""
        return self.labels.get(contract.NODE_LABEL)

    @property
    def taints(self) -> list[Mapping[str, Any]]:
        return [t for t in _list(self.spec.get("taints")) if isinstance(t, Mapping)]

    @property
    def allocatable(self) -> Mapping[str, str]:
        return _map(self.status.get("allocatable"))

    @property
    def ready(self) -> str:
        """The Ready condition's status: "True", "False" or "Unknown" (also when not said)."""
        ready = self.condition("Ready")
        return str(ready.get("status")) if ready is not None else "Unknown"
