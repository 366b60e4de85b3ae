"""Our Slurm jobs, kept current by polling slurmrestd with update_time.

An idle poll costs nearly nothing (22.05: a 304 with no body; 24.11+: a 200 with an empty list,
which the client reports as "not modified" too); the interval still backs off when nothing of
ours is in flight. A changed list is diffed so only Pods whose job
changed are reconciled: work follows changes, not the number of Pods.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable

from slurmgate import contract
from slurmgate.binder import metrics
from slurmgate.logs import kv
from slurmgate.slurm import IN_FLIGHT_STATES, RUNNING, JobInfo, SlurmClient

log = logging.getLogger("slurmgate.jobs")

FAST_POLL = 0.1  # while our jobs are pending or changing: notice allocations quickly
SLOW_POLL = 1.0  # nothing in flight
FULL_RESYNC = 60.0  # a periodic full list guards against missed same-second updates


def _preferred(a: JobInfo, b: JobInfo) -> bool:
    """Which of two jobs with one claim speaks for the Pod: a live one over an ended one
    (an ended one only if it is newer, e.g. after a resubmit), RUNNING over waiting, then the
    older one (the one Slurm queued first)."""
    if a.active != b.active:
        return a.active
    if not a.active:
        return a.job_id > b.job_id
    if (a.state == RUNNING) != (b.state == RUNNING):
        return a.state == RUNNING
    return a.job_id < b.job_id


def _fingerprint(j: JobInfo) -> tuple[str, str, tuple[str, ...], bool]:
    return (j.state, j.reason, j.nodes, j.preempted)


def poll_delay(in_flight: bool, took: float) -> float:
    """A changed list costs slurmctld (it packs every job) and us (parsing): when a poll is
    slow, wait as long as it took, so polling stays under half of the time."""
    return max(FAST_POLL, min(SLOW_POLL, took)) if in_flight else SLOW_POLL


class JobTracker:
    def __init__(self, slurm: SlurmClient, on_change: Callable[[str, JobInfo | None], None]):
        self.slurm = slurm
        self.on_change = on_change  # (claim, job or None when it left Slurm's list)
        self.by_claim: dict[str, JobInfo] = {}
        self.synced = asyncio.Event()
        self.synced_at = 0.0  # monotonic time of the last successful full answer
        self.healthy = False
        self.seen_running_at: dict[int, float] = {}  # job id -> when we first saw RUNNING
        # job id -> (wall time the poll that first saw it RUNNING was sent, answered): the
        # bind log carries them, so a bench can tell waiting for a poll from the poll itself
        self.noticed_wall: dict[int, tuple[float, float]] = {}
        self._poll_sent_wall = 0.0
        self.busy_until = 0.0
        self.duplicates: list[JobInfo] = []  # live jobs that lost to another of their claim
        self._errors = 0

    def get(self, claim: str | None) -> JobInfo | None:
        return self.by_claim.get(claim) if claim else None

    def kick(self) -> None:
        """Something expects a job change soon (a new gated Pod): poll fast for a while."""
        self.busy_until = time.monotonic() + 10.0

    def _apply(self, jobs: list[JobInfo]) -> None:
        fresh: dict[str, JobInfo] = {}
        duplicates: list[JobInfo] = []
        for j in jobs:
            claim = contract.claim_from_comment(j.comment)
            if claim is None:
                continue
            prev = fresh.get(claim)
            if prev is None:
                fresh[claim] = j
                continue
            keep, drop = (j, prev) if _preferred(j, prev) else (prev, j)
            fresh[claim] = keep
            if drop.active:
                duplicates.append(drop)
        # Several live jobs for one claim happen when a submit timed out at admission but
        # slurmrestd still ran it, and the binder submitted again: one of them must go.
        self.duplicates = duplicates
        old = self.by_claim
        self.by_claim = fresh
        now = time.monotonic()
        answered = time.time()
        changed = 0
        for claim, j in fresh.items():
            if j.state == RUNNING and j.job_id not in self.seen_running_at:
                self.seen_running_at[j.job_id] = now
                self.noticed_wall[j.job_id] = (self._poll_sent_wall or answered, answered)
            p = old.get(claim)
            if p is None or p.job_id != j.job_id or _fingerprint(p) != _fingerprint(j):
                changed += 1
                self.on_change(claim, j)
        for claim in old.keys() - fresh.keys():
            changed += 1
            self.on_change(claim, None)
        if len(self.seen_running_at) > 4 * len(fresh) + 1000:
            live = {j.job_id for j in fresh.values()}
            self.seen_running_at = {k: v for k, v in self.seen_running_at.items() if k in live}
            self.noticed_wall = {k: v for k, v in self.noticed_wall.items() if k in live}
        if changed:
            self.busy_until = now + 5.0
        metrics.JOB_CHANGES.inc(changed)

    def _in_flight(self) -> bool:
        return time.monotonic() < self.busy_until or any(
            j.state in IN_FLIGHT_STATES or j.preempted
            for j in self.by_claim.values())

    async def poll_once(self, since: int | None) -> int | None:
        t0 = time.perf_counter()
        self._poll_sent_wall = time.time()
        # only ours are parsed: the list also holds every other job of the cluster
        jobs, update_time = await self.slurm.jobs(since, comment_prefix=contract.COMMENT_PREFIX)
        metrics.SLURM_POLL_LATENCY.observe(time.perf_counter() - t0)
        self.healthy = True
        if jobs is None:
            metrics.SLURM_POLLS.labels("not_modified").inc()
        else:
            metrics.SLURM_POLLS.labels("changed").inc()
            self._apply(jobs)
            self.synced_at = time.monotonic()
            self.synced.set()
        return update_time

    async def run(self) -> None:
        since: int | None = None
        last_full = 0.0
        while True:
            try:
                if time.monotonic() - last_full > FULL_RESYNC:
                    since = None
                    last_full = time.monotonic()
                t0 = time.monotonic()
                t = await self.poll_once(since)
                took = time.monotonic() - t0
                # Slurm's update times have one-second resolution: ask from one second
                # earlier so a change in the same second as the last answer is not missed.
                since = max(0, t - 1) if t else None
                self._errors = 0
                delay = poll_delay(self._in_flight(), took)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.healthy = False
                self._errors += 1
                metrics.SLURM_POLLS.labels("error").inc()
                delay = min(30.0, 0.25 * 2 ** min(self._errors, 7)) * random.uniform(0.5, 1.5)
                log.warning("slurm poll failed; backing off",
                            extra=kv(error=str(e), retry_in=round(delay, 2)))
            await asyncio.sleep(delay)
