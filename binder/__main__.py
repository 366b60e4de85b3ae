"""slurmgate-binder: the reconciler process (a sidecar beside the webhook)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from binder import metrics
from binder.leader import LeaderElector
from binder.reconciler import Binder
from slurmgate import logs
from slurmgate.config import SlurmSettings
from slurmgate.kube import KubeClient, load_config
from slurmgate.logs import kv
from slurmgate.slurm import SlurmClient

log = logging.getLogger("slurmgate.binder")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="slurmgate-binder")
    ap.add_argument("--health-listen", default=os.environ.get("BINDER_HEALTH_LISTEN",
                                                              "0.0.0.0:8080"))
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--lease-namespace", default=os.environ.get("LEASE_NAMESPACE",
                                                                "slurmgate-system"))
    ap.add_argument("--lease-name", default=os.environ.get("LEASE_NAME", "slurmgate-binder"))
    ap.add_argument("--lease-seconds", type=int,
                    default=int(os.environ.get("LEASE_DURATION_SECONDS", "15")),
                    help="leader Lease duration; renewed every third of it")
    ap.add_argument("--workers", type=int, default=int(os.environ.get("BINDER_WORKERS", "16")))
    ap.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    return ap.parse_args()


def health_app(binder: Binder, elector: LeaderElector) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        # A standby replica is ready (the PDB must not count it as down); a leader is ready
        # once its caches are synced.
        if elector.is_leader and not (binder.pods.synced.is_set() and binder.jobs.synced.is_set()):
            return web.Response(text="leader, caches not synced", status=503)
        return web.Response(text="ok leader" if elector.is_leader else "ok standby")

    async def prom(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.REGISTRY),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", prom)
    return app


async def run(a: argparse.Namespace) -> int:
    s = SlurmSettings.from_env()
    slurm = SlurmClient(s.url, Path(s.token_file), s.user)
    kube = KubeClient(load_config(a.kubeconfig), user_agent="slurmgate-binder")
    binder = Binder(kube, slurm, workers=a.workers,
                    default_memory=os.environ.get("DEFAULT_MEMORY") or None,
                    default_partition=os.environ.get("DEFAULT_PARTITION") or None,
                    orphan_grace=float(os.environ.get("BINDER_ORPHAN_GRACE", "60")))
    lease = max(3, a.lease_seconds)
    elector = LeaderElector(kube, a.lease_namespace, a.lease_name, lease_seconds=lease,
                            renew_seconds=lease / 3)
    runner = web.AppRunner(health_app(binder, elector), access_log=None)
    await runner.setup()
    host, _, port = a.health_listen.rpartition(":")
    await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def lead() -> None:
        await elector.acquire()
        metrics.LEADER.set(1)
        work = asyncio.create_task(binder.run())
        keep = asyncio.create_task(elector.keep())
        done, _ = await asyncio.wait({work, keep}, return_when=asyncio.FIRST_COMPLETED)
        work.cancel()
        keep.cancel()
        for t in done:
            if t.exception():
                raise t.exception()  # type: ignore[misc]

    log.info("binder starting", extra=kv(identity=elector.identity, slurmrestd=s.url))
    leading = asyncio.create_task(lead())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({leading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if leading.done():
        log.error("lost leadership or failed; exiting so a fresh process starts clean")
        code = 1
    leading.cancel()
    stopping.cancel()
    metrics.LEADER.set(0)
    await runner.cleanup()
    await slurm.close()
    await kube.close()
    return code


def main() -> None:
    a = parse_args()
    logs.setup(a.log_level)
    raise SystemExit(asyncio.run(run(a)))


if __name__ == "__main__":
    main()
