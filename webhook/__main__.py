"""slurmgate-webhook: the mutating admission webhook process."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from pathlib import Path

from slurmgate import logs
from slurmgate.config import SlurmSettings, env_bool
from slurmgate.inventory import Inventory
from slurmgate.kube import KubeClient, load_config
from slurmgate.logs import kv
from slurmgate.slurm import SlurmClient
from webhook import metrics
from webhook.admission import Admitter, Settings
from webhook.lookup import OwnerLookup
from webhook.server import CertReloader, TLSFiles, cancel, make_app, serve

log = logging.getLogger("slurmgate.webhook")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="slurmgate-webhook")
    ap.add_argument("--listen", default=os.environ.get("WEBHOOK_LISTEN", "0.0.0.0:8443"))
    ap.add_argument("--tls-cert-file", default=os.environ.get("WEBHOOK_TLS_CERT",
                                                         "/etc/slurmgate/tls/tls.crt"))
    ap.add_argument("--tls-key-file", default=os.environ.get("WEBHOOK_TLS_KEY",
                                                        "/etc/slurmgate/tls/tls.key"))
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--log-level", default=os.environ.get("LOG_LEVEL", "INFO"))
    return ap.parse_args()


async def run(a: argparse.Namespace) -> None:
    s = SlurmSettings.from_env()
    settings = Settings(
        fail_open=env_bool("FAIL_OPEN", False),
        default_memory=os.environ.get("DEFAULT_MEMORY") or None,
        default_partition=os.environ.get("DEFAULT_PARTITION") or None,
    )
    slurm = SlurmClient(s.url, Path(s.token_file), s.user)
    kube = KubeClient(load_config(a.kubeconfig), user_agent="slurmgate-webhook")
    inventory = Inventory(slurm, kube)
    admitter = Admitter(slurm.submit, lambda: inventory.current, settings, OwnerLookup(kube))

    def ready() -> tuple[bool, str]:
        # fail-open admits gated Pods even without an inventory, so it is ready regardless
        if inventory.current is None and not settings.fail_open:
            return False, "node inventory not loaded (Slurm or Kubernetes unreachable)"
        return True, ""

    reloader = CertReloader(TLSFiles(Path(a.tls_cert_file), Path(a.tls_key_file)))
    host, _, port = a.listen.rpartition(":")
    runner = await serve(make_app(admitter, ready), host or "0.0.0.0", int(port), reloader)
    tasks = [asyncio.create_task(inventory.run(metrics.INVENTORY_ERRORS.inc)),
             asyncio.create_task(reloader.run())]
    log.info("webhook serving", extra=kv(listen=a.listen, slurmrestd=s.url,
                                         fail_open=settings.fail_open))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("webhook stopping")
    for t in tasks:
        await cancel(t)
    await runner.cleanup()
    await slurm.close()
    await kube.close()


def main() -> None:
    a = parse_args()
    logs.setup(a.log_level)
    asyncio.run(run(a))


if __name__ == "__main__":
    main()
