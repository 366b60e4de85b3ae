"""core/v1 Events on Pods, so `kubectl describe pod` tells the story."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from slurmgate.kube import KubeClient, KubeError
from slurmgate.kubeview import PodView
from slurmgate.logs import kv
from slurmgate.timestamps import now_time

log = logging.getLogger("slurmgate.events")
COMPONENT = "slurmgate-binder"
RECENT = 4  # Events per Pod remembered, so that `once` skips a repeat


class Recorder:
    """Events are sent in the background: a reconcile never waits for one (they were a third
    of the API calls on the RUNNING -> bound path). One Pod's Events keep their order; at most
    `concurrency` are in flight."""

    def __init__(self, kube: KubeClient, concurrency: int = 8,
                 turn: Callable[[], Awaitable[None]] | None = None) -> None:
        self.kube = kube
        self._turn = turn  # waits while binds are in flight: they go to the API server first
        self.instance = socket.gethostname()
        self._last: dict[str, tuple[tuple[str, str], ...]] = {}  # uid -> recent (reason, message)
        self._slots = asyncio.Semaphore(concurrency)
        self._tail: dict[str, asyncio.Task[None]] = {}  # uid -> its newest pending send

    async def emit(self, pod: dict[str, Any], reason: str, message: str,
                   warning: bool = False, once: bool = True) -> None:
        """`once`: skip when the same reason+message is among the last RECENT for this Pod.

        Returns once the Event is queued; `flush()` waits until all are sent."""
        view = PodView(pod)
        uid = view.uid
        recent = self._last.get(uid, ())
        if once and (reason, message) in recent:
            return
        # a few, not one: an eviction says why, then "Evicted"; a second look before the watch
        # shows the Pod terminating must not say why again
        self._last[uid] = (*recent[-(RECENT - 1):], (reason, message))
        if len(self._last) > 50_000:
            self._last.clear()
        now = now_time()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{view.name}.", "namespace": view.namespace},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": view.name,
                               "namespace": view.namespace, "uid": uid},
            "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT, "reportingInstance": self.instance,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        task = asyncio.create_task(self._send(view.namespace, body, self._tail.get(uid)))
        self._tail[uid] = task
        task.add_done_callback(lambda t: self._done(uid, t))

    async def _send(self, namespace: str, body: dict[str, Any],
                    before: asyncio.Task[None] | None) -> None:
        if before is not None:  # the Pod's previous Event first
            await asyncio.wait([before])
        if self._turn is not None:
            await self._turn()
        async with self._slots:
            try:
                await self.kube.create(f"/api/v1/namespaces/{namespace}/events", body)
            except Exception as e:  # an Event is best effort; never fail a reconcile for it
                level = logging.INFO if isinstance(e, KubeError) else logging.WARNING
                log.log(level, "event not recorded",
                        extra=kv(reason=body["reason"], error=str(e)))

    def _done(self, uid: str, task: asyncio.Task[None]) -> None:
        if self._tail.get(uid) is task:
            del self._tail[uid]

    async def flush(self) -> None:
        """Wait until every queued Event has been sent (or failed)."""
        while self._tail:
            await asyncio.wait(list(self._tail.values()))

    def forget(self, uid: str) -> None:
        self._last.pop(uid, None)
