"""The binder's indexes over its caches, and the typed Request they produce.

Claim <-> Pod, gang -> members, Slurm node <-> Kubernetes Node, and the claims of Pods deleted
since their unit was last reconciled. Event handlers update these and get back the Requests
to queue; a reconcile turns a Request into a decision.Unit. Everything here is rebuilt from
watches and polls after a restart.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from slurmgate import contract
from slurmgate.slurm import RELEASED_STATES, JobInfo

from .decision import Unit
from .informer import Informer
from .podview import NodeRef, Pod, ann, node_ref

# how long the job of a deleted Pod is still asked about (a few polls, at the slowest)
GONE_JOB_KEEP = 60.0


@dataclass(frozen=True)
class Request:
    """One unit to reconcile: a single Pod, or a gang by its group name. Hashable, so the
    work queue holds each unit once and never runs it twice at the same time."""
    namespace: str
    name: str
    gang: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def request_for(key: str, pod: Pod | None) -> Request:
    """A gang member is reconciled with its whole group."""
    ns, name = key.split("/", 1)
    group = ann(pod or {}).get(contract.A_GROUP)
    return Request(ns, group, True) if group else Request(ns, name)


class Index:
    def __init__(self, pods: Informer) -> None:
        self.informer = pods  # its store is replaced on a relist: always read it through here
        self.key_by_claim: dict[str, str] = {}
        self.claim_by_key: dict[str, str] = {}
        self.group_keys: dict[str, set[str]] = {}  # "ns/group" -> member Pod keys
        self.node_for: dict[str, NodeRef] = {}  # Slurm node -> k8s Node
        self.slurm_of: dict[str, str] = {}  # k8s Node -> Slurm node
        self.gone_claims: dict[Request, set[str]] = {}  # claims of deleted Pods, by unit
        # job id (the Pod's annotation) -> the comment its job was submitted with: a push
        # about a job no poll has shown yet is still recognised as ours
        self.comment_by_job: dict[int, str] = {}
        self._gone_jobs: dict[int, float] = {}  # job id of a deleted Pod -> when (monotonic)

    def request(self, key: str) -> Request:
        return request_for(key, self.informer.store.get(key))

    def pod_changed(self, key: str, old: Pod | None, new: Pod | None) -> Request:
        obj = new or old or {}
        claim = ann(obj).get(contract.A_CLAIM)
        req = request_for(key, obj)
        if req.gang:
            members = self.group_keys.setdefault(req.key, set())
            if new is None:
                members.discard(key)
                if not members:
                    self.group_keys.pop(req.key, None)
            else:
                members.add(key)
        if new is None:
            if claim:
                self._unlink(claim, key, req)
                self.gone_claims.setdefault(req, set()).add(claim)
            self.claim_by_key.pop(key, None)
            job = ann(obj).get(contract.A_JOB_ID, "")
            if job.isdigit():
                self.comment_by_job.pop(int(job), None)
                # still asked about for a while: a Pod deleted before any poll read its job
                # leaves an orphan no other id names
                self._gone_jobs[int(job)] = time.monotonic()
            return req
        before = ann(old).get(contract.A_JOB_ID, "") if old is not None else ""
        if before.isdigit() and before != ann(obj).get(contract.A_JOB_ID, ""):
            # the Pod moved to a new job (resubmitted): its old id is no longer ours, and a
            # controller that lost its state hands that id to someone else's job
            self.comment_by_job.pop(int(before), None)
        had = ann(old).get(contract.A_CLAIM) if old is not None else None
        if had and had != claim:
            # the claim was taken off (a released gang's gated member, back to GroupPending) or
            # replaced: its job is no longer this Pod's, and if no other Pod holds the claim,
            # the orphan sweep must see it (a cancel slurmctld lost in a crash is redone)
            self._unlink(had, key, req)
            if not claim:
                self.claim_by_key.pop(key, None)
        if claim:
            self.key_by_claim[claim] = key
            self.claim_by_key[key] = claim
            job = ann(obj).get(contract.A_JOB_ID, "")
            if job.isdigit():
                self.comment_by_job[int(job)] = (
                    contract.group_comment(claim, req.namespace, req.name) if req.gang
                    else contract.job_comment(claim, req.namespace, req.name))
        return req

    def recently_gone_jobs(self) -> list[int]:
        """Job ids of Pods deleted within GONE_JOB_KEEP: the job poller asks about them."""
        now = time.monotonic()
        self._gone_jobs = {i: t for i, t in self._gone_jobs.items() if now - t < GONE_JOB_KEEP}
        return list(self._gone_jobs)

    def _unlink(self, claim: str, key: str, req: Request) -> None:
        """`key` no longer holds `claim`: point it at another gang member that does, if any."""
        if self.key_by_claim.get(claim) != key:
            return
        del self.key_by_claim[claim]
        for other in self.group_keys.get(req.key, ()) if req.gang else ():
            if other != key and ann(self.informer.store.get(other) or {}).get(
                    contract.A_CLAIM) == claim:
                self.key_by_claim[claim] = other
                break

    def job_changed(self, claim: str) -> Request | None:
        key = self.key_by_claim.get(claim)
        if key is not None:
            return self.request(key)
        # A deleted Pod's job still on its way out: Slurm 22.05 requeues a job under the same
        # id (COMPLETING, then PENDING again), and its unit must see it to cancel it then
        return next((req for req, claims in self.gone_claims.items() if claim in claims), None)

    def node_changed(self, key: str, old: dict[str, Any] | None, new: dict[str, Any] | None,
                     jobs: dict[str, JobInfo]) -> tuple[list[Request], bool] | None:
        """The units to look at again and whether the Node's drain may need syncing; None for
        a change the binder does not read (a status heartbeat)."""
        # as the binder reads a Node (its name aside: the key says it)
        before, after = (dataclasses.replace(v, name="") if v else None
                         for v in (node_ref(old), node_ref(new)))
        if before == after:
            return None
        prev = self.slurm_of.pop(key, None)
        if prev:
            self.node_for.pop(prev, None)
        slurm_name = after.slurm_node if after else None
        requests = []
        if after is not None and slurm_name:
            self.node_for[slurm_name] = dataclasses.replace(after, name=key)
            self.slurm_of[key] = slurm_name
            # Pods waiting on this node (e.g. it just appeared) get another look
            for claim, job in jobs.items():
                if slurm_name in job.nodes and claim in self.key_by_claim:
                    requests.append(self.request(self.key_by_claim[claim]))
        return requests, bool(slurm_name or (before and before.slurm_node))

    def unit(self, req: Request) -> Unit:
        gone = frozenset(self.gone_claims.get(req, ()))
        if not req.gang:
            return Unit.single(self.informer.store.get(req.key), gone)
        keys = sorted(self.group_keys.get(req.key, ()))
        return Unit(tuple(self.informer.store[k] for k in keys
                     if k in self.informer.store), True, gone)

    def forget_gone(self, req: Request, job_of: Callable[[str], JobInfo | None],
                    cancelled: JobInfo | None = None) -> None:
        """Drop the deleted Pods' claims whose job needs nothing more from us. A COMPLETING
        job is kept: it may come back PENDING (requeued) and then needs our cancel."""
        claims = self.gone_claims.get(req)
        if not claims:
            return
        for claim in list(claims):
            job = job_of(claim)
            if job is None or job.state in RELEASED_STATES or (
                    cancelled is not None and job.job_id == cancelled.job_id):
                claims.discard(claim)
        if not claims:
            del self.gone_claims[req]

    def unclaimed(self, jobs: dict[str, JobInfo]) -> Iterator[JobInfo]:
        """Jobs of ours no cached Pod holds the claim of."""
        return (job for claim, job in jobs.items() if claim not in self.key_by_claim)
