"""slurmgate-webhook: the mutating admission webhook process."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Sequence
from functools import partial

from slurmgate import entry
from slurmgate.inventory import Inventory
from slurmgate.kube import KubeClient, load_config
from slurmgate.logs import kv
from slurmgate.slurm import SlurmClient
from slurmgate.tenancy_source import PolicySource

from . import config, metrics
from .admission import Admitter
from .config import WebhookConfig
from .lookup import OwnerLookup
from .orphans import OrphanWatch
from .server import (
    CertReloader,
    TLSFiles,
    cancel,
    make_app,
    readiness,
    serve,
)

log = logging.getLogger("slurmgate.webhook")

# within the Pod's default terminationGracePeriodSeconds (30 s), beyond one Slurm client timeout
DRAIN_SECONDS = 6.0
# How long a submit's request may run. An admission waits answer_within (5 s) for it; a denied
# Pod's submit goes on, so a job slurmctld makes when it is back is named by the answer and
# cancelled. slurmrestd holds a request while slurmctld restarts (chaos: 7-12 s); past this
# the binder's whole list is the safety net.
LATE_ANSWER = 120.0


async def run(cfg: WebhookConfig) -> None:
    s = cfg.slurm
    settings = cfg.admission
    slurm = SlurmClient(s.url, s.token_file, s.user, json_offload_bytes=s.json_offload_bytes,
                        metrics=metrics.SLURMRESTD)
    kube = KubeClient(load_config(cfg.kubeconfig), user_agent="slurmgate-webhook")
    inventory = Inventory(slurm, kube)
    policy = PolicySource(kube, cfg.tenancy_configmap,
                          on_state=metrics.TENANCY.on_state,
                          on_error=metrics.TENANCY.on_error)
    orphans = OrphanWatch(kube, slurm.cancel, slurm.job)
    admitter = Admitter(partial(slurm.submit, seconds=LATE_ANSWER), lambda: inventory.current,
                        settings, OwnerLookup(kube), policy.current,
                        on_submitted=orphans.admitted)

    def ready() -> tuple[bool, str]:
        return readiness(inventory.current is not None, settings.fail_open, policy.state)

    reloader = CertReloader(TLSFiles(cfg.tls_cert_file, cfg.tls_key_file))
    host, _, port = cfg.listen.rpartition(":")
    runner = await serve(make_app(admitter, ready), host or "0.0.0.0", int(port), reloader)
    tasks = [asyncio.create_task(inventory.run(metrics.INVENTORY_ERRORS.inc)),
             asyncio.create_task(reloader.run()), asyncio.create_task(policy.run()),
             asyncio.create_task(orphans.run())]
    log.info("webhook serving", extra=kv(listen=cfg.listen, slurmrestd=s.url,
                                         fail_open=settings.fail_open,
                                         submit_budget=settings.submit_budget,
                                         long_grace=str(settings.long_grace),
                                         tenancy=str(cfg.tenancy_configmap or "off")))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("webhook stopping")
    await runner.cleanup()  # no new reviews; the submits already sent may still land
    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            await admitter.drain()
    except TimeoutError:
        log.warning("submits still running at exit; the binder submits for their Pods after "
                    "its grace", extra=kv(running=len(admitter.in_flight)))
    for t in tasks:
        await cancel(t)
    await slurm.close()
    await kube.close()


def main(argv: Sequence[str] | None = None) -> None:
    cfg = entry.start("slurmgate-webhook", config.load, argv)
    asyncio.run(run(cfg))


if __name__ == "__main__":
    main()
