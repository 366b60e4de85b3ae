"""The bench's handle on the real local cluster (Env): clients, metric scrapes, Pod and job
creation, and the cleanup between phases. The watchers that time a phase are in observers.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import ssl
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench import util
from cluster.bridge import Bridge
from cluster.local import Local
from slurmgate import contract
from slurmgate.kube import KubeClient, KubeError, load_config, pod_path
from slurmgate.slurm import PENDING, RUNNING, JobSpec, SlurmClient, scontrol

BENCH_LABEL = "slurmgate-bench"


def pod_manifest(name: str, marked: bool, run: str,
                 annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {BENCH_LABEL: run}
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
    if marked:
        labels[contract.MARK_LABEL] = contract.MARK_VALUE
    else:
        # the kube-scheduler floor: every kwok Node is a (tainted) Slurm Node
        spec["tolerations"] = [contract.TOLERATION]
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


@dataclass
class Created:
    name: str
    t_send: float
    t_done: float
    ok: bool
    job_id: int | None = None
    error: str = ""


@dataclass
class Env:
    local: Local
    bridge: Bridge
    kube: KubeClient
    slurm: SlurmClient
    http: aiohttp.ClientSession
    webhook_ssl: ssl.SSLContext
    # nodes Slurm itself drained (e.g. "Kill task failed" under load) that the bench resumed
    resumed: list[dict[str, str]] = field(default_factory=list)
    cancel_failures: int = 0
    # jobs still live long after cleanup began that the bench cancelled itself
    recancelled: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    async def open(cls, local: Local, bridge: Bridge, pool: int = 128) -> Env:
        kube = KubeClient(load_config(local.kube.kubeconfig), pool=pool, timeout=60.0,
                          user_agent="slurmgate-bench")
        slurm = SlurmClient(local.slurm.rest_url, local.slurm.token_file, "root",
                            timeout=30.0, connections=64)
        ctx = ssl.create_default_context(cafile=str(Path(bridge.run_dir) / "certs" / "ca.crt"))
        os.environ["SLURM_CONF"] = str(local.slurm.conf)  # for scontrol (resume)
        return cls(local, bridge, kube, slurm, aiohttp.ClientSession(), ctx)

    def logs(self) -> tuple[Path, Path]:
        """slurmctld's log and the binder's (the attribution reads both)."""
        return (Path(self.local.slurm.run_dir) / "log" / "ctld.log",
                Path(self.bridge.run_dir) / "log" / "binder.log")

    async def close(self) -> None:
        await self.kube.close()
        await self.slurm.close()
        await self.http.close()

    # --- metrics
    async def apiserver_metrics(self) -> list[tuple[str, dict[str, str], float]]:
        async with self.kube.session.get(self.kube.config.server + "/metrics") as r:
            return util.parse_prom(await r.text())

    async def webhook_metrics(self) -> list[tuple[str, dict[str, str], float]]:
        async with self.http.get(f"{self.bridge.webhook_url}/metrics",
                                 ssl=self.webhook_ssl) as r:
            return util.parse_prom(await r.text())

    async def binder_metrics(self) -> list[tuple[str, dict[str, str], float]]:
        async with self.http.get(f"{self.bridge.binder_url}/metrics") as r:
            return util.parse_prom(await r.text())

    def pid(self, name: str) -> int:
        return self.bridge.pids[name]

    # --- namespaces
    async def namespace(self, name: str) -> str:
        try:
            # the unmarked floor's Pods tolerate the Slurm taint: allowed only in namespaces
            # labelled as node infrastructure (slurmgate-taint-guard)
            await self.kube.create("/api/v1/namespaces", {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {
                    "name": name, "labels": {contract.INFRA_NAMESPACE_LABEL: "true"}}})
        except KubeError as e:
            if e.status != 409:
                raise
        deadline = time.monotonic() + 60
        while True:  # Pods need the default ServiceAccount (kube-controller-manager makes it)
            try:
                await self.kube.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
                return name
            except KubeError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    # --- creation
    async def create_pods(self, ns: str, names: list[str], marked: bool, run: str,
                          concurrency: int, annotations: dict[str, str] | None = None
                          ) -> list[Created]:
        out: list[Created] = []
        it = iter(names)

        async def worker() -> None:
            for name in it:
                t0 = time.monotonic()
                try:
                    pod = await self.kube.create(pod_path(ns), pod_manifest(name, marked, run,
                                                                        annotations))
                except Exception as e:
                    out.append(Created(name, t0, time.monotonic(), False, error=str(e)[:200]))
                    continue
                t1 = time.monotonic()
                ann = (pod.get("metadata") or {}).get("annotations") or {}
                jid = ann.get(contract.A_JOB_ID)
                out.append(Created(name, t0, t1, True, int(jid) if jid else None))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return out

    async def submit_jobs(self, n: int, run: str, concurrency: int) -> list[Created]:
        """Bare Slurm floor: the same exclusive 1-node job the webhook submits, no Kubernetes."""
        out: list[Created] = []
        it = iter(range(n))

        async def worker() -> None:
            for i in it:
                spec = JobSpec(name=f"bench-{run}-{i}", comment=f"bench {run} {i}",
                               memory_mb=1000, cpus=1, nodes=1, partition="k8s")
                t0 = time.monotonic()
                try:
                    jid = await self.slurm.submit(spec)
                except Exception as e:
                    out.append(Created(str(i), t0, time.monotonic(), False, error=str(e)[:200]))
                    continue
                out.append(Created(str(i), t0, time.monotonic(), True, jid))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return out

    # --- cleanup
    async def delete_pods(self, ns: str) -> None:
        """Delete every Pod of ns. A big collection delete can outlast the client's timeout
        on a loaded apiserver; it goes on server-side, and wait_no_pods asks again."""
        try:
            await self.kube.request("DELETE", pod_path(ns), params={"gracePeriodSeconds": "0"})
        except KubeError as e:
            if e.status != 404:
                raise
        except TimeoutError:
            pass

    async def wait_no_pods(self, ns: str, limit: float = 300) -> None:
        deadline = time.monotonic() + limit
        asked = time.monotonic()
        while True:
            try:
                items, _ = await self.kube.list(pod_path(ns))
            except TimeoutError:
                items = [{}]
            if not items:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(items)} Pods still in {ns} after {limit:.0f}s")
            if time.monotonic() - asked > 30:
                asked = time.monotonic()
                await self.delete_pods(ns)
            await asyncio.sleep(0.5)

    async def cancel_jobs(self, job_ids: list[int], concurrency: int = 32) -> None:
        it = iter(job_ids)

        async def worker() -> None:
            for j in it:
                for attempt in range(6):  # an overloaded slurmctld times out; try again
                    try:
                        await self.slurm.cancel(j, "KILL")
                        break
                    except Exception:
                        await asyncio.sleep(1.0 + 2 * attempt)
                else:
                    self.cancel_failures += 1  # wait_slurm_idle cancels it again

        await asyncio.gather(*(worker() for _ in range(concurrency)))

    async def wait_slurm_idle(self, limit: float = 600, recancel_after: float = 30,
                              phase: str = "") -> float:
        """Until no job is active and every node of k8s is idle again; returns seconds.

        A node Slurm drained on its own (not our cordon drain) is resumed, as an operator
        would, and recorded: the next phase needs every node. Jobs still RUNNING or PENDING
        `recancel_after` seconds in (a cancel lost to an overloaded slurmctld) are cancelled
        again, and recorded."""
        t0 = time.monotonic()
        tried: dict[str, float] = {}
        last_cancel = t0
        while True:
            try:
                jobs, _ = await self.slurm.jobs(None)
                nodes = await self.slurm.nodes()
            except Exception:  # slurmctld busy: look again
                await asyncio.sleep(1.0)
                continue
            active = [j for j in jobs or [] if j.active]
            busy = [n for n in nodes if n.state != "IDLE" or "COMPLETING" in n.flags]
            drained = [n for n in nodes if ("DRAIN" in n.flags or n.state.startswith("DRAIN"))
                       and not (n.reason or "").startswith(contract.DRAIN_REASON_PREFIX)]
            for n in drained:
                if time.monotonic() - tried.get(n.name, -1e9) < 10:
                    continue
                tried[n.name] = time.monotonic()
                with contextlib.suppress(Exception):
                    await scontrol.update_node(n.name, "RESUME", None, self.slurm.token())
                    self.resumed.append({"node": n.name, "reason": n.reason or "",
                                         "at": time.strftime("%H:%M:%S")})
            if not active and not busy and not drained:
                return time.monotonic() - t0
            live = [j for j in active if j.state in (RUNNING, PENDING)]
            now = time.monotonic()
            if live and now - t0 > recancel_after and now - last_cancel > recancel_after:
                last_cancel = now
                self.recancelled.append({"phase": phase, "after_s": round(now - t0, 1),
                                         "jobs": len(live),
                                         "sample": [j.job_id for j in live[:5]]})
                await self.cancel_jobs([j.job_id for j in live], 8)
            if time.monotonic() - t0 > limit:
                raise TimeoutError(
                    f"Slurm not idle after {limit:.0f}s: {len(active)} active jobs "
                    f"{[(j.job_id, j.state) for j in active[:5]]}, {len(busy)} busy nodes "
                    f"{[(n.name, n.state, sorted(n.flags)) for n in busy[:5]]} and "
                    f"{len(drained)} drained")
            await asyncio.sleep(1.0)
