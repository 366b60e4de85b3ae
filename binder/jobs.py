"""Our Slurm jobs: what the binder knows of them, kept current by binder/jobpoll.py (which asks
Slurm about our jobs only) and told at once of starts and ends by slurmctld's
PrologSlurmctld/EpilogSlurmctld hook when a site installs it (binder/push.py); polling stays the
safety net for a missed or absent push.

Each answer is diffed, so only Pods whose job changed are reconciled: work follows changes, not
the number of Pods.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping

from slurmgate import contract
from slurmgate.logs import kv
from slurmgate.slurm import (
    CONFIGURING,
    ENDING_STATES,
    IN_FLIGHT_STATES,
    RUNNING,
    SUSPENDED,
    WAITING_STATES,
    JobInfo,
    SlurmClient,
    SlurmError,
)

from . import jobpoll, lostjobs, metrics
from .displaced import RecentEnds
from .jobpoll import SLOW_POLL, HookHealth, Schedule, poll_delay

log = logging.getLogger("slurmgate.jobs")

EARLY_KEEP = 10.0  # a pushed start waits this long for its Pod to reach our watch
EARLY_MAX = 10_000
MIN_POLL_GAP = 0.05  # a push wakes the poller, but never into more than 20 polls a second


def _fingerprint(j: JobInfo) -> tuple[object, ...]:
    """What of a job its Pods show: a change of any makes them reconciled. A pending job's
    start_time is Slurm's expected start (the Pod's expected-start annotation); the decision
    lets it drift by seconds without a write (podview.EXPECTED_START_SLACK)."""
    return (j.state, j.reason, j.nodes, j.preempted, j.expected_start or 0, j.allocation)


class JobTracker:
    def __init__(self, slurm: SlurmClient, on_change: Callable[[str, JobInfo | None], None],
                 comment_of: Callable[[int], str | None] = lambda _: None,
                 named: Callable[[], Iterable[int]] = tuple,
                 full_every: float = jobpoll.FULL_EVERY,
                 ready: Callable[[], bool] = lambda: True, partitions: Iterable[str] = ()):
        self.slurm = slurm
        # the job ids our Pods' annotations name (some no poll has shown yet)
        self.named = named
        self.schedule = Schedule(full_every=full_every)
        self.hook = HookHealth()
        # partition -> GraceTime (s), read with each whole list: how often a running job of
        # ours there is read whole (slurmgate.preemption.preempt_every)
        self.grace: dict[str, int] = {}
        # job id -> the comment of a job of ours no poll has shown yet (from the Pods)
        self.comment_of = comment_of
        self.on_change = on_change  # (claim, job or None when it left Slurm's list)
        self.by_claim: dict[str, JobInfo] = {}
        # set once a poll asked about every job our Pods name (`ready`: our Pods are known)
        self.synced = asyncio.Event()
        self.ready = ready
        # jobs of ours no Pod names yet: by name, and the safety net
        self.finder = lostjobs.Finder(
            slurm, self.schedule, known=lambda: self.by_claim.values(), add=self._add_found,
            after_full=self._read_grace, wake=self.wake, partitions=partitions)
        self.listed = self.finder.listed  # the safety net looked once
        self.synced_at = 0.0  # monotonic time of the last successful full answer
        self.healthy = False
        self.seen_running_at: dict[int, float] = {}  # job id -> when we first saw RUNNING
        # job id -> (wall time the poll that first saw it RUNNING was sent, answered): the
        # bind log carries them, so a bench can tell waiting for a poll from the poll itself
        self.noticed_wall: dict[int, tuple[float, float]] = {}
        self._poll_sent_wall = 0.0
        self.busy_until = 0.0
        self.duplicates: list[JobInfo] = []  # live jobs that lost to another of their claim
        # job id -> when we cancelled it (Actions' record, shared): it never speaks for its
        # claim beside another job, whatever a read sent before the cancel still says
        self.cancelled: Mapping[int, float] = {}
        self._errors = 0
        self._claim_of: dict[int, str] = {}  # job id -> claim, for pushes (they carry the id)
        # job id -> when a push said it started (monotonic): an answer to a poll sent before
        # that must not take the job back to waiting (and the Pod off its Node)
        self._pushed_at: dict[int, float] = {}
        self._wake = asyncio.Event()
        # job id -> (nodes, when) of a pushed start that named no job or Pod we knew yet: the
        # job was allocated as it was submitted, before the Pod reached our watch
        self._early: dict[int, tuple[tuple[str, ...], float]] = {}
        # job id -> the claim it ran for: a controller that lost its state reuses job ids, and
        # slurmd then refuses the reused id ("Job credential revoked") a moment after the
        # start. A push about such an id is left to the polls, which see the failure first.
        self._ran_for: dict[int, str] = {}
        self.recent_ends = RecentEnds()  # other jobs' ends per node, to name what a Pod displaced
        self._urgent: set[int] = set()  # ids a push named: the next poll reads them whole

    def get(self, claim: str | None) -> JobInfo | None:
        return self.by_claim.get(claim) if claim else None

    def kick(self) -> None:
        """Something expects a job change soon (a new gated Pod): poll fast for a while."""
        self.busy_until = time.monotonic() + 10.0

    def wake(self) -> None:
        """Poll now (a push named a job we do not know, or one that ended)."""
        self._wake.set()

    def pushed(self, job_id: int, event: str, nodes: tuple[str, ...]) -> str:
        """slurmctld says job `job_id` started on `nodes` (or ended). A start of a job of ours
        (known from a poll, or from its Pod's annotation when it started before any poll saw
        it) is taken at its word: the push is authenticated, and the next polls confirm or
        overrule it. The end of a job of ours makes the poller look now (the end's reason is
        Slurm's to tell). Every other job of the cluster changes nothing: on a busy site most
        pushes are about them, and each could otherwise cost slurmctld a full job list.
        Returns what was done, for the metric."""
        claim = self._claim_of.get(job_id)
        ours = claim is not None or self.comment_of(job_id) is not None
        self.hook.pushed(job_id, event, ours=ours)
        if ours:  # Slurm knows this id now, whatever a read said before (a reused id)
            self.schedule.known_again(job_id, time.monotonic())
        have = self.by_claim.get(claim) if claim else None
        if have is not None and have.job_id != job_id:
            have = None  # the claim moved on to a newer job
        if event != "started":
            if have is None and self.comment_of(job_id) is None:
                self.recent_ends.record(job_id, nodes)  # it may have made room for a Pod
                return "ignored"
            self._urgent.add(job_id)
            self.wake()
            return "polled"
        if not nodes:
            return "ignored"
        if have is None:
            comment = self.comment_of(job_id)
            claim = contract.claim_from_comment(comment)
            if claim is None:  # not ours, or its Pod has not reached our watch yet
                self._remember_early(job_id, nodes)
                return "early"
            have = JobInfo(job_id=job_id, name="", state="PENDING", reason="", nodes=(),
                           comment=comment, partition="", submit_time=int(time.time()),
                           start_time=0, end_time=0)
        elif have.state not in WAITING_STATES:
            return "known"  # a poll was quicker
        assert claim is not None
        if self._ran_for.setdefault(job_id, claim) != claim:
            self._urgent.add(job_id)
            self.wake()
            return "reused"
        now = time.monotonic()
        job = dataclasses.replace(have, state=RUNNING, reason="None", nodes=nodes,
                                  state_flags=frozenset({RUNNING}))
        self._pushed_at[job_id] = now
        self._claim_of[job_id] = claim
        self.by_claim[claim] = job
        self.seen_running_at.setdefault(job_id, now)
        wall = time.time()
        self.noticed_wall.setdefault(job_id, (wall, wall))
        self.busy_until = now + 5.0
        self.on_change(claim, job)
        return "applied"

    def _remember_early(self, job_id: int, nodes: tuple[str, ...]) -> None:
        now = time.monotonic()
        if len(self._early) > EARLY_MAX:
            self._early = {k: v for k, v in self._early.items() if now - v[1] < EARLY_KEEP}
        self._early[job_id] = (nodes, now)

    def submitted(self, job_id: int) -> None:
        """The binder submitted this job: Slurm knows the id now, whatever a read said of it
        before (ids come back after a controller lost its state), so the polls ask about it."""
        self.schedule.known_again(job_id, time.monotonic())

    def pod_seen(self, job_id: int) -> None:
        """A Pod with this job id appeared: apply a start pushed before it did; else, when
        the job is new to us, ask about it now. Without the hook a job that starts at once
        would otherwise wait for the idle poll (up to HOOK_IDLE_POLL)."""
        # An id Slurm once said was gone, named by a new Pod: a controller that lost its state
        # gave it to a new job, which is asked about like any other
        self.schedule.known_again(job_id, time.monotonic())
        early = self._early.pop(job_id, None)
        if early is not None and time.monotonic() - early[1] < EARLY_KEEP:
            metrics.SLURM_PUSHES.labels("started", "applied_late").inc()
            self.pushed(job_id, "started", early[0])
        elif job_id not in self._claim_of:
            self.wake()

    def _keep_pushed(self, polled: JobInfo, sent: float) -> bool:
        """Whether a pushed start outranks this poll's view of the job. A poll sent before the
        push can show it still pending; one sent after can show it CONFIGURING (our own hook
        was still running). Any other state, or a later poll, is the truth. Only a read sent
        after the push retires it: the polls and the whole list each pass our own view (the
        pushed RUNNING) through here, and must not unguard a slower read sent before it."""
        at = self._pushed_at.get(polled.job_id)
        if at is None:
            return False
        if polled.state == CONFIGURING or (polled.state in WAITING_STATES and sent < at):
            return True
        if sent >= at:
            del self._pushed_at[polled.job_id]
        return False

    def _apply(self, jobs: list[JobInfo], sent: float = 0.0, complete: bool = True) -> None:
        """Take `jobs` as our jobs now. `complete`: they came from the whole list, so its
        duplicates replace those found before (a look at our known ids finds none)."""
        fresh: dict[str, JobInfo] = {}
        duplicates: list[JobInfo] = []
        claim_of: dict[int, str] = {}
        for j in jobs:
            claim = contract.claim_from_comment(j.comment)
            if claim is None:
                continue
            claim_of[j.job_id] = claim
            # our own view passed on unread (a look in slurmdbd skips the ids we know) says
            # nothing new of the job: only a record read from Slurm may retire a push's guard
            if self.by_claim.get(claim) is not j and self._keep_pushed(j, sent):
                j = self.by_claim.get(claim, j)
            prev = fresh.get(claim)
            if prev is None:
                fresh[claim] = j
                continue
            keep, drop = (j, prev) if jobpoll.preferred(j, prev, self.cancelled) else (prev, j)
            fresh[claim] = keep
            if drop.active and drop.job_id not in self.cancelled:  # ours is on its way
                duplicates.append(drop)
        # a pushed start this poll cannot have seen (sent before the job existed) stays
        for job_id, at in self._pushed_at.items():
            c = self._claim_of.get(job_id)
            if at > sent and c is not None and c not in fresh and c in self.by_claim:
                fresh[c] = self.by_claim[c]
                claim_of[job_id] = c
        # Several live jobs for one claim happen when a submit timed out at admission but
        # slurmrestd still ran it, and the binder submitted again: one of them must go.
        if complete:
            self.duplicates = duplicates
        elif duplicates:  # a look at known ids adds what it found; the sweep cancels them
            self.duplicates = list({d.job_id: d for d in [*self.duplicates, *duplicates]}
                                   .values())
        self._claim_of = claim_of
        self._pushed_at = {k: v for k, v in self._pushed_at.items() if k in claim_of}
        old = self.by_claim
        self.by_claim = fresh
        now = time.monotonic()
        answered = time.time()
        changed = 0
        for claim, j in fresh.items():
            p = old.get(claim)
            self._note_start_and_end(claim, j, p, now, answered)
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
            self._ran_for = {k: v for k, v in self._ran_for.items() if k in live}
        if changed:
            self.busy_until = now + 5.0
        metrics.JOB_CHANGES.inc(changed)

    def _note_start_and_end(self, claim: str, j: JobInfo, p: JobInfo | None, now: float,
                            answered: float) -> None:
        """When a poll first saw the job RUNNING (for the bind log), and the starts and ends a
        poll saw, for the hook's health."""
        if j.state == RUNNING and self._ran_for.setdefault(j.job_id, claim) != claim:
            self._ran_for[j.job_id] = claim  # the id was reused: a new start
            self.seen_running_at.pop(j.job_id, None)
            self.noticed_wall.pop(j.job_id, None)
        if j.state == RUNNING and j.job_id not in self.seen_running_at:
            self.seen_running_at[j.job_id] = now
            self.noticed_wall[j.job_id] = (self._poll_sent_wall or answered, answered)
            self.hook.saw(j.job_id, "started")  # a push before this poll set it already
        if p is not None and p.job_id == j.job_id and p.state == RUNNING and (
                j.state in ENDING_STATES or j.state in WAITING_STATES - {SUSPENDED}):
            self.hook.saw(j.job_id, "ended")  # EpilogSlurmctld runs for requeues too

    def _in_flight(self) -> bool:
        return time.monotonic() < self.busy_until or any(
            j.state in IN_FLIGHT_STATES or j.preempted
            for j in self.by_claim.values())

    async def _pending_every(self) -> float:
        """How seldom a pending job of ours may be read (jobpoll.pending_every)."""
        try:
            d = await self.slurm.dialect()
        except Exception:  # unknown yet: the read below fails the same way
            return 0.0
        return jobpoll.pending_every(self.hook.ok, d.state_query, self.by_claim.values())

    async def poll_once(self) -> float:
        """One look at our jobs (see binder/jobpoll.py); returns the delay before the next."""
        t0 = time.perf_counter()
        sent = time.monotonic()
        self._wake.clear()  # a push from now on asks for the next poll, not this one
        self._poll_sent_wall = time.time()
        self.hook.check()
        urgent, self._urgent = self._urgent, set()
        # before the ids: once our Pods are all known, this poll asks about every job they name
        ready = self.ready()
        known = {j.job_id: j for j in self.by_claim.values()}
        idle_every = jobpoll.HOOK_IDLE_POLL if self.hook.ok else SLOW_POLL
        plan = self.schedule.plan(sent, known, self.named(), {*self._pushed_at, *urgent},
                                  idle_every, self.grace, await self._pending_every())
        reads = 0
        self.finder.tick(sent, plan.full)
        try:
            if plan.ids:
                fresh, gone, reads = await jobpoll.read(self.slurm, plan, known)
                foreign = {i for i, j in fresh.items()
                           if contract.claim_from_comment(j.comment) is None}
                self.schedule.left(gone | foreign, sent)
                self.schedule.read_whole(fresh, sent)
                # onto what we hold now: a push or the whole list may have come meanwhile
                now_known = {j.job_id: j for j in self.by_claim.values()}
                self._apply(jobpoll.merged(now_known, fresh, gone), sent, complete=False)
                outcome = "ids"
            else:
                outcome = "none"
            if ready:
                self.synced.set()
        except BaseException:
            self._urgent |= urgent  # asked again by the next poll
            raise
        took = time.perf_counter() - t0
        metrics.SLURM_POLL_LATENCY.observe(took)
        metrics.SLURM_POLLS.labels(outcome).inc()
        self.healthy = True
        self.synced_at = time.monotonic()
        # never past a preemption read that falls due (slurmgate/preemption.py); 22.05 reads
        # job by job: keep those reads under READS_PER_SECOND
        due = self.schedule.next_read_in(time.monotonic(), {
            j.job_id: j for j in self.by_claim.values()}, self.grace)
        return max(min(poll_delay(self._in_flight(), took, self.hook.ok),
                       max(jobpoll.FAST_POLL, due)),
                   reads / jobpoll.READS_PER_SECOND)

    def want_named(self, names: Iterable[str], for_seconds: float) -> None:
        """Look for jobs with these names for `for_seconds` (binder/lostjobs.py)."""
        self.finder.want_named(names, for_seconds)

    def want_full(self, for_seconds: float = 0.0) -> None:
        """The safety net soon, and every jobpoll.FULL_MIN_GAP for `for_seconds`."""
        self.finder.want_full(for_seconds)

    def _add_found(self, jobs: list[JobInfo], sent: float, complete: bool) -> None:
        """Jobs found beside the id polls (binder/lostjobs.py): only those still unknown are
        added (pushes and id polls learnt newer things meanwhile)."""
        now_known = {j.job_id: j for j in self.by_claim.values()}
        self._apply(jobpoll.merged(now_known, {j.job_id: j for j in jobs
                                               if j.job_id not in now_known}, set()), sent,
                    complete=complete)
        self.schedule.read_whole([j.job_id for j in jobs], sent)

    async def _read_grace(self) -> None:
        """The partitions' GraceTimes (GET /partitions: its cost follows the site's partitions,
        a handful, never its jobs). On failure the last ones stay."""
        try:
            parts = await self.slurm.partitions()
        except SlurmError as e:
            log.warning("cannot read the partitions' GraceTime; keeping the last",
                        extra=kv(error=str(e)))
            return
        self.grace = {p.name: p.grace_time_seconds for p in parts if p.grace_time_seconds}

    async def run(self) -> None:
        try:
            await self._poll_forever()
        finally:
            self.finder.cancel()

    async def _poll_forever(self) -> None:
        while True:
            try:
                delay = await self.poll_once()
                self._errors = 0
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self.healthy = False
                self._errors += 1
                metrics.SLURM_POLLS.labels("error").inc()
                delay = min(30.0, 0.25 * 2 ** min(self._errors, 7)) * random.uniform(0.5, 1.5)
                log.warning("slurm poll failed; backing off",
                            extra=kv(error=str(e), retry_in=round(delay, 2)))
            await self._sleep(delay)

    async def _sleep(self, delay: float) -> None:
        """`delay`, or less when a push wakes us (but at least MIN_POLL_GAP)."""
        try:
            await asyncio.wait_for(self._wake.wait(), delay)
        except TimeoutError:
            return
        await asyncio.sleep(MIN_POLL_GAP)
