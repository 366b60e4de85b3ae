"""What Slurm gave a job on each node: which cores, how much memory, which GPU indices, read
from the job's whole record (GET /job/{id}), per release.

This is what several Pods on one Node will be held to (docs/design-share-a-node.md); today it
is shown on the Pod, so `kubectl describe pod` says what its placeholder holds. No Slurm call
of its own: the binder reads a job's whole record once it starts anyway.

Slurm states cores as (socket, core) pairs of its own abstract numbering; the CPU ids a cgroup
uses are slurmd's mapping of those, which no REST answer carries (`scontrol show job -d` says
`CPU_IDs`). The recorded answers are in tests/unit/fixtures/slurm-rest/.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slurmgate.slurm.values import num, strs

# a core of the job's (Slurm's JOB_RES_CORE_* words; v0.0.38 writes them lower-case)
_HELD = frozenset({"ALLOCATED", "IN_USE"})
# one GRES of gres_detail: "gpu:a100:2(IDX:0-1)", "gpu(IDX:0,2)", "gpu:1(IDX:N/A)"
_GRES = re.compile(r"([^,(]+)\(IDX:([^)]*)\)")


@dataclass(frozen=True)
class NodeAllocation:
    node: str
    cores: tuple[tuple[int, int], ...]  # (socket, core), sorted
    memory_mb: int  # 0: not said
    gpus: tuple[int, ...]  # GPU indices on the node, sorted; () when none or not said

    def describe(self) -> str:
        """`cores=s0:0-3,s1:0-3 memory=1024M gpus=0,2`: the Pod's annotation."""
        by_socket: dict[int, list[int]] = {}
        for s, c in self.cores:
            by_socket.setdefault(s, []).append(c)
        parts = [f"cores={','.join(f's{s}:{ranges(cs)}' for s, cs in sorted(by_socket.items()))}"
                 if by_socket else "cores=-"]
        if self.memory_mb:
            parts.append(f"memory={self.memory_mb}M")
        if self.gpus:
            parts.append(f"gpus={ranges(self.gpus)}")
        return " ".join(parts)


def ranges(values: Iterable[int]) -> str:
    """`0-3,5`: sorted integers as Slurm writes ranges."""
    out: list[str] = []
    run: list[int] = []
    for v in sorted(set(values)):
        if run and v == run[-1] + 1:
            run.append(v)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [v]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _indices(text: str) -> tuple[int, ...]:
    """`0-1,3` -> (0, 1, 3); anything else (`N/A`, junk) -> ()."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return ()
        a, b = int(lo), int(hi or lo)
        if b < a or b - a > 4096:
            return ()
        out.extend(range(a, b + 1))
    return tuple(sorted(set(out)))


def gpu_indices(detail: str) -> tuple[int, ...]:
    """The GPU indices of one node's gres_detail entry."""
    out: set[int] = set()
    for name, idx in _GRES.findall(detail):
        if name.strip().split(":")[0] == "gpu":
            out.update(_indices(idx))
    return tuple(sorted(out))


def _held(status: Any) -> bool:
    return any(w.upper() in _HELD for w in strs(status))


def _index(v: Any) -> int:
    return max(0, num(v))


def _cores_v38(sockets: Any) -> list[tuple[int, int]]:
    """v0.0.38-v0.0.40: {"0": {"cores": {"0": "allocated"}}}."""
    out = []
    for s, sock in (sockets.items() if isinstance(sockets, Mapping) else ()):
        cores = sock.get("cores") if isinstance(sock, Mapping) else None
        for c, status in (cores.items() if isinstance(cores, Mapping) else ()):
            if str(s).isdigit() and str(c).isdigit() and _held(status):
                out.append((int(s), int(c)))
    return out


def _cores_v41(sockets: Any) -> list[tuple[int, int]]:
    """v0.0.41+: [{"index": 0, "cores": [{"index": 0, "status": ["ALLOCATED"]}]}]."""
    out = []
    for sock in sockets if isinstance(sockets, list) else ():
        if not isinstance(sock, Mapping):
            continue
        for core in sock.get("cores") or ():
            if isinstance(core, Mapping) and _held(core.get("status")):
                out.append((_index(sock.get("index")), _index(core.get("index"))))
    return out


def _per_node(res: Mapping[str, Any]) -> list[tuple[str, list[tuple[int, int]], int]]:
    nodes = res.get("nodes")
    if isinstance(nodes, Mapping):  # v0.0.41+
        return [(str(n.get("name") or ""), _cores_v41(n.get("sockets")),
                 _index(n["memory"].get("allocated")
                        if isinstance(n.get("memory"), Mapping) else 0))
                for n in nodes.get("allocation") or () if isinstance(n, Mapping)]
    return [(str(n.get("nodename") or ""), _cores_v38(n.get("sockets")),
             _index(n.get("memory_allocated")))
            for n in res.get("allocated_nodes") or () if isinstance(n, Mapping)]


def parse(job: Mapping[str, Any], nodes: Sequence[str]) -> tuple[NodeAllocation, ...]:
    """Each node's share of a job's whole record; () while it holds nothing (pending) or the
    record says nothing of it (a job list's entry may leave job_resources out). `nodes`: the
    job's nodes in Slurm's order, which gres_detail's entries follow."""
    res = job.get("job_resources")
    if not isinstance(res, Mapping):
        return ()
    detail = job.get("gres_detail")
    gres = [d if isinstance(d, str) else "" for d in detail] if isinstance(detail, list) else []
    gpus_of = {n: gpu_indices(gres[i]) for i, n in enumerate(nodes) if i < len(gres)}
    out = [NodeAllocation(node=name, cores=tuple(sorted(set(cores))), memory_mb=mem,
                          gpus=gpus_of.get(name, ()))
           for name, cores, mem in _per_node(res) if name]
    return tuple(sorted(out, key=lambda a: nodes.index(a.node) if a.node in nodes else 1 << 30))
