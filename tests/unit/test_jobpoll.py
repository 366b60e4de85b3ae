"""The job poller asks Slurm about our jobs only: what it asks, and what it does with the
answers, against a Slurm stand-in that records every request (the e2e suite uses the real one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import pytest

from slurmgate.binder import jobpoll
from slurmgate.binder.jobpoll import HookHealth, Schedule
from slurmgate.binder.jobs import JobTracker
from slurmgate.slurm import JobInfo, PartitionInfo, dialects


def job(i: int, st: str, claim: str | None = None, preempt_time: int = 0,
        reason: str = "None") -> JobInfo:
    comment = f"slurmgate claim={claim or f'c{i}'} pod=ns/p{i}" if claim != "" else "someone"
    return JobInfo(job_id=i, name="x", state=st, reason=reason,
                   nodes=("n1",) if st == "RUNNING" else (), comment=comment, partition="k8s",
                   submit_time=1, start_time=0, end_time=0, state_flags=frozenset({st}),
                   preempt_time=preempt_time)


class Slurm:
    """A Slurm with a whole site's jobs in it; counts what it is asked."""

    def __init__(self, version: str, jobs: Iterable[JobInfo]) -> None:
        self.d = dialects.dialect(version)
        self.site = {j.job_id: j for j in jobs}
        self.calls: list[tuple[str, Any]] = []
        self.grace: int | None = None  # the k8s partition's GraceTime

    async def dialect(self) -> dialects.Dialect:
        return self.d

    async def job_states(self, ids: Iterable[int]) -> dict[int, tuple[str, frozenset[str]]]:
        ids = sorted(ids)
        self.calls.append(("states", ids))
        return {i: (self.site[i].state, self.site[i].state_flags) for i in ids if i in self.site}

    async def jobs_by_id(self, ids: Iterable[int]) -> dict[int, JobInfo | None]:
        ids = sorted(ids)
        self.calls.append(("whole", ids))
        return {i: self.site.get(i) for i in ids}

    async def partitions(self) -> list[PartitionInfo]:
        self.calls.append(("partitions", 0))
        return [PartitionInfo("k8s", (), True, None, "UP", self.grace)]

    # slurmrestd without slurmdbd's endpoints (see test_lostjobs.py for one with)
    serves_dbd_jobs = False

    async def our_jobs(self, comment_prefix: str) -> list[JobInfo]:
        self.calls.append(("list", len(self.site)))
        return [j for j in self.site.values() if (j.comment or "").startswith(comment_prefix)]


def tracker(slurm: Slurm, named: set[int] | None = None) -> tuple[JobTracker, list[Any]]:
    seen: list[Any] = []
    t = JobTracker(slurm, lambda c, j: seen.append((c, j and j.state)),  # type: ignore[arg-type]
                   named=lambda: named or set())
    return t, seen


async def tick(t: JobTracker) -> float:
    """One poll, and the whole list it may have started beside it, read to its end."""
    delay = await t.poll_once()
    if t.finder._listing is not None:
        await t.finder._listing
    return delay


def foreign(n: int, start: int = 10_000) -> list[JobInfo]:
    return [job(start + k, "PENDING", claim="") for k in range(n)]


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.38"])
async def test_after_the_first_list_only_our_jobs_are_asked_about(version: str) -> None:
    slurm = Slurm(version, [job(1, "PENDING"), job(2, "RUNNING"), *foreign(3000)])
    t, seen = tracker(slurm)
    await tick(t)
    assert slurm.calls == [("list", 3002), ("partitions", 0)] and t.synced.is_set()
    assert {c for c, _ in seen} == {"c1", "c2"}
    slurm.calls.clear()
    await tick(t)
    asked = [ids for _, ids in slurm.calls]
    assert all(set(ids) <= {1, 2} for ids in asked), slurm.calls  # never a foreign id
    assert not any(kind == "list" for kind, _ in slurm.calls)


async def test_a_changed_state_is_read_whole_and_applied() -> None:
    slurm = Slurm("v0.0.42", [job(1, "PENDING", reason="Priority"), *foreign(10)])
    t, seen = tracker(slurm)
    await tick(t)
    slurm.site[1] = job(1, "RUNNING")
    slurm.calls.clear()
    seen.clear()
    await tick(t)
    assert slurm.calls == [("states", [1]), ("whole", [1])]
    assert seen == [("c1", "RUNNING")] and t.by_claim["c1"].nodes == ("n1",)
    slurm.calls.clear()
    await tick(t)  # nothing changed and the job is no longer in flight: nothing read
    assert ("whole", [1]) not in slurm.calls


async def test_a_pending_job_whose_planned_start_moved_is_applied() -> None:
    """Backfill plans the job for later (its start_time, the Pod's expected start): the
    periodic whole read of a pending job passes that on, as it does a new reason."""
    slurm = Slurm("v0.0.42", [job(1, "PENDING", reason="Resources")])
    t, seen = tracker(slurm)
    await tick(t)
    slurm.site[1] = dataclasses.replace(slurm.site[1], start_time=1_800_000_000)
    seen.clear()
    t.schedule.idle_at = float("-inf")  # a tick that asks about every job...
    t.schedule.detail_at[1] = float("-inf")  # ...and reads this pending one whole
    await tick(t)
    assert ("whole", [1]) in slurm.calls
    assert seen == [("c1", "PENDING")] and t.by_claim["c1"].start_time == 1_800_000_000
    seen.clear()
    t.schedule.idle_at = t.schedule.detail_at[1] = float("-inf")
    await tick(t)  # read again, unchanged: nothing to apply
    assert seen == []


async def test_a_job_that_left_slurm_leaves_and_is_not_asked_again() -> None:
    slurm = Slurm("v0.0.42", [job(1, "PENDING")])
    t, seen = tracker(slurm, named={1})
    await tick(t)
    del slurm.site[1]
    seen.clear()
    await tick(t)
    assert seen == [("c1", None)] and "c1" not in t.by_claim
    slurm.calls.clear()
    t.schedule.idle_at = float("-inf")  # a tick that asks about every job
    await tick(t)
    assert slurm.calls == []  # the Pod still names it, but Slurm said it is gone


async def test_a_reused_id_a_new_pod_names_is_asked_about_again() -> None:
    """A controller that lost its state forgets job 68, then gives its id to the next submit.
    The new Pod names 68 too: the id Slurm once said was gone is asked about again (found on
    24.11 in CI: the new 68 failed at launch unread, and its Pod waited 60 s for vanish_grace)."""
    slurm = Slurm("v0.0.42", [job(68, "RUNNING", claim="old")])
    named = {68}
    t, seen = tracker(slurm, named)
    await tick(t)
    t.comment_of = lambda i: "slurmgate claim=new pod=ns/new" if i == 68 else None
    del slurm.site[68]  # slurmctld -c: every job forgotten
    t.schedule.idle_at = float("-inf")  # a tick that asks about every job
    await tick(t)
    assert "old" not in t.by_claim and 68 in t.schedule.gone
    slurm.site[68] = job(68, "FAILED", claim="new")  # the reused id, refused by slurmd
    t.pod_seen(68)  # the new Pod arrives naming it
    seen.clear()
    await tick(t)
    assert t.by_claim["new"].state == "FAILED" and ("new", "FAILED") in seen
    # and a push about an id we took for gone means Slurm knows it again
    del slurm.site[68]
    t.schedule.idle_at = float("-inf")
    await tick(t)
    assert 68 in t.schedule.gone
    slurm.site[68] = job(68, "RUNNING", claim="new")
    t.pushed(68, "ended", ())
    await tick(t)
    assert t.by_claim["new"].state == "RUNNING"


async def test_a_reused_id_the_binder_itself_submitted_is_asked_about_again() -> None:
    """The binder's own submit (a group's job, a resubmit) gets an id Slurm once said was gone:
    its Pods already exist (no new Pod names it), so the submit's answer alone brings the id
    back to the polls."""
    slurm = Slurm("v0.0.38", [job(90, "RUNNING", claim="old")])
    named = {90}
    t, seen = tracker(slurm, named)
    await tick(t)
    del slurm.site[90]  # slurmctld -c: every job forgotten
    t.schedule.idle_at = float("-inf")
    await tick(t)
    assert 90 in t.schedule.gone
    slurm.site[90] = job(90, "PENDING", claim="group", reason="Resources")
    seen.clear()
    await tick(t)
    assert "group" not in t.by_claim  # unasked: Slurm said the id was gone
    t.submitted(90)
    await tick(t)
    assert ("group", "PENDING") in seen and t.by_claim["group"].reason == "Resources"


def test_a_read_sent_before_a_new_pod_named_the_id_does_not_call_it_gone() -> None:
    s = Schedule()
    s.known_again(68, now=10.0)
    s.left({68}, sent=5.0)  # sent before the new Pod came, answered after
    assert 68 not in s.gone
    s.left({68}, sent=11.0)  # a read sent after it: the truth
    assert 68 in s.gone


async def test_a_job_a_pod_names_is_found_before_any_list_shows_it() -> None:
    slurm = Slurm("v0.0.38", [])
    named: set[int] = set()
    t, _ = tracker(slurm, named)
    await tick(t)  # the first, whole list: empty
    slurm.site[7] = job(7, "PENDING")
    named.add(7)  # the webhook submitted it; its Pod arrived
    await tick(t)
    assert t.by_claim["c7"].job_id == 7 and slurm.calls[-1] == ("whole", [7])


async def test_a_foreign_job_a_pod_names_is_read_once() -> None:
    slurm = Slurm("v0.0.42", [job(9, "RUNNING", claim="")])
    t, _ = tracker(slurm, named={9})  # a user wrote someone else's job id on a Pod
    await tick(t)
    await tick(t)
    slurm.calls.clear()
    for _ in range(3):
        t.schedule.idle_at = float("-inf")
        await tick(t)
    assert slurm.calls == [] and t.by_claim == {}


async def test_22_05_reads_each_job_and_spaces_the_reads() -> None:
    slurm = Slurm("v0.0.38", [job(i, "PENDING") for i in range(1, 201)])
    t, _ = tracker(slurm)
    await tick(t)
    delay = await tick(t)
    assert slurm.calls[-1] == ("whole", list(range(1, 201)))
    assert delay >= 200 / jobpoll.READS_PER_SECOND


async def test_a_pushed_end_is_read_at_the_next_poll_even_when_idle() -> None:
    slurm = Slurm("v0.0.42", [job(1, "RUNNING")])
    t, seen = tracker(slurm)
    await tick(t)
    await tick(t)  # the idle look at every job
    slurm.site[1] = dataclasses.replace(job(1, "COMPLETING"), nodes=("n1",))
    assert t.pushed(1, "ended", ("n1",)) == "polled"
    slurm.calls.clear()
    seen.clear()
    await tick(t)
    assert slurm.calls == [("whole", [1])]  # no state query first: it is read whole anyway
    assert seen == [("c1", "COMPLETING")]


async def test_a_failed_poll_keeps_what_a_push_asked_for() -> None:
    slurm = Slurm("v0.0.42", [job(1, "RUNNING")])
    t, _ = tracker(slurm)
    await tick(t)
    await tick(t)
    t.pushed(1, "ended", ("n1",))

    async def down(ids: Iterable[int]) -> dict[int, Any]:
        raise ConnectionError("slurmrestd away")
    slurm.jobs_by_id = down  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await tick(t)
    del slurm.jobs_by_id  # back
    slurm.calls.clear()
    await tick(t)
    assert slurm.calls == [("whole", [1])]


async def test_a_preemption_is_noticed_within_a_tenth_of_the_grace_time() -> None:
    slurm = Slurm("v0.0.42", [job(1, "RUNNING")])
    slurm.grace = 30  # Slurm lets a preempted job run 30 s, still RUNNING
    t, seen = tracker(slurm)
    await tick(t)
    assert t.grace == {"k8s": 30}
    slurm.site[1] = job(1, "RUNNING", preempt_time=5)  # same state list, now preempted
    seen.clear()
    t.schedule.idle_at = sent = float("inf")  # no idle look: only the GraceTime's pace
    t.schedule.detail_at[1] = 0.0
    plan = t.schedule.plan(2.9, {1: t.by_claim["c1"]}, (), (), 10, t.grace)
    assert plan.detail == set()  # read whole 2.9 s ago: not yet
    plan = t.schedule.plan(3.0, {1: t.by_claim["c1"]}, (), (), 10, t.grace)
    assert plan.detail == {1} and sent
    t.schedule.detail_at[1] = float("-inf")
    await tick(t)
    assert t.by_claim["c1"].preempted and seen == [("c1", "RUNNING")]


async def test_a_healthy_hook_does_not_stretch_the_wait_past_a_preemption_read() -> None:
    """Slurm pushes nothing on a preemption: with the hook healthy and nothing in flight, the
    poller would sleep HOOK_IDLE_POLL (15 s), but a running job in a partition with a GraceTime
    is due its whole read every tenth of it (3 s here)."""
    slurm = Slurm("v0.0.42", [job(1, "RUNNING")])
    t, _ = tracker(slurm)
    t.hook.pushed(99, "started")  # the hook is installed and nothing was missed
    assert t.hook.ok
    await tick(t)
    t.busy_until = float("-inf")  # nothing in flight: only the hook's idle pace is left
    assert await tick(t) == jobpoll.HOOK_IDLE_POLL  # no GraceTime: the idle pace
    slurm.grace = 30
    t.schedule.full_at = float("-inf")  # the next whole list reads the partitions' GraceTime
    await tick(t)
    t.busy_until = float("-inf")
    delay = await tick(t)
    assert t.grace == {"k8s": 30} and 0 < delay <= 3.0


async def test_without_a_grace_time_running_jobs_are_not_read_whole() -> None:
    slurm = Slurm("v0.0.42", [job(1, "RUNNING")])
    t, _ = tracker(slurm)
    await tick(t)
    for _ in range(3):
        t.schedule.idle_at = float("-inf")
        await tick(t)
    assert ("whole", [1]) not in slurm.calls and ("states", [1]) in slurm.calls


def test_the_whole_list_comes_back_rarely_and_when_asked() -> None:
    s = Schedule(full_every=300)
    assert s.plan(0, {}, (), (), 1).full
    s.done_full(0, ())
    assert not s.plan(1, {}, (), (), 1).full
    s.want_full(2)
    assert not s.plan(2, {}, (), (), 1).full  # asked, but within FULL_MIN_GAP of the last
    assert s.plan(jobpoll.FULL_MIN_GAP, {}, (), (), 1).full
    s.done_full(10, ())
    assert not s.plan(309, {}, (), (), 1).full and s.plan(310, {}, (), (), 1).full


def test_a_whole_list_asked_for_while_one_was_being_read_still_comes() -> None:
    s = Schedule(full_every=300)
    s.done_full(0, ())
    s.want_full(10)
    assert s.plan(10, {}, (), (), 1).full  # sent at 10...
    s.want_full(10.5)  # ...a handed-off submit arrives while it is read
    s.done_full(10, ())
    assert s.plan(10 + jobpoll.FULL_MIN_GAP, {}, (), (), 1).full


def test_an_id_back_in_the_whole_list_is_asked_about_again() -> None:
    s = Schedule()
    s.done_full(0, ())
    s.left([5])
    assert 5 not in s.plan(1, {}, [5], (), 10).ids
    s.done_full(2, [5])  # a controller that lost its state reused the id for a job of ours
    assert 5 in s.plan(3, {}, [5], (), 10).ids


def test_a_burst_of_pending_jobs_spreads_its_reason_reads() -> None:
    s = Schedule()
    s.done_full(0, ())
    known = {i: job(i, "PENDING") for i in range(100)}
    read: set[int] = set()
    for k in range(5):
        plan = s.plan(20 + k * 0.1, known, (), (), 10)
        assert len(plan.detail) == jobpoll.STALE_PER_TICK and not plan.detail & read
        s.read_whole(plan.detail, 20 + k * 0.1)
        read |= plan.detail
    assert read == set(known)


async def test_state_queries_are_not_paced_like_22_05_reads() -> None:
    slurm = Slurm("v0.0.42", [job(i, "PENDING") for i in range(1, 501)])
    t, _ = tracker(slurm)
    await tick(t)
    assert await tick(t) < 1.0  # 500 jobs asked in one request: no 10 s wait


def test_in_flight_jobs_are_asked_every_tick_the_others_at_the_idle_rate() -> None:
    s = Schedule()
    s.done_full(0, ())
    known = {1: job(1, "PENDING"), 2: job(2, "RUNNING"), 3: job(3, "RUNNING", preempt_time=4)}
    assert s.plan(1, known, (), (), 10).ids == {1, 2, 3}  # the first idle look
    assert s.plan(1.1, known, (), (), 10).ids == {1, 3}
    assert s.plan(11.1, known, (), (), 10).ids == {1, 2, 3}


def test_pending_jobs_are_read_whole_now_and_then_for_their_reason() -> None:
    s = Schedule()
    s.done_full(0, ())
    known = {1: job(1, "PENDING")}
    assert s.plan(1, known, (), (), 10).detail == {1}
    s.read_whole([1], 1)
    assert s.plan(2, known, (), (), 10).detail == set()
    assert s.plan(1 + jobpoll.DETAIL_EVERY, known, (), (), 10).detail == {1}


def test_the_hook_is_trusted_until_a_change_a_poll_saw_goes_without_its_push() -> None:
    now = [1000.0]
    h = HookHealth(clock=lambda: now[0])
    assert not h.ok  # never heard from
    h.pushed(99, "started")  # some other job's start
    assert h.ok
    h.saw(1, "started")  # a poll quicker than the push...
    now[0] += 1
    h.pushed(1, "started")  # ...which came all the same
    now[0] += 5
    h.check()
    assert h.ok
    h.pushed(2, "ended")
    h.saw(2, "ended")  # the push came first: nothing to wait for
    h.saw(3, "ended")  # this one's push never comes
    now[0] += jobpoll.HOOK_MISS_AFTER - 0.5
    h.check()
    assert h.ok
    now[0] += 0.5
    h.check()
    assert not h.ok
    assert jobpoll.poll_delay(False, 0.01, h.ok) == jobpoll.SLOW_POLL
    now[0] += 1
    h.pushed(4, "started")  # someone else's job: says nothing of our pushes
    assert not h.ok
    h.pushed(5, "started", ours=True)
    assert h.ok and jobpoll.poll_delay(False, 0.01, h.ok) == jobpoll.HOOK_IDLE_POLL


async def test_a_start_no_push_announced_marks_the_hook_unhealthy() -> None:
    slurm = Slurm("v0.0.42", [job(1, "PENDING")])
    t, _ = tracker(slurm)
    now = [100.0]
    t.hook.clock = lambda: now[0]
    t.hook.pushed(50, "started")  # the hook told of some other job
    await tick(t)
    slurm.site[1] = job(1, "RUNNING")
    await tick(t)  # a poll sees the start; no push for it
    assert t.hook.ok
    now[0] += jobpoll.HOOK_MISS_AFTER
    await tick(t)
    assert not t.hook.ok


def test_a_configuring_job_is_polled_for_at_the_fast_rate() -> None:
    s = Schedule()
    s.done_full(0, ())
    known = {1: job(1, "CONFIGURING"), 2: job(2, "RUNNING")}
    assert s.plan(1, known, (), (), 10).ids == {1, 2}
    assert s.plan(1.1, known, (), (), 10).ids == {1}


async def test_a_whole_list_only_adds_jobs_the_id_polls_remove_them() -> None:
    """A whole list cut short (or a job it misses) must not take a Pod's job away: only a
    look at the id itself says a job left Slurm."""
    slurm = Slurm("v0.0.42", [job(1, "RUNNING")])
    t, seen = tracker(slurm)
    await tick(t)
    hidden = slurm.site.pop(1)
    t.schedule.want_full(0)
    t.schedule.full_at = float("-inf")
    seen.clear()
    await tick(t)
    assert slurm.calls[-2:] == [("list", 0), ("partitions", 0)] and "c1" in t.by_claim
    assert seen == []
    slurm.site[1] = hidden
    t.schedule.idle_at = float("-inf")
    await tick(t)
    assert "c1" in t.by_claim


def test_a_slow_whole_list_paces_the_next_by_what_it_cost() -> None:
    """At 50,000 jobs a whole list took 130 s of slurmrestd: the next one waits until it is
    FULL_SHARE of the time, an asked-for one until WANTED_SHARE."""
    s = Schedule(full_every=3600)
    s.done_full(0, (), took=130)
    every = 130 / jobpoll.FULL_SHARE
    assert every > 3600
    assert not s.plan(every - 1, {}, (), (), 10).full and s.plan(every, {}, (), (), 10).full
    s.done_full(0, (), took=130)
    s.want_full(1)
    gap = 130 / jobpoll.WANTED_SHARE
    assert not s.plan(gap - 1, {}, (), (), 10).full and s.plan(gap, {}, (), (), 10).full
    s.done_full(0, (), took=0.05)  # a small site: as configured
    assert s.plan(3600, {}, (), (), 10).full
    # a cheap list on a loaded host is not paced: a short interval holds as configured
    quick = Schedule(full_every=10)
    quick.done_full(0, (), took=0.2)
    assert quick.plan(10, {}, (), (), 10).full
    quick.done_full(0, (), took=jobpoll.PACE_FROM)
    assert not quick.plan(10, {}, (), (), 10).full


async def test_the_whole_list_runs_beside_the_id_polls_and_sync_waits_for_our_pods() -> None:
    """At 50,000 jobs the whole list takes minutes: the id polls go on meanwhile, and the
    binder counts as synced once a poll asked about every job our Pods name."""
    import asyncio
    slurm = Slurm("v0.0.42", [job(1, "PENDING"), job(2, "RUNNING", claim="lost")])
    release = asyncio.Event()
    whole = slurm.our_jobs

    async def slow(prefix: str) -> list[JobInfo]:
        await release.wait()
        return await whole(prefix)
    slurm.our_jobs = slow  # type: ignore[method-assign]
    pods_known = [False]
    seen: list[Any] = []
    t = JobTracker(slurm, lambda c, j: seen.append((c, j and j.state)),  # type: ignore[arg-type]
                   named=lambda: {1}, ready=lambda: pods_known[0])
    await t.poll_once()
    assert t.finder._listing is not None and not t.synced.is_set()  # our Pods not all known yet
    pods_known[0] = True
    slurm.site[1] = job(1, "RUNNING")
    await t.poll_once()  # the whole list still streams in
    assert t.synced.is_set() and not t.listed.is_set()
    assert t.by_claim["c1"].state == "RUNNING"
    release.set()
    await t.finder._listing
    assert t.listed.is_set() and t.by_claim["lost"].job_id == 2  # no Pod names it
    assert t.by_claim["c1"].state == "RUNNING"


def test_a_failed_whole_list_is_paced_by_the_last_that_was_read() -> None:
    """A list that failed because slurmctld was away says nothing of what a list costs: the
    next is asked for at the usual gap, not at ten times the outage."""
    s = Schedule(full_every=3600)
    s.done_full(0, (), took=0.05)
    s.full_failed(100)  # it hung for as long as slurmctld was away
    assert s.plan(100 + jobpoll.FULL_MIN_GAP, {}, (), (), 10).full


def test_pending_jobs_can_be_read_at_a_slower_pace_but_never_past_a_push() -> None:
    s = Schedule()
    s.done_full(0, ())
    known = {1: job(1, "PENDING"), 2: job(2, "PENDING"), 3: job(3, "COMPLETING"),
             4: job(4, "PENDING", preempt_time=5)}  # requeued by a preemption: still moving
    assert s.plan(1, known, (), (), 10, pending_every=2).ids == {1, 2, 3, 4}  # the idle look
    s.read_whole([1, 2, 3, 4], 1)
    assert s.plan(1.1, known, (), (), 10, pending_every=2).ids == {3, 4}
    assert s.plan(1.2, known, (), [2], 10, pending_every=2).ids == {2, 3, 4}  # pushed about
    assert s.plan(3.0, known, (), (), 10, pending_every=2).ids == {1, 2, 3, 4}
    assert s.plan(3.1, known, (), (), 10).ids == {1, 2, 3, 4}  # 0: every tick, as before


def test_pending_jobs_read_job_by_job_share_one_budget_while_the_hook_pushes() -> None:
    """22.05 reads job by job: however many of ours pend, their reads together stay at
    PENDING_HOOKED_READS_PER_SECOND (a few pend: each every PENDING_HOOKED_EVERY)."""
    rate = jobpoll.PENDING_HOOKED_READS_PER_SECOND
    few = [job(1, "PENDING"), job(2, "RUNNING")]
    many = [job(i, "PENDING") for i in range(40)] + [job(99, "PENDING", preempt_time=5)]
    assert jobpoll.pending_every(True, False, few) == jobpoll.PENDING_HOOKED_EVERY
    assert jobpoll.pending_every(True, False, many) == pytest.approx(40 / rate)  # not the requeued
    assert jobpoll.pending_every(False, False, many) == 0.0  # polling is the signal
    assert jobpoll.pending_every(True, True, many) == 0.0  # one state query asks about all


@pytest.mark.parametrize(("version", "hooked", "want"), [
    # 22.05: GET /job/{id} per job; 12 pending share the budget
    ("v0.0.38", True, max(jobpoll.PENDING_HOOKED_EVERY,
                          12 / jobpoll.PENDING_HOOKED_READS_PER_SECOND)),
    ("v0.0.38", False, 0.0),  # no sign the hook pushes: polling is the signal
    ("v0.0.42", True, 0.0),  # one state query asks about every job at once
])
async def test_only_job_by_job_reads_slow_down_and_only_while_the_hook_pushes(
        version: str, hooked: bool, want: float) -> None:
    slurm = Slurm(version, [job(i, "PENDING") for i in range(1, 13)])
    t, _ = tracker(slurm)
    if hooked:
        t.hook.pushed(99, "started")
    await tick(t)  # the first whole list, and the first idle look
    assert await t._pending_every() == want
    await tick(t)
    slurm.calls.clear()
    await tick(t)
    asked = {i for kind, ids in slurm.calls if kind in ("states", "whole") for i in ids}
    assert len(asked) == (0 if want else 12)
