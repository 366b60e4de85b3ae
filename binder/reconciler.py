"""The binder: watches marked Pods, Nodes and our Slurm jobs; carries out state.decide().

State lives in Pod annotations and in Slurm, never only here: the in-memory maps are caches
rebuilt from watches and polls after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from binder import metrics, state
from binder.config import ReconcileSettings
from binder.events import Recorder
from binder.gangs import GangReconciler
from binder.informer import Informer
from binder.jobs import JobTracker
from binder.nodesync import NodeSync, node_view
from binder.workqueue import WorkQueue
from slurmgate import contract, faults, podrequest
from slurmgate.kube import KubeClient, KubeError, parse_time, pod_path, pointer_escape
from slurmgate.logs import kv
from slurmgate.slurm import PENDING, RUNNING, STOPPING_STATES, JobInfo, SlurmClient, SlurmError
from slurmgate.slurm.placeholder import job_spec, pod_display_name

log = logging.getLogger("slurmgate.binder")

STUCK_AFTER = 30.0


class Binder:
    def __init__(self, kube: KubeClient, slurm: SlurmClient,
                 settings: ReconcileSettings | None = None) -> None:
        self.kube = kube
        self.slurm = slurm
        self.settings = settings or ReconcileSettings()
        self.queue = WorkQueue()
        self.events = Recorder(kube)
        self.jobs = JobTracker(slurm, self._on_job)
        self.pods = Informer(kube, "/api/v1/pods", self._on_pod,
                             label_selector=f"{contract.MARK_LABEL}={contract.MARK_VALUE}")
        self.nodes = Informer(kube, "/api/v1/nodes", self._on_node,
                              label_selector=contract.NODE_LABEL)
        self.key_by_claim: dict[str, str] = {}
        self.claim_by_key: dict[str, str] = {}
        self.node_for: dict[str, state.NodeRef] = {}  # Slurm node -> k8s Node
        self.slurm_of: dict[str, str] = {}  # k8s Node -> Slurm node
        self._evict_refused_since: dict[str, float] = {}
        self._announced: dict[str, None] = {}  # Pod uids told about their job (insertion order)
        self.node_queue = WorkQueue()
        self.nodesync = NodeSync(self)
        self.group_keys: dict[str, set[str]] = {}  # "ns/group" -> member Pod keys
        self.gangs = GangReconciler(self)

    # --- event handlers: cheap, they only index and enqueue ---
    def _item(self, key: str, obj: dict[str, Any] | None = None) -> tuple[str, str, str | None]:
        """The queue item for a Pod: a gang member is reconciled with its whole group."""
        obj = obj if obj is not None else self.pods.store.get(key)
        ann = ((obj or {}).get("metadata") or {}).get("annotations") or {}
        group = ann.get(contract.A_GROUP)
        if group:
            return ("group", f"{key.split('/', 1)[0]}/{group}", None)
        return ("pod", key, ann.get(contract.A_CLAIM))

    def _on_pod(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        obj = new or old or {}
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        claim = ann.get(contract.A_CLAIM)
        group = ann.get(contract.A_GROUP)
        if group:
            gkey = f"{key.split('/', 1)[0]}/{group}"
            members = self.group_keys.setdefault(gkey, set())
            if new is None:
                members.discard(key)
                if not members:
                    self.group_keys.pop(gkey, None)
            else:
                members.add(key)
        if new is None:
            if claim and self.key_by_claim.get(claim) == key:
                del self.key_by_claim[claim]
                # another member of the gang may hold the same claim
                for other in self.group_keys.get(f"{key.split('/', 1)[0]}/{group}", ()):
                    self.key_by_claim[claim] = other
                    break
            self.claim_by_key.pop(key, None)
            # a gang member's job is the group's: the group reconcile decides, not "gone"
            self.queue.add(self._item(key, old) if group else ("gone", key, claim))
            return
        if claim:
            self.key_by_claim[claim] = key
            self.claim_by_key[key] = claim
        if state.is_gated(new):
            self.jobs.kick()
        self.queue.add(self._item(key, new))

    def _on_job(self, claim: str, job: JobInfo | None) -> None:
        key = self.key_by_claim.get(claim)
        if key is not None:
            self.queue.add(self._item(key))

    def _on_node(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        before, after = node_view(old), node_view(new)
        if before == after:  # a status heartbeat: nothing the binder reads changed
            return
        prev = self.slurm_of.pop(key, None)
        if prev:
            self.node_for.pop(prev, None)
        slurm_name = after[0] if after else None
        if after is not None and slurm_name:
            self.node_for[slurm_name] = state.NodeRef(key, after[1])
            self.slurm_of[key] = slurm_name
            # Pods waiting on this node (e.g. it just appeared) get another look
            for claim, job in self.jobs.by_claim.items():
                if slurm_name in job.nodes and claim in self.key_by_claim:
                    self.queue.add(self._item(self.key_by_claim[claim]))
        if slurm_name or (before and before[0]):
            self.node_queue.add(key)

    # --- reconcile ---
    async def handle(self, item: Any) -> None:
        kind, key, claim = item
        try:
            if kind == "gone":
                await self._pod_gone(key, claim)
            elif kind == "group":
                await self.gangs.reconcile(key)
            else:
                await self._reconcile(key)
            self.queue.forget(item)
        except Exception as e:
            metrics.RECONCILE_ERRORS.inc()
            delay = self.queue.retry(item)
            log.warning("reconcile failed; will retry",
                        extra=kv(pod=key, error=str(e), retry_in=round(delay, 2)))

    async def _pod_gone(self, key: str, claim: str | None) -> None:
        job = self.jobs.get(claim)
        if job is not None and state.holds_node(job):
            await self._cancel(job, "pod_deleted")
            log.info("pod gone; job cancelled", extra=kv(pod=key, job=job.job_id))

    async def _cancel(self, job: JobInfo, why: str) -> None:
        await self.slurm.cancel(job.job_id, "KILL")
        metrics.CANCELS.labels(why).inc()

    async def _reconcile(self, key: str) -> None:
        pod = self.pods.store.get(key)
        if pod is None:
            return
        ann = pod["metadata"].get("annotations") or {}
        job = self.jobs.get(ann.get(contract.A_CLAIM))
        d = state.decide(pod, job, state.World(
            slurm_synced=self.jobs.synced.is_set(), now=time.time(), node_for=self.node_for))
        metrics.RECONCILES.labels(d.action).inc()
        uid = pod["metadata"].get("uid", "")
        if uid not in self._announced and ann.get(contract.A_JOB_ID) and d.action != state.SUBMIT:
            # the webhook can't write Events (the Pod does not exist yet at admission)
            self._announced[uid] = None
            if len(self._announced) > 100_000:
                self._announced.clear()
            await self.events.emit(pod, contract.EV_JOB_SUBMITTED,
                                   f"placeholder job {ann[contract.A_JOB_ID]} submitted at "
                                   f"admission", once=False)
        if d.action in (state.NOTHING, state.WAIT):
            if d.reason:
                await self.events.emit(pod, d.reason, d.message, warning=True)
            if d.requeue_after:
                self.queue.add_after(self._item(key, pod), d.requeue_after)
            return
        if d.action == state.STATUS:
            await self._set_status(pod, d.status)
            if d.reason:
                await self.events.emit(pod, d.reason, d.message)
        elif d.action == state.BIND:
            assert job is not None and d.node is not None
            await self._bind(pod, job, d)
        elif d.action == state.EVICT:
            await self._evict(pod, d)
        elif d.action == state.CANCEL:
            assert job is not None
            await self._cancel(job, "pod_finished")
            await self.events.emit(pod, d.reason, d.message)
        elif d.action == state.SUBMIT:
            await self._submit(pod, contract.EV_JOB_SUBMITTED)
        elif d.action == state.RESUBMIT:
            if job is not None:
                await self._cancel(job, "resubmit")
            await self.events.emit(pod, d.reason, d.message, warning=True)
            await self._submit(pod, contract.EV_JOB_SUBMITTED)

    async def _set_status(self, pod: dict[str, Any], status: dict[str, str]) -> None:
        meta = pod["metadata"]
        patch = {"metadata": {"annotations": {k: (v or None) for k, v in status.items()}}}
        await self.kube.merge_patch(pod_path(meta["namespace"], meta["name"]), patch)

    async def _submit(self, pod: dict[str, Any], reason: str) -> None:
        meta = pod["metadata"]
        ann = meta.get("annotations") or {}
        claim = ann.get(contract.A_CLAIM)
        if not claim:
            await self.events.emit(pod, contract.EV_MISSING_CLAIM, f"Pod has no {contract.A_CLAIM} "
                                   "annotation (not admitted by the webhook?)", warning=True)
            return
        try:
            r = podrequest.from_pod(pod, self.settings.default_memory,
                                     self.settings.default_partition)
        except podrequest.PodRequestError as e:
            await self.events.emit(pod, contract.EV_INVALID_REQUEST, str(e), warning=True)
            return
        spec = job_spec(r, claim, meta["namespace"], pod_display_name(meta))
        try:
            job_id = await self.slurm.submit(spec)
        except SlurmError as e:
            await self.events.emit(pod, contract.EV_SUBMIT_FAILED, str(e), warning=True)
            raise
        await self._set_status(pod, {contract.A_JOB_ID: str(job_id),
                                     contract.A_JOB_STATE: PENDING,
                                     contract.A_JOB_REASON: "",
                                     contract.A_SUBMITTED_AT: str(int(time.time()))})
        self.jobs.kick()
        await self.events.emit(pod, reason, f"submitted placeholder job {job_id}")

    async def _bind(self, pod: dict[str, Any], job: JobInfo, d: state.Decision,
                    slurm_node: str | None = None) -> None:
        slurm_node = slurm_node or job.nodes[0]
        meta = pod["metadata"]
        path = pod_path(meta["namespace"], meta["name"])
        ops: list[dict[str, Any]] = []
        gates = pod["spec"].get("schedulingGates") or []
        if state.is_gated(pod):
            # test first: if anything changed the gates meanwhile, fail and reconcile again
            ops += [{"op": "test", "path": "/spec/schedulingGates", "value": gates},
                    {"op": "replace", "path": "/spec/schedulingGates",
                     "value": [g for g in gates if g.get("name") != contract.GATE]}]
        if not isinstance(meta.get("annotations"), dict):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        have = meta.get("annotations") or {}
        for k, v in d.status.items():
            ann_path = f"/metadata/annotations/{pointer_escape(k)}"
            if v:
                ops.append({"op": "add", "path": ann_path, "value": v})
            elif k in have:  # e.g. the pending reason, gone once running
                ops.append({"op": "remove", "path": ann_path})
        await self.kube.json_patch(path, ops)
        faults.point("binder_after_ungate")
        binding = {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                                "uid": meta["uid"]},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": d.node}}
        try:
            await self.kube.create(pod_path(meta["namespace"], meta["name"], "binding"), binding)
        except KubeError as e:
            if e.status != 409:
                raise
            return  # already bound (our cache lagged, or a retry after a crash): nothing new
        # Assume the binding in our cache until the watch delivers it, so that a reconcile in
        # between does not decide to bind again.
        key = f"{meta['namespace']}/{meta['name']}"
        cached = self.pods.store.get(key)
        if cached is not None and cached["metadata"].get("uid") == meta["uid"]:
            self.pods.store[key] = {**cached, "spec": {
                **cached["spec"], "nodeName": d.node,
                "schedulingGates": [g for g in cached["spec"].get("schedulingGates") or []
                                    if g.get("name") != contract.GATE]}}
        faults.point("binder_after_bind")
        seen = self.jobs.seen_running_at.get(job.job_id)
        if seen is not None:
            metrics.BIND_LATENCY.observe(time.monotonic() - seen)
        created = parse_time(meta.get("creationTimestamp"))
        if created is not None:
            metrics.GATE_TO_BIND.observe(max(0.0, time.time() - created))
        log.info("pod bound", extra=kv(pod=f"{meta['namespace']}/{meta['name']}",
                                       node=d.node, job=job.job_id, slurm_node=slurm_node))
        await self.events.emit(pod, contract.EV_ALLOCATED,
                               f"job {job.job_id} RUNNING on Slurm node {slurm_node}")
        await self.events.emit(pod, d.reason, d.message)

    async def _evict(self, pod: dict[str, Any], d: state.Decision) -> None:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}"
        await self.events.emit(pod, d.reason, d.message, warning=True)
        if d.status:
            await self._set_status(pod, d.status)
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "deleteOptions": {"preconditions": {"uid": meta["uid"]}}}
        try:
            await self.kube.create(pod_path(meta["namespace"], meta["name"], "eviction"), body)
        except KubeError as e:
            if e.status == 404:
                return
            if e.status != 429:
                raise
            since = self._evict_refused_since.setdefault(key, time.monotonic())
            grace = self.settings.evict_grace
            if time.monotonic() - since < grace:
                self.queue.add_after(self._item(key), 5.0)
                await self.events.emit(pod, contract.EV_EVICTION_REFUSED, f"{e.message}; retrying, "
                                       f"deleting after {grace:.0f}s", warning=True)
                return
            await self.kube.delete(pod_path(meta["namespace"], meta["name"]),
                                   {"preconditions": {"uid": meta["uid"]}})
        self._evict_refused_since.pop(key, None)
        metrics.EVICTIONS.labels(d.reason).inc()
        await self.events.emit(pod, contract.EV_EVICTED, f"evicted: {d.message}", warning=True)

    # --- periodic sweeps (work proportional to our jobs, run rarely) ---
    async def sweep(self, interval: float = 10.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self._sweep_once()
            except Exception as e:
                log.warning("sweep failed", extra=kv(error=str(e)))

    async def _sweep_once(self) -> None:
        if not (self.pods.synced.is_set() and self.jobs.synced.is_set()):
            return
        for dup in self.jobs.duplicates:
            await self._cancel(dup, "duplicate")
            log.info("duplicate job of a claim cancelled", extra=kv(job=dup.job_id))
        self.jobs.duplicates = []
        now = time.time()
        gated = stuck = 0
        for claim, job in list(self.jobs.by_claim.items()):
            key = self.key_by_claim.get(claim)
            if key is None:
                # already ending (usually our own KILL): cancelling again only costs
                # slurmctld an RPC
                if job.state in STOPPING_STATES:
                    continue
                # Pod never appeared (admission rejected later) or vanished while we were down
                if job.submit_time and now - job.submit_time > self.settings.orphan_grace:
                    await self._cancel(job, "orphan")
                    log.info("orphan job cancelled", extra=kv(job=job.job_id, claim=claim))
                continue
            pod = self.pods.store.get(key)
            if pod is None or (pod.get("spec") or {}).get("nodeName"):
                continue
            gated += 1
            seen = self.jobs.seen_running_at.get(job.job_id)
            if job.state == RUNNING and seen and time.monotonic() - seen > STUCK_AFTER:
                stuck += 1
                self.queue.add(self._item(key, pod))
        metrics.GATED.set(gated)
        metrics.STUCK.set(stuck)
        for node in await self.nodesync.drifted():  # e.g. a drain undone behind our back
            self.node_queue.add(node)

    async def _first_sync(self) -> None:
        """Once both sides are known, look at every Pod once (e.g. jobs gone while we were down)."""
        await self.pods.synced.wait()
        await self.jobs.synced.wait()
        for key in list(self.pods.store):
            self.queue.add(self._item(key))

    async def run(self) -> None:
        tasks = [asyncio.create_task(t) for t in (
            self.nodes.run(), self.pods.run(), self.jobs.run(), self._first_sync(),
            self.queue.run_workers(self.settings.workers, self.handle), self.sweep(),
            self.node_queue.run_workers(2, self.nodesync.handle))]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
