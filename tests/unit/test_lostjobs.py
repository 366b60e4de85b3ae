"""Jobs of ours no Pod names are looked for by name or partition in slurmdbd, never in the
site's whole list, where slurmrestd serves slurmdbd's job query (binder/lostjobs.py). The
stand-in below keeps slurmdbd's index beside slurmctld's records and counts what it is asked;
the queries' wording is checked against slurmrestd's recorded answers in test_slurm_dialects.py
and end to end in the e2e suite (test_faults_slurm.py, test_submit_handoff.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

import pytest

from slurmgate import contract
from slurmgate.binder import jobpoll, lostjobs
from slurmgate.binder.jobs import JobTracker
from slurmgate.slurm import JobInfo, dialects
from slurmgate.slurm.accounting import live_ids, query
from tests.unit.test_jobpoll import Slurm, foreign, tick


class DbdSlurm(Slurm):
    """A Slurm whose slurmrestd serves slurmdbd's job query, answering it from slurmdbd's
    index (`db`: it hears of jobs late) in its JSON form, by name or partition."""

    serves_dbd_jobs = True

    def __init__(self, version: str, jobs: Iterable[JobInfo]) -> None:
        super().__init__(version, jobs)
        # slurmdbd's own records: it hears of jobs late, and keeps runaways slurmctld forgot
        self.db: dict[int, JobInfo] = dict(self.site)

    async def get(self, path: str, what: str, query: str | None = None) -> dict[str, Any]:
        q = dict(kv.split("=", 1) for kv in (query or "").split("&"))
        names = set(unquote(q.get("job_name", "")).split(",")) - {""}
        partitions = set(unquote(q.get("partition", "")).split(",")) - {""}
        self.calls.append(("dbd", sorted(names) or sorted(partitions)))
        return {"jobs": [
            {"job_id": i, "name": j.name, "partition": j.partition,
             "state": {"current": [j.state]}}
            for i, j in sorted(self.db.items())
            if (not names or j.name in names) and (not partitions or j.partition in partitions)]}


def named_job(i: int, name: str, claim: str | None = None, partition: str = "k8s") -> JobInfo:
    return JobInfo(job_id=i, name=name, state="PENDING", reason="None", nodes=(),
                   comment=f"slurmgate claim={claim or f'c{i}'} pod=ns/p{i}",
                   partition=partition, submit_time=1, start_time=0, end_time=0,
                   state_flags=frozenset({"PENDING"}))


def tracker(slurm: Slurm, partitions: Iterable[str] = ()) -> JobTracker:
    return JobTracker(slurm, lambda c, j: None,  # type: ignore[arg-type]
                      partitions=partitions)


async def look(t: JobTracker) -> None:
    """One poll and the looks it started beside it, read to their end."""
    await tick(t)
    if t.finder._looking is not None:
        await t.finder._looking


@pytest.mark.parametrize("version", ["v0.0.42", "v0.0.38"])
async def test_a_lost_submit_is_found_by_its_name_not_in_the_whole_list(version: str) -> None:
    slurm = DbdSlurm(version, [*foreign(3000)])
    t = tracker(slurm, partitions=["k8s"])
    await tick(t)  # the safety net at start: slurmdbd, for the partition we use
    assert slurm.calls[0] == ("dbd", ["k8s"]) and ("list", 3000) not in slurm.calls
    lost = named_job(7, "k8s:ns/p7", claim="lost")
    slurm.site[7] = lost  # slurmrestd made it after our request had timed out
    slurm.db[7] = slurm.site[7]
    slurm.calls.clear()
    t.want_named(lostjobs.names_of({"namespace": "ns", "name": "p7"}), 60)
    await look(t)
    assert ("dbd", ["k8s:ns/p7"]) in slurm.calls and ("whole", [7]) in slurm.calls
    assert t.by_claim["lost"].job_id == 7
    assert not any(kind == "list" for kind, _ in slurm.calls)


async def test_a_name_is_looked_for_until_its_job_appears_then_for_as_long_as_asked() -> None:
    slurm = DbdSlurm("v0.0.42", [])
    t = tracker(slurm, partitions=["k8s"])
    await tick(t)
    t.want_named(["k8s:ns/late"], 60)
    await look(t)
    assert "late" not in t.by_claim  # slurmctld has not made it yet
    slurm.site[8] = named_job(8, "k8s:ns/late", claim="late")
    slurm.db[8] = slurm.site[8]
    t.finder.wanted.looked_at = float("-inf")  # LOOK_EVERY has passed
    await look(t)
    assert t.by_claim["late"].job_id == 8
    # known now: further looks read no record again
    slurm.calls.clear()
    t.finder.wanted.looked_at = float("-inf")
    await look(t)
    assert [c for c in slurm.calls if c[0] == "whole" and 8 in c[1]] == []


async def test_names_are_looked_up_at_most_every_look_every_and_expire() -> None:
    w = lostjobs.Wanted()
    w.want(["a"], until=100.0)
    assert w.due(10.0) == ["a"]
    w.looked_at = 10.0
    assert w.due(10.0 + lostjobs.LOOK_EVERY / 2) == []
    assert w.due(10.0 + lostjobs.LOOK_EVERY) == ["a"]
    assert w.due(100.0) == [] and not w.until  # expired
    w.want(["b"], until=50.0)
    w.want(["b"], until=40.0)  # a shorter wish never cuts a longer one
    assert w.until["b"] == 50.0 and w.left(20.0) == 30.0


async def test_without_slurmdbd_the_whole_list_stands_in_for_the_wishes() -> None:
    slurm = Slurm("v0.0.42", [*foreign(10)])  # serves no slurmdbd job query
    t = tracker(slurm, partitions=["k8s"])
    await tick(t)
    assert slurm.calls[0] == ("list", 10)
    t.want_named(["k8s:ns/p"], 60)
    before = time.monotonic()
    await look(t)
    assert not t.finder.wanted.until  # handed to the whole list...
    assert t.schedule.wanted_until >= before + 60 - 1  # ...for the wishes' remaining time


async def test_the_safety_net_needs_a_partition_else_reads_the_whole_list() -> None:
    slurm = DbdSlurm("v0.0.42", [named_job(3, "k8s:ns/p3", partition="gpu"), *foreign(10)])
    t = tracker(slurm)  # no DEFAULT_PARTITION, no job of ours known yet
    await tick(t)
    assert slurm.calls[0] == ("list", 11) and "c3" in t.by_claim
    slurm.calls.clear()
    t.schedule.full_at = float("-inf")  # the next safety net is due
    await tick(t)
    assert ("dbd", ["gpu"]) in slurm.calls  # the partition of the job it now holds
    assert not any(kind == "list" for kind, _ in slurm.calls)


def test_names_of_a_pod_include_its_generate_name_form() -> None:
    assert lostjobs.names_of({"namespace": "ns", "name": "web-x1", "generateName": "web-"}) \
        == ("k8s:ns/web-x1", "k8s:ns/web-*")
    assert lostjobs.names_of({"namespace": "ns", "name": "p"}) == ("k8s:ns/p",)
    assert lostjobs.group_name("ns", "g") == f"{contract.JOB_NAME_PREFIX}ns/group:g"


@pytest.mark.parametrize("version,since", [("v0.0.42", "start_time=900"),
                                           ("v0.0.38", "start_time=now-100")])
def test_the_query_escapes_what_slurmdbd_refuses_and_speaks_each_time_form(
        version: str, since: str) -> None:
    q = query(dialects.dialect(version), names=["k8s:ns/a", "k8s:ns/b*"], within=100,
              now=1000)
    assert q == f"skip_steps=true&job_name=k8s%3Ans%2Fa%2Ck8s%3Ans%2Fb%2A&{since}"
    assert "partition=k8s%2Cgpu" in query(dialects.dialect(version),
                                          partitions=["k8s", "gpu"], within=1)


def test_ended_jobs_are_not_live_and_only_asked_names_count() -> None:
    answer: dict[str, Any] = {"jobs": [
        {"job_id": 1, "name": "k8s:ns/a", "state": {"current": ["RUNNING"]}},
        {"job_id": 2, "name": "k8s:ns/a", "state": {"current": "CANCELLED"}},  # v0.0.38 form
        {"job_id": 3, "name": "k8s:ns/b", "state": {"current": ["PENDING"]}},
        {"job_id": 4, "name": "other", "state": {"current": ["PENDING"]}},
        "garbage"]}
    assert live_ids(answer) == {1, 3, 4}
    assert live_ids(answer, ["k8s:ns/a"]) == {1}


def test_the_scan_window_covers_the_time_since_the_last_look() -> None:
    assert lostjobs.scan_window(None, 3600, now=0) == 3600 + lostjobs.SCAN_MARGIN
    assert lostjobs.scan_window(100.0, 3600, now=700.0) == 600 + lostjobs.SCAN_MARGIN
    # a binder that slept for days asks about two periods, not all of history
    assert lostjobs.scan_window(0.0, 3600, now=1e6) == 7200 + lostjobs.SCAN_MARGIN
    assert jobpoll.FULL_MIN_GAP < lostjobs.NAME_WINDOW


def test_slurmdbds_job_query_has_a_label_of_its_own() -> None:
    from slurmgate.slurm.restmetrics import endpoint
    assert endpoint("/slurmdb/v0.0.42/jobs/") == "slurmdb/jobs"
    assert endpoint("/slurm/v0.0.42/jobs") == "jobs"  # the whole list, never confused with it
    assert endpoint("/slurm/v0.0.38/job/17") == "job/{id}"


async def test_the_safety_net_reads_an_id_not_ours_once_not_at_every_look() -> None:
    """slurmdbd's runaway jobs (a controller that lost its state) and other users' jobs in our
    partition stay live there: each is read once per NOT_OURS_KEEP, so a look does not grow
    with them (22.05 reads each alone, and a slow look is paced away)."""
    slurm = DbdSlurm("v0.0.38", [named_job(3, "k8s:ns/p3")])
    for i in (70, 71):  # runaways: slurmdbd has them, slurmctld does not
        slurm.db[i] = named_job(i, f"k8s:ns/old{i}", claim=f"old{i}")
    slurm.site[72] = dataclasses.replace(named_job(72, "batch"), comment="someone's")
    slurm.db[72] = slurm.site[72]
    t = tracker(slurm, partitions=["k8s"])
    await tick(t)
    assert ("whole", [3, 70, 71, 72]) in slurm.calls and "c3" in t.by_claim
    slurm.calls.clear()
    slurm.site[9] = named_job(9, "k8s:ns/p9", claim="new")
    slurm.db[9] = slurm.site[9]
    t.schedule.full_at = float("-inf")  # the next safety net is due
    await tick(t)
    assert ("whole", [9]) in slurm.calls and "new" in t.by_claim
    assert not [c for c in slurm.calls if c[0] == "whole" and {70, 71, 72} & set(c[1])]
    t.finder.not_ours.at = {i: v - lostjobs.NOT_OURS_KEEP for i, v in t.finder.not_ours.at.items()}
    t.schedule.full_at = float("-inf")
    slurm.calls.clear()
    await tick(t)
    assert ("whole", [70, 71, 72]) in slurm.calls  # read again once NOT_OURS_KEEP is past


async def test_a_slow_look_in_slurmdbd_does_not_put_the_next_off() -> None:
    """Only the whole list is paced by its length (the site's cost); a look in slurmdbd that
    was slow because slurmctld was (a restart) comes again after BINDER_FULL_LIST_INTERVAL."""
    slurm = DbdSlurm("v0.0.38", [named_job(3, "k8s:ns/p3")])
    t = tracker(slurm, partitions=["k8s"])
    t.schedule.full_every = 10.0
    await t.finder._safety_net(time.monotonic() - 30.0)  # sent 30 s ago: it took 30 s
    assert "c3" in t.by_claim and t.schedule.full_took == 0.0
    assert t.schedule.plan(t.schedule.full_at + 10.0, {}, (), (), 15.0).full
    # the whole list, where slurmdbd is not served, is paced by what it took, as before
    plain = Slurm("v0.0.38", [named_job(3, "k8s:ns/p3")])
    t = tracker(plain, partitions=["k8s"])
    await t.finder._safety_net(time.monotonic() - 30.0)
    assert t.schedule.full_took >= 30.0
