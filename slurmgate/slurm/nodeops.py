"""SlurmClient's node and partition operations (a part of the client: slurmgate.slurm.client).

Reads cost the site's node or partition count (a handful to thousands of records, never its
jobs); a single node is read by name. Drain and resume go over REST where the dialect has
POST /node/{name} (23.02+); 22.05 has none, so they run `scontrol` there (scontrol.py: an
argument list, never a shell; the JWT in its environment).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from slurmgate.slurm import scontrol
from slurmgate.slurm.dialects import Dialect, parse_node, parse_partition
from slurmgate.slurm.models import NodeInfo, PartitionInfo, SlurmError

_NODE_NAME = re.compile(r"[A-Za-z0-9._-]+")


class NodeOperations:
    """Mixed into SlurmClient, which provides the three requests below."""

    async def _base(self) -> tuple[str, Dialect]:
        raise NotImplementedError

    async def _request(self, method: str, path: str, **kw: Any) -> tuple[int, dict | None]:
        raise NotImplementedError

    async def _record(self, path: str, what: str,
                      gone: Callable[[SlurmError], bool]) -> dict[str, Any] | None:
        raise NotImplementedError

    def token(self) -> str:
        raise NotImplementedError

    def may_write(self) -> None:
        raise NotImplementedError

    async def nodes(self) -> list[NodeInfo]:
        base, _ = await self._base()
        _, data = await self._request("GET", f"{base}/nodes", what="list nodes")
        return [parse_node(n) for n in (data or {}).get("nodes") or [] if isinstance(n, Mapping)]

    async def node(self, name: str) -> NodeInfo | None:
        """One node's record (None: Slurm has no such node), GET /node/{name}: its cost is one
        node's, whatever the site's size."""
        if not _NODE_NAME.fullmatch(name):
            raise ValueError(f"bad node name {name!r}")
        base, _ = await self._base()
        # 24.11 answers an unknown name 200 with an error "Failure to query node <name>"
        data = await self._record(f"{base}/node/{name}", f"node {name}",
                                  lambda e: any(f"query node {name}" in m for m in e.errors))
        found = [parse_node(n) for n in (data or {}).get("nodes") or [] if isinstance(n, Mapping)]
        return next((n for n in found if n.name == name), None)

    async def partitions(self) -> list[PartitionInfo]:
        base, _ = await self._base()
        _, data = await self._request("GET", f"{base}/partitions", what="list partitions")
        return [
            parse_partition(p)
            for p in (data or {}).get("partitions") or []
            if isinstance(p, Mapping)
        ]

    async def _update_node(self, node: str, state: str, reason: str | None, what: str) -> None:
        base, d = await self._base()
        if not _NODE_NAME.fullmatch(node):
            raise ValueError(f"bad node name {node!r}")
        if not d.node_update:
            # slurmrestd v0.0.38 (Slurm 22.05) has only GET /node/{name}; POST /node/{name}
            # exists from v0.0.39 (Slurm 23.02)
            self.may_write()  # the leader's fence, as a REST write would ask it
            await scontrol.update_node(node, state, reason, self.token())
            return
        body: dict[str, Any] = {"state": [state], **({"reason": reason} if reason else {})}
        await self._request("POST", f"{base}/node/{node}", what=what, body=body)

    async def drain(self, node: str, reason: str) -> None:
        if not reason:
            raise ValueError("Slurm requires a reason to drain a node")
        await self._update_node(node, "DRAIN", reason, f"drain node {node}")

    async def resume(self, node: str) -> None:
        await self._update_node(node, "RESUME", None, f"resume node {node}")

