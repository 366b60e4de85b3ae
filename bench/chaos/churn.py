"""The load a chaos run keeps up: marked Pods created and deleted (single Pods, gangs of two,
some with a one-minute Slurm time limit) and ordinary batch jobs, both low-priority ones our
Pods preempt (scavenger, requeued) and high-priority ones that preempt our Pods (hpc)."""

from __future__ import annotations

import random
import subprocess
import threading
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.observe import Admin, Observer
from cluster.local import Local
from slurmgate import contract

CHAOS_LABEL = "slurmgate-chaos"


def pod(name: str, run: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": annotations or {},
                         "labels": {CHAOS_LABEL: run, contract.MARK_LABEL: contract.MARK_VALUE}},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}


@dataclass
class ChurnStats:
    created: int = 0
    gangs: int = 0
    time_limited: int = 0
    create_failed: int = 0
    deleted: int = 0
    delete_failed: int = 0
    batch_submitted: int = 0
    batch_failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def error(self, what: str, e: Exception) -> None:
        key = f"{what}: {type(e).__name__}"
        self.errors[key] = self.errors.get(key, 0) + 1


class Churn(threading.Thread):
    """About `target` marked Pods alive at any time on a 4-node cluster: more than fit, so some
    always wait in Slurm's queue, and every tick either adds or deletes some."""

    def __init__(self, local: Local, ns: str, run: str, rng: random.Random, obs: Observer,
                 deleted_by_us: set[str], lock: threading.Lock, target: int = 6,
                 tick: float = 1.5) -> None:
        super().__init__(daemon=True, name="chaos-churn")
        self.local, self.ns, self.run_id, self.rng, self.obs = local, ns, run, rng, obs
        self.deleted, self.lock = deleted_by_us, lock
        self.target, self.tick = target, tick
        self.admin = Admin(local)
        self.stats = ChurnStats()
        self.live: list[str] = []  # names of Pods we created and have not deleted
        self.stop_flag = threading.Event()
        self.n = 0

    def _create_pod(self, name: str, annotations: dict[str, str] | None = None) -> bool:
        try:
            self.admin.call("POST", f"/api/v1/namespaces/{self.ns}/pods",
                            pod(name, self.run_id, annotations), timeout=30)
        except Exception as e:  # webhook or API server down: refused, and nothing is created
            self.stats.create_failed += 1
            self.stats.error("create", e)
            return False
        self.stats.created += 1
        self.live.append(name)
        self.obs.note(f"created {self.ns}/{name} {annotations or ''}")
        return True

    def _delete_pod(self, name: str) -> None:
        with self.lock:
            self.deleted.add(f"{self.ns}/{name}")  # before the call: the watch may beat us
        try:
            self.admin.call("DELETE", f"/api/v1/namespaces/{self.ns}/pods/{name}", timeout=30)
        except Exception as e:
            if "404" not in str(e):  # already evicted by the binder: fine
                self.stats.delete_failed += 1
                self.stats.error("delete", e)
                return
        self.stats.deleted += 1
        self.live.remove(name)
        self.obs.note(f"deleted {self.ns}/{name}")

    def _add(self, kind: float) -> None:
        self.n += 1
        if kind < 0.15:
            group = f"g{self.n}"
            self.stats.gangs += 1
            for i in range(2):
                self._create_pod(f"{group}-{i}", {
                    contract.A_GROUP: group, contract.A_GROUP_SIZE: "2",
                    contract.A_GROUP_INDEX: str(i)})
        elif kind < 0.30:
            if self._create_pod(f"t{self.n}", {contract.A_TIME_LIMIT: "1"}):
                self.stats.time_limited += 1
        else:
            self._create_pod(f"p{self.n}")

    def _batch(self, hpc: float) -> None:
        """Keep two scavenger jobs in Slurm (our Pods preempt them), and now and then a short
        hpc job (it preempts one of our Pods)."""
        try:
            rows = self._slurm("squeue", "-h", "-o", "%P").split()
        except Exception as e:
            self.stats.error("squeue", e)
            return
        wants = []
        if rows.count("scavenger") < 2:
            wants.append(["-p", "scavenger", "--wrap", "sleep 90"])
        if rows.count("hpc") < 1 and hpc < 0.05:
            wants.append(["-p", "hpc", "--time=2", "--wrap", "sleep 20"])
        for w in wants:
            try:
                self._slurm("sbatch", "--parsable", "--exclusive", "-N1", "--mem=1000",
                            "--output=/dev/null", "-J", f"chaos-{w[1]}", *w)
                self.stats.batch_submitted += 1
                self.obs.note(f"sbatch {w[1]}")
            except Exception as e:
                self.stats.batch_failed += 1
                self.stats.error("sbatch", e)

    def _slurm(self, *args: str) -> str:
        argv, env = self.local.slurm.command(*args)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20,
                              check=True).stdout

    def run(self) -> None:
        while not self.stop_flag.wait(self.tick):
            self.step()

    def step(self) -> None:
        """One tick. Its six draws are made every tick, used or not: what the cluster did (a
        create refused, a Pod evicted, an hpc job queued) decides which draws matter, and must
        not shift the ones after it, or a replay with the same seed would part from the run at
        the first such difference (rng.choice over a list the cluster sized would too)."""
        add, kind, delete, pick, hpc, forget = (self.rng.random() for _ in range(6))
        if len(self.live) < self.target or add < 0.3:
            self._add(kind)
        if len(self.live) > self.target or (self.live and delete < 0.3):
            self._delete_pod(self.live[int(pick * len(self.live))])
        self._batch(hpc)
        # Pods the binder evicted (a time limit, a preemption) are no longer ours to delete
        if forget < 0.2:
            self._forget_gone()

    def _forget_gone(self) -> None:
        try:
            names = {p["metadata"]["name"] for p in self.admin.pods(self.ns, CHAOS_LABEL)}
        except Exception:
            return
        self.live = [n for n in self.live if n in names]

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(60)

    def delete_all(self) -> None:
        """At the end: every Pod still ours goes (a failed delete is tried once more)."""
        for _ in range(2):
            self._forget_gone()
            for name in list(self.live):
                self._delete_pod(name)
