"""Which Kubernetes Node is which Slurm node, and what each can give a Pod beside its slurmd."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from slurmgate import quantity
from slurmgate.kubeview import NodeView, PodView
from slurmgate.podrequest import GPU_RESOURCES, effective_requests
from slurmgate.slurm import NodeInfo, PartitionInfo

# One gres of a node's list: name[:type]:count, optionally followed by "(S:0-1)" (sockets) or
# "(IDX:...)"; every release lists them comma-separated, as in "gpu:a100:4(S:0),gpu:v100:2".
_GRES_ITEM = re.compile(r"^(?P<name>[^:()]+)(?::(?P<type>[^:()]+))?:(?P<count>\d+)(?:\(.*\))?$")


def gpus_by_type(gres: str | None) -> dict[str, int]:
    """GPUs of a Slurm node's gres string, by type ("" = untyped): {"a100": 4}."""
    out: dict[str, int] = {}
    depth, item, items = 0, "", []
    for ch in gres or "":  # split on the commas outside parentheses: "(S:0,1)" is one item
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            items.append(item)
            item = ""
        else:
            item += ch
    items.append(item)
    for raw in items:
        m = _GRES_ITEM.match(raw.strip())
        if m and m["name"] == "gpu":
            kind = m["type"] or ""
            out[kind] = out.get(kind, 0) + int(m["count"])
    return out


@dataclass(frozen=True)
class NodeCapacity:
    slurm_node: str
    k8s_node: str
    memory_mib: int  # what a Pod may request: min(Slurm RealMemory, allocatable - slurmd)
    cpus: int
    gpus: int
    node_memory_mib: int  # the Node's allocatable memory
    slurmd_memory_mib: int  # the slurmd container's request on that Node
    partitions: tuple[str, ...]
    unschedulable: bool
    # Slurm's GPUs by gres type ("" = untyped), each capped by the Node's allocatable GPUs
    gpu_types: tuple[tuple[str, int], ...] = ()

    def gpus_of(self, kind: str | None) -> int:
        """GPUs a Pod asking for type `kind` (None = any) can have here."""
        if kind is None:
            return self.gpus
        return next((n for t, n in self.gpu_types if t == kind), 0)


@dataclass
class NodeMap:
    nodes: dict[str, NodeCapacity] = field(default_factory=dict)  # by Slurm node name
    partitions: dict[str, PartitionInfo] = field(default_factory=dict)
    by_k8s: dict[str, str] = field(default_factory=dict)  # k8s Node -> Slurm node

    @property
    def default_partition(self) -> str | None:
        return next((p.name for p in self.partitions.values() if p.default), None)

    def k8s_node_for(self, slurm_node: str) -> str | None:
        cap = self.nodes.get(slurm_node)
        return cap.k8s_node if cap else None

    def in_partition(self, partition: str | None) -> list[NodeCapacity]:
        name = partition or self.default_partition
        if name is None:
            return list(self.nodes.values())
        part = self.partitions.get(name)
        members = set(part.nodes) if part else set()
        return [c for c in self.nodes.values() if c.slurm_node in members]

    @classmethod
    def build(cls, slurm_nodes: Iterable[NodeInfo], partitions: Iterable[PartitionInfo],
              k8s_nodes: Iterable[dict[str, Any]],
              slurmd_pods: Iterable[dict[str, Any]]) -> NodeMap:
        by_label: dict[str, dict[str, Any]] = {}
        for n in k8s_nodes:
            label = NodeView(n).slurm_node
            if label:
                by_label[label] = n
        kept: dict[str, tuple[int, int]] = {}  # k8s node -> (mib, millicpu) kept for slurmd
        for p in slurmd_pods:
            pv = PodView(p)
            node = pv.node_name
            if not node or pv.finished:
                continue
            req = effective_requests(p)
            mib, mcpu = kept.get(node, (0, 0))
            kept[node] = (mib + quantity.to_mib_ceil(req.get("memory", Fraction(0))),
                          mcpu + int(req.get("cpu", Fraction(0)) * 1000))
        out = cls(partitions={p.name: p for p in partitions})
        for sn in slurm_nodes:
            kn = by_label.get(sn.name)
            if kn is None:
                continue  # a Slurm node without a Kubernetes Node can't run Pods
            kv = NodeView(kn)
            name, alloc = kv.name, kv.allocatable
            node_mib = quantity.to_mib_ceil(quantity.parse(alloc.get("memory", "0")))
            node_mcpu = int(quantity.parse(alloc.get("cpu", "0")) * 1000)
            k8s_gpus = sum(int(quantity.parse(alloc.get(g, "0"))) for g in GPU_RESOURCES)
            by_type = gpus_by_type(sn.gres)
            slurm_gpus = sum(by_type.values())
            sd_mib, sd_mcpu = kept.get(name, (0, 0))
            out.nodes[sn.name] = NodeCapacity(
                slurm_node=sn.name, k8s_node=name,
                memory_mib=max(0, min(sn.real_memory_mb, node_mib - sd_mib)),
                cpus=max(0, min(sn.cpus, (node_mcpu - sd_mcpu) // 1000)),
                gpus=min(slurm_gpus, k8s_gpus),
                node_memory_mib=node_mib, slurmd_memory_mib=sd_mib,
                partitions=sn.partitions,
                unschedulable=kv.unschedulable,
                gpu_types=tuple(sorted((t, min(n, k8s_gpus)) for t, n in by_type.items() if t)),
            )
            out.by_k8s[name] = sn.name
        return out
