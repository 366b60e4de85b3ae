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
from slurmgate.slurm import SlurmClient

log = logging.getLogger("slurmgate.inventory")


# Slurm's nodes and partitions change rarely (sizes, GRES, partition limits); two reads every
# 30 s keep the webhook's idle cost to a site at 4 requests a minute.
REFRESH_EVERY = 30.0


class Inventory:
    def __init__(self, slurm: SlurmClient, kube: KubeClient,
                 interval: float = REFRESH_EVERY) -> None:
        self.slurm = slurm
        self.kube = kube
        self.interval = interval
        self.current: NodeMap | None = None
        self.refreshed_at = 0.0
        self.errors = 0

    async def refresh(self) -> NodeMap:
        snodes, parts, (knodes, _), (pods, _) = await asyncio.gather(
            self.slurm.nodes(), self.slurm.partitions(),
            self.kube.list("/api/v1/nodes", labelSelector=contract.NODE_LABEL),
            self.kube.list("/api/v1/pods", labelSelector=contract.SLURMD_POD_LABEL),
        )
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
