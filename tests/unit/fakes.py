"""Small fakes for unit tests only (the e2e suite uses real Slurm and kube-apiserver)."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from slurmgate import contract
from slurmgate.nodemap import NodeMap
from slurmgate.slurm import JobSpec, NodeInfo, PartitionInfo, SlurmError


class FakeSubmit:
    def __init__(self, fail: str | None = None) -> None:
        self.specs: list[JobSpec] = []
        self.fail = fail

    async def __call__(self, spec: JobSpec) -> int:
        if self.fail:
            raise SlurmError(self.fail)
        self.specs.append(spec)
        return 100 + len(self.specs)


def node_map(n: int = 2, node_mib: int = 16000, slurmd: str = "1Gi") -> NodeMap:
    snodes = [NodeInfo(name=f"n{i}", state="IDLE", flags=frozenset(), cpus=8,
                       real_memory_mb=node_mib, partitions=("k8s", "hpc"), reason="",
                       features=(), gres="") for i in range(1, n + 1)]
    parts = [PartitionInfo("k8s", tuple(s.name for s in snodes), True, None, "UP"),
             PartitionInfo("hpc", tuple(s.name for s in snodes), False, None, "UP")]
    knodes = [{"metadata": {"name": f"kwok-n{i}", "labels": {contract.NODE_LABEL: f"n{i}"}},
               "status": {"allocatable": {"cpu": "8", "memory": f"{node_mib}Mi"}}}
              for i in range(1, n + 1)]
    pods = [{"metadata": {"name": f"slurmd-n{i}"}, "spec": {
        "nodeName": f"kwok-n{i}",
        "containers": [{"name": "slurmd", "resources": {"requests": {"memory": slurmd,
                                                                     "cpu": "500m"}}}]},
             "status": {"phase": "Running"}} for i in range(1, n + 1)]
    return NodeMap.build(snodes, parts, knodes, pods)


def review(pod: dict[str, Any], uid: str | None = None, dry_run: bool = False,
           operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid or str(uuid.uuid4()),
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": "default", "operation": operation, "dryRun": dry_run,
                        "object": copy.deepcopy(pod)}}


def marked_pod(memory: str = "1Gi", **ann: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default",
                         "labels": {contract.MARK_LABEL: contract.MARK_VALUE},
                         "annotations": dict(ann)},
            "spec": {"containers": [{"name": "c", "image": "x",
                                     "resources": {"requests": {"memory": memory}}}]}}
