"""What the binder writes off a bind's critical path: the SlurmAllocated condition, and the
slots and patience every background write (Events included) shares with binds in flight.

On a busy API server every write competes with the two calls a bind needs (gate patch,
Binding), so background writes wait while any bind is in flight, up to PATIENCE."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

from slurmgate.kube import KubeClient, KubeError, pod_path
from slurmgate.kubeview import PodView
from slurmgate.logs import kv
from slurmgate.timestamps import now_time

from .podview import Condition, Pod, condition, key_of

log = logging.getLogger("slurmgate.actions")  # its messages keep the logger they had
PATIENCE = 2.0  # an Event or condition waits at most this long for binds to finish
SLOTS = 4  # background API calls in flight at once (Events have their own Recorder slots)


class BackgroundWrites:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.slots = asyncio.Semaphore(SLOTS)
        # a failed condition write asks for the Pod (its key) to be reconciled again
        self.on_condition_failed: Callable[[str], None] = lambda key: None
        # uid -> (status, reason, write): a condition being written
        self._condition_writes: dict[str, tuple[str, str, asyncio.Task[None]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._binding = 0
        self._binds_idle = asyncio.Event()
        self._binds_idle.set()

    @contextlib.contextmanager
    def binding(self) -> Iterator[None]:
        """Around a bind: while any is in flight, background writes wait."""
        self._binding += 1
        self._binds_idle.clear()
        try:
            yield
        finally:
            self._binding -= 1
            if not self._binding:
                self._binds_idle.set()

    @property
    def binds_in_flight(self) -> bool:
        return not self._binds_idle.is_set()

    async def after_binds(self) -> None:
        """Wait until no bind is in flight, or PATIENCE has passed."""
        if self._binds_idle.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._binds_idle.wait(), PATIENCE)

    def run(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run coro as a task the binder keeps a reference to (or the loop may drop it)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def set_condition(self, pod: Pod, want: Condition) -> None:
        """The SlurmAllocated condition, through pods/status, in the background: a reconcile
        never waits for it (a waiting Pod's condition in a burst would hold up its own bind a
        moment later). One Pod's writes keep their order; one equal to the write still pending
        is not made twice. A failed write calls `on_condition_failed`."""
        uid = PodView(pod).uid
        pending = self._condition_writes.get(uid)
        if pending is not None and pending[:2] == (want["status"], want.get("reason", "")):
            return
        before = pending[2] if pending is not None else None

        async def write() -> None:
            if before is not None:
                await asyncio.wait([before])
            await self.after_binds()
            async with self.slots:
                try:
                    await self._write_condition(pod, want)
                except Exception as e:
                    log.warning("condition not written; will look again",
                                extra=kv(pod=key_of(pod), error=str(e)))
                    self.on_condition_failed(key_of(pod))

        task = asyncio.create_task(write())
        self._condition_writes[uid] = (want["status"], want.get("reason", ""), task)

        def done(_: asyncio.Task[None]) -> None:
            if self._condition_writes.get(uid, (0, 0, None))[2] is task:
                del self._condition_writes[uid]

        task.add_done_callback(done)

    async def _write_condition(self, pod: Pod, want: Condition) -> None:
        view = PodView(pod)
        have = condition(pod) or {}
        changed = have.get("status") != want["status"]
        body = {**want, "lastProbeTime": None,
                "lastTransitionTime": have.get("lastTransitionTime") if not changed and
                have.get("lastTransitionTime") else now_time()}
        try:
            await self.kube.strategic_patch(
                pod_path(view.namespace, view.name, "status"),
                {"status": {"conditions": [body]}})
        except KubeError as e:
            if e.status not in (404, 409):  # gone, or replaced by a Pod of the same name
                raise
