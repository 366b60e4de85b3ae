"""How the binder asks Slurm about its jobs: about them only, so its cost follows our jobs and
never the site's.

A site's Slurm holds tens of thousands of jobs that are not ours, and some of them change every
second. Any change anywhere makes GET /jobs?update_time=T answer with the whole list, so the
binder no longer polls that list. Each tick asks about the ids of our own jobs (from our polls
and from our Pods' annotations):

- 24.11+ (``dialect.state_query``): one GET /jobs/state?job_id=A,B,... for their states; only a
  job whose state changed (or that is new to us, or whose start a push announced) is then read
  whole with GET /job/{id}.
- 22.05: GET /job/{id} per job (no filtered list there), at most READS_PER_SECOND a second.

slurmctld's hook (binder/push.py) is the primary signal for starts and ends; these polls are the
safety net. Jobs in flight are asked about every FAST_POLL, or every HOOKED_FAST_POLL while the
hook is known to work (it pushed since the last change a poll saw first); the others every
SLOW_POLL, or every HOOK_IDLE_POLL while the hook is known to work. The whole list is read
rarely (at start, every ``full_every`` seconds, and when asked: a submit whose answer was lost
may have made a job no Pod names) and parsed only for our jobs.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field

from slurmgate.preemption import preempt_every
from slurmgate.slurm import COMPLETING, IN_FLIGHT_STATES, PENDING, RUNNING, JobInfo, SlurmClient

FAST_POLL = 0.1  # a job of ours is pending or changing: notice its start quickly
# ...while the hook is known to push: starts and ends come by push (an end wakes the poller at
# once), so polls in flight are the safety net for a push the hook misses. At FAST_POLL they
# were slurmctld's main cost of us on a busy site (bench.busy, 24.11, 50,000 jobs: 16 Pods in
# flight added 6.5 % of a core, 758 reads a minute), and each read holds slurmctld's job lock
# against our own cancels (their p50 1.5-1.8x the same cancel made directly). A start the hook
# misses is still seen within this, and 3 s later (HOOK_MISS_AFTER) polling is fast again.
HOOKED_FAST_POLL = 0.5
SLOW_POLL = 1.0  # nothing in flight, and no sign that the hook works
HOOK_IDLE_POLL = 15.0  # nothing in flight, and the hook pushed since the last change it missed
FULL_EVERY = 3600.0  # the whole list, for jobs of ours no Pod names (binder/config.py)
FULL_MIN_GAP = 5.0  # asked-for whole lists (a handed-off submit) at most this often
# ...and never more than this share of the time, measured by how long the last one took: at
# 50,000 jobs a whole list took 130 s and 122 CPU-s of Slurm (bench.busy, 26.05), so there the
# next comes 7 hours later, and an asked-for one 22 minutes later
FULL_SHARE = 0.005
WANTED_SHARE = 0.1
# A list that took less than this costs the site next to nothing (tens of ms on a small site):
# it is not paced, so the configured interval holds rather than swinging with the host's load
# (CI: a 0.2 s list on a busy machine had stretched a 10 s interval to 40 s)
PACE_FROM = 1.0
DETAIL_EVERY = 10.0  # a pending job's whole record (its reason), at most this often
STALE_PER_TICK = 20  # pending jobs read whole for their reason, at most this many a tick
READS_PER_SECOND = 50.0  # GET /job/{id} reads where no filtered state query exists (22.05)
# ...and there, while the hook is known to push, a pending job of ours is read at most this
# often: its start comes by push, and each read costs the site ~3 ms of slurmctld at 50,000
# jobs (bench.busy, 22.05: 12 pending jobs read every tick were 44 reads/s, 14.7 % of a core).
# A start the hook misses is still seen within this (and then polling is fast again).
PENDING_HOOKED_EVERY = 2.0
# ...and all of them together at most this many a second, so that their cost stays flat however
# many of our jobs pend (bench.busy, 22.05, 50,000 jobs: 12 pending jobs each every 2 s were
# 6 of the 8 reads a second, ~8 % of slurmctld with 16 Pods in flight; a read is two RPCs of
# ~4.7 ms each there). A start the hook misses waits up to pending / this seconds.
PENDING_HOOKED_READS_PER_SECOND = 2.0
KNOWN_AGAIN_KEEP = 60.0  # s a new Pod's or a push's word outranks an older read's "gone"
HOOK_MISS_AFTER = 3.0  # s a start or end a poll saw first may wait for its push
TOLD_MAX = 10_000  # pushes remembered to match what polls see
# A preempted job runs out its partition's GraceTime still RUNNING: the preemption shows only in
# its whole record (preempt_time), neither in GET /jobs/state nor in any push. So a running job
# of ours in a partition with a GraceTime is read whole every preempt_every(GraceTime) seconds
# (slurmgate/preemption.py: the webhook holds the Pods' terminationGracePeriodSeconds to what
# is left of the GraceTime after that and the eviction).


def pending_every(hook_ok: bool, state_query: bool, known: Iterable[JobInfo]) -> float:
    """Seconds a pending job of ours goes unread (0: every tick). Job-by-job releases (22.05)
    read pending jobs slowly while the hook pushes their starts: each at most every
    PENDING_HOOKED_EVERY, all together at most PENDING_HOOKED_READS_PER_SECOND. One state
    query asks about all at once on 24.11+, so there they are asked every tick."""
    if not hook_ok or state_query:
        return 0.0
    pending = sum(1 for j in known if j.state == PENDING and not j.preempted)
    return max(PENDING_HOOKED_EVERY, pending / PENDING_HOOKED_READS_PER_SECOND)


def poll_delay(in_flight: bool, took: float, hook_ok: bool = False) -> float:
    """A slow answer means a loaded slurmrestd: wait as long as the poll took, so polling stays
    under half of the time; never slower than when idle."""
    if not in_flight:
        return HOOK_IDLE_POLL if hook_ok else SLOW_POLL
    return max(HOOKED_FAST_POLL if hook_ok else FAST_POLL, min(SLOW_POLL, took))


@dataclass
class Plan:
    """What one tick asks Slurm: these job ids (of which `detail` are read whole whatever their
    state), and whether to start reading the whole list beside them."""

    full: bool = False
    ids: set[int] = field(default_factory=set)
    detail: set[int] = field(default_factory=set)


@dataclass
class Schedule:
    """When to ask about which of our jobs; pure bookkeeping, unit-tested without Slurm."""

    full_every: float = FULL_EVERY
    full_at: float = float("-inf")  # monotonic time of the last whole list
    full_took: float = 0.0  # how long it took (s)
    listing: bool = False  # a whole list is being read (it runs beside the id polls)
    # when a whole list was last asked for (want_full); the first tick reads one
    wanted_at: float | None = float("-inf")
    wanted_until: float = float("-inf")  # ...and whole lists every FULL_MIN_GAP until then
    idle_at: float = float("-inf")  # the last tick that asked about every job of ours
    detail_at: dict[int, float] = field(default_factory=dict)
    gone: set[int] = field(default_factory=set)  # ids Slurm no longer knows: never asked again
    # id -> when a new Pod named it or a push did (a controller that lost its state reuses
    # ids): a read sent before that which found it gone does not put it back in `gone`
    known_again_at: dict[int, float] = field(default_factory=dict)

    def want_full(self, now: float, until: float | None = None) -> None:
        self.wanted_at = now
        if until is not None:
            self.wanted_until = max(self.wanted_until, until)

    def plan(self, now: float, known: dict[int, JobInfo], named: Iterable[int],
             pushed: Iterable[int], idle_every: float,
             grace: Mapping[str, int] | None = None, pending_every: float = 0.0) -> Plan:
        """`grace`: partition -> GraceTime (s) of the partitions that have one.
        `pending_every`: a pending job read less than this ago is not asked again (0: every
        tick), unless new, pushed about, or due its idle or preemption look."""
        since = now - self.full_at
        took = self.full_took if self.full_took >= PACE_FROM else 0.0
        full = not self.listing and (
            since >= max(self.full_every, took / FULL_SHARE)
            or ((self.wanted_at is not None or now < self.wanted_until)
                and since >= max(FULL_MIN_GAP, took / WANTED_SHARE)))
        named_ids = set(named)
        self.gone &= named_ids  # forget ids no Pod names any more
        self.known_again_at = {i: t for i, t in self.known_again_at.items()
                               if now - t < KNOWN_AGAIN_KEEP}
        ids = (set(known) | named_ids) - self.gone
        for i in self.detail_at.keys() - ids:  # jobs we no longer hold or ask about
            del self.detail_at[i]
        new = ids - set(known)
        moving = {i for i, j in known.items() if (j.state in IN_FLIGHT_STATES or j.preempted)
                  and not (j.state == PENDING and not j.preempted
                           and now - self.detail_at.get(i, float("-inf")) < pending_every)}
        pushed_ids = set(pushed) & ids
        if now - self.idle_at >= idle_every:
            self.idle_at = now
            ask = ids
        else:
            ask = new | moving | pushed_ids
        # the longest unread first, a few a tick: a burst of pending jobs spreads its reads
        stale = set(sorted((i for i in ask & set(known) if known[i].state == PENDING
                            and now - self.detail_at.get(i, float("-inf")) >= DETAIL_EVERY),
                           key=lambda i: self.detail_at.get(i, float("-inf")))[:STALE_PER_TICK])
        preemptible = {i for i, g in watched_for_preemption(known, grace)
                       if now - self.detail_at.get(i, float("-inf")) >= preempt_every(g)}
        return Plan(full=full, ids=ask | preemptible,
                    detail=new | pushed_ids | stale | preemptible)

    def next_read_in(self, now: float, known: dict[int, JobInfo],
                     grace: Mapping[str, int] | None) -> float:
        """Seconds until a running job of ours in a GraceTime partition is due its whole read
        (inf: none): the poller never sleeps past it, however quiet the rest is."""
        due = [self.detail_at.get(i, float("-inf")) + preempt_every(g) - now
               for i, g in watched_for_preemption(known, grace)]
        return min(due, default=float("inf"))

    def done_full(self, sent: float, listed: Iterable[int], took: float = 0.0) -> None:
        """A whole list sent at `sent` was read in `took` s: a wish for one made after `sent`
        stays."""
        self.full_at = sent
        self.full_took = took
        if self.wanted_at is not None and self.wanted_at <= sent:
            self.wanted_at = None
        self.gone -= set(listed)  # back in Slurm's list (a reused id): ask about it again

    def full_failed(self, sent: float) -> None:
        """A whole list sent at `sent` failed: asked for again, paced by the last one that
        was read (a failure's length says how long Slurm was away, not what a list costs)."""
        self.full_at = sent
        self.wanted_at = sent

    def read_whole(self, ids: Iterable[int], now: float) -> None:
        for i in ids:
            self.detail_at[i] = now

    def left(self, ids: Iterable[int], sent: float = float("inf")) -> None:
        """A read sent at `sent` found `ids` gone from Slurm (or not ours)."""
        for i in ids:
            if self.known_again_at.get(i, float("-inf")) <= sent:
                self.gone.add(i)
            self.detail_at.pop(i, None)

    def known_again(self, job_id: int, now: float) -> None:
        """A new Pod names this id, or slurmctld pushed about it: ask about it again."""
        self.gone.discard(job_id)
        self.known_again_at[job_id] = now


def watched_for_preemption(known: Mapping[int, JobInfo], grace: Mapping[str, int] | None
                           ) -> Iterable[tuple[int, int]]:
    """(job id, GraceTime) of each running, not yet preempted job of ours in a partition with
    a GraceTime: the jobs read whole every preempt_every(GraceTime), which the plan asks for and
    the poller's sleep never passes."""
    for i, j in known.items():
        if j.state == RUNNING and not j.preempted and (g := (grace or {}).get(j.partition)):
            yield i, g


def changed(known: JobInfo | None, flags: frozenset[str]) -> bool:
    """Whether a job's state list differs from what we hold of it (a job we do not hold yet
    has changed)."""
    return known is None or flags != known.state_flags


async def read(slurm: SlurmClient, plan: Plan,
               known: dict[int, JobInfo]) -> tuple[dict[int, JobInfo], set[int], int]:
    """Ask Slurm about `plan.ids`. Returns (records read whole, ids Slurm no longer knows, how
    many GET /job/{id} stood in for a state query: 22.05's, paced by READS_PER_SECOND)."""
    d = await slurm.dialect()
    whole = set(plan.detail)
    gone: set[int] = set()
    if d.state_query and plan.ids - whole:
        states = await slurm.job_states(plan.ids - whole)
        gone = plan.ids - whole - states.keys()
        whole |= {i for i, (_, flags) in states.items() if changed(known.get(i), flags)}
    else:
        whole |= plan.ids
    whole -= gone
    records = await slurm.jobs_by_id(whole)
    gone |= {i for i, j in records.items() if j is None}
    paced = 0 if d.state_query else len(whole)
    return {i: j for i, j in records.items() if j is not None}, gone, paced


def merged(known: dict[int, JobInfo], fresh: dict[int, JobInfo], gone: set[int]) -> list[JobInfo]:
    """Our jobs after a tick: what we held, updated by what was read, less what left Slurm."""
    out = {i: j for i, j in known.items() if i not in gone}
    out.update(fresh)
    return list(out.values())


class HookHealth:
    """Whether slurmctld's hook is known to work: it has pushed, and no start or end of ours
    that a poll saw went without its push for HOOK_MISS_AFTER seconds since it last pushed.
    Only then may polling slow down (HOOK_IDLE_POLL, HOOKED_FAST_POLL). A hook that dies is
    found out by the next change of ours (a start is polled for at HOOKED_FAST_POLL, an end
    within HOOK_IDLE_POLL): from then on the binder polls at FAST_POLL in flight and SLOW_POLL
    otherwise, until the hook pushes about a job of ours."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.last_push = 0.0  # 0: never
        self.last_ours = 0.0  # the last push about a job of ours
        self.last_miss = 0.0
        self._told: dict[tuple[int, str], None] = {}  # pushes, oldest first (bounded)
        self._seen: dict[tuple[int, str], float] = {}  # what a poll saw first, and when

    @property
    def ok(self) -> bool:
        """Any push shows the hook is installed; after a miss, only one about a job of ours
        shows it reaches us again (on a busy site others' pushes never stop)."""
        if not self.last_miss:
            return self.last_push > 0
        return self.last_ours > self.last_miss

    def pushed(self, job_id: int, event: str, ours: bool = False) -> None:
        self.last_push = self.clock()
        if ours:
            self.last_ours = self.last_push
        key = (job_id, event)
        self._seen.pop(key, None)
        self._told[key] = None
        if len(self._told) > TOLD_MAX:
            del self._told[next(iter(self._told))]

    def saw(self, job_id: int, event: str) -> None:
        """A poll saw a job of ours start ("started") or end ("ended")."""
        if (job_id, event) not in self._told:
            self._seen.setdefault((job_id, event), self.clock())

    def check(self) -> None:
        """A change a poll saw whose push has not come within HOOK_MISS_AFTER is a miss."""
        now = self.clock()
        late = [k for k, at in self._seen.items() if now - at >= HOOK_MISS_AFTER]
        for k in late:
            del self._seen[k]
        if late:
            self.last_miss = now


def preferred(a: JobInfo, b: JobInfo, cancelled: Container[int] = ()) -> bool:
    """Which of two jobs with one claim speaks for the Pod: never one we `cancelled` over one
    we did not (a read sent just before our KILL still shows it RUNNING: the old job, still
    older, would otherwise win, its new one be cancelled as a duplicate and the Pod just bound
    for it evicted), a live one over an ended one (an ended one only if it is newer, e.g. after
    a resubmit), a live one over one that is COMPLETING (the same, read after the KILL), RUNNING
    over waiting, then the older one (the one Slurm queued first)."""
    if (a.job_id in cancelled) != (b.job_id in cancelled):
        return b.job_id in cancelled
    if a.active != b.active:
        return a.active
    if not a.active:
        return a.job_id > b.job_id
    if (a.state == COMPLETING) != (b.state == COMPLETING):
        return b.state == COMPLETING
    if (a.state == RUNNING) != (b.state == RUNNING):
        return a.state == RUNNING
    return a.job_id < b.job_id
