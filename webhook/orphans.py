"""Jobs the webhook submitted for a Pod that never came: a step after ours (a ResourceQuota, a
validating webhook, an API server that failed to store the Pod) refused the Pod once its job
existed. The webhook cancels such a job itself, a little after admission, by asking the API
server for the Pod by the claim label it wrote. Otherwise only the binder's safety net would find
it (binder/lostjobs.py: a look in slurmdbd at our partitions' jobs, or where slurmrestd serves no
slurmdbd, Slurm's whole job list, whose cost grows with the site's jobs), and that runs rarely
(BINDER_FULL_LIST_INTERVAL). Cost: one Pod list per admitted Pod
(label-selected, at most one item); to Slurm, only for a Pod really missing, one read of the job
(it must still carry the claim: a controller that lost its state reuses ids) and its cancel.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from slurmgate import contract
from slurmgate.kube import KubeClient, KubeError
from slurmgate.logs import kv
from slurmgate.slurm import JobInfo, SlurmError

from . import metrics

log = logging.getLogger("slurmgate.webhook.orphans")

# An admitted Pod is stored within milliseconds; this leaves room for the API server's retries
# and for a slow etcd.
SETTLE = 15.0
CHECK_EVERY = 5.0
# admissions remembered at once; past it the oldest are left to the binder's safety net
KEEP_MAX = 50_000
# a check that keeps failing (API server away) is given up after this: the binder's safety
# net (binder/lostjobs.py) finds the job then
GIVE_UP_AFTER = 600.0


@dataclass(frozen=True)
class Admitted:
    namespace: str
    claim: str
    job_id: int
    at: float


class OrphanWatch:
    def __init__(self, kube: KubeClient, cancel: Callable[[int], Awaitable[None]],
                 job: Callable[[int], Awaitable[JobInfo | None]],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.cancel = cancel
        self.job = job  # the job's record: it must still carry the claim
        self.clock = clock
        self._pending: dict[str, Admitted] = {}  # claim -> admission, oldest first

    def admitted(self, namespace: str, claim: str, job_id: int) -> None:
        """A Pod was admitted with job `job_id` for `claim`: look for it after SETTLE."""
        self._pending[claim] = Admitted(namespace, claim, job_id, self.clock())
        while len(self._pending) > KEEP_MAX:
            del self._pending[next(iter(self._pending))]

    def __len__(self) -> int:
        return len(self._pending)

    async def check_once(self) -> int:
        """Look for the Pods admitted at least SETTLE ago; cancel the jobs of those that are
        not there. Returns how many jobs were cancelled."""
        now = self.clock()
        due = [a for a in self._pending.values() if now - a.at >= SETTLE]
        cancelled = 0
        for a in due:
            try:
                pods, _ = await self.kube.list(
                    f"/api/v1/namespaces/{a.namespace}/pods",
                    labelSelector=f"{contract.CLAIM_LABEL}={a.claim}")
                if not pods:
                    # the binder may have cancelled it already (it too sweeps orphans)
                    live = await self._still_ours(a)
                    if live:
                        await self.cancel(a.job_id)
                        cancelled += 1
                        metrics.ORPHANS_CANCELLED.inc()
                    # a Pod stored and deleted (evicted) within SETTLE leaves the same trace
                    log.info("no Pod for an admitted job: never stored, or gone already",
                             extra=kv(namespace=a.namespace, claim=a.claim, job=a.job_id,
                                      cancelled=live))
            except (KubeError, SlurmError, OSError, aiohttp.ClientError, TimeoutError) as e:
                if now - a.at < GIVE_UP_AFTER:
                    log.warning("orphan check failed; will retry",
                                extra=kv(claim=a.claim, job=a.job_id, error=str(e)))
                    continue
            self._pending.pop(a.claim, None)
        return cancelled

    async def _still_ours(self, a: Admitted) -> bool:
        """The job still carries the claim and still holds or waits for a node: a controller
        that lost its state hands the same id to another job (e2e: test_slurmctld_lost_its_state
        saw the next Pod's job cancelled by id alone)."""
        job = await self.job(a.job_id)
        return (job is not None and job.active
                and contract.claim_from_comment(job.comment) == a.claim)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_EVERY)
            try:
                await self.check_once()
            except Exception as e:  # never let the loop die: the next round tries again
                log.warning("orphan check round failed", extra=kv(error=str(e)))
