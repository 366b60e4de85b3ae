"""Which Slurm job a Pod displaced: when a Pod's placeholder preempts a batch job (its partition
or QOS ranks above the job's), the Pod's Events say which job gave up the node, and how.

Slurm keeps no record of "job A preempted job B" that slurmrestd shows: a cancelled victim
reads PREEMPTED, but a requeued one is PENDING again with its nodes cleared. What names the
node is slurmctld's EpilogSlurmctld hook (slurmgate-notify), which pushes every job's end with
its nodes; the binder remembers the last end on each node for a short while. When a Pod binds
to a node where another job ended just before its job started, one GET of that job tells
whether Slurm preempted it (PREEMPTED, or requeued: PENDING with a restart count). Sites
without the hook see no such Event; nothing else depends on it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from slurmgate.slurm import SlurmClient
from slurmgate.slurm.models import PREEMPTED, REQUEUE_ROUND_STATES, JobInfo

# A victim's end and the preemptor's start are seconds apart (the node frees, the scheduler's
# next pass starts the preemptor); a job that ended longer ago than this did not make room.
WINDOW = 60.0
# slurmctld runs the victim's EpilogSlurmctld and the Pod's PrologSlurmctld side by side: under
# load the victim's end can reach us after the Pod is bound. We wait this long for it.
LATE = 5.0
MAX_NODES = 100_000  # a bound on memory whatever pushes arrive


@dataclass(frozen=True)
class Ended:
    job_id: int
    at: float  # wall time the end was pushed


class RecentEnds:
    """The last pushed end of a job that is not ours, per Slurm node."""

    def __init__(self) -> None:
        self._by_node: dict[str, Ended] = {}
        self._recorded: asyncio.Event | None = None  # set (and replaced) on every record

    def record(self, job_id: int, nodes: tuple[str, ...], at: float | None = None) -> None:
        when = time.time() if at is None else at
        if len(self._by_node) + len(nodes) > MAX_NODES:
            self._by_node = {n: e for n, e in self._by_node.items() if when - e.at < WINDOW}
        for n in nodes[:MAX_NODES]:
            self._by_node[n] = Ended(job_id, when)
        if self._recorded is not None:
            self._recorded.set()
            self._recorded = None

    def before(self, node: str, started: float) -> int | None:
        """The job that ended on `node` within WINDOW before `started` (wall time)."""
        e = self._by_node.get(node)
        # the node was the Pod's alone from `started` on: an end a moment later is the victim's
        # end pushed late, never another job's
        if e is None or not (started - WINDOW <= e.at <= started + LATE):
            return None
        return e.job_id

    async def wait_before(self, node: str, started: float, patience: float = LATE) -> int | None:
        """before(), waiting up to `patience` seconds for an end pushed late."""
        deadline = time.monotonic() + patience
        while (found := self.before(node, started)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if self._recorded is None:
                self._recorded = asyncio.Event()
            try:
                await asyncio.wait_for(self._recorded.wait(), left)
            except TimeoutError:
                return None
        return found


def how_displaced(job: JobInfo) -> str | None:
    """'cancelled' or 'requeued' when Slurm preempted the job, else None (it just ended)."""
    if job.state == PREEMPTED or PREEMPTED in job.state_flags:
        return "cancelled"
    if "REQUEUED" in job.state_flags or (job.restarts > 0 and job.state in REQUEUE_ROUND_STATES):
        # requeued on preemption: still completing on the node (the list form reads
        # ["PENDING", "COMPLETING", "REQUEUED"] a moment after), waiting again, or already
        # running elsewhere
        return "requeued"
    return None


async def describe(slurm: SlurmClient, job_id: int, slurm_node: str) -> str | None:
    """The Event message naming the displaced job, or None if Slurm did not preempt it."""
    job = await slurm.job(job_id)
    if job is None:
        return None
    how = how_displaced(job)
    if how is None:
        return None
    who = ", ".join(x for x in (job.name and f"{job.name!r}",
                                job.user and f"user {job.user}",
                                job.partition and f"partition {job.partition}") if x)
    return (f"Slurm preempted job {job.job_id} ({who}) on {slurm_node} to run this Pod; the job "
            f"was {how}")
