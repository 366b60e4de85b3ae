"""Naming the batch job a Pod's placeholder preempted (binder/displaced.py)."""

from __future__ import annotations

import asyncio
import dataclasses

from slurmgate.binder import displaced
from slurmgate.binder.displaced import RecentEnds, how_displaced
from slurmgate.slurm.models import JobInfo

JOB = JobInfo(job_id=7, name="train", state="RUNNING", reason="None", nodes=("n2",),
              comment=None, partition="scavenger", submit_time=1, start_time=2, end_time=0,
              user="alice")


def test_the_last_end_on_the_node_within_the_window() -> None:
    ends = RecentEnds()
    ends.record(7, ("n1", "n2"), at=1000.0)
    ends.record(8, ("n2",), at=1010.0)
    assert ends.before("n2", 1012.0) == 8  # the later end on n2 replaced the earlier
    assert ends.before("n1", 1012.0) == 7
    assert ends.before("n3", 1012.0) is None
    assert ends.before("n1", 1000.0 + displaced.WINDOW + 1) is None  # too long ago
    assert ends.before("n1", 990.0) is None  # ended after the start: it made no room


def test_only_a_preempted_job_counts() -> None:
    assert how_displaced(dataclasses.replace(JOB, state="PREEMPTED")) == "cancelled"
    assert how_displaced(dataclasses.replace(
        JOB, state="COMPLETED", state_flags=frozenset({"PREEMPTED"}))) == "cancelled"
    assert how_displaced(dataclasses.replace(JOB, state="PENDING", restarts=1)) == "requeued"
    # asked while the requeued job still completes on the node
    assert how_displaced(dataclasses.replace(
        JOB, state="COMPLETING", state_flags=frozenset({"COMPLETING", "REQUEUED"}))) == "requeued"
    assert how_displaced(dataclasses.replace(JOB, state="COMPLETING", restarts=1)) == "requeued"
    assert how_displaced(dataclasses.replace(JOB, state="COMPLETING")) is None  # just ended
    assert how_displaced(dataclasses.replace(JOB, state="COMPLETED")) is None
    assert how_displaced(dataclasses.replace(JOB, state="PENDING")) is None  # never started


class FakeSlurm:
    def __init__(self, job: JobInfo | None) -> None:
        self._job = job

    async def job(self, job_id: int) -> JobInfo | None:
        return self._job


async def test_the_message_names_the_job_its_owner_and_how() -> None:
    msg = await displaced.describe(FakeSlurm(dataclasses.replace(  # type: ignore[arg-type]
        JOB, state="PENDING", restarts=1)), 7, "n2")
    assert msg is not None
    assert "job 7" in msg and "'train'" in msg and "user alice" in msg and "n2" in msg
    assert msg.endswith("requeued")
    assert await displaced.describe(FakeSlurm(None), 7, "n2") is None  # type: ignore[arg-type]
    assert await displaced.describe(FakeSlurm(  # type: ignore[arg-type]
        dataclasses.replace(JOB, state="COMPLETED")), 7, "n2") is None


async def test_an_end_pushed_after_the_bind_is_waited_for() -> None:
    ends = RecentEnds()
    waiting = asyncio.create_task(ends.wait_before("n1", started=1000.0, patience=5))
    await asyncio.sleep(0)  # the waiter is parked on the event
    assert not waiting.done()
    ends.record(9, ("n2",), at=1000.5)  # another node: keeps waiting
    await asyncio.sleep(0)
    assert not waiting.done()
    ends.record(7, ("n1",), at=1001.0)  # the victim's end, a second after the Pod's start
    assert await asyncio.wait_for(waiting, 1) == 7
    assert await ends.wait_before("n3", started=1000.0, patience=0.05) is None
