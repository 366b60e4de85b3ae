"""The hot-path shortcuts found by profiling (bench/): same results, less work."""

from __future__ import annotations

import asyncio
from typing import Any

from slurmgate import contract
from slurmgate.binder.events import Recorder
from slurmgate.kube import KubeError
from slurmgate.slurm import SlurmClient

OURS = {"job_id": 7, "job_state": "RUNNING", "nodes": "n1",
        "comment": f"{contract.COMMENT_PREFIX}abc pod=ns/p"}
OTHER = {"job_id": 8, "job_state": "PENDING", "nodes": "", "comment": "someone else"}
BARE = {"job_id": 9, "job_state": "PENDING", "nodes": ""}


async def test_jobs_comment_prefix_filters_before_parsing(tmp_path: Any) -> None:
    tok = tmp_path / "token"
    tok.write_text("t\n")
    c = SlurmClient("http://127.0.0.1:1", tok, api_version="v0.0.38")

    async def fake_request(method: str, path: str, **kw: Any) -> tuple[int, dict[str, Any]]:
        if path.endswith("/diag"):
            return 200, {"statistics": {"req_time": 100}}
        return 200, {"jobs": [OURS, OTHER, BARE]}

    c._request = fake_request  # type: ignore[method-assign]
    every, t = await c.jobs()
    ours, t2 = await c.jobs(comment_prefix=contract.COMMENT_PREFIX)
    assert [j.job_id for j in every] == [7, 8, 9] and t == t2 == 100
    assert ours == [every[0]]


class FakeKube:
    def __init__(self) -> None:
        self.created: list[str] = []
        self.release = asyncio.Event()

    async def create(self, path: str, body: dict[str, Any]) -> None:
        if body["reason"] == "Slow":
            await self.release.wait()
        if body["reason"] == "Refused":
            raise KubeError(403, "Forbidden", "no")
        self.created.append(body["reason"])


def pod(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": f"p-{uid}", "namespace": "ns", "uid": uid}}


async def test_events_do_not_block_and_keep_per_pod_order() -> None:
    kube = FakeKube()
    r = Recorder(kube)  # type: ignore[arg-type]
    await asyncio.wait_for(r.emit(pod("a"), "Slow", "m"), 1)  # returns before it is sent
    await r.emit(pod("a"), "Refused", "m")  # a failure is logged, never raised
    await r.emit(pod("a"), "Second", "m")
    await r.emit(pod("b"), "Other", "m")
    await r.emit(pod("b"), "Other", "m")  # once=True: the repeat is skipped
    await asyncio.sleep(0.01)
    assert kube.created == ["Other"]  # b is not held up by a's slow Event
    kube.release.set()
    await r.flush()
    assert kube.created == ["Other", "Slow", "Second"]


async def test_an_eviction_says_why_once_even_when_decided_twice() -> None:
    kube = FakeKube()
    r = Recorder(kube)  # type: ignore[arg-type]
    for _ in range(2):  # a second reconcile before the watch shows the Pod terminating
        await r.emit(pod("a"), "SlurmJobTimeLimit", "m", warning=True)
        await r.emit(pod("a"), "Evicted", "evicted: m", warning=True)
    await r.emit(pod("a"), "Evicted", "evicted: m", warning=True, once=False)
    await r.flush()
    assert kube.created == ["SlurmJobTimeLimit", "Evicted", "Evicted"]


def test_two_live_jobs_for_one_claim_keep_one_and_flag_the_other() -> None:
    from slurmgate.binder.jobs import JobTracker
    from slurmgate.slurm import JobInfo

    def j(i: int, st: str) -> JobInfo:
        return JobInfo(job_id=i, name="x", state=st, reason="None", nodes=(),
                       comment="slurmgate claim=c pod=ns/p", partition="k8s", submit_time=1,
                       start_time=0, end_time=0)

    seen: list[tuple[str, object]] = []
    t = JobTracker(None, lambda c, job: seen.append((c, job)))  # type: ignore[arg-type]
    t._apply([j(28, "RUNNING"), j(29, "PENDING")])  # the timed-out submit ran after all
    assert t.by_claim["c"].job_id == 28 and [d.job_id for d in t.duplicates] == [29]
    t._apply([j(28, "PENDING"), j(29, "PENDING")])
    assert t.by_claim["c"].job_id == 28 and [d.job_id for d in t.duplicates] == [29]
    t._apply([j(28, "CANCELLED"), j(31, "PENDING")])  # a resubmit after the end: newest
    assert t.by_claim["c"].job_id == 31 and t.duplicates == []
    # a resubmit while the killed job is still COMPLETING (its node lacked the GPUs, was
    # cordoned, ...): the new job speaks for the Pod and the old one is the one to kill
    t._apply([j(40, "COMPLETING"), j(41, "PENDING")])
    assert t.by_claim["c"].job_id == 41 and [d.job_id for d in t.duplicates] == [40]
    t._apply([j(40, "COMPLETING"), j(41, "RUNNING")])
    assert t.by_claim["c"].job_id == 41 and [d.job_id for d in t.duplicates] == [40]


def test_slow_polls_back_off() -> None:
    from slurmgate.binder.jobpoll import (
        FAST_POLL,
        HOOK_IDLE_POLL,
        HOOKED_FAST_POLL,
        SLOW_POLL,
        poll_delay,
    )

    assert poll_delay(True, 0.003) == FAST_POLL  # fast answers: poll fast
    assert poll_delay(True, 0.4) == 0.4  # slow answers: wait as long as the poll took
    assert poll_delay(True, 7.0) == SLOW_POLL  # never slower than when idle
    assert poll_delay(False, 0.003) == SLOW_POLL
    assert poll_delay(False, 0.003, hook_ok=True) == HOOK_IDLE_POLL  # the hook pushes starts
    # in flight with a hook that pushes: polls are the safety net for a push it misses, and a
    # slower one than without it (each read holds slurmctld's job lock against our cancels)
    assert poll_delay(True, 0.003, hook_ok=True) == HOOKED_FAST_POLL > FAST_POLL
    assert poll_delay(True, 0.8, hook_ok=True) == 0.8  # slow answers still pace it
    assert HOOKED_FAST_POLL < 1.0  # a start the hook misses is seen within a second
