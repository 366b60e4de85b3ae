"""The binder's work queue: dedup, one worker per key, timers, backoff."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Hashable

from slurmgate.binder.workqueue import WorkQueue


async def drain(q: WorkQueue) -> list[Hashable]:
    out = []
    while len(q):
        k = await q.get()
        out.append(k)
        q.done(k)
    return out


async def test_dedup_and_again_while_processing() -> None:
    q = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    k = await q.get()
    assert k == "a"
    q.add("a")  # changed while being handled: handled again afterwards, not concurrently
    assert len(q) == 1
    q.done("a")
    assert sorted(map(str, await drain(q))) == ["a", "b"]


async def test_add_after_fires() -> None:
    q = WorkQueue()
    q.add_after("a", 0.05)
    assert len(q) == 0
    assert await asyncio.wait_for(q.get(), 2) == "a"


async def test_processing_a_key_supersedes_its_timer() -> None:
    q = WorkQueue()
    q.add_after("a", 0.2)  # "look again later" ...
    q.add("a")  # ... but it changed now
    assert await q.get() == "a"
    q.done("a")
    # the reconcile just made saw everything; the old timer must not bring "a" back
    try:
        await asyncio.wait_for(q.get(), 0.6)
        raise AssertionError("superseded timer fired")
    except TimeoutError:
        pass


async def test_timer_keeps_the_earliest() -> None:
    q = WorkQueue()
    q.add_after("a", 0.05)
    q.add_after("a", 30)  # a later wish does not postpone an earlier one
    assert await asyncio.wait_for(q.get(), 2) == "a"


async def test_retry_backs_off_and_forget_resets() -> None:
    q = WorkQueue(base_delay=0.01, max_delay=1.0)
    delays = [q.retry("a") for _ in range(4)]
    assert all(b > a for a, b in itertools.pairwise(delays))
    assert delays[-1] <= 1.0 * 1.2
    q.forget("a")
    assert q.retry("a") <= 0.01 * 1.2
