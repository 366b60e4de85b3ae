"""Keeps a NodeMap fresh from Slurm (nodes, partitions) and Kubernetes (Nodes, slurmd Pods)."""

from __future__ import annotations

import asyncio
import logging
import random
import time

from slurmgate import contract
from slurmgate.kube import KubeClient
from slurmgate.logs import kv
from slurmgate.nodemap import NodeMap
from slurmgate.slurm import NodeInfo, PartitionInfo, SlurmClient

log = logging.getLogger("slurmgate.inventory")


# Kubernetes' side (labelled Nodes, slurmd Pods) changes as Nodes come and go; it costs the API
# server only and is read every REFRESH_EVERY. Slurm's side (node sizes, GRES, partitions and
# their GraceTime) changes only with slurm.conf, and every read of it costs the site's
# slurmrestd: it is read every SLURM_REFRESH_EVERY, 2 requests a minute (issue 29: with the
# binder's idle look at our bound jobs every 15 s, 6 a minute in all).
REFRESH_EVERY = 30.0
SLURM_REFRESH_EVERY = 60.0


class Inventory:
    def __init__(self, slurm: SlurmClient, kube: KubeClient,
                 interval: float = REFRESH_EVERY,
                 slurm_interval: float = SLURM_REFRESH_EVERY) -> None:
        self.slurm = slurm
        self.kube = kube
        self.interval = interval
        self.slurm_interval = slurm_interval
        self.current: NodeMap | None = None
        self.refreshed_at = 0.0
        self.errors = 0
        self._slurm: tuple[list[NodeInfo], list[PartitionInfo]] | None = None
        self._slurm_at = float("-inf")

    async def refresh(self) -> NodeMap:
        now = time.monotonic()
        stale = self._slurm is None or now - self._slurm_at >= self.slurm_interval

        async def slurm_side() -> tuple[list[NodeInfo], list[PartitionInfo]]:
            if not stale and self._slurm is not None:
                return self._slurm
            snodes, parts = await asyncio.gather(self.slurm.nodes(), self.slurm.partitions())
            return snodes, parts

        (snodes, parts), (knodes, _), (pods, _) = await asyncio.gather(
            slurm_side(),
            self.kube.list("/api/v1/nodes", labelSelector=contract.NODE_LABEL),
            self.kube.list("/api/v1/pods", labelSelector=contract.SLURMD_POD_LABEL),
        )
        if stale:  # only once both sides answered: a failed refresh retries Slurm's too
            self._slurm, self._slurm_at = (snodes, parts), now
        self.current = NodeMap.build(snodes, parts, knodes, pods)
        self.refreshed_at = time.monotonic()
        return self.current

    async def run(self, on_error=None) -> None:
        """Refresh forever; errors keep the last good map and back off with jitter."""
        delay = self.interval
        while True:
            try:
                await self.refresh()
                self.errors = 0
                delay = self.interval
            except Exception as e:  # keep serving the last good map
                self.errors += 1
                if on_error:
                    on_error()
                log.warning("inventory refresh failed", extra=kv(error=str(e)))
                delay = min(self.interval, 0.5 * 2 ** min(self.errors, 5))
            await asyncio.sleep(delay * random.uniform(0.8, 1.2))
