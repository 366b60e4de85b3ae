"""Reads of owning workloads (Job, JobSet, LWS, PodGroup) at admission, cached briefly: the
members of one gang arrive together and share an owner."""

from __future__ import annotations

import time
from typing import Any

from slurmgate.kube import KubeClient, KubeError


class OwnerLookup:
    def __init__(self, kube: KubeClient, ttl: float = 10.0, max_entries: int = 4096) -> None:
        self.kube = kube
        self.ttl = ttl
        self.max_entries = max_entries
        self._cache: dict[str, tuple[float, dict[str, Any] | None]] = {}

    async def __call__(self, path: str) -> dict[str, Any] | None:
        now = time.monotonic()
        hit = self._cache.get(path)
        if hit and now - hit[0] < self.ttl:
            return hit[1]
        try:
            obj: dict[str, Any] | None = await self.kube.get(path)
        except KubeError as e:
            if e.status != 404:  # 404: no such object, or its CRD is not installed
                raise
            obj = None
        if len(self._cache) >= self.max_entries:
            self._cache.clear()
        self._cache[path] = (now, obj)
        return obj
