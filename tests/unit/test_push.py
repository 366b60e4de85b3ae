"""The push path: slurmctld's hook -> the binder's listener -> the job tracker. What a push may
change is bounded, and no poll answer older than a push takes a started job back."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from slurmgate.binder import metrics, push
from slurmgate.binder.jobs import JobTracker
from slurmgate.slurm import JobInfo

TOKEN = b"t" * 32
HOOK = Path(__file__).resolve().parents[2] / "slurmgate" / "hooks" / "slurmgate-notify"


def job(i: int, st: str, nodes: tuple[str, ...] = (), claim: str = "c") -> JobInfo:
    return JobInfo(job_id=i, name="x", state=st, reason="Resources" if st == "PENDING" else "None",
                   nodes=nodes, comment=f"slurmgate claim={claim} pod=ns/p", partition="k8s",
                   submit_time=1, start_time=0, end_time=0)


def tracker(comments: dict[int, str] | None = None) -> tuple[JobTracker, list[object]]:
    seen: list[object] = []
    t = JobTracker(None, lambda c, j: seen.append((c, j and j.state)),  # type: ignore[arg-type]
                   comment_of=lambda i: (comments or {}).get(i))
    return t, seen


def test_a_pushed_start_of_a_known_job_binds_at_once() -> None:
    t, seen = tracker()
    t._apply([job(5, "PENDING")], sent=time.monotonic())
    seen.clear()
    assert t.pushed(5, "started", ("n1",)) == "applied"
    assert t.by_claim["c"].state == "RUNNING" and t.by_claim["c"].nodes == ("n1",)
    assert seen == [("c", "RUNNING")]
    assert t.pushed(5, "started", ("n1",)) == "known"  # a second push changes nothing


def test_a_poll_sent_before_the_push_does_not_take_the_job_back() -> None:
    t, seen = tracker()
    t._apply([job(5, "PENDING")], sent=time.monotonic())
    before = time.monotonic()
    t.pushed(5, "started", ("n1",))
    seen.clear()
    t._apply([job(5, "PENDING")], sent=before)  # its answer came late
    assert t.by_claim["c"].state == "RUNNING" and seen == []
    t._apply([], sent=before)  # sent before the job was even listed
    assert t.by_claim["c"].state == "RUNNING" and seen == []


def test_configuring_after_the_push_is_our_own_hook_still_running() -> None:
    t, _ = tracker()
    t._apply([job(5, "PENDING")], sent=time.monotonic())
    t.pushed(5, "started", ("n1",))
    t._apply([job(5, "CONFIGURING", ("n1",))], sent=time.monotonic())
    assert t.by_claim["c"].state == "RUNNING"


def test_a_read_sent_before_the_push_stays_overruled_whatever_lands_first() -> None:
    """CI, 26.05: an id poll and the whole list were both sent before a start's push; the list
    landed first (passing on our pushed RUNNING), then the poll's CONFIGURING read of the job
    (taken while PrologSlurmctld ran) was believed, and the just-bound Pod evicted as requeued."""
    t, seen = tracker()
    t._apply([job(5, "PENDING")], sent=time.monotonic())
    before = time.monotonic()
    t.pushed(5, "started", ("n1",))
    seen.clear()
    t._apply(list(t.by_claim.values()), sent=before)  # the whole list: adds nothing new
    t._apply([job(5, "CONFIGURING")], sent=before)  # the id poll's read, in the prolog
    t._apply([job(5, "PENDING")], sent=before)
    assert t.by_claim["c"].state == "RUNNING" and seen == []


def test_our_own_view_passed_on_after_the_push_does_not_retire_its_guard() -> None:
    """CI, 26.05: slurmdbd's safety net, sent after a start's push, skips the jobs we know and
    passes our own (pushed RUNNING) view on; that retired the push's guard, and the id poll's
    CONFIGURING read of the job (PrologSlurmctld still running) was then believed: the Pod,
    bound 26 ms earlier, was evicted as requeued."""
    t, seen = tracker()
    t._apply([job(5, "PENDING")], sent=time.monotonic())
    t.pushed(5, "started", ("n1",))
    seen.clear()
    t._add_found([], time.monotonic(), True)  # the safety net: nothing new
    t._apply([job(5, "CONFIGURING")], sent=time.monotonic())  # a read sent after the push
    assert t.by_claim["c"].state == "RUNNING" and seen == []
    t._apply([job(5, "RUNNING", ("n1",))], sent=time.monotonic())  # a real read retires it
    t._apply([job(5, "PENDING")], sent=time.monotonic())  # and a later requeue is believed
    assert t.by_claim["c"].state == "PENDING"


def test_a_later_poll_overrules_the_push() -> None:
    t, seen = tracker()
    t._apply([job(5, "PENDING")], sent=time.monotonic())
    t.pushed(5, "started", ("n1",))
    seen.clear()
    t._apply([job(5, "PENDING")], sent=time.monotonic())  # e.g. requeued as the hook ran
    assert t.by_claim["c"].state == "PENDING" and seen == [("c", "PENDING")]
    t._apply([job(5, "RUNNING", ("n2",))], sent=time.monotonic())
    assert t.by_claim["c"].nodes == ("n2",)
    t._apply([], sent=time.monotonic())  # gone from Slurm after the push: gone
    assert "c" not in t.by_claim


def test_a_start_pushed_before_its_pod_was_seen_waits_for_the_pod() -> None:
    comments: dict[int, str] = {}
    t, seen = tracker(comments)
    assert t.pushed(9, "started", ("n3",)) == "early"  # neither polled nor its Pod seen
    assert not t._wake.is_set()  # it may not be ours at all: no poll for it
    assert "c9" not in t.by_claim
    comments[9] = "slurmgate claim=c9 pod=ns/p9"  # the Pod reaches the watch
    t.pod_seen(9)
    assert t.by_claim["c9"].state == "RUNNING" and seen == [("c9", "RUNNING")]
    t._apply([job(9, "PENDING", claim="c9")], sent=time.monotonic() - 1)  # older poll
    assert t.by_claim["c9"].state == "RUNNING"


def test_a_pod_naming_a_new_job_wakes_the_poller_once() -> None:
    """Without the hook, a job that starts at once is seen by the next poll: the poller is
    woken for it instead of sleeping out its idle delay. A job it already holds wakes nothing."""
    t, _ = tracker()
    t.pod_seen(7)
    assert t._wake.is_set()
    t._wake.clear()
    t._apply([job(7, "RUNNING", ("n1",))], sent=time.monotonic())
    t.pod_seen(7)
    assert not t._wake.is_set()


def test_pushes_that_may_not_change_anything() -> None:
    t, seen = tracker()
    t._apply([job(5, "PENDING"), job(6, "RUNNING", ("n2",), claim="d")],
             sent=time.monotonic())
    seen.clear()
    # the end of another job of the cluster (most pushes on a busy site): not even a poll
    assert t.pushed(777, "ended", ()) == "ignored" and not t._wake.is_set()
    assert t.pushed(5, "started", ()) == "ignored"  # no nodes: nothing to bind to
    assert t.pushed(777, "started", ("n1",)) == "early"  # not ours (as far as we know)
    assert not t._wake.is_set()
    assert t.pushed(5, "ended", ("n1",)) == "polled"  # ours: its end is read from Slurm
    assert t._wake.is_set()
    assert seen == [] and t.by_claim["c"].state == "PENDING"
    assert t.pushed(6, "started", ("n9",)) == "known"  # RUNNING already: the poll's nodes
    assert t.by_claim["d"].nodes == ("n2",)


async def _client(leading: JobTracker | None) -> TestClient[web.Request, web.Application]:
    app = web.Application()
    app.router.add_post(push.PATH, push.handler(TOKEN, lambda: leading))
    client = TestClient(TestServer(app))
    await client.start_server()
    return client


async def test_listener_checks_the_token_and_the_body() -> None:
    t, _ = tracker()
    t._apply([job(5, "PENDING")], sent=time.monotonic())
    c = await _client(t)
    try:
        body = {"job": "5", "event": "started", "nodes": "n[1-2]"}
        r = await c.post(push.PATH, data=body)
        assert r.status == 401
        r = await c.post(push.PATH, data=body, headers={"Authorization": "Bearer wrong"})
        assert r.status == 401
        auth = {"Authorization": "Bearer " + TOKEN.decode()}
        for bad in ({"job": "5; rm -rf /", "event": "started"}, {"job": "5", "event": "boom"},
                    {"job": "9" * 40, "event": "started"},
                    {"job": "5", "event": "started", "nodes": "n[1-"}):
            r = await c.post(push.PATH, data=bad, headers=auth)
            assert r.status == 400, bad
        r = await c.post(push.PATH, data="x" * (push.MAX_BODY + 1), headers=auth)
        assert r.status == 413
        assert t.by_claim["c"].state == "PENDING"  # none of that changed anything
        r = await c.post(push.PATH, data=body, headers=auth)
        assert r.status == 202 and (await r.text()).strip() == "applied"
        assert t.by_claim["c"].nodes == ("n1", "n2")
    finally:
        await c.close()


async def test_a_standby_replica_says_so() -> None:
    standby = metrics.SLURM_PUSHES.labels("started", "standby")
    before = standby._value.get()
    c = await _client(None)
    try:
        r = await c.post(push.PATH, data={"job": "5", "event": "started"},
                         headers={"Authorization": "Bearer " + TOKEN.decode()})
        assert r.status == 503
        assert standby._value.get() == before + 1  # an operator can see where pushes go
    finally:
        await c.close()


def test_token_must_not_be_trivial(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text("short\n")
    with pytest.raises(ValueError):
        push.read_token(str(f))
    f.write_text("a-long-enough-random-token\n")
    assert push.read_token(str(f)) == b"a-long-enough-random-token"


@contextlib.asynccontextmanager
async def _listener(port: int, expect: int) -> AsyncIterator[tuple[list[str], asyncio.Event]]:
    """A push listener that records what it is told (the Authorization header and the body);
    the event is set once `expect` requests came in."""
    got: list[str] = []
    enough = asyncio.Event()
    if not expect:
        enough.set()

    async def record(request: web.Request) -> web.Response:
        got.append(f"{request.headers.get('Authorization')} {await request.text()}")
        if len(got) >= expect:
            enough.set()
        return web.Response(status=202, text="applied\n")

    app = web.Application()
    app.router.add_post(push.PATH, record)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield got, enough
    finally:
        await runner.cleanup()


async def _hook_run(tmp_path: Path, env: dict[str, str], port: int,
                    expect: int = 0) -> tuple[int, list[str]]:
    """Run the real hook script against a listener that records what it was told; wait (with
    a deadline) for `expect` requests: the script returns before its detached child sends."""
    async with _listener(port, expect) as (got, enough):
        proc = await asyncio.create_subprocess_exec(
            str(tmp_path / "slurmgate-notify"), env={"PATH": os.environ["PATH"], **env})
        rc = await asyncio.wait_for(proc.wait(), 10)
        await asyncio.wait_for(enough.wait(), 10)
        return rc, got


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="the hook needs bash and timeout")
async def test_the_hook_script_tells_the_listener_and_never_fails(tmp_path: Path,
                                                                  unused_tcp_port: int) -> None:
    shutil.copy2(HOOK, tmp_path / "slurmgate-notify")
    conf = tmp_path / "slurmgate"
    # The checks run in the child; run it directly (synchronous) so that "nothing was sent"
    # is known when it exits. Not configured: nothing sent, exit 0 (a failing PrologSlurmctld
    # would requeue the job).
    child = {"SLURMGATE_NOTIFY_CHILD": "1"}
    rc, got = await _hook_run(tmp_path, {**child, "SLURM_JOB_ID": "5"}, unused_tcp_port)
    assert rc == 0 and got == []
    conf.mkdir()
    (conf / "endpoint").write_text(f"127.0.0.1:{unused_tcp_port}\n")
    (conf / "token").write_text("tok-" + "x" * 20 + "\n")
    rc, got = await _hook_run(tmp_path, {**child, "SLURM_JOB_ID": "5 6"}, unused_tcp_port)
    assert rc == 0 and got == []  # not a job id: nothing sent
    rc, got = await _hook_run(tmp_path, {**child, "SLURM_JOB_ID": "5",
                                         "SLURM_JOB_NODELIST": "n1$(id)",
                                         "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld"},
                              unused_tcp_port)
    assert rc == 0 and got == [f"Bearer tok-{'x' * 20} job=5&event=ended&nodes="]
    # as slurmctld runs it: returns at once, the detached child sends
    rc, got = await _hook_run(tmp_path, {"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n[1-2]",
                                         "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"},
                              unused_tcp_port, expect=1)
    assert rc == 0 and got == [f"Bearer tok-{'x' * 20} job=5&event=started&nodes=n[1-2]"]
    # the binder is down: still exit 0, quickly
    t0 = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        str(tmp_path / "slurmgate-notify"), env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": "5"})
    assert await asyncio.wait_for(proc.wait(), 10) == 0 and time.monotonic() - t0 < 5


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                    reason="the hook needs bash and timeout")
async def test_the_hook_tells_every_replica_listed_a_dead_one_first(
        tmp_path: Path, unused_tcp_port_factory: Callable[[], int]) -> None:
    """Two binder replicas: the hook cannot know which leads, so it tells each; a dead replica
    listed first must not keep the push from the live one."""
    dead, live = unused_tcp_port_factory(), unused_tcp_port_factory()
    shutil.copy2(HOOK, tmp_path / "slurmgate-notify")
    conf = tmp_path / "slurmgate"
    conf.mkdir()
    (conf / "endpoint").write_text(f"127.0.0.1:{dead}\n\n127.0.0.1:{live}\n")
    (conf / "token").write_text("tok-" + "z" * 20 + "\n")
    rc, got = await _hook_run(tmp_path, {"SLURMGATE_NOTIFY_CHILD": "1", "SLURM_JOB_ID": "9",
                                         "SLURM_SCRIPT_CONTEXT": "epilog_slurmctld"}, live)
    assert rc == 0 and got == [f"Bearer tok-{'z' * 20} job=9&event=ended&nodes="]


def test_a_reused_job_id_is_left_to_the_polls() -> None:
    # a controller that lost its state gives a new job the id of an old one; slurmd refuses
    # it a moment later ("Job credential revoked"): binding on the push would lose the Pod
    t, seen = tracker()
    t._apply([job(68, "RUNNING", ("n1",), claim="old")], sent=time.monotonic())
    t._apply([job(68, "PENDING", claim="new")], sent=time.monotonic())
    seen.clear()
    assert t.pushed(68, "started", ("n1",)) == "reused" and t._wake.is_set()
    assert t.by_claim["new"].state == "PENDING" and seen == []
    t._apply([job(68, "RUNNING", ("n1",), claim="new")], sent=time.monotonic())
    assert t.by_claim["new"].state == "RUNNING"  # the polls still bind it when it really runs


@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("setsid") is None
                    or not Path("/proc/self/stat").exists(),
                    reason="the detached send needs bash, setsid and /proc")
async def test_the_send_survives_slurmctld_killing_the_hooks_process_group(
        tmp_path: Path, unused_tcp_port: int) -> None:
    """slurmctld runs the hook as a process group leader and SIGKILLs the group the moment the
    hook exits ("kill children too"): a send not yet out of that group is lost. Done as
    slurmctld does it, every one of these starts must arrive."""
    shutil.copy2(HOOK, tmp_path / "slurmgate-notify")
    conf = tmp_path / "slurmgate"
    conf.mkdir()
    (conf / "endpoint").write_text(f"127.0.0.1:{unused_tcp_port}\n")
    (conf / "token").write_text("tok-" + "y" * 20 + "\n")
    runs = 20
    async with _listener(unused_tcp_port, runs) as (got, all_in):
        for job_id in range(1, runs + 1):
            proc = await asyncio.create_subprocess_exec(
                str(tmp_path / "slurmgate-notify"), process_group=0,
                env={"PATH": os.environ["PATH"], "SLURM_JOB_ID": str(job_id),
                     "SLURM_JOB_NODELIST": "n1", "SLURM_SCRIPT_CONTEXT": "prolog_slurmctld"})
            assert await asyncio.wait_for(proc.wait(), 10) == 0
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass  # nothing left in the group: as it should be
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), 10)
        sent = sorted(int(body.rsplit("job=", 1)[1].split("&", 1)[0]) for body in got)
        assert sent == list(range(1, runs + 1))


def test_a_read_sent_before_our_cancel_never_makes_the_new_job_a_duplicate() -> None:
    # CI, in-cluster, 26.05: the binder gave job 38 back (KILL) and submitted 39 for the same
    # claim; 39's start was pushed and the Pod bound; then an id poll sent just before the KILL
    # answered, still showing 38 RUNNING. Without the record of our cancel the older 38 won, 39
    # went to the duplicates (the sweep cancels those) and the just-bound Pod was evicted.
    t, seen = tracker()
    before_kill = time.monotonic()
    t._apply([job(38, "RUNNING", ("n3",))], sent=before_kill)
    t.cancelled = {38: time.monotonic()}
    t._apply([job(39, "PENDING")], sent=time.monotonic())
    assert t.pushed(39, "started", ("n4",)) == "applied"
    seen.clear()
    # the late answer: 38 as read before the KILL, onto what the tracker holds now
    t._apply([*t.by_claim.values(), job(38, "RUNNING", ("n3",))], sent=before_kill,
             complete=False)
    assert t.by_claim["c"].job_id == 39 and t.by_claim["c"].state == "RUNNING"
    assert t.duplicates == [] and seen == []
    # two live jobs neither of which we cancelled: the older speaks, the newer is a duplicate
    t.cancelled = {}
    t._apply([job(40, "PENDING", claim="d"), job(41, "PENDING", claim="d")],
             sent=time.monotonic(), complete=False)
    assert t.by_claim["d"].job_id == 40 and [d.job_id for d in t.duplicates] == [41]
