"""Does a Pod fit on at least one Slurm node beside that Node's slurmd container?"""

from __future__ import annotations

from dataclasses import dataclass

from slurmgate import contract, reasons
from slurmgate.nodemap import NodeMap
from slurmgate.podrequest import PodRequest


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str = ""  # CamelCase, for the denials metric and the Status reason
    message: str = ""
    warnings: tuple[str, ...] = ()


def check_fit(req: PodRequest, nodes: NodeMap) -> Verdict:
    partition = req.partition or nodes.default_partition
    if partition is not None and partition not in nodes.partitions:
        known = ", ".join(sorted(nodes.partitions)) or "none"
        return Verdict(False, reasons.DENY_UNKNOWN_PARTITION,
                       f"partition {partition!r} does not exist in Slurm (known: {known})")
    candidates = nodes.in_partition(partition)
    if not candidates:
        return Verdict(False, reasons.DENY_NO_SLURM_NODES,
                       f"partition {partition!r} has no Slurm node with a Kubernetes Node "
                       f"(label the Nodes running slurmd)")
    warnings = tuple(
        f"Node {c.k8s_node}: slurmd requests {c.slurmd_memory_mib}Mi, more than half of the "
        f"Node's {c.node_memory_mib}Mi"
        for c in candidates if c.slurmd_memory_mib * 2 > c.node_memory_mib
    )
    kind = req.gpu_type
    if kind is not None and not any(c.gpus_of(kind) for c in candidates):
        types = sorted({t for c in candidates for t, n in c.gpu_types if n})
        return Verdict(False, reasons.DENY_UNKNOWN_GPU_TYPE,
                       f"GPU type {kind!r} ({contract.A_GPU_TYPE}) is on no Slurm node of "
                       f"partition {partition!r} with a Kubernetes Node that has GPUs (types "
                       f"there: {', '.join(types) or 'none'})", warnings)
    fitting = [c for c in candidates if c.memory_mib >= req.memory_mib and c.cpus >= req.cpus
               and c.gpus_of(kind) >= req.gpus]
    if fitting:
        return Verdict(True, warnings=warnings)
    best_mem = max(candidates, key=lambda c: c.memory_mib)
    if all(c.memory_mib < req.memory_mib for c in candidates):
        return Verdict(
            False, reasons.DENY_MEMORY_TOO_LARGE,
            f"memory request {req.memory_mib}Mi fits on no Slurm node of partition "
            f"{partition!r}: the most any Node can give beside its slurmd container is "
            f"{best_mem.memory_mib}Mi (Node {best_mem.k8s_node}: {best_mem.node_memory_mib}Mi "
            f"allocatable, slurmd requests {best_mem.slurmd_memory_mib}Mi)", warnings)
    if all(c.cpus < req.cpus for c in candidates):
        most = max(c.cpus for c in candidates)
        return Verdict(False, reasons.DENY_CPU_TOO_LARGE,
                       f"cpu request {req.cpus} fits on no Slurm node of partition "
                       f"{partition!r} (at most {most} beside slurmd)", warnings)
    if all(c.gpus_of(kind) < req.gpus for c in candidates):
        best = max(candidates, key=lambda c: c.gpus_of(kind))
        what = f"{kind} GPUs" if kind else "GPUs"
        return Verdict(False, reasons.DENY_GPU_TOO_LARGE,
                       f"request of {req.gpus} {what} fits on no Slurm node of partition "
                       f"{partition!r}: the most any node has is {best.gpus_of(kind)} (Slurm "
                       f"node {best.slurm_node}, Node {best.k8s_node})", warnings)
    gpus = f"{req.gpus} {kind} GPUs" if kind else f"{req.gpus} GPUs"
    return Verdict(False, reasons.DENY_NO_SINGLE_NODE_FITS,
                   f"no single Slurm node of partition {partition!r} has memory "
                   f"{req.memory_mib}Mi, {req.cpus} CPUs and {gpus} at once", warnings)
