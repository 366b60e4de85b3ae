"""The HTTPS server: fuzzed bodies always get well-formed JSON; TLS floor; cert reload."""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgate.certs import pki
from slurmgate.webhook.admission import Admitter
from slurmgate.webhook.config import Settings
from slurmgate.webhook.server import MAX_BODY, CertReloader, TLSFiles, make_app, serve
from tests.unit.fakes import FakeSubmit, marked_pod, node_map, review


def app():
    nm = node_map()
    return make_app(Admitter(FakeSubmit(), lambda: nm, Settings()), lambda: (True, ""))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=20)


def mutate(body: dict, path: list[str], value: object) -> dict:
    cur = body
    for p in path[:-1]:
        nxt = cur.get(p)
        if not isinstance(nxt, dict):
            return body
        cur = nxt
    cur[path[-1]] = value
    return body


PATHS = [["request", "uid"], ["request", "object"], ["request", "object", "metadata"],
         ["request", "object", "metadata", "labels"], ["request", "object", "spec"],
         ["request", "object", "metadata", "annotations"], ["request", "kind"],
         ["request", "operation"], ["request", "object", "spec", "containers"],
         ["request", "dryRun"], ["request", "namespace"], ["apiVersion"], ["request"]]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=json_values)
def test_fuzzed_reviews_answered_with_json(path: list[str], value: object) -> None:
    async def go() -> None:
        async with TestClient(TestServer(app())) as c:
            body = mutate(review(marked_pod()), path, value)
            r = await c.post("/mutate", data=json.dumps(body))
            assert r.status in (200, 400)
            doc = await r.json()
            if r.status == 200:
                assert doc["kind"] == "AdmissionReview"
                assert isinstance(doc["response"]["allowed"], bool)
            else:
                assert "error" in doc
    asyncio.run(go())


@settings(max_examples=60, deadline=None)
@given(raw=st.binary(max_size=2000))
def test_random_bytes_answered_with_json(raw: bytes) -> None:
    async def go() -> None:
        async with TestClient(TestServer(app())) as c:
            r = await c.post("/mutate", data=raw)
            assert r.status in (200, 400)
            await r.json()
    asyncio.run(go())


async def test_deep_nesting_and_huge_bodies_refused() -> None:
    async with TestClient(TestServer(app())) as c:
        r = await c.post("/mutate", data="[" * 100_000 + "]" * 100_000)
        assert r.status == 400 and "deeper" in (await r.json())["error"]
        r = await c.post("/mutate", data=b" " * (MAX_BODY + 10))
        assert r.status == 413
        r = await c.get("/metrics")
        assert "slurmgate_webhook_requests_total" in await r.text()


def _write_pair(d: Path, cn: str) -> tuple[Path, Path, Path]:
    ca_key, ca = pki.make_ca(f"{cn}-ca", days=2)
    key, cert = pki.make_cert(ca_key, ca, cn, dns_names=["localhost"],
                              ip_addresses=["127.0.0.1"], days=1)
    pki.write_key(d / "tls.key", key)
    pki.write_cert(d / "tls.crt", cert)
    pki.write_cert(d / f"{cn}-ca.crt", ca)
    return d / "tls.crt", d / "tls.key", d / f"{cn}-ca.crt"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _peer_cn(port: int, ca: Path, max_version: ssl.TLSVersion | None = None) -> str:
    ctx = ssl.create_default_context(cafile=str(ca))
    if max_version:
        ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
        ctx.maximum_version = max_version
    _, w = await asyncio.open_connection("127.0.0.1", port, ssl=ctx)
    cert = w.get_extra_info("peercert")
    w.close()
    return dict(x[0] for x in cert["subject"])["commonName"]


async def test_tls_reload_and_floor(tmp_path: Path) -> None:
    cert, key, ca1 = _write_pair(tmp_path, "first")
    reloader = CertReloader(TLSFiles(cert, key))
    port = _free_port()
    runner = await serve(app(), "127.0.0.1", port, reloader)
    try:
        assert await _peer_cn(port, ca1) == "first"
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            await _peer_cn(port, ca1, max_version=ssl.TLSVersion.TLSv1_1)
        _, _, ca2 = _write_pair(tmp_path, "second")
        assert reloader.load() is True
        assert await _peer_cn(port, ca2) == "second"
        assert reloader.load() is False  # unchanged files: nothing to do
    finally:
        await runner.cleanup()
