"""Carries out gang.decide_group(): one job per group, all members bound in one reconcile."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import TYPE_CHECKING, Any

from binder import gang, metrics, state
from slurmgate import contract, podrequest
from slurmgate.logs import kv
from slurmgate.slurm import ENDING_STATES, PENDING, JobInfo, SlurmError
from slurmgate.slurm.placeholder import job_spec

if TYPE_CHECKING:
    from binder.reconciler import Binder

log = logging.getLogger("slurmgate.gangs")


class GangReconciler:
    def __init__(self, binder: Binder) -> None:
        self.b = binder

    def members(self, gkey: str) -> list[dict[str, Any]]:
        store = self.b.pods.store
        return [store[k] for k in sorted(self.b.group_keys.get(gkey, ())) if k in store]

    async def reconcile(self, gkey: str) -> None:
        b = self.b
        members = self.members(gkey)
        if not members:
            return
        d = gang.decide_group(members, b.jobs.get, state.World(
            slurm_synced=b.jobs.synced.is_set(), now=time.time(), node_for=b.node_for),
            timeout=b.settings.group_timeout)
        metrics.RECONCILES.labels(f"group{d.action}").inc()
        item = ("group", gkey, None)
        if d.action in (gang.NOTHING, gang.WAIT):
            for p in d.members:
                if d.reason:
                    await b.events.emit(p, d.reason, d.message, warning=True)
            if d.requeue_after:
                b.queue.add_after(item, d.requeue_after)
            return
        if d.action == gang.SUBMIT:
            await self._submit(gkey, list(d.members))
        elif d.action == gang.STATUS:
            await asyncio.gather(*(b._set_status(p, d.status) for p in d.members))
            await asyncio.gather(*(b.events.emit(p, d.reason, d.message) for p in d.members))
        elif d.action == gang.BIND:
            job = b.jobs.get(gang.current_claim(members))
            assert job is not None
            await asyncio.gather(*(
                b._bind(p, job, state.Decision(
                    state.BIND, node=node, reason=contract.EV_BOUND,
                    status={**d.status, contract.A_SLURM_NODE: slurm_node},
                    message=f"{d.message} allocated {slurm_node} (rank "
                            f"{gang.rank_key(p)[0]}); bound to Node {node}"), slurm_node)
                for p, node, slurm_node in d.binds))
            log.info("group bound", extra=kv(group=gkey, job=job.job_id,
                                             nodes=[n for _, n, _ in d.binds]))
        elif d.action in (gang.EVICT, gang.RELEASE):
            ev = state.Decision(state.EVICT, reason=d.reason, message=d.message,
                                status=d.status)
            await asyncio.gather(*(b._evict(p, ev) for p in d.evict))
            await asyncio.gather(*(self._clear(p, d.reason, d.message) for p in d.clear))
            if d.cancel is not None:
                await b._cancel(d.cancel, "group_released")
            if d.evict or d.cancel:
                log.info("group released", extra=kv(group=gkey, reason=d.reason,
                                                    evicted=len(d.evict)))

    async def _clear(self, pod: dict[str, Any], reason: str, message: str) -> None:
        """Send a gated member back to waiting for a new job of its group."""
        await self.b._set_status(pod, {
            contract.A_CLAIM: "", **dict.fromkeys(contract.JOB_ANNOTATIONS, ""),
            contract.A_JOB_STATE: contract.JOB_STATE_GROUP_PENDING})
        await self.b.events.emit(pod, reason, message, warning=True)

    def _adoptable(self, gkey: str) -> JobInfo | None:
        """A job submitted for this group whose claim no member carries (we crashed between
        submitting and annotating): take it over rather than submit a second one."""
        for claim, job in self.b.jobs.by_claim.items():
            if (contract.group_from_comment(job.comment) == gkey
                    and claim not in self.b.key_by_claim
                    and job.state not in ENDING_STATES):
                return job
        return None

    async def _submit(self, gkey: str, members: list[dict[str, Any]]) -> None:
        b = self.b
        if not b.jobs.synced.is_set():
            return  # never submit blind: a job of ours may already exist
        ns, group = gkey.split("/", 1)
        try:
            reqs = [podrequest.from_pod(p, b.settings.default_memory,
                                         b.settings.default_partition)
                    for p in members]
        except podrequest.PodRequestError as e:
            await asyncio.gather(*(b.events.emit(p, contract.EV_INVALID_REQUEST, str(e),
                                                 warning=True)
                                   for p in members))
            return
        # One node per member; each node sized for the largest member.
        first = reqs[0]
        r = podrequest.PodRequest(
            memory_mib=max(x.memory_mib for x in reqs), cpus=max(x.cpus for x in reqs),
            gpus=max(x.gpus for x in reqs), partition=first.partition, qos=first.qos,
            account=first.account, time_limit_minutes=first.time_limit_minutes,
            constraint=first.constraint, nice=first.nice,
            termination_grace_seconds=first.termination_grace_seconds)
        adopted = self._adoptable(gkey)
        if adopted is not None:
            claim = contract.claim_from_comment(adopted.comment) or ""
            job_id = adopted.job_id
        else:
            claim = uuid.uuid4().hex
            spec = job_spec(r, claim, ns, f"group:{group}")
            spec = dataclasses.replace(spec, nodes=len(members),
                                       comment=contract.group_comment(claim, ns, group))
            try:
                job_id = await b.slurm.submit(spec)
            except SlurmError as e:
                await asyncio.gather(*(b.events.emit(p, contract.EV_SUBMIT_FAILED, str(e),
                                                     warning=True) for p in members))
                raise
        now = str(int(time.time()))
        await asyncio.gather(*(b._set_status(p, {
            contract.A_CLAIM: claim, contract.A_JOB_ID: str(job_id),
            contract.A_JOB_STATE: PENDING, contract.A_SUBMITTED_AT: now,
            contract.A_GROUP_INDEX: str(rank)}) for rank, p in enumerate(members)))
        b.jobs.kick()
        await asyncio.gather(*(b.events.emit(
            p, contract.EV_JOB_SUBMITTED, f"group {group} complete ({len(members)} members): "
            f"{'adopted' if adopted else 'submitted'} job {job_id} for {len(members)} nodes; "
            f"this member is rank {rank}") for rank, p in enumerate(members)))
        log.info("group job submitted", extra=kv(group=gkey, job=job_id, nodes=len(members)))
