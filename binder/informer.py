"""List+watch cache of one resource, resumed from resourceVersion after disconnects."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import Any

from slurmgate.kube import KubeClient, WatchExpired
from slurmgate.logs import kv

from . import metrics

log = logging.getLogger("slurmgate.informer")

Handler = Callable[[str, dict[str, Any] | None, dict[str, Any] | None], None]


def obj_key(obj: dict[str, Any]) -> str:
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


class Informer:
    """`handler(key, old, new)` runs for every change (new None on delete)."""

    def __init__(self, kube: KubeClient, path: str, handler: Handler,
                 label_selector: str | None = None, resource: str = "") -> None:
        self.kube = kube
        self.resource = resource or path.rsplit("/", 1)[-1]
        self.path = path
        self.handler = handler
        self.params = {"labelSelector": label_selector} if label_selector else {}
        self.store: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.relists = 0
        self.watch_restarts = 0

    async def _relist(self) -> None:
        items, rv = await self.kube.list(self.path, **self.params)
        fresh = {obj_key(o): o for o in items}
        old = self.store
        self.store = fresh
        self.resource_version = rv
        self.relists += 1
        events = metrics.WATCH_EVENTS.labels(self.resource, "RELIST")
        for key in old.keys() - fresh.keys():
            events.inc()
            self.handler(key, old[key], None)
        for key, obj in fresh.items():
            prev = old.get(key)
            if prev is None or prev["metadata"].get("resourceVersion") != \
                    obj["metadata"].get("resourceVersion"):
                events.inc()
                self.handler(key, prev, obj)
        self.synced.set()

    async def run(self) -> None:
        errors = 0
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                async for kind, obj in self.kube.watch(self.path, self.resource_version,
                                                       **self.params):
                    errors = 0
                    rv = obj.get("metadata", {}).get("resourceVersion")
                    if rv:
                        self.resource_version = rv
                    metrics.WATCH_EVENTS.labels(self.resource, kind).inc()
                    if kind == "BOOKMARK":
                        continue
                    key = obj_key(obj)
                    prev = self.store.get(key)
                    if kind == "DELETED":
                        self.store.pop(key, None)
                        self.handler(key, prev, None)
                    else:
                        self.store[key] = obj
                        self.handler(key, prev, obj)
                self.watch_restarts += 1  # server closed the watch (timeout): resume from rv
            except WatchExpired:
                need_list = True
            except asyncio.CancelledError:
                raise
            except Exception as e:
                errors += 1
                delay = min(30.0, 0.2 * 2 ** min(errors, 8)) * random.uniform(0.8, 1.2)
                log.warning("watch failed, retrying", extra=kv(path=self.path, error=str(e),
                                                               retry_in=round(delay, 2)))
                await asyncio.sleep(delay)
