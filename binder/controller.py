"""The binder's controller: wiring, the event handlers, reconcile(Request) and the sweeps.

A reconcile reads one unit (a Pod, or a gang) from the index, asks decide.decide() what to do
and carries the Decision out through Actions. State lives in Pod annotations and in Slurm,
never only here: the indexes are caches rebuilt from watches and polls after a restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from slurmgate import contract, reasons, tenancy
from slurmgate.kube import KubeClient
from slurmgate.kubeview import PodView
from slurmgate.logs import kv
from slurmgate.slurm import RUNNING, STOPPING_STATES, JobInfo, SlurmClient

from . import actions, decide, lostjobs, metrics, podview
from .actions import Actions
from .config import ReconcileSettings
from .decision import Decision, Unit, World
from .events import Recorder
from .index import Index, Request
from .informer import Informer
from .jobs import JobTracker
from .nodesync import NodeSync
from .podview import ann, claim_of, handoff_left, is_gated, key_of
from .workqueue import WorkQueue

log = logging.getLogger("slurmgate.binder")

STUCK_AFTER = 30.0
# how long a job is looked for after a Pod whose admission submit got no answer
UNANSWERED_SUBMIT_WATCH = 60.0
ANNOUNCED_MAX = 100_000
# a bound Pod's status refresh that met binds in flight is looked at again after this
REFRESH_AFTER_BINDS = 1.0


class Controller:
    def __init__(self, kube: KubeClient, slurm: SlurmClient,
                 settings: ReconcileSettings | None = None,
                 policy: Callable[[], tenancy.PolicyState] = lambda: tenancy.STATE_DISABLED
                 ) -> None:
        self.settings = settings or ReconcileSettings()
        self.queue: WorkQueue[Request] = WorkQueue()
        self.node_queue: WorkQueue[str] = WorkQueue()
        self.events = Recorder(kube, turn=lambda: self.actions.background.after_binds())
        self.jobs = JobTracker(slurm, self._on_job,
                               comment_of=lambda job_id: self.index.comment_by_job.get(job_id),
                               named=self._named_job_ids,
                               full_every=self.settings.full_list_interval,
                               ready=lambda: self.pods.synced.is_set(),
                               partitions=[p for p in [self.settings.default_partition] if p])
        self.pods = Informer(kube, "/api/v1/pods", self._on_pod,
                             label_selector=f"{contract.MARK_LABEL}={contract.MARK_VALUE}")
        self.nodes = Informer(kube, "/api/v1/nodes", self._on_node,
                              label_selector=contract.NODE_LABEL)
        self.index = Index(self.pods)
        self.actions = Actions(kube, slurm, self.events, self.jobs, self.pods,
                               self.settings, policy)
        self.jobs.cancelled = self.actions.cancelled
        self.actions.background.on_condition_failed = lambda key: self.queue.add_after(
            self.index.request(key), 1.0)
        self.nodesync = NodeSync(slurm, self.nodes, self.node_queue, self._stopping_on)
        self._announced: dict[str, None] = {}  # Pod uids told about their job (insertion order)
        self._refused: set[Request] = set()  # units the tenancy policy refused a submit

    def _named_job_ids(self) -> set[int]:
        """The ids of our jobs that Pods name (or named until just now), and those we submitted
        whose id has not reached a Pod yet: what the job poller asks Slurm about."""
        return {*self.index.comment_by_job, *self.index.recently_gone_jobs(),
                *(i for i, _ in self.actions.submitted.values())}

    # --- event handlers: cheap, they only index and enqueue ---
    def policy_changed(self, state: tenancy.PolicyState) -> None:
        """The tenancy policy changed: whom it refused is looked at now, not at the next
        TENANCY_RETRY (an operator who just listed a namespace expects its Pods to start)."""
        refused, self._refused = self._refused, set()
        for req in refused:
            self.queue.add(req)

    def _on_pod(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        unanswered = next((p for p in (new, old) if p is not None and ann(p).get(
            contract.A_JOB_STATE) == contract.JOB_STATE_SUBMIT_PENDING), None)
        if unanswered is not None:
            # the webhook's submit got no answer (fail-open): slurmrestd may still make that
            # job once slurmctld is back, beside the one we submit; no Pod names it, so it is
            # looked up by name (e2e test_slurmctld_killed_fail_open)
            self.jobs.want_named(lostjobs.names_of(unanswered["metadata"]),
                                 UNANSWERED_SUBMIT_WATCH)
        if new is not None and is_gated(new):
            self.jobs.kick()
            if ann(new).get(contract.A_JOB_STATE) == contract.JOB_STATE_SUBMITTING:
                # a submit handed off at admission: its job may land any time within the grace
                self.jobs.want_named(lostjobs.names_of(new["metadata"]), handoff_left(
                    (new,), time.time(), contract.SUBMIT_HANDOFF_GRACE))
            job = ann(new).get(contract.A_JOB_ID, "")
            # a new Pod, or one the binder gave a new job (a resubmit, a group's job)
            if job.isdigit() and (old is None or ann(old).get(contract.A_JOB_ID) != job):
                self.index.pod_changed(key, old, new)  # so the push below finds its claim
                self.jobs.pod_seen(int(job))
        self.queue.add(self.index.pod_changed(key, old, new))
        was = PodView(old).node_name if old is not None else ""
        if was and (new is None or not podview.occupies(new)):
            self.nodesync.pod_left(was)  # it may have been what kept its Slurm node drained

    def _unheld(self, pod: dict[str, Any]) -> bool:
        """Its job's placeholder no longer keeps its Slurm node (it ended NODE_FAIL, is requeued
        or is ending): only then may Slurm need holding off the Node while the Pod stops."""
        slurm_node = ann(pod).get(contract.A_SLURM_NODE, "")
        return not podview.placeholder_keeps(self.jobs.get(claim_of(pod)), slurm_node)

    def _stopping_on(self, k8s_node: str) -> list[str]:
        """Our Pods that still occupy this Node while their job's placeholder no longer keeps
        its Slurm node (binder/nodesync.held). A walk over our Pods, never Slurm's."""
        return sorted(key for key, pod in list(self.pods.store.items())
                      if PodView(pod).node_name == k8s_node and podview.occupies(pod)
                      and self._unheld(pod))

    def _on_job(self, claim: str, job: JobInfo | None) -> None:
        req = self.index.job_changed(claim)
        if req is not None:
            self.queue.add(req)

    def _on_node(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> None:
        changed = self.index.node_changed(key, old, new, self.jobs.by_claim)
        if changed is None:  # a status heartbeat: nothing the binder reads changed
            return
        requests, sync = changed
        for req in requests:
            self.queue.add(req)
        if sync:
            self.node_queue.add(key)

    # --- reconcile ---
    async def handle(self, req: Request) -> None:
        try:
            await self.reconcile(req)
            self.queue.forget(req)
        except Exception as e:
            metrics.RECONCILE_ERRORS.inc()
            delay = self.queue.retry(req)
            log.warning("reconcile failed; will retry",
                        extra=kv(pod=req.key, error=str(e), retry_in=round(delay, 2)))

    async def reconcile(self, req: Request) -> None:
        started = time.monotonic()
        self.index.forget_gone(req, self.jobs.get)
        unit = self.index.unit(req)
        if not unit.members and not unit.gone_claims:
            return
        failed = (await self.nodesync.failed_nodes(read_after=started)
                  if decide.needs_node_states(unit, self.jobs.get) else frozenset())
        d = decide.decide(unit, self.jobs.get, World(
            slurm_synced=self.jobs.synced.is_set(), now=time.time(),
            node_for=self.index.node_for, failed_nodes=failed,
            group_timeout=self.settings.group_timeout, gpu_grace=self.settings.gpu_grace,
            submitted=self.actions.submitted, cancelled=self.actions.cancelled.keys(),
            kill_wait=self.settings.kill_wait,
            grace_time=self.jobs.grace))
        metrics.RECONCILES.labels(f"group{d.action}" if unit.gang else d.action).inc()
        if not unit.gang and unit.members and d.action != decide.SUBMIT:
            await self._announce(unit.members[0])
        await self.apply(req, unit, d)

    async def _announce(self, pod: dict[str, Any]) -> None:
        """The webhook can't write Events (the Pod does not exist yet at admission)."""
        uid = PodView(pod).uid
        # a submit handed off at admission names no job: Slurm's list knows it by the claim
        job = self.jobs.get(claim_of(pod))
        job_id = ann(pod).get(contract.A_JOB_ID) or (str(job.job_id) if job else None)
        if uid in self._announced or not job_id:
            return
        self._announced[uid] = None
        if len(self._announced) > ANNOUNCED_MAX:
            self._announced.clear()
        await self.events.emit(pod, reasons.EV_JOB_SUBMITTED,
                               f"placeholder job {job_id} submitted at admission", once=False)

    async def apply(self, req: Request, unit: Unit, d: Decision) -> None:
        act = self.actions
        for p, c in d.conditions:
            act.background.set_condition(p, c)
        if d.action in (decide.NOTHING, decide.WAIT):
            if d.reason:
                await asyncio.gather(*(self.events.emit(p, d.reason, d.message, warning=True)
                                       for p in d.members))
            if d.requeue_after:
                self.queue.add_after(req, d.requeue_after)
            return
        if d.action == decide.STATUS and not d.reason and act.background.binds_in_flight:
            # a bound Pod's refresh (its allocation, read after a pushed start bound it) waits
            # out a burst of binds: the API server is what a burst waits on
            self.queue.add_after(req, REFRESH_AFTER_BINDS)
        elif d.action == decide.STATUS:
            await asyncio.gather(*(act.set_status(p, d.status) for p in d.members))
            if d.reason:
                await asyncio.gather(*(self.events.emit(p, d.reason, d.message)
                                       for p in d.members))
        elif d.action == decide.BIND:
            assert d.job is not None
            await asyncio.gather(*(act.bind(b.pod, d.job, b.node, b.slurm_node, d.status,
                                            decide.bind_message(d, b, unit.gang))
                                   for b in d.binds))
            if unit.gang:
                log.info("group bound", extra=kv(group=req.key, job=d.job.job_id,
                                                 nodes=[b.node for b in d.binds]))
        elif d.action == decide.SUBMIT:
            again = await act.submit(req.key, list(d.members), unit.gang, self._unclaimed)
            if again is not None:  # the tenancy policy refuses it now; it may change
                self._refused.add(req)
                self.queue.add_after(req, again)
        else:  # EVICT, RELEASE: let go of Nodes and jobs
            await self._release(req, unit, d)

    def _unclaimed(self) -> list[JobInfo]:
        return list(self.index.unclaimed(self.jobs.by_claim))

    async def _release(self, req: Request, unit: Unit, d: Decision) -> None:
        act = self.actions
        # first, whatever must keep Slurm off their Nodes while they stop (a failed node)
        await asyncio.gather(*(self.nodesync.settle(n) for n in
                               {PodView(p).node_name for p in d.evict if self._unheld(p)} - {""}))
        retry = await asyncio.gather(*(act.evict(p, d.reason, d.message, d.status, d.stop_by)
                                       for p in d.evict))
        if any(r is not None for r in retry):  # a PodDisruptionBudget said no, for now
            self.queue.add_after(req, min(r for r in retry if r is not None))
        await asyncio.gather(*(act.clear(p, d.reason, d.message) for p in d.clear))
        if d.cancel is not None:
            await act.cancel(d.cancel, d.cancel_why)
            self.index.forget_gone(req, self.jobs.get, cancelled=d.cancel)
            await asyncio.gather(*(self.events.emit(p, d.reason, d.message)
                                   for p in d.members))
            if unit.members and contract.claim_from_comment(d.cancel.comment) in unit.gone_claims:
                self.queue.add(req)  # the rest of the unit (e.g. a re-created Pod) decides next
        for p in d.resubmit:
            await self.events.emit(p, d.reason, d.message, warning=True)
            if await act.submit(req.key, [p], False, self._unclaimed) is not None:
                # refused by the tenancy policy; said on the Pod, so that its given-back job's
                # end (ours) never evicts it, across restarts too: it waits for the policy to
                # allow a new one
                await act.set_status(p, {contract.A_JOB_STATE: contract.JOB_STATE_GIVEN_BACK})
                self._refused.add(req)
                self.queue.add_after(req, actions.TENANCY_RETRY)
        if unit.gang and (d.evict or d.cancel):
            log.info("group released", extra=kv(group=req.key, reason=d.reason,
                                                evicted=len(d.evict)))
        elif d.cancel is not None and not unit.members:
            log.info("pod gone; job cancelled", extra=kv(pod=req.key, job=d.cancel.job_id))

    # --- periodic sweeps (work proportional to our jobs, run rarely) ---
    async def sweep(self, interval: float = 10.0) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sweep_once()
            except Exception as e:
                log.warning("sweep failed", extra=kv(error=str(e)))

    async def sweep_once(self) -> None:
        if not (self.pods.synced.is_set() and self.jobs.synced.is_set()):
            return
        for dup in self.jobs.duplicates:
            await self.actions.cancel(dup, "duplicate")
            claim = contract.claim_from_comment(dup.comment)
            log.info("duplicate job of a claim cancelled", extra=kv(
                job=dup.job_id, pod=self.index.key_by_claim.get(claim) if claim else None))
        self.jobs.duplicates = []
        for req in list(self.index.gone_claims):
            self.index.forget_gone(req, self.jobs.get)
        now = time.time()
        gated = stuck = overdue = 0
        for claim, job in list(self.jobs.by_claim.items()):
            key = self.index.key_by_claim.get(claim)
            if key is None:
                # already ending (usually our own KILL): cancelling again only costs
                # slurmctld an RPC
                if job.state in STOPPING_STATES:
                    continue
                # Pod never appeared (admission rejected later) or vanished while we were down
                if job.submit_time and now - job.submit_time > self.settings.orphan_grace:
                    await self.actions.cancel(job, "orphan")
                    log.info("orphan job cancelled", extra=kv(job=job.job_id, claim=claim))
                continue
            pod = self.pods.store.get(key)
            if pod is None or PodView(pod).bound:
                continue
            gated += 1
            overdue += podview.overdue(pod, now)
            seen = self.jobs.seen_running_at.get(job.job_id)
            if job.state == RUNNING and seen and time.monotonic() - seen > STUCK_AFTER:
                stuck += 1
                self.queue.add(self.index.request(key_of(pod)))
        metrics.GATED.set(gated)
        metrics.STUCK.set(stuck)
        metrics.OVERDUE.set(overdue)
        for node in await self.nodesync.drifted():  # e.g. a drain undone behind our back
            self.node_queue.add(node)

    async def _first_sync(self) -> None:
        """Once both sides are known, look at every Pod once (e.g. jobs gone while we were down)."""
        await self.pods.synced.wait()
        await self.jobs.synced.wait()
        for key in list(self.pods.store):
            self.queue.add(self.index.request(key))

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
