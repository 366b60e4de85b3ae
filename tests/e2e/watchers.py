"""Background samplers of the fault tests: BoundWatch checks that Pods bound before a fault
stay bound through it; LoadWatch checks the node-sharing invariant and stuck Pods under load."""

from __future__ import annotations

import json
import ssl
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from cluster.local import Local
from slurmgate import contract
from tests.e2e.conftest import Kubectl, squeue
from tests.e2e.faultkit import ann, pods


class BoundWatch(threading.Thread):
    """Samples the Pods that were bound at the start: each must stay bound to the same Node,
    with the same uid, not terminating (unless the test itself deleted it: `release`)."""

    def __init__(self, admin: Kubectl, ns: str, bound_at_start: dict[str, tuple[str, str]]):
        super().__init__(daemon=True)
        self.admin, self.ns, self.expect = admin, ns, dict(bound_at_start)
        self.stop_flag = threading.Event()
        self.violations: list[str] = []
        self.samples = 0
        self.lock = threading.Lock()

    def release(self, name: str) -> None:
        with self.lock:
            self.expect.pop(name, None)

    def run(self) -> None:
        while not self.stop_flag.is_set():
            try:
                now = pods(self.admin, self.ns)
            except Exception:  # kube-apiserver down: nothing to sample
                time.sleep(0.3)
                continue
            with self.lock:
                for name, (uid, node) in self.expect.items():
                    p = now.get(name)
                    if p is None:
                        self.violations.append(f"{name} gone")
                    elif p["metadata"]["uid"] != uid or p["spec"].get("nodeName") != node:
                        self.violations.append(f"{name} rebound/replaced")
                    elif p["metadata"].get("deletionTimestamp"):
                        self.violations.append(f"{name} being deleted (evicted?)")
            self.samples += 1
            time.sleep(0.3)

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(10)

    def check(self) -> None:
        assert self.samples >= 3, "BoundWatch took too few samples"
        assert not self.violations, self.violations[:10]



class LoadWatch(threading.Thread):
    """Samples Slurm and Kubernetes (admin client certs, no kubectl) every ~0.5 s:
    - a Node running an hpc job and holding a Pod at once is a violation;
    - a gated/unbound Pod whose job has been RUNNING for more than `stuck_after` is stuck."""

    def __init__(self, local: Local, ns: str, stuck_after: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.local, self.ns, self.stuck_after = local, ns, stuck_after
        self.stop_flag = threading.Event()
        self.sharing: list[str] = []
        self.stuck: dict[str, float] = {}
        self.running_since: dict[str, float] = {}
        self.samples = 0
        self.max_unbound_running = 0.0
        pki = Path(local.kube.ca_file).parent
        self.ctx = ssl.create_default_context(cafile=local.kube.ca_file)
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def _pods(self) -> list[dict[str, Any]]:
        url = f"{self.local.kube.server}/api/v1/namespaces/{self.ns}/pods"
        with urllib.request.urlopen(url, context=self.ctx, timeout=20) as r:
            return json.loads(r.read())["items"]

    def run(self) -> None:
        while not self.stop_flag.is_set():
            try:
                rows = squeue(self.local)
                items = self._pods()
            except Exception:
                time.sleep(0.5)
                continue
            now = time.monotonic()
            hpc = {r["nodes"] for r in rows if r["partition"] == "hpc" and r["state"] == "RUNNING"}
            pod_nodes = {p["spec"].get("nodeName") for p in items}
            both = hpc & {n.removeprefix("kwok-") for n in pod_nodes if n}
            if both:
                self.sharing.append(f"sample {self.samples}: {sorted(both)}")
            running = {contract.claim_from_comment(r["comment"]) for r in rows
                       if r["state"] == "RUNNING"}
            unbound_running = set()
            for p in items:
                a = ann(p)
                if (not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                        and a.get(contract.A_CLAIM) in running):
                    unbound_running.add(p["metadata"]["name"])
            for name in unbound_running:
                since = self.running_since.setdefault(name, now)
                self.max_unbound_running = max(self.max_unbound_running, now - since)
                if now - since > self.stuck_after:
                    self.stuck[name] = now - since
            for name in set(self.running_since) - unbound_running:
                del self.running_since[name]
            self.samples += 1
            time.sleep(0.5)
