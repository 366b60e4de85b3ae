"""SlurmClient against answers recorded from real slurmrestd daemons of every release the
local cluster runs (tests/fixtures/record_slurm_rest.py writes them; never typed by hand).

A tiny replay server serves one release's answers for one REST version; each test drives the
client through it as the binder and webhook do."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from cluster import slurm_release
from slurmgate.slurm import (
    DIALECTS,
    JobSpec,
    SlurmClient,
    SlurmError,
    SlurmIgnoredField,
    accounting,
    dialects,
)
from slurmgate.slurm.dialects import body_warnings, no_changes
from slurmgate.slurm.models import ENDED_STATES

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm-rest"
CASES = sorted(
    (d.name, f.name.split("-", 1)[0])
    for d in FIXTURES.iterdir() if d.is_dir()
    for f in d.glob("*-ping.json")
)


def answer(release: str, api: str, name: str) -> tuple[int, dict[str, Any]]:
    d = json.loads((FIXTURES / release / f"{api}-{name}.json").read_text())
    return d["status"], d["body"]


class Replay:
    def __init__(self, release: str, api: str) -> None:
        self.release, self.api = release, api
        self.submit_answer = "submit"
        self.calls: list[tuple[str, str]] = []
        self.users: list[tuple[str, str | None]] = []  # (path, X-SLURM-USER-NAME) per request
        self.bodies: list[Any] = []  # submit bodies

    async def handle(self, request: web.Request) -> web.Response:
        path, m = request.path, request.method
        self.calls.append((m, request.path_qs))
        self.users.append((path, request.headers.get("X-SLURM-USER-NAME")))
        if path.endswith("/job/submit"):
            self.bodies.append(await request.json())
        base = f"/slurm/{self.api}/"
        dbd = f"/slurmdb/{self.api}/jobs/"
        if path == "/openapi/v3":
            return web.json_response({"paths": {f"{base}ping/": {}, **(
                {dbd: {}} if (FIXTURES / self.release / f"{self.api}-dbd-jobs-named.json"
                              ).exists() else {})}})
        if path == dbd:  # the recorder asked for its job, for nothing, and for partition k8s
            q = request.query
            name = ("dbd-jobs-partition" if "partition" in q else "dbd-jobs-nothing"
                    if q.get("job_name") == "k8s:rec/none" else "dbd-jobs-named")
            status, body = answer(self.release, self.api, name)
            return web.json_response(body, status=status)
        rest = path.removeprefix(base).rstrip("/")
        if rest.startswith("job/") and rest != "job/submit":
            missing = rest.endswith("/999999")
            name = ("cancel" if m == "DELETE" else "job") + ("-missing" if missing else "")
        elif rest == "job/submit":
            name = self.submit_answer
        elif rest == "jobs":
            name = "jobs-since-idle" if "update_time" in request.query else "jobs"
        elif rest.startswith("node/"):
            name = "node-drain"
        else:
            name = rest.replace("/", "-")
        status, body = answer(self.release, self.api, name)
        if status == 304:
            return web.Response(status=304)
        return web.json_response(body, status=status)


@pytest.fixture(params=CASES, ids=[f"{r}-{a}" for r, a in CASES])
async def replay(request: pytest.FixtureRequest, tmp_path: Path
                 ) -> AsyncIterator[tuple[Replay, SlurmClient]]:
    release, api = request.param
    rp = Replay(release, api)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", rp.handle)
    server = TestServer(app)
    await server.start_server()
    tok = tmp_path / "token"
    tok.write_text("t")
    async with SlurmClient(str(server.make_url("")), tok) as c:
        yield rp, c
    await server.close()


def test_every_release_was_recorded() -> None:
    assert {r for r, _ in CASES} == set(slurm_release.RELEASES)
    # and each one in the REST version slurmgate picks there
    for r in slurm_release.RELEASES.values():
        assert (r.version, r.rest_api) in CASES


async def test_version_and_ping(replay: tuple[Replay, SlurmClient]) -> None:
    rp, c = replay
    assert await c.detect_version() == rp.api
    await c.ping()


async def test_our_jobs_are_exclusive_as_slurm_reports_them(
        replay: tuple[Replay, SlurmClient]) -> None:
    rp, c = replay
    jobs, t = await c.jobs(comment_prefix="slurmgate ")
    assert jobs and t > 0
    ours = [j for j in jobs if j.comment == f"slurmgate claim=rec-{rp.api} pod=rec/a"]
    (j,) = [j for j in ours if j.state == "RUNNING"]
    # asked for 1 CPU, given the whole 8-CPU node: exclusive, read back from Slurm itself
    assert j.cpus == 8 and len(j.nodes) == 1
    assert j.whole_nodes in (True, None)
    one = await c.job(j.job_id)
    assert one is not None and one.cpus == 8


async def test_idle_poll_is_not_a_changed_list(replay: tuple[Replay, SlurmClient]) -> None:
    rp, c = replay
    d = DIALECTS[rp.api]
    status, idle = answer(rp.release, rp.api, "jobs-since-idle")
    if not d.update_time_query:
        # what slurmrestd says to update_time there: so the client never sends it
        assert status == 422 and "timestamp failed" in json.dumps(idle)
        jobs, _ = await c.jobs(since=1234)
        assert jobs and ("GET", f"/slurm/{rp.api}/jobs") in rp.calls
        return
    if d.idle_is_304:
        assert status == 304
    else:
        assert status == 200 and no_changes(idle)
    jobs, t = await c.jobs(since=1234)
    assert jobs is None and t == 1234  # NOT "every job vanished"


async def test_changed_poll_is_a_list(replay: tuple[Replay, SlurmClient]) -> None:
    rp, _ = replay
    status, changed = answer(rp.release, rp.api, "jobs-since-changed")
    if DIALECTS[rp.api].update_time_query:
        assert status == 200 and changed["jobs"] and not no_changes(changed)


async def test_missing_job_and_cancel_of_missing_job(
        replay: tuple[Replay, SlurmClient]) -> None:
    _, c = replay
    assert await c.job(999999) is None
    await c.cancel(999999)  # gone is not an error, however the version says it
    await c.cancel(1)


async def test_submit_answers_with_a_job_id(replay: tuple[Replay, SlurmClient]) -> None:
    rp, c = replay
    _, body = answer(rp.release, rp.api, "submit")
    assert body_warnings(body) == []  # our body, as recorded: nothing ignored
    assert await c.submit(JobSpec(name="k8s:x", comment="c", memory_mb=100, cpus=1)) > 0


async def test_submit_as_a_tenant_user_in_every_dialect(
        replay: tuple[Replay, SlurmClient]) -> None:
    """22.05 (v0.0.38) to 26.05 alike: the owner is the header's user, never a body field."""
    rp, c = replay
    assert await c.submit(JobSpec(name="k8s:x", comment="c", memory_mb=100, cpus=1,
                                  user="team-a", account="team-a")) > 0
    await c.nodes()
    submits = [u for p, u in rp.users if p.endswith("/job/submit")]
    assert submits == ["team-a"]
    assert {u for p, u in rp.users if not p.endswith("/job/submit")} == {"root"}
    (body,) = rp.bodies
    for part in (body, body["job"]):
        assert not {"user", "user_id", "user_name", "uid", "group_id"} & set(part)
    assert body["job"]["account"] == "team-a"


async def test_a_field_slurm_ignored_fails_the_submit_and_the_job_is_cancelled(
        replay: tuple[Replay, SlurmClient]) -> None:
    """Another dialect's body (the exclusive flag in a form this version does not know): either
    Slurm refuses it outright, or it runs the job with a warning, which must fail the submit and
    take the job back. Never a job that silently shares its node."""
    rp, c = replay
    status, body = answer(rp.release, rp.api, "submit-foreign-body")
    rp.submit_answer = "submit-foreign-body"
    with pytest.raises(SlurmError) as ei:
        await c.submit(JobSpec(name="k8s:x", comment="c", memory_mb=100, cpus=1))
    if body.get("errors"):  # refused (v0.0.38, and 24.11's v0.0.40/41)
        assert status >= 400 and not isinstance(ei.value, SlurmIgnoredField)
        deletes = [c for c in rp.calls if c[0] == "DELETE"]
        if not body.get("job_id"):  # no job was made
            assert not deletes
            return
        # 24.11's v0.0.41 made the job all the same (without the flag): taken back
        bad = body["job_id"]
        assert f"({bad}) was cancelled" in str(ei.value)
        assert deletes == [("DELETE", f"/slurm/{rp.api}/job/{bad}?signal=KILL")]
        return
    assert isinstance(ei.value, SlurmIgnoredField) and body_warnings(body)
    bad = body["job_id"]
    assert any("exclusive" in e for e in ei.value.errors), ei.value.errors
    assert f"({bad}) was cancelled" in str(ei.value)
    assert ("DELETE", f"/slurm/{rp.api}/job/{bad}?signal=KILL") in rp.calls


async def test_nodes_partitions_and_drain(replay: tuple[Replay, SlurmClient]) -> None:
    rp, c = replay
    nodes = await c.nodes()
    assert sorted(n.name for n in nodes) == ["n1", "n2", "n3", "n4"]
    assert all(n.cpus == 8 and n.real_memory_mb == 16000 for n in nodes)
    parts = {p.name: p for p in await c.partitions()}
    assert parts["k8s"].nodes == ("n1", "n2", "n3", "n4")
    assert parts["k8s"].grace_time_seconds == 20 and not parts["hpc"].grace_time_seconds
    if DIALECTS[rp.api].partition_flags:
        assert parts["k8s"].default and not parts["hpc"].default
    if DIALECTS[rp.api].node_update:
        await c.drain("n4", "cordoned")
        await c.resume("n4")
    else:  # 22.05: scontrol, not REST (test_slurm_client: test_drain_resume_v38_run_scontrol)
        assert not any("/node/" in path for _, path in rp.calls if _ == "POST")


RAW = sorted(FIXTURES.glob("*/*-job-missing.raw"))


@pytest.mark.parametrize("raw", RAW, ids=[f"{p.parent.name}-{p.name[:7]}" for p in RAW])
async def test_missing_job_on_the_wire(raw: Path, tmp_path: Path) -> None:
    """The recorded bytes of GET /job/<missing>, replayed over TCP. slurmrestd 26.05 writes a
    second text/plain 404 after the JSON one, which aiohttp refuses; the client still reads
    Slurm's error number from it and answers "no such job"."""
    data = await asyncio.to_thread(raw.read_bytes)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()).strip():
            pass  # the request head
        writer.write(data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tok = tmp_path / "token"
    tok.write_text("t")
    api = raw.name.split("-", 1)[0]
    try:
        async with SlurmClient(f"http://127.0.0.1:{port}", tok, api_version=api) as c:
            assert await c.job(999999) is None
    finally:
        server.close()
        await server.wait_closed()


def test_a_running_job_being_signalled_reads_as_running() -> None:
    """24.11 during a preemption's GraceTime (CI, test_preemption_placeholder_survives_until_
    killed): ["RUNNING", "SIGNALING"]. The signal says nothing of where the job is: read as a
    waiting state, a bound Pod's job would have looked requeued. Flags that do say so win."""
    from slurmgate.slurm.dialects import job_state

    assert job_state(["RUNNING", "SIGNALING"]) == ("RUNNING", frozenset({"RUNNING",
                                                                          "SIGNALING"}))
    assert job_state(["RUNNING", "COMPLETING", "SIGNALING"])[0] == "COMPLETING"
    assert job_state(["PENDING", "REQUEUED"])[0] == "REQUEUED"


async def test_our_jobs_are_found_by_name_and_partition_in_slurmdbd(
        replay: tuple[Replay, SlurmClient]) -> None:
    """binder/lostjobs.py: slurmdbd's answers as recorded, read to the live jobs asked for;
    where the dialect cannot ask (24.11's v0.0.40/41 refuse start_time) nothing is sent."""
    rp, c = replay
    d = DIALECTS[rp.api]
    name = f"k8s:rec/{rp.api}"
    found = await accounting.accounted_ids(c, names=[name, "k8s:rec/none"], within=600)
    sent = [qs for _, qs in rp.calls if qs.startswith("/slurmdb/")]
    if not d.dbd_jobs:
        assert found is None and sent == []
        return
    status, body = answer(rp.release, rp.api, "dbd-jobs-named")
    live = {j["job_id"] for j in body["jobs"] if j["name"] == name
            and not set(dialects.strs(j["state"]["current"])) & ENDED_STATES}
    assert status == 200 and found == live and live  # the recorder's running and pending job
    assert "job_name=k8s%3Arec%2F" in sent[-1] and "start_time=" in sent[-1]
    assert await accounting.accounted_ids(c, names=["k8s:rec/none"], within=600) == set()
    # by partition: the recorder's live jobs there, not the ones it had cancelled before
    in_k8s = await accounting.accounted_ids(c, partitions=["k8s"], within=600)
    _, body = answer(rp.release, rp.api, "dbd-jobs-partition")
    assert in_k8s == {j["job_id"] for j in body["jobs"]
                      if not set(dialects.strs(j["state"]["current"])) & ENDED_STATES}
