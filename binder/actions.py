"""Every side effect of the binder, as one public object: bind, evict, cancel, submit, status,
clear. The controller carries out a Decision with these; nothing else writes to Kubernetes or
Slurm (Events go through the Recorder these methods are given, the condition after a bind
through their BackgroundWrites)."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

from slurmgate import contract, faults, podrequest, priorities, reasons, tenancy
from slurmgate.kube import KubeClient, KubeError, pod_path, pointer_escape
from slurmgate.kubeview import PodView
from slurmgate.logs import kv
from slurmgate.preemption import evict_grace
from slurmgate.slurm import (
    ENDING_STATES,
    JobInfo,
    JobSpec,
    SlurmClient,
    SlurmError,
    SlurmRefused,
    SlurmUnavailable,
)
from slurmgate.slurm.placeholder import job_spec, pod_display_name, refusal, submitted_status
from slurmgate.timestamps import parse_time

from . import displaced, metrics
from .background import BackgroundWrites
from .config import ReconcileSettings
from .events import Recorder
from .informer import Informer
from .jobs import JobTracker
from .podview import (
    Pod,
    allocated_condition,
    is_gated,
    job_status,
    key_of,
)

log = logging.getLogger("slurmgate.actions")
# A Pod the tenancy policy refuses now is looked at again after this (the policy may change)
TENANCY_RETRY = 30.0
CANCELLED_KEEP = 3600.0  # seconds a job we cancelled stays known as such
SUBMITTED_KEEP = 60.0  # seconds a submit is remembered: the watch has the Pod's job id by then
# how long a job is looked for after our submit got no answer: slurmrestd keeps the request and
# may still make the job once slurmctld is back (seen 12 s later; the webhook waits 120 s)
LOST_SUBMIT_WATCH = 120.0

# the claims no cached Pod holds; adoption looks among their jobs
UnclaimedJobs = Callable[[], list[JobInfo]]


def _submit_event(e: SlurmError, spec: JobSpec) -> tuple[str, str]:
    """Reason and message of the Event of a failed submit: a refusal in Slurm's own words,
    apart from a Slurm that could not be reached or answered what we could not read."""
    if isinstance(e, SlurmRefused):
        return reasons.EV_SUBMIT_REFUSED, refusal(e, spec)
    return reasons.EV_SUBMIT_FAILED, str(e)


def _widest(reqs: list[podrequest.PodRequest]) -> podrequest.PodRequest:
    """One node per member, each sized for the largest member (a single Pod: its own)."""
    return dataclasses.replace(reqs[0], memory_mib=max(x.memory_mib for x in reqs),
                               cpus=max(x.cpus for x in reqs), gpus=max(x.gpus for x in reqs))


def _spec(key: str, r: podrequest.PodRequest, claim: str, members: list[Pod],
          gang: bool) -> JobSpec:
    view = PodView(members[0])
    if not gang:
        return job_spec(r, claim, view.namespace, pod_display_name(view.meta))
    group = key.split("/", 1)[1]
    return dataclasses.replace(job_spec(r, claim, view.namespace, f"group:{group}"),
                               nodes=len(members),
                               comment=contract.group_comment(claim, view.namespace, group))


def _submitted_words(key: str, job_id: int, size: int, rank: int, gang: bool, adopted: bool,
                     user: str | None) -> str:
    if gang:
        return (f"group {key.split('/', 1)[1]} complete ({size} members): "
                f"{'adopted' if adopted else 'submitted'} job {job_id} for {size} nodes; "
                f"this member is rank {rank}")
    return f"submitted placeholder job {job_id}" + (f" as Slurm user {user}" if user else "")


class Actions:
    def __init__(self, kube: KubeClient, slurm: SlurmClient, events: Recorder, jobs: JobTracker,
                 pods: Informer, settings: ReconcileSettings,
                 policy: Callable[[], tenancy.PolicyState] = lambda: tenancy.STATE_DISABLED
                 ) -> None:
        self.kube = kube
        # the tenancy policy now: the user and account of every job come from it, never from
        # the Pod (its annotations name an account at most, which the policy checks)
        self.policy = policy
        self.slurm = slurm
        self.events = events
        self.jobs = jobs
        self.pods = pods  # a bind is assumed in its store at once
        self.settings = settings
        self._evict_refused_since: dict[str, float] = {}
        # job id -> when we cancelled it: a group never adopts such a job, though it may still
        # look alive (until the next poll, or for good if slurmctld lost the cancel in a crash)
        self.cancelled: dict[int, float] = {}
        # claim -> (job id, wall time) of a single Pod's latest submit, for decision.World
        self.submitted: dict[str, tuple[int, float]] = {}
        # the condition and lookups after a bind; they wait while binds are in flight
        self.background = BackgroundWrites(kube)

    async def set_status(self, pod: Pod, status: dict[str, str]) -> None:
        """Merge the status annotations; an empty value removes one."""
        view = PodView(pod)
        patch = {"metadata": {"annotations": {k: (v or None) for k, v in status.items()}}}
        await self.kube.merge_patch(pod_path(view.namespace, view.name), patch)

    async def cancel(self, job: JobInfo, why: str) -> None:
        now = time.monotonic()
        # noted before the call: a cancel that fails may still have reached slurmctld; ids
        # come back only from a controller that lost its state, so an hour bounds the map
        for old in [j for j, t in self.cancelled.items() if now - t >= CANCELLED_KEEP]:
            del self.cancelled[old]  # in place: the job store reads this same dict
        self.cancelled[job.job_id] = now
        await self.slurm.cancel(job.job_id, "KILL")
        metrics.CANCELS.labels(why).inc()

    async def clear(self, pod: Pod, reason: str, message: str) -> None:
        """Send a gated gang member back to waiting for a new job of its group."""
        await self.set_status(pod, {
            contract.A_CLAIM: "", **dict.fromkeys(contract.JOB_ANNOTATIONS, ""),
            contract.A_JOB_STATE: contract.JOB_STATE_GROUP_PENDING})
        await self.events.emit(pod, reason, message, warning=True)

    def _request(self, pods: list[Pod]) -> list[podrequest.PodRequest]:
        return [podrequest.from_pod(p, self.settings.default_memory,
                                    self.settings.default_partition) for p in pods]

    async def _tenant(self, namespace: str, r: podrequest.PodRequest,
                      pods: list[Pod]) -> podrequest.PodRequest | None:
        """`r` as the tenancy policy lets it run (user set, account defaulted, what the first
        Pod's PriorityClass gives applied, as the webhook did), or None after telling the Pods
        why not: the policy may have changed since admission."""
        try:
            return tenancy.check(self.policy(), namespace, r, *priorities.of_pod(pods[0]))
        except tenancy.TenancyDenied as e:
            metrics.TENANCY_DENIED.labels(e.reason).inc()
            log.warning("tenancy policy refuses the submit; will look again",
                        extra=kv(namespace=namespace, reason=e.reason, error=e.message))
            await asyncio.gather(*(self.events.emit(p, e.reason, e.message, warning=True)
                                   for p in pods))
            return None

    async def submit(self, key: str, members: list[Pod], gang: bool,
                     unclaimed: UnclaimedJobs) -> float | None:
        """One placeholder job for a unit, the same way for a single Pod and a gang: a single
        Pod's under the claim the webhook gave it; a complete gang's (--nodes=len(members),
        each node sized for its largest member, members in rank order) under a new claim,
        unless a job we submitted for it before a crash is there to adopt. Returns when to
        look again if it cannot be submitted now (the tenancy policy refuses it), else None."""
        if gang and not self.jobs.listed.is_set():
            # never submit blind: a job of ours may already exist that no Pod names yet (we
            # crashed between a submit and the members' annotations); only the whole list,
            # read once after a start, finds it
            return None
        first = PodView(members[0])
        claim = "" if gang else first.annotations.get(contract.A_CLAIM, "")
        if not gang and not claim:
            await self.events.emit(members[0], reasons.EV_MISSING_CLAIM, f"Pod has no "
                                   f"{contract.A_CLAIM} annotation (not admitted by the "
                                   "webhook?)", warning=True)
            return None
        try:
            reqs = self._request(members)
        except podrequest.PodRequestError as e:
            await self._tell(members, reasons.EV_INVALID_REQUEST, str(e), warning=True)
            return None
        adopted = self._adoptable(key, unclaimed) if gang else None
        user = None
        if adopted is not None:
            claim = contract.claim_from_comment(adopted.comment) or ""
            job_id = adopted.job_id
        else:
            # the job carries the first member's options, its PriorityClass's mapping included
            allowed = await self._tenant(first.namespace, _widest(reqs), members)
            if allowed is None:
                return TENANCY_RETRY
            claim = claim or uuid.uuid4().hex
            spec = _spec(key, allowed, claim, members, gang)
            user = spec.user
            try:
                job_id = await self.slurm.submit(spec)
            except SlurmError as e:
                self._submit_failed(e, spec.name)
                await self._tell(members, *_submit_event(e, spec), warning=True)
                raise
        if adopted is None:
            # Slurm just gave this id to a new job: after a controller lost its state, an id
            # we cancelled or saw gone before comes back, and is this job's from now on
            self.cancelled.pop(job_id, None)
            self.jobs.submitted(job_id)
        self._remember_submit(claim, job_id)  # before the members' claims reach the watch
        now = time.time()
        await asyncio.gather(*(self.set_status(p, submitted_status(
            job_id, now, *((claim, rank) if gang else ()))) for rank, p in enumerate(members)))
        self.jobs.kick()
        await asyncio.gather(*(self.events.emit(p, reasons.EV_JOB_SUBMITTED, _submitted_words(
            key, job_id, len(members), rank, gang, adopted is not None, user))
            for rank, p in enumerate(members)))
        if gang:
            log.info("group job submitted", extra=kv(group=key, job=job_id, nodes=len(members)))
        return None

    async def _tell(self, pods: list[Pod], reason: str, message: str, warning: bool) -> None:
        await asyncio.gather(*(self.events.emit(p, reason, message, warning=warning)
                               for p in pods))

    def _adoptable(self, key: str, unclaimed: UnclaimedJobs) -> JobInfo | None:
        """A job submitted for this group whose claim no member carries (we crashed between
        submitting and annotating): taken over rather than a second one submitted."""
        return next((j for j in unclaimed() if contract.group_from_comment(j.comment) == key
                     and j.state not in ENDING_STATES and j.job_id not in self.cancelled), None)

    def _submit_failed(self, e: SlurmError, name: str) -> None:
        if isinstance(e, SlurmUnavailable):  # no answer: the job may exist all the same
            self.jobs.want_named([name], LOST_SUBMIT_WATCH)

    def _remember_submit(self, claim: str, job_id: int) -> None:
        now = time.time()
        self.submitted = {c: v for c, v in self.submitted.items()
                          if now - v[1] < SUBMITTED_KEEP}
        self.submitted[claim] = (job_id, now)

    async def bind(self, pod: Pod, job: JobInfo, node: str, slurm_node: str,
                   status: dict[str, str], message: str) -> None:
        """Ungate (with the status, in one patch) and bind to `node`; a retry is harmless.

        Only the two calls the API requires are on the path: the condition and the Events
        follow in the background."""
        with self.background.binding():
            await self._bind(pod, job, node, slurm_node, status, message)

    async def _bind(self, pod: Pod, job: JobInfo, node: str, slurm_node: str,
                    status: dict[str, str], message: str) -> None:
        t_start = time.time()
        view = PodView(pod)
        path = pod_path(view.namespace, view.name)
        # a gang's status names its first node: each member gets its own node and share
        status = {**status, contract.A_ALLOCATION: "", **job_status(job, slurm_node)}
        ops: list[dict[str, Any]] = []
        # the JSON patch's test compares the list as it is, so it is read as it is
        gates = pod["spec"].get("schedulingGates") or []
        if is_gated(pod):
            # test first: if anything changed the gates meanwhile, fail and reconcile again
            ops += [{"op": "test", "path": "/spec/schedulingGates", "value": gates},
                    {"op": "replace", "path": "/spec/schedulingGates",
                     "value": [g for g in gates if g.get("name") != contract.GATE]}]
        if not isinstance(view.meta.get("annotations"), dict):
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        have = view.annotations
        for k, v in status.items():
            ann_path = f"/metadata/annotations/{pointer_escape(k)}"
            if v:
                ops.append({"op": "add", "path": ann_path, "value": v})
            elif k in have:  # e.g. the pending reason, gone once running
                ops.append({"op": "remove", "path": ann_path})
        await self.kube.json_patch(path, ops)
        t_ungated = time.time()
        faults.point("binder_after_ungate")
        binding = {"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": view.name, "namespace": view.namespace,
                                "uid": view.uid},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            await self.kube.create(pod_path(view.namespace, view.name, "binding"), binding)
        except KubeError as e:
            if e.status != 409:
                raise
            return  # already bound (our cache lagged, or a retry after a crash): nothing new
        t_bound = time.time()
        self._assume_bound(pod, node)
        faults.point("binder_after_bind")
        seen = self.jobs.seen_running_at.get(job.job_id)
        if seen is not None:
            metrics.BIND_LATENCY.observe(time.monotonic() - seen)
        created = parse_time(view.created)
        if created is not None:
            metrics.GATE_TO_BIND.observe(max(0.0, time.time() - created))
        # wall times of each step, so that a bench can attribute RUNNING -> bound
        poll_sent, noticed = self.jobs.noticed_wall.get(job.job_id, (0.0, 0.0))
        log.info("pod bound", extra=kv(pod=key_of(pod), node=node, job=job.job_id,
                                       slurm_node=slurm_node, t_poll=round(poll_sent, 4),
                                       t_noticed=round(noticed, 4), t_start=round(t_start, 4),
                                       t_ungated=round(t_ungated, 4),
                                       t_bound=round(t_bound, 4)))
        await self.events.emit(pod, reasons.EV_ALLOCATED,
                               f"job {job.job_id} RUNNING on Slurm node {slurm_node}")
        await self.events.emit(pod, reasons.EV_BOUND, message)
        self.background.set_condition(pod, allocated_condition(job.job_id, slurm_node, node))
        self.background.run(self._tell_displaced(pod, t_start, slurm_node))

    async def _tell_displaced(self, pod: Pod, started: float, slurm_node: str) -> None:
        """An Event naming the batch job Slurm preempted for this Pod (binder/displaced.py)."""
        victim = await self.jobs.recent_ends.wait_before(slurm_node, started)
        if victim is None:
            return
        await self.background.after_binds()
        async with self.background.slots:
            try:
                said = await displaced.describe(self.slurm, victim, slurm_node)
            except SlurmError as e:
                log.info("could not look up the job that ended before a bind",
                         extra=kv(pod=key_of(pod), job=victim, error=str(e)))
                return
        if said is None:
            log.info("the job that ended before a bind was not preempted for it",
                     extra=kv(pod=key_of(pod), job=victim, slurm_node=slurm_node))
            return
        await self.events.emit(pod, reasons.EV_DISPLACED, said)

    def _assume_bound(self, pod: Pod, node: str) -> None:
        """Until the watch delivers the binding, a reconcile in between must not bind again."""
        key = key_of(pod)
        cached = self.pods.store.get(key)
        if cached is not None and PodView(cached).uid == PodView(pod).uid:
            self.pods.store[key] = {**cached, "spec": {
                **cached["spec"], "nodeName": node,
                "schedulingGates": [g for g in cached["spec"].get("schedulingGates") or []
                                    if g.get("name") != contract.GATE]}}

    async def evict(self, pod: Pod, reason: str, message: str, status: dict[str, str],
                    stop_by: float | None = None) -> float | None:
        """Evict (a PodDisruptionBudget may refuse: retry, then delete after a grace), with
        no more grace than is left before `stop_by`, when Slurm gives the Node to the next job.
        Returns when to try again if refused, else None."""
        view = PodView(pod)
        key = key_of(pod)
        options: dict[str, Any] = {"preconditions": {"uid": view.uid}}
        own = view.grace_seconds
        now = time.time()
        if stop_by is not None and (grace := evict_grace(own, stop_by, now)) is not None:
            options["gracePeriodSeconds"] = grace
            message += (f"; Slurm gives the Node to the next job in {max(0, stop_by - now):.0f}"
                        f"s, so the Pod gets {grace}s to stop (it asked for {own}s)")
        await self.events.emit(pod, reason, message, warning=True)
        if status:
            await self.set_status(pod, status)
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": view.name, "namespace": view.namespace},
                "deleteOptions": options}
        try:
            await self.kube.create(pod_path(view.namespace, view.name, "eviction"), body)
        except KubeError as e:
            if e.status == 404:
                return None
            if e.status != 429:
                raise
            since = self._evict_refused_since.setdefault(key, time.monotonic())
            wait = self.settings.evict_grace
            if time.monotonic() - since < wait:
                await self.events.emit(pod, reasons.EV_EVICTION_REFUSED, f"{e.message}; "
                                       f"retrying, deleting after {wait:.0f}s", warning=True)
                return 5.0
            await self.kube.delete(pod_path(view.namespace, view.name), options)
        self._evict_refused_since.pop(key, None)
        metrics.EVICTIONS.labels(reason).inc()
        # the Events expire after an hour; the log keeps why Slurm took the Node back
        log.info("pod evicted", extra=kv(pod=key, reason=reason, message=message))
        await self.events.emit(pod, reasons.EV_EVICTED, f"evicted: {message}", warning=True)
        return None
