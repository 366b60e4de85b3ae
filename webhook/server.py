"""The HTTPS server: /mutate, /healthz, /readyz, /metrics; certificates reloaded on change."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import ssl
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from slurmgate import tenancy
from slurmgate.logs import kv

from . import metrics
from .admission import Admitter, BadReview

log = logging.getLogger("slurmgate.webhook")

MAX_BODY = 4 * 1024 * 1024  # a Pod is at most ~1.5 MiB in etcd; the review holds one copy
MAX_DEPTH = 64


@dataclass
class TLSFiles:
    cert: Path
    key: Path


class CertReloader:
    """Loads the chain into one SSLContext; new handshakes use new files after a change."""

    def __init__(self, files: TLSFiles, interval: float = 2.0) -> None:
        self.files = files
        self.interval = interval
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp: tuple[float, float] | None = None
        self.reloads = 0
        self.load()

    def _mtimes(self) -> tuple[float, float]:
        return (os.stat(self.files.cert).st_mtime, os.stat(self.files.key).st_mtime)

    def load(self) -> bool:
        stamp = self._mtimes()
        if stamp == self._stamp:
            return False
        self.context.load_cert_chain(str(self.files.cert), str(self.files.key))
        self._stamp = stamp
        self.reloads += 1
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                if self.load():
                    log.info("serving certificate reloaded", extra=kv(cert=str(self.files.cert)))
            except (OSError, ssl.SSLError) as e:  # half-written rotation: keep the old pair
                log.warning("certificate reload failed", extra=kv(error=str(e)))


def readiness(inventory_loaded: bool, fail_open: bool,
              policy: tenancy.PolicyState) -> tuple[bool, str]:
    """What /readyz says. Not ready while the tenancy policy loads: every marked Pod would be
    refused meanwhile. A missing or invalid policy is ready: its denials say what is wrong,
    where a webhook out of the Service would only time out."""
    if policy.status == tenancy.LOADING:
        return False, "tenancy policy not loaded yet (its ConfigMap unreadable?)"
    # fail-open admits gated Pods even without an inventory, so it is ready regardless
    if not inventory_loaded and not fail_open:
        return False, "node inventory not loaded (Slurm or Kubernetes unreachable)"
    return True, ""


def _depth_ok(raw: bytes) -> bool:
    """Reject deeply nested JSON before json.loads recurses into it."""
    depth = 0
    in_str = esc = False
    for b in raw:
        if in_str:
            if esc:
                esc = False
            elif b == 0x5C:
                esc = True
            elif b == 0x22:
                in_str = False
        elif b == 0x22:
            in_str = True
        elif b in (0x7B, 0x5B):
            depth += 1
            if depth > MAX_DEPTH:
                return False
        elif b in (0x7D, 0x5D):
            depth -= 1
    return True


def _error(status: int, message: str) -> web.Response:
    metrics.REQUESTS.labels(str(status)).inc()
    return web.json_response({"error": message}, status=status)


def make_app(admitter: Admitter, ready: Any) -> web.Application:
    """`ready()` says whether the inventory is loaded and Slurm answered recently."""

    async def mutate(request: web.Request) -> web.Response:
        t0 = time.perf_counter()
        if request.content_length is not None and request.content_length > MAX_BODY:
            return _error(413, f"body larger than {MAX_BODY} bytes")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"body larger than {MAX_BODY} bytes")
        if not _depth_ok(raw):
            return _error(400, f"JSON nested deeper than {MAX_DEPTH}")
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return _error(400, f"body is not JSON: {str(e)[:100]}")
        try:
            out = await admitter.review(body)
        except BadReview as e:
            return _error(400, str(e))
        except Exception:
            log.exception("admission failed")
            return _error(500, "internal error (see webhook logs)")
        marked = "patch" in out["response"] or not out["response"]["allowed"]
        metrics.LATENCY.labels(str(marked).lower()).observe(time.perf_counter() - t0)
        metrics.REQUESTS.labels("200").inc()
        return web.json_response(out)

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        ok, why = ready()
        return web.Response(text="ok" if ok else why, status=200 if ok else 503)

    async def prom(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.REGISTRY),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", prom)
    return app


async def serve(app: web.Application, host: str, port: int,
                reloader: CertReloader | None) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=reloader.context if reloader else None,
                       backlog=1024)
    await site.start()
    return runner


async def cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task
