"""slurmgate-binder: the reconciler process (a sidecar beside the webhook)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from slurmgate import entry
from slurmgate.kube import KubeClient, load_config
from slurmgate.logs import kv
from slurmgate.slurm import SlurmClient
from slurmgate.tenancy import LOADING
from slurmgate.tenancy_source import PolicySource

from . import config, metrics, push
from .config import BinderConfig
from .controller import Controller
from .leader import LeaderElector, label_own_pod

log = logging.getLogger("slurmgate.binder")


def health_app(binder: Controller, elector: LeaderElector, push_token: bytes | None = None,
               policy: PolicySource | None = None) -> web.Application:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        # A standby replica is ready (the PDB must not count it as down); a leader is ready
        # once its caches are synced.
        if elector.is_leader and not (binder.pods.synced.is_set() and binder.jobs.synced.is_set()):
            return web.Response(text="leader, caches not synced", status=503)
        if elector.is_leader and policy is not None and policy.state.status == LOADING:
            return web.Response(text="leader, tenancy policy not loaded", status=503)
        return web.Response(text="ok leader" if elector.is_leader else "ok standby")

    async def prom(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(metrics.REGISTRY),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", prom)
    if push_token is not None:
        app.router.add_post(push.PATH, push.handler(
            push_token, lambda: binder.jobs if elector.is_leader else None))
    return app


@dataclass(frozen=True)
class _Parts:
    """The process's long-lived objects, built once by `_assemble` and closed at exit."""

    slurm: SlurmClient
    kube: KubeClient
    lease_kube: KubeClient
    policy: PolicySource
    binder: Controller
    elector: LeaderElector


def _assemble(cfg: BinderConfig) -> _Parts:
    s, lease = cfg.slurm, cfg.lease
    slurm = SlurmClient(s.url, s.token_file, s.user, json_offload_bytes=s.json_offload_bytes,
                        metrics=metrics.SLURMRESTD)
    kube = KubeClient(load_config(cfg.kubeconfig), user_agent="slurmgate-binder")
    # the Lease and our own Pod's label are written on a client of their own: every write of
    # the reconcilers is fenced by the Lease (below), and stepping down must still be said
    lease_kube = KubeClient(load_config(cfg.kubeconfig), user_agent="slurmgate-binder", pool=4)
    policy = PolicySource(kube, cfg.tenancy_configmap,
                          on_state=metrics.TENANCY.on_state,
                          on_error=metrics.TENANCY.on_error)
    binder = Controller(kube, slurm, cfg.reconcile, policy.current)
    policy.subscribe(binder.policy_changed)
    elector = LeaderElector(lease_kube, lease.namespace, lease.name,
                            lease_seconds=lease.seconds, renew_seconds=lease.renew_seconds,
                            identity=lease.identity)
    # a leader frozen past its Lease (SIGSTOP, a paused VM) and resumed must not write with its
    # stale view before keep() notices: every write to Kubernetes or Slurm asks the Lease first
    kube.write_guard = slurm.write_guard = elector.fence
    return _Parts(slurm, kube, lease_kube, policy, binder, elector)


async def _serve_health(cfg: BinderConfig, p: _Parts, token: bytes | None) -> web.AppRunner:
    runner = web.AppRunner(health_app(p.binder, p.elector, token, p.policy), access_log=None)
    await runner.setup()
    host, _, port = cfg.health_listen.rpartition(":")
    await web.TCPSite(runner, host or "0.0.0.0", int(port)).start()
    return runner


def _stop_on_signals() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _lead(cfg: BinderConfig, p: _Parts) -> None:
    """Wait to lead, then reconcile until the work or the Lease keeper ends."""
    lease = cfg.lease
    await label_own_pod(p.lease_kube, lease.pod_namespace, lease.identity, leading=False)
    await p.elector.acquire()
    metrics.LEADER.set(1)
    await label_own_pod(p.lease_kube, lease.pod_namespace, lease.identity, leading=True)
    work = asyncio.create_task(p.binder.run())
    keep = asyncio.create_task(p.elector.keep())
    # only the leader binds; a standby's pool may close
    warm = asyncio.create_task(p.kube.keep_warm(cfg.reconcile.warm_connections)) \
        if cfg.reconcile.warm_connections > 0 else None
    done, _ = await asyncio.wait({work, keep}, return_when=asyncio.FIRST_COMPLETED)
    work.cancel()
    keep.cancel()
    if warm is not None:
        warm.cancel()
    for t in done:
        if t.exception():
            raise t.exception()  # type: ignore[misc]


async def _lead_until_stopped(cfg: BinderConfig, p: _Parts, stop: asyncio.Event) -> int:
    """The exit code: 0 when asked to stop, 1 when leading ended by itself."""
    log.info("binder starting", extra=kv(identity=p.elector.identity, slurmrestd=cfg.slurm.url,
                                         tenancy=str(cfg.tenancy_configmap or "off")))
    # standbys keep the policy current too: a new leader submits at once
    watching = asyncio.create_task(p.policy.run())
    leading = asyncio.create_task(_lead(cfg, p))
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait({leading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if leading.done():
        log.error("lost leadership or failed; exiting so a fresh process starts clean")
        code = 1
    leading.cancel()
    stopping.cancel()
    watching.cancel()
    return code


async def _shut_down(cfg: BinderConfig, p: _Parts, runner: web.AppRunner, code: int) -> None:
    if p.elector.is_leader or code:
        # the push Service must stop sending here before the next leader labels its Pod
        await label_own_pod(p.lease_kube, cfg.lease.pod_namespace, cfg.lease.identity,
                            leading=False)
    metrics.LEADER.set(0)
    await runner.cleanup()
    await p.slurm.close()
    await p.kube.close()
    await p.lease_kube.close()


async def run(cfg: BinderConfig) -> int:
    p = _assemble(cfg)
    try:
        token = push.read_token(cfg.push_token_file) if cfg.push_token_file else None
    except (OSError, ValueError) as e:
        log.error("cannot read the push token (SLURM_PUSH_TOKEN_FILE)", extra=kv(error=str(e)))
        return 2
    runner = await _serve_health(cfg, p, token)
    stop = _stop_on_signals()
    code = await _lead_until_stopped(cfg, p, stop)
    await _shut_down(cfg, p, runner, code)
    return code


def main(argv: Sequence[str] | None = None) -> None:
    cfg = entry.start("slurmgate-binder", config.load, argv)
    raise SystemExit(asyncio.run(run(cfg)))


if __name__ == "__main__":
    main()
