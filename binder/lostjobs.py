"""Jobs of ours that no Pod names yet, looked for where the cost follows our jobs.

Such a job exists when a submit's answer was lost (slurmrestd made the job after the request
timed out), when the webhook handed a submit off at admission, or when a binder crashed between
a submit and the Pod's annotation; and an orphan whose Pod is gone holds a node until found.
Slurmctld's REST API finds them only in its whole job list, the site's: at 50,000 jobs it made
slurmrestd 24.11 grow to 23 GB and be OOM-killed (bench.busy). So, where slurmrestd serves
slurmdbd's job query (slurmgate/slurm/accounting.py):

* a job we may have lost is looked up **by its name** (the Pod's, or the group's), every
  LOOK_EVERY seconds for as long as it may still appear: one slurmdbd query for all the names
  wanted, then GET /job/{id} for each live job it names that we do not know;
* the periodic safety net (at start, then every FULL_EVERY) asks slurmdbd for the live jobs of
  **the partitions our jobs use** (the binder's DEFAULT_PARTITION and those of the jobs we
  hold): its answer is those partitions' jobs, not the site's.

Only where slurmrestd serves no slurmdbd endpoints (or no partition is known yet for the
safety net) is the whole list read, as before, paced by its own cost (binder/jobpoll.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from slurmgate import contract
from slurmgate.logs import kv
from slurmgate.slurm import JobInfo, SlurmClient, accounting, placeholder

from . import metrics
from .jobpoll import Schedule

log = logging.getLogger("slurmgate.jobs")

# a job name wanted is looked up at most this often (its job may land any time in its watch)
LOOK_EVERY = 2.0
# how far back slurmdbd is asked about a name: a lost submit is minutes old at most, and a job
# still pending or running is found whatever its age (sacct -S semantics)
NAME_WINDOW = 900
# the safety net asks about the time since its last look plus this (clocks, slurmdbd's lag)
SCAN_MARGIN = 300
NAMES_MAX = 10_000  # names wanted at once; beyond it the oldest wishes are dropped
# how long the safety net leaves an id that was not ours unread (a slurmctld that lost its state
# reuses ids: a job of ours under such an id is found at the latest this much later)
NOT_OURS_KEEP = 600.0
NOT_OURS_MAX = 100_000


@dataclass
class Wanted:
    """Job names to look up, each until a monotonic deadline."""
    until: dict[str, float] = field(default_factory=dict)
    looked_at: float = float("-inf")

    def want(self, names: Iterable[str], until: float) -> None:
        for n in names:
            self.until[n] = max(self.until.get(n, until), until)
        while len(self.until) > NAMES_MAX:
            del self.until[next(iter(self.until))]

    def due(self, now: float) -> list[str]:
        """The names to look up now (none if looked up less than LOOK_EVERY ago)."""
        self.until = {n: t for n, t in self.until.items() if t > now}
        if not self.until or now - self.looked_at < LOOK_EVERY:
            return []
        return sorted(self.until)

    def left(self, now: float) -> float:
        """Seconds the longest wish still has (for the whole list that stands in for them)."""
        return max((t - now for t in self.until.values()), default=0.0)


def names_of(meta: dict) -> tuple[str, ...]:
    """The names a Pod's job may carry: the webhook names it `k8s:ns/name`, or, when the Pod
    was created with generateName (no name yet at admission), `k8s:ns/generateName*`."""
    ns = meta.get("namespace", "")
    out = [placeholder.job_name(ns, meta["name"])] if meta.get("name") else []
    if meta.get("generateName"):  # what pod_display_name gave at admission
        out.append(placeholder.job_name(ns, placeholder.pod_display_name(
            {"generateName": meta["generateName"]})))
    return tuple(out)


def group_name(namespace: str, group: str) -> str:
    return placeholder.job_name(namespace, f"group:{group}")


@dataclass
class NotOurs:
    """Ids the safety net read and found not ours (another's job) or unknown to slurmctld
    (slurmdbd's runaway jobs: a controller that lost its state never told slurmdbd they ended,
    so they stay live there for good). Each is read once per NOT_OURS_KEEP, not at every look:
    on 22.05 every read is a GET /job/{id}, and a look that grew with them was paced away."""
    at: dict[int, float] = field(default_factory=dict)

    def skip(self, ids: set[int], now: float) -> set[int]:
        self.at = {i: t for i, t in self.at.items() if now - t < NOT_OURS_KEEP}
        while len(self.at) > NOT_OURS_MAX:
            del self.at[next(iter(self.at))]
        return {i for i in ids if i not in self.at}

    def saw(self, records: dict[int, JobInfo | None], now: float) -> None:
        for i, j in records.items():
            if j is None or contract.claim_from_comment(j.comment) is None:
                self.at[i] = now


async def find(slurm: SlurmClient, known: Iterable[int], *, names: Iterable[str] = (),
               partitions: Iterable[str] = (), within: int,
               not_ours: NotOurs | None = None) -> list[JobInfo] | None:
    """Our live jobs (by comment) that slurmdbd names for `names` or `partitions`, read whole
    from slurmctld, less the `known` ids (and those `not_ours` read lately). None: slurmrestd
    serves no slurmdbd job query."""
    ids = await accounting.accounted_ids(slurm, names=names, partitions=partitions,
                                         within=within)
    if ids is None:
        return None
    ids -= set(known)
    now = time.monotonic()
    if not_ours is not None:
        ids = not_ours.skip(ids, now)
    records = await slurm.jobs_by_id(ids)
    if not_ours is not None:
        not_ours.saw(records, now)
    return [j for j in records.values()
            if j is not None and contract.claim_from_comment(j.comment) is not None]


def scan_window(last: float | None, full_every: float, now: float | None = None) -> int:
    """Seconds back the safety net asks slurmdbd about: since its last look (or a whole
    FULL_EVERY at start), plus SCAN_MARGIN."""
    now = time.monotonic() if now is None else now
    since = full_every if last is None else min(now - last, 2 * full_every)
    return int(since + SCAN_MARGIN)


class Finder:
    """Looks for jobs of ours no Pod names, beside the id polls (each look is a task of its
    own: a whole list takes minutes on a busy site), and hands what it finds to `add`
    (found jobs, when the look was sent, whether it was the safety net)."""

    def __init__(self, slurm: SlurmClient, schedule: Schedule, *,
                 known: Callable[[], Iterable[JobInfo]],
                 add: Callable[[list[JobInfo], float, bool], None],
                 after_full: Callable[[], Awaitable[None]], wake: Callable[[], None],
                 partitions: Iterable[str] = ()) -> None:
        self.slurm = slurm
        self.schedule = schedule
        self.known = known
        self.add = add
        self.after_full = after_full  # e.g. the partitions' GraceTimes, read with each
        self.wake = wake
        self.partitions = tuple(partitions)  # beside those of our jobs (DEFAULT_PARTITION)
        self.wanted = Wanted()
        self.not_ours = NotOurs()
        self.listed = asyncio.Event()  # the safety net looked once
        self._scanned_at: float | None = None
        self._listing: asyncio.Task[None] | None = None
        self._looking: asyncio.Task[None] | None = None

    def want_named(self, names: Iterable[str], for_seconds: float) -> None:
        """Look for jobs with these names for `for_seconds` (a submit whose job may exist
        though no Pod names it): by name in slurmdbd, else in the whole list."""
        self.wanted.want(names, time.monotonic() + max(for_seconds, LOOK_EVERY))
        self.wake()

    def want_full(self, for_seconds: float = 0.0) -> None:
        """The safety net soon, and every jobpoll.FULL_MIN_GAP for `for_seconds`."""
        now = time.monotonic()
        self.schedule.want_full(now, now + for_seconds)
        self.wake()

    def tick(self, sent: float, full: bool) -> None:
        """A poll sent at `sent`: start the safety net (`full`: the schedule says it is due)
        and a look by name, each unless one is under way."""
        if full:
            self.schedule.listing = True
            self._listing = asyncio.create_task(self._safety_net(sent))
        if self._looking is None and (names := self.wanted.due(sent)):
            self.wanted.looked_at = sent
            self._looking = asyncio.create_task(self._look_up(names, sent))

    def cancel(self) -> None:
        for task in (self._listing, self._looking):
            if task is not None:
                task.cancel()

    def _known_ids(self) -> set[int]:
        return {j.job_id for j in self.known()}

    async def _look_up(self, names: list[str], sent: float) -> None:
        try:
            found = await find(self.slurm, self._known_ids(), names=names, within=NAME_WINDOW)
            if found is None:  # no slurmdbd: the whole list stands in for the wishes' time
                self.want_full(self.wanted.left(time.monotonic()))
                self.wanted.until.clear()
                return
            self.add(found, sent, False)
            metrics.SLURM_POLLS.labels("names").inc()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            metrics.SLURM_POLLS.labels("error").inc()
            log.warning("looking up jobs by name failed; asked again later",
                        extra=kv(error=str(e), names=len(names)))
        finally:
            self._looking = None

    async def _safety_net(self, sent: float) -> None:
        """Our jobs in the partitions we use, from slurmdbd; else (not served, or no partition
        known yet) Slurm's whole list (minutes on a busy site: 130 s at 50,000 jobs), of which
        only ours are kept as it streams in."""
        try:
            parts = {j.partition for j in self.known() if j.partition} | set(self.partitions)
            found = None if not parts else await find(
                self.slurm, self._known_ids(), partitions=parts,
                within=scan_window(self._scanned_at, self.schedule.full_every),
                not_ours=self.not_ours)
            jobs = found if found is not None else await self.slurm.our_jobs(
                contract.COMMENT_PREFIX)
            self._scanned_at = sent
            self.add(jobs, sent, True)
            await self.after_full()
            # only a whole list is paced by what it took (its cost is the site's); a look in
            # slurmdbd costs our partitions' jobs, and its length is slurmctld's latency of
            # the moment (after a restart, seconds), which must not put the next one off
            took = time.monotonic() - sent if found is None else 0.0
            self.schedule.done_full(sent, [j.job_id for j in jobs], took)
            self.listed.set()
            metrics.SLURM_POLLS.labels("full" if found is None else "partitions").inc()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.schedule.full_failed(sent)
            metrics.SLURM_POLLS.labels("error").inc()
            log.warning("slurm whole job list failed; asked again later",
                        extra=kv(error=str(e)))
        finally:
            self.schedule.listing = False
            self._listing = None
