"""KubeClient.keep_warm: a burst after it opens no connection (a real local HTTP server)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from slurmgate.kube import KEEPALIVE_SECONDS, KubeClient, KubeConfig

N = 5


class Server:
    """Counts the connections it accepted; holds each request until N are in flight, so that
    N concurrent requests really need N connections."""

    def __init__(self) -> None:
        self.peers: set[tuple[str, int]] = set()
        self.in_flight = 0
        self.enough = asyncio.Event()
        self.changed = asyncio.Condition()

    async def _tell(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def until(self, cond: Callable[[], bool], deadline: float = 5.0) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(cond), deadline)

    async def version(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if peer is not None:
            self.peers.add(peer[:2])
        self.in_flight += 1
        if self.in_flight >= N:
            self.enough.set()
        await self._tell()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.enough.wait(), 5)
        self.in_flight -= 1
        if self.in_flight == 0:
            self.enough.clear()
        await self._tell()
        return web.json_response({"major": "1"})


@pytest.fixture
async def served() -> AsyncIterator[tuple[Server, str]]:
    s = Server()
    app = web.Application()
    app.router.add_get("/version", s.version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield s, f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _burst(kube: KubeClient) -> None:
    await asyncio.gather(*(kube.get("/version") for _ in range(N)))


async def test_a_burst_after_keep_warm_opens_no_connection(served: tuple[Server, str]) -> None:
    server, url = served
    async with KubeClient(KubeConfig(url, ssl.create_default_context())) as kube:
        warm = asyncio.create_task(kube.keep_warm(N, every=3600))
        await server.until(lambda: len(server.peers) == N and server.in_flight == 0)
        opened_before = set(server.peers)
        await _burst(kube)
        warm.cancel()
        assert server.peers == opened_before


async def test_without_it_a_burst_opens_its_connections(served: tuple[Server, str]) -> None:
    server, url = served
    async with KubeClient(KubeConfig(url, ssl.create_default_context())) as kube:
        await _burst(kube)
        assert len(server.peers) == N


async def test_connections_outlive_the_gap_between_bursts() -> None:
    # aiohttp's default (15 s) closed them between every two bursts; the API server's own idle
    # timeout is 90 s
    async with KubeClient(KubeConfig("http://127.0.0.1:1", ssl.create_default_context())) as kube:
        assert 15 < KEEPALIVE_SECONDS < 90
        connector = kube.session.connector
        assert connector is not None
        assert connector._keepalive_timeout == KEEPALIVE_SECONDS  # type: ignore[attr-defined]
