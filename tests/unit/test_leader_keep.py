"""A leading binder keeps its Lease through a slow or failing API server for as long as the
Lease is still its own, and steps down at the renew deadline, never later: a renewal that
hangs past it is abandoned, since the standby may take the Lease then."""

from __future__ import annotations

import asyncio
import copy
import time
from pathlib import Path
from typing import Any

from slurmgate.binder.leader import RENEW_DEADLINE, LeaderElector
from slurmgate.kube import KubeError

LEASE_SECONDS = 3
RENEW = 0.5


class LeaseServer:
    """The Lease's GET and PUT, with faults: `fail` answers 503, `hang` never answers."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.fail = 0  # how many of the next requests fail
        self.hang = False
        self.puts = 0
        self.renewed = asyncio.Event()  # set by every PUT

    async def _fault(self) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if self.fail:
            self.fail -= 1
            raise KubeError(503, "ServiceUnavailable", "etcd slow")

    async def get(self, path: str) -> dict[str, Any]:
        await self._fault()
        if self.lease is None:
            raise KubeError(404, "NotFound", "no lease")
        return copy.deepcopy(self.lease)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.lease = copy.deepcopy(body)
        return body

    async def request(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        await self._fault()
        self.puts += 1
        self.renewed.set()
        self.lease = copy.deepcopy(body)
        return body


def _elector(server: LeaseServer) -> LeaderElector:
    return LeaderElector(server, "ns", lease_seconds=LEASE_SECONDS,  # type: ignore[arg-type]
                         renew_seconds=RENEW, identity="me")


async def _led(server: LeaseServer) -> LeaderElector:
    e = _elector(server)
    await e.acquire()
    assert e.is_leader
    return e


def test_a_renewal_hanging_past_the_deadline_is_abandoned() -> None:
    async def main() -> float:
        server = LeaseServer()
        e = await _led(server)
        server.hang = True
        t0 = time.monotonic()
        await asyncio.wait_for(e.keep(), LEASE_SECONDS * 3)  # the old code waited forever
        assert not e.is_leader
        return time.monotonic() - t0

    took = asyncio.run(main())
    # stepped down at the deadline (counted from the last renewal, up to RENEW before the
    # hang began), before the Lease expires for the standby
    assert took < LEASE_SECONDS, took
    assert took >= LEASE_SECONDS * RENEW_DEADLINE - RENEW, took


def test_failed_renewals_are_retried_sooner_and_a_recovery_keeps_the_lease() -> None:
    async def main() -> tuple[bool, int]:
        server = LeaseServer()
        e = await _led(server)
        # six failures in a row: tried at the renew period alone (0.5 s) they would outlast
        # the 2.4 s window; retried every 0.2 s they leave time for a renewal
        server.fail = 6
        keep = asyncio.create_task(e.keep())
        deadline = time.monotonic() + LEASE_SECONDS * 2
        while server.fail or server.puts < 2:
            assert time.monotonic() < deadline, "no renewal after the failures"
            assert not keep.done(), "stepped down although the API server came back"
            await asyncio.sleep(0.05)
        leading = e.is_leader and not keep.done()
        keep.cancel()
        return leading, server.puts

    leading, puts = asyncio.run(main())
    assert leading and puts >= 2


def test_failing_until_the_deadline_steps_down() -> None:
    async def main() -> float:
        server = LeaseServer()
        e = await _led(server)
        server.fail = 10_000
        t0 = time.monotonic()
        await asyncio.wait_for(e.keep(), LEASE_SECONDS * 3)
        assert not e.is_leader
        return time.monotonic() - t0

    took = asyncio.run(main())
    assert LEASE_SECONDS * RENEW_DEADLINE - RENEW <= took < LEASE_SECONDS, took


def test_another_holder_ends_the_lead_at_once() -> None:
    async def main() -> None:
        server = LeaseServer()
        e = await _led(server)
        assert server.lease is not None
        server.lease["spec"]["holderIdentity"] = "someone-else"
        await asyncio.wait_for(e.keep(), LEASE_SECONDS)
        assert not e.is_leader

    asyncio.run(main())


async def test_a_leader_frozen_past_its_lease_refuses_writes_before_keep_wakes() -> None:
    """The split brain of a paused process: SIGSTOP past the Lease, SIGCONT, and a reconciler
    runs before keep() does. Simulated by a freeze of the event loop itself (a blocking sleep
    stands for the stopped process: the monotonic clock runs on through SIGSTOP too)."""
    from slurmgate.binder.leader import NotLeading
    server = LeaseServer()
    e = await _led(server)
    e.fence()  # just acquired: writes allowed
    keeper = asyncio.create_task(e.keep())
    await asyncio.wait_for(server.renewed.wait(), LEASE_SECONDS)  # one renewal went through
    assert e.holds()
    # the freeze itself: the loop blocked, nothing runs, keep() included
    time.sleep(LEASE_SECONDS * RENEW_DEADLINE + 0.2)  # noqa: ASYNC251
    # the first task to run after the freeze finds the Lease gone, keep() not yet told
    assert e.is_leader and not e.holds()
    try:
        e.fence()
        raise AssertionError("a write was allowed past the Lease")
    except NotLeading:
        pass
    await asyncio.wait_for(keeper, LEASE_SECONDS)  # and keep() steps down as it wakes
    assert not e.is_leader


async def test_the_clients_ask_the_guard_before_every_write_only(tmp_path: Path) -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from slurmgate.kube import KubeClient, KubeConfig
    from slurmgate.slurm import SlurmClient

    token = tmp_path / "token"
    token.write_text("t")

    seen: list[tuple[str, str]] = []

    async def ok(request: web.Request) -> web.Response:
        seen.append((request.method, request.path))
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", ok)
    srv = TestServer(app)
    await srv.start_server()
    asked: list[str] = []

    def guard() -> None:
        asked.append("w")
        if len(asked) > 1:
            raise RuntimeError("refused")

    kube = KubeClient(KubeConfig(str(srv.make_url("")).rstrip("/"), None),  # type: ignore[arg-type]
                      write_guard=guard)
    try:
        await kube.request("GET", "/api/v1/pods")
        assert asked == []
        await kube.request("PATCH", "/api/v1/namespaces/a/pods/p", body={})
        assert asked == ["w"]
        try:
            await kube.request("DELETE", "/api/v1/namespaces/a/pods/p")
            raise AssertionError("the guard's refusal did not stop the write")
        except RuntimeError:
            pass
        # Slurm's writes ask it too (a cancel here), its reads do not
        slurm = SlurmClient(str(srv.make_url("")), token, api_version="v0.0.42")
        slurm.write_guard = guard
        try:
            await slurm.cancel(5)
            raise AssertionError("a cancel went out past the guard")
        except RuntimeError:
            pass
        finally:
            await slurm.close()
        assert [m for m, _ in seen] == ["GET", "PATCH"]
    finally:
        await kube.close()
        await srv.close()
