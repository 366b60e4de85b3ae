"""A controller-runtime style work queue: keys deduplicated, one worker per key at a time,
failed keys retried with per-key exponential backoff."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)  # a Request for Pods, a Node name for node sync


class WorkQueue(Generic[K]):
    def __init__(self, base_delay: float = 0.05, max_delay: float = 30.0) -> None:
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._dirty: set[K] = set()  # queued, not yet taken
        self._processing: set[K] = set()
        self._again: set[K] = set()  # added while processing: re-queue when done
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self.base_delay = base_delay
        self.max_delay = max_delay

    def __len__(self) -> int:
        return len(self._dirty)

    def add(self, key: K) -> None:
        if key in self._processing:
            self._again.add(key)
        elif key not in self._dirty:
            self._dirty.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        if key in self._timers:
            if self._timers[key].when() <= asyncio.get_running_loop().time() + delay:
                return
            self._timers[key].cancel()
        loop = asyncio.get_running_loop()
        self._timers[key] = loop.call_later(delay, self._fire, key)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def retry(self, key: K) -> float:
        n = self._failures.get(key, 0) + 1
        self._failures[key] = n
        delay = min(self.max_delay, self.base_delay * 2 ** (n - 1)) * random.uniform(0.8, 1.2)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    async def get(self) -> K:
        key = await self._queue.get()
        self._dirty.discard(key)
        self._processing.add(key)
        # the reconcile about to run looks at everything again and sets a new timer if it
        # still needs one: an older "look again in 15 s" would only be idle work later
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        return key

    def done(self, key: K) -> None:
        self._processing.discard(key)
        if key in self._again:
            self._again.discard(key)
            self.add(key)

    async def run_workers(self, n: int, handle: Callable[[K], Awaitable[None]]) -> None:
        async def worker() -> None:
            while True:
                key = await self.get()
                try:
                    await handle(key)
                finally:
                    self.done(key)

        await asyncio.gather(*(worker() for _ in range(n)))
