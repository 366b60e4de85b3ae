"""SlurmClient against a tiny in-process fake slurmrestd (aiohttp.web).

v0.0.38 fixtures are trimmed from a real Slurm 22.05.8 slurmrestd; v0.0.40 fixtures are
handwritten from the v0.0.40 OpenAPI schema (Slurm 23.11).
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from slurmgate.slurm import (
    PLACEHOLDER_SCRIPT,
    JobInfo,
    JobSpec,
    SlurmClient,
    SlurmError,
    SlurmRefused,
    SlurmUnavailable,
)

TOKEN = "eyJhbGciOiJIUzI1NiJ9.secret-token-1"
TOKEN2 = "eyJhbGciOiJIUzI1NiJ9.secret-token-2"

META38 = {
    "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
    "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
}
META40 = {
    "plugin": {"type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld",
               "data_parser": "data_parser/v0.0.40"},
    "slurm": {"version": {"major": "23", "micro": "4", "minor": "11"}, "release": "23.11.4"},
}


def nv(n: int | None, infinite: bool = False) -> dict[str, Any]:
    return {"set": n is not None, "infinite": infinite, "number": n or 0}


JOB38_RUNNING: dict[str, Any] = {
    "account": "", "accrue_time": 1796218877, "batch_flag": True, "batch_host": "n1",
    "cluster": "sg16800", "comment": "slurmgate claim=abc pod=ns/p", "cpus": 8,
    "end_time": 1827754877, "job_id": 7, "job_state": "RUNNING",
    "last_sched_evaluation": 1796218877, "name": "k8s:ns/p", "nodes": "n1",
    "partition": "k8s", "preempt_time": 0, "priority": 4294901759, "shared": "none",
    "start_time": 1796218877, "state_reason": "None", "submit_time": 1796218877,
    "time_limit": 525600, "user_name": "root",
}
JOB38_PENDING: dict[str, Any] = {
    **JOB38_RUNNING, "job_id": 8, "job_state": "PENDING", "nodes": "", "batch_host": "",
    "state_reason": "Resources", "start_time": 1827754877, "comment": "",
}
JOB38_PREEMPTED: dict[str, Any] = {
    **JOB38_RUNNING, "job_id": 9, "job_state": "PREEMPTED", "nodes": "n[2-3]",
    "preempt_time": 1796218900, "end_time": 1796218920,
}

JOB40_RUNNING: dict[str, Any] = {
    "account": "", "accrue_time": nv(1700000000), "batch_flag": True, "batch_host": "n1",
    "comment": "slurmgate claim=xyz pod=ns/q", "cpus": nv(8), "end_time": nv(1731536000),
    "job_id": 41, "job_state": ["RUNNING"], "last_sched_evaluation": nv(1700000000),
    "name": "k8s:ns/q", "nodes": "gpu[01-02]", "partition": "k8s", "preempt_time": nv(0),
    "priority": nv(1), "shared": ["none"], "start_time": nv(1700000001),
    "state_reason": "None", "submit_time": nv(1700000000), "time_limit": nv(None, True),
}
JOB40_COMPLETING: dict[str, Any] = {
    **JOB40_RUNNING, "job_id": 42, "job_state": ["PREEMPTED", "COMPLETING"],
    "preempt_time": nv(1700000100), "nodes": "n1",
}
JOB40_CANCELLED: dict[str, Any] = {
    **JOB40_RUNNING, "job_id": 43, "job_state": ["CANCELLED"], "nodes": "n4",
    "state_reason": "None", "end_time": nv(1700000200),
}

NODE38 = {
    "name": "n1", "state": "idle", "state_flags": ["DRAIN"], "cpus": 8, "real_memory": 16000,
    "partitions": ["k8s", "hpc"], "reason": "slurmgate: cordoned", "features": "a100,ib",
    "active_features": "a100,ib", "gres": "gpu:4",
}
NODE40 = {
    "name": "gpu01", "state": ["MIXED", "DRAIN"], "cpus": 64, "real_memory": 512000,
    "partitions": ["k8s"], "reason": "", "features": ["a100", "ib"], "gres": "gpu:a100:8",
}
PART38 = {
    "flags": ["default"], "name": "k8s", "nodes": "n[1-4]", "max_time_limit": -1,
    "state": "UP", "preemption_grace_time": 20, "priority_tier": 1,
}
PART38_HPC = {**PART38, "flags": [], "name": "hpc", "max_time_limit": 1440}
PART40 = {
    "name": "batch", "nodes": {"configured": "gpu[01-02]", "total": 2},
    "partition": {"state": ["UP"]}, "flags": ["DEFAULT"],
    "maximums": {"time": nv(120)},
}
PART40_INF = {
    "name": "long", "nodes": {"configured": "n1"}, "partition": {"state": ["DRAIN"]},
    "maximums": {"time": nv(0, True)},
}


def openapi(*versions: str) -> dict[str, Any]:
    paths: dict[str, Any] = {"/openapi/v3": {"get": {}}}
    for v in versions:
        for p in ("ping", "jobs", "job/{job_id}", "job/submit", "nodes", "partitions", "diag"):
            paths[f"/slurm/{v}/{p}"] = {"get": {}}
    return {"openapi": "3.0.2", "info": {"version": versions[0] if versions else ""},
            "paths": paths}


@dataclass
class Fake:
    """Behaviour of the fake slurmrestd; tests mutate it."""

    versions: tuple[str, ...] = ("v0.0.38", "v0.0.37", "v0.0.36")
    openapi_v3: bool = True
    jobs: list[dict[str, Any]] = field(default_factory=lambda: [JOB38_RUNNING, JOB38_PENDING])
    last_update: int = 1796219000  # server clock (diag req_time / last_update)
    changed_at: int = 1796218990  # like slurmctld's last_job_update
    nodes: list[dict[str, Any]] = field(default_factory=lambda: [NODE38])
    partitions: list[dict[str, Any]] = field(default_factory=lambda: [PART38, PART38_HPC])
    override: dict[str, Callable[[web.Request], Any]] = field(default_factory=dict)
    requests: list[tuple[str, str, dict[str, str], dict[str, str], Any]] = field(
        default_factory=list
    )
    next_job_id: int = 100

    def calls(self, path_suffix: str) -> list[tuple[str, str, dict[str, str], dict[str, str],
                                                    Any]]:
        return [r for r in self.requests if r[1].endswith(path_suffix)]


FAKE = web.AppKey("fake", Fake)


def meta_for(request: web.Request) -> dict[str, Any]:
    return META38 if "v0.0.38" in request.path else META40


async def handler(request: web.Request) -> web.StreamResponse:
    fake = request.app[FAKE]
    body = await request.json() if request.can_read_body else None
    fake.requests.append(
        (request.method, request.path, dict(request.headers), dict(request.query), body)
    )
    for key, fn in fake.override.items():
        if request.path.endswith(key):
            res = fn(request)
            if asyncio.iscoroutine(res):
                res = await res
            return res  # type: ignore[no-any-return]
    if request.headers.get("X-SLURM-USER-TOKEN") not in (TOKEN, TOKEN2):
        return web.Response(status=401, text="Authentication failure")
    path = request.path
    if path in ("/openapi/v3", "/openapi"):
        if path == "/openapi/v3" and not fake.openapi_v3:
            return web.Response(status=404, text="Unable to find requested URL")
        return web.json_response(openapi(*fake.versions))
    parts = path.strip("/").split("/")
    if len(parts) < 3 or parts[0] != "slurm" or parts[1] not in fake.versions:
        return web.Response(status=404, text="Unable to find requested URL")
    v, rest = parts[1], "/".join(parts[2:])
    meta = meta_for(request)
    new = v != "v0.0.38"
    if rest == "ping":
        key = "pinged" if new else "ping"
        return web.json_response({"meta": meta, "errors": [],
                                  "pings": [{"hostname": "c", key: "UP", "mode": "primary"}]})
    if rest == "diag":
        return web.json_response({"meta": meta, "errors": [],
                                  "statistics": {"req_time": fake.last_update}})
    if rest == "jobs":
        since = request.query.get("update_time")
        if since is not None and int(since) - 1 >= fake.changed_at:
            if not new:
                return web.Response(status=304)
            # v0.0.42+, as recorded from 24.11 and 26.05 (tests/unit/fixtures)
            return web.json_response({"meta": meta, "errors": [], "jobs": [],
                                      "last_update": nv(0), "warnings": [{
                                          "description": f"No job changes since {since}",
                                          "source": "op_handler_jobs"}]})
        out: dict[str, Any] = {"meta": meta, "errors": [], "jobs": fake.jobs}
        if new:
            out["last_update"] = nv(fake.last_update)
            out["warnings"] = []
        return web.json_response(out)
    if rest.startswith("job/") and rest != "job/submit":
        jid = int(rest.split("/")[1])
        match = [j for j in fake.jobs if j["job_id"] == jid]
        if request.method == "DELETE":
            if not match:
                return web.json_response(
                    {"meta": meta, "errors": [{"error": "Invalid job id specified",
                                               "error_number": 2017,
                                               "source": "slurm_kill_job"}]},
                    status=500,
                )
            return web.json_response({"meta": meta, "errors": []})
        if not match:
            return web.json_response(
                {"meta": meta, "jobs": [], "errors": [
                    {"description": f"Unable to find JobId={jid}", "error_number": 2017,
                     "error": "Invalid job id specified", "source": "slurm_load_job"}]},
                status=500,
            )
        return web.json_response({"meta": meta, "errors": [], "jobs": match})
    if rest == "job/submit":
        fake.next_job_id += 1
        return web.json_response({"meta": meta, "errors": [], "job_id": fake.next_job_id,
                                  "step_id": "batch", "job_submit_user_msg": ""})
    if rest == "nodes":
        return web.json_response({"meta": meta, "errors": [], "nodes": fake.nodes})
    if rest == "partitions":
        return web.json_response({"meta": meta, "errors": [], "partitions": fake.partitions})
    if rest.startswith("node/") and request.method == "POST" and new:
        return web.json_response({"meta": meta, "errors": [], "warnings": []})
    return web.Response(status=404, text="Unable to find requested URL")


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    p = tmp_path / "token"
    p.write_text(TOKEN + "\n")
    return p


@pytest.fixture
async def fake_server() -> AsyncIterator[tuple[Fake, str]]:
    fake = Fake()
    app = web.Application()
    app[FAKE] = fake
    app.router.add_route("*", "/{tail:.*}", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield fake, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
async def client(
    fake_server: tuple[Fake, str], token_file: Path
) -> AsyncIterator[tuple[Fake, SlurmClient]]:
    fake, url = fake_server
    async with SlurmClient(url, token_file, timeout=2.0) as c:
        yield fake, c


def use40(fake: Fake) -> None:
    """The list-and-object dialect family, as served by 24.11 (v0.0.42 chosen)."""
    fake.versions = ("v0.0.42", "v0.0.41", "v0.0.40")
    fake.jobs = [JOB40_RUNNING, JOB40_COMPLETING, JOB40_CANCELLED]
    fake.nodes = [NODE40]
    fake.partitions = [PART40, PART40_INF]


# ----------------------------------------------------------------------------- version


async def test_detect_version_38_and_cached(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    assert await c.detect_version() == "v0.0.38"
    assert await c.detect_version() == "v0.0.38"
    await c.ping()
    assert len(fake.calls("/openapi/v3")) == 1
    assert fake.requests[0][2]["X-SLURM-USER-NAME"] == "root"


@pytest.mark.parametrize(
    ("offered", "want"),
    [
        (("v0.0.42", "v0.0.41", "v0.0.40"), "v0.0.42"),  # Slurm 24.11
        (("v0.0.45", "v0.0.44", "v0.0.43", "v0.0.42"), "v0.0.45"),  # Slurm 26.05
        (("v0.0.46", "v0.0.45"), "v0.0.45"),  # a newer server: the newest we know
        (("v0.0.40", "v0.0.39"), "v0.0.40"),
        (("v0.0.38", "v0.0.37", "v0.0.36"), "v0.0.38"),
    ],
)
async def test_detect_version_picks_newest_supported(
    client: tuple[Fake, SlurmClient], offered: tuple[str, ...], want: str
) -> None:
    fake, c = client
    fake.versions = offered
    assert await c.detect_version() == want


async def test_detect_version_falls_back_to_openapi(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    fake.openapi_v3 = False
    assert await c.detect_version() == "v0.0.38"
    assert [r[1] for r in fake.requests] == ["/openapi/v3", "/openapi"]


async def test_detect_version_none_supported(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    fake.versions = ("v0.0.39", "v0.0.37", "v0.0.36")  # 23.02 without v0.0.40: never tested
    with pytest.raises(SlurmError, match=r"no supported API version.*v0\.0\.37"):
        await c.detect_version()


async def test_explicit_version_skips_detection(
    fake_server: tuple[Fake, str], token_file: Path
) -> None:
    fake, url = fake_server
    async with SlurmClient(url, token_file, api_version="v0.0.38") as c:
        await c.ping()
    assert not fake.calls("/openapi/v3")
    with pytest.raises(ValueError, match="unsupported"):
        SlurmClient(url, token_file, api_version="v0.0.35")


# ----------------------------------------------------------------------------- parsing


async def test_jobs_v38(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    fake.jobs = [JOB38_RUNNING, JOB38_PENDING, JOB38_PREEMPTED]
    jobs, t = await c.jobs()
    assert jobs is not None
    assert t == fake.last_update  # server clock from /diag, taken before the list
    diag_i = next(i for i, r in enumerate(fake.requests) if r[1].endswith("/diag"))
    jobs_i = next(i for i, r in enumerate(fake.requests) if r[1].endswith("/jobs"))
    assert diag_i < jobs_i
    run, pend, pre = jobs
    assert run == JobInfo(
        job_id=7, name="k8s:ns/p", state="RUNNING", reason="None", nodes=("n1",),
        comment="slurmgate claim=abc pod=ns/p", partition="k8s", submit_time=1796218877,
        start_time=1796218877, end_time=1827754877, state_flags=frozenset({"RUNNING"}),
        preempt_time=0, cpus=8, user="root",
    )
    assert run.active and not run.ended and not run.preempted
    assert pend.state == "PENDING" and pend.reason == "Resources"
    assert pend.nodes == () and pend.comment is None and pend.active
    assert pre.state == "PREEMPTED" and pre.ended and pre.preempted
    assert pre.nodes == ("n2", "n3")


async def test_jobs_v40(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    use40(fake)
    jobs, t = await c.jobs()
    assert jobs is not None and t == fake.last_update
    assert not fake.calls("/diag")  # v0.0.40 carries last_update itself
    run, comp, canc = jobs
    assert run.job_id == 41 and run.state == "RUNNING" and run.nodes == ("gpu01", "gpu02")
    assert run.submit_time == 1700000000 and run.start_time == 1700000001
    assert run.comment == "slurmgate claim=xyz pod=ns/q" and run.preempt_time == 0
    assert comp.state == "COMPLETING" and comp.active and comp.preempted
    assert comp.state_flags == {"PREEMPTED", "COMPLETING"}
    assert canc.state == "CANCELLED" and canc.ended and canc.end_time == 1700000200


@pytest.mark.parametrize("dialect", ["38", "40"])
async def test_jobs_304(client: tuple[Fake, SlurmClient], dialect: str) -> None:
    fake, c = client
    if dialect == "40":
        use40(fake)
    jobs, t = await c.jobs()
    assert jobs is not None
    again, t2 = await c.jobs(since=t)
    assert again is None and t2 == t
    assert fake.calls("/jobs")[-1][3] == {"update_time": str(t)}
    fake.changed_at = t  # something changed in the same second: never a 304
    fake.last_update = t + 5
    changed, t3 = await c.jobs(since=t)
    assert changed is not None and t3 == t + 5


async def test_job_and_missing_job(client: tuple[Fake, SlurmClient]) -> None:
    _, c = client
    j = await c.job(7)
    assert j is not None and j.job_id == 7
    assert await c.job(12345) is None


async def test_nodes_and_partitions_v38(client: tuple[Fake, SlurmClient]) -> None:
    _, c = client
    (n,) = await c.nodes()
    assert n.name == "n1" and n.state == "IDLE" and n.flags == {"DRAIN"}
    assert n.cpus == 8 and n.real_memory_mb == 16000 and n.partitions == ("k8s", "hpc")
    assert n.features == ("a100", "ib") and n.gres == "gpu:4"
    assert n.reason == "slurmgate: cordoned"
    k8s, hpc = await c.partitions()
    assert k8s.name == "k8s" and k8s.default and k8s.max_time_minutes is None
    assert k8s.nodes == ("n1", "n2", "n3", "n4") and k8s.state == "UP"
    assert not hpc.default and hpc.max_time_minutes == 1440


async def test_nodes_and_partitions_v40(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    use40(fake)
    (n,) = await c.nodes()
    assert n.state == "MIXED" and n.flags == {"DRAIN"} and n.features == ("a100", "ib")
    assert n.cpus == 64 and n.real_memory_mb == 512000
    batch, long = await c.partitions()
    assert batch.default and batch.max_time_minutes == 120
    assert batch.nodes == ("gpu01", "gpu02") and batch.state == "UP"
    assert not long.default and long.max_time_minutes is None and long.state == "DRAIN"


# ----------------------------------------------------------------------------- submit

HOSTILE = [
    "; rm -rf /",
    "a\nb\n#SBATCH --uid=0",
    "#SBATCH --uid=0",
    "$(id)",
    "`id`",
    "x' && touch /tmp/pwned '",
    '"; exit 1; "',
]


@pytest.mark.parametrize("dialect", ["38", "40"])
@pytest.mark.parametrize("evil", HOSTILE)
async def test_submit_hostile_strings_stay_in_json_fields(
    client: tuple[Fake, SlurmClient], dialect: str, evil: str
) -> None:
    fake, c = client
    if dialect == "40":
        use40(fake)
    spec = JobSpec(
        name=f"k8s:{evil}", comment=f"slurmgate claim=c pod={evil}", memory_mb=1000, cpus=2,
        partition=evil, qos=evil, account=evil, constraint=evil, time_limit_minutes=30,
        nice=5,
    )
    job_id = await c.submit(spec)
    assert job_id == fake.next_job_id
    (call,) = fake.calls("/job/submit")
    body = call[4]
    job = body["job"]
    script = body["script"] if dialect == "38" else job["script"]
    assert script == PLACEHOLDER_SCRIPT
    assert script.encode() == PLACEHOLDER_SCRIPT.encode()
    assert evil not in script
    assert job["name"] == f"k8s:{evil}"
    assert job["comment"] == f"slurmgate claim=c pod={evil}"
    for k in ("partition", "qos", "account", "constraints"):
        assert job[k] == evil
    # The hostile text appears nowhere else than in those fields.
    stripped = copy.deepcopy(body)
    sj = stripped["job"]
    for k in ("name", "comment", "partition", "qos", "account", "constraints"):
        sj.pop(k)
    assert evil not in json.dumps(stripped)
    env = job["environment"]
    assert (env == {"PATH": "/usr/local/bin:/usr/bin:/bin"} if dialect == "38"
            else env == ["PATH=/usr/local/bin:/usr/bin:/bin"])
    assert job["current_working_directory"] == "/tmp"


async def test_submit_body_v38(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    await c.submit(JobSpec(name="k8s:a", comment="c", memory_mb=2048, cpus=4, gpus=2, nodes=2,
                           time_limit_minutes=90))
    body = fake.calls("/job/submit")[0][4]
    assert set(body) == {"script", "job"}
    job = body["job"]
    assert job["exclusive"] == "exclusive" and job["nodes"] == 2
    assert job["memory_per_node"] == 2048 and job["minimum_cpus_per_node"] == 4
    assert job["gres"] == "gpu:2" and job["time_limit"] == 90 and job["requeue"] is False
    assert "partition" not in job and "nice" not in job


async def test_submit_body_v40(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    use40(fake)
    await c.submit(JobSpec(name="k8s:a", comment="c", memory_mb=2048, cpus=4, gpus=1,
                           time_limit_minutes=90, nice=-5))
    body = fake.calls("/job/submit")[0][4]
    assert set(body) == {"job"}
    job = body["job"]
    assert job["script"] == PLACEHOLDER_SCRIPT
    assert job["memory_per_node"] == {"set": True, "infinite": False, "number": 2048}
    assert job["time_limit"] == {"set": True, "infinite": False, "number": 90}
    assert job["shared"] == ["none"] and job["tres_per_node"] == "gres/gpu:1"
    assert job["minimum_nodes"] == job["maximum_nodes"] == 1 and job["nice"] == -5


@pytest.mark.parametrize("dialect", ["38", "40"])
async def test_submit_as_the_jobs_user_for_that_request_only(
    client: tuple[Fake, SlurmClient], dialect: str
) -> None:
    """The tenant's user goes in the header of the submit alone; the body names no user (the
    header decides the owner), and every other request stays the service user's."""
    fake, c = client
    if dialect == "40":
        use40(fake)
    await c.submit(JobSpec(name="k8s:a", comment="c", memory_mb=100, cpus=1, user="team-a"))
    await c.submit(JobSpec(name="k8s:b", comment="c", memory_mb=100, cpus=1))
    await c.jobs()
    await c.cancel(7)
    first, second = fake.calls("/job/submit")
    assert first[2]["X-SLURM-USER-NAME"] == "team-a"
    assert first[2]["X-SLURM-USER-TOKEN"] == TOKEN
    assert second[2]["X-SLURM-USER-NAME"] == "root"
    for body in (first[4], second[4]):
        for part in (body, body["job"]):
            assert not {"user", "user_id", "user_name", "uid", "group_id"} & set(part)
    others = [r for r in fake.requests if not r[1].endswith("/job/submit")]
    assert others and {r[2]["X-SLURM-USER-NAME"] for r in others} == {"root"}


@pytest.mark.parametrize("user", ["team a", "x\r\nX-Evil: 1", "", "-rf", "a" * 40])
async def test_submit_refuses_a_user_no_header_should_carry(
    client: tuple[Fake, SlurmClient], user: str
) -> None:
    fake, c = client
    with pytest.raises(ValueError, match="user"):
        await c.submit(JobSpec(name="n", comment="c", memory_mb=1, cpus=1, user=user))
    assert fake.calls("/job/submit") == []


def test_placeholder_script_ignores_term() -> None:
    assert PLACEHOLDER_SCRIPT.startswith("#!/bin/sh\n")
    assert "trap '' TERM" in PLACEHOLDER_SCRIPT
    assert "#SBATCH" not in PLACEHOLDER_SCRIPT


@pytest.mark.parametrize(
    "bad",
    [dict(memory_mb=0), dict(cpus=0), dict(nodes=0), dict(gpus=-1), dict(time_limit_minutes=0)],
)
async def test_submit_rejects_bad_specs(client: tuple[Fake, SlurmClient],
                                        bad: dict[str, int]) -> None:
    _, c = client
    spec: dict[str, Any] = dict(name="n", comment="c", memory_mb=1, cpus=1, **{})
    spec.update(bad)
    with pytest.raises(ValueError):
        await c.submit(JobSpec(**spec))


# ----------------------------------------------------------------------------- cancel / drain


async def test_cancel_is_idempotent(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    await c.cancel(7)
    assert fake.calls("/job/7")[-1][0] == "DELETE"
    assert fake.calls("/job/7")[-1][3] == {"signal": "KILL"}
    await c.cancel(4242)  # unknown job id: already gone
    fake.override["/job/8"] = lambda r: web.json_response(
        {"meta": META38, "errors": [{"error": "Job/step already completing or completed",
                                     "error_number": 2021}]}, status=500)
    await c.cancel(8, signal="SIGTERM")
    assert fake.calls("/job/8")[-1][3] == {"signal": "TERM"}
    with pytest.raises(ValueError):
        await c.cancel(7, signal="KILL; rm -rf /")


async def test_drain_resume_v38_run_scontrol(client: tuple[Fake, SlurmClient], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """22.05 has no node update over REST: the client runs scontrol (an argument list, the JWT
    in its environment), so every caller drains the same way on every release."""
    fake, c = client
    said = tmp_path / "said"
    tool = tmp_path / "scontrol"
    tool.write_text(f'#!/bin/sh\necho "$SLURM_JWT $*" >> {said}\n')
    tool.chmod(0o755)
    monkeypatch.setenv("SCONTROL", str(tool))
    await c.drain("n1", "slurmgate: cordoned")
    await c.resume("n1")
    assert said.read_text().splitlines() == [
        f"{TOKEN} update NodeName=n1 State=DRAIN Reason=slurmgate: cordoned",
        f"{TOKEN} update NodeName=n1 State=RESUME"]
    assert not fake.calls("/node/n1")  # nothing over REST
    with pytest.raises(ValueError):
        await c.drain("n1; reboot", "slurmgate: cordoned")
    with pytest.raises(SlurmError, match="refusing drain reason"):
        await c.drain("n1", "slurmgate: cordoned\n")  # one line, or no scontrol at all
    assert len(said.read_text().splitlines()) == 2


async def test_drain_resume_v40(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    use40(fake)
    await c.drain("gpu01", "slurmgate: cordoned by kubectl")
    await c.resume("gpu01")
    (d, r) = fake.calls("/node/gpu01")
    assert d[0] == "POST"
    assert d[4] == {"state": ["DRAIN"], "reason": "slurmgate: cordoned by kubectl"}
    assert r[4] == {"state": ["RESUME"]}
    with pytest.raises(ValueError):
        await c.drain("gpu01/../x", "r")


# ----------------------------------------------------------------------------- errors


async def test_slurm_error_quotes_slurm_text(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    fake.override["/job/submit"] = lambda r: web.json_response(
        {"meta": META38, "errors": [{"error_code": 2000,
                                     "error": "Invalid partition name specified"}]},
        status=500,
    )
    with pytest.raises(SlurmError) as ei:
        await c.submit(JobSpec(name="n", comment="c", memory_mb=1, cpus=1, partition="nope"))
    e = ei.value
    assert isinstance(e, SlurmRefused) and not isinstance(e, SlurmUnavailable)
    assert e.status == 500 and e.errnos == [2000]
    # a refusal reads as Slurm's words; the HTTP status (500 for a bad request) stays out
    assert str(e) == ("Slurm refused to submit job 'n': "
                      "Invalid partition name specified (errno 2000)")
    assert e.errors == ["Invalid partition name specified (errno 2000)"]


async def test_errors_on_200_are_surfaced(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    fake.override["/nodes"] = lambda r: web.json_response(
        {"meta": META38, "nodes": [], "errors": [
            {"description": "slurm_load_node failed", "error": "Access/permission denied",
             "error_number": 2002, "source": "slurm_load_node"}]})
    with pytest.raises(SlurmError, match="Access/permission denied") as ei:
        await c.nodes()
    assert ei.value.status == 200


async def test_parse_error_400(client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    fake.override["/job/submit"] = lambda r: web.Response(status=400,
                                                          text="Unable to parse query.")
    with pytest.raises(SlurmError, match="Unable to parse query") as ei:
        await c.submit(JobSpec(name="n", comment="c", memory_mb=1, cpus=1))
    assert ei.value.status == 400 and not isinstance(ei.value, SlurmUnavailable)


@pytest.mark.parametrize(
    "response",
    [
        lambda r: web.Response(status=503, text="busy"),
        lambda r: web.Response(status=500, text="<html>oops</html>"),
        lambda r: web.json_response({"errors": [
            {"error": "Unable to contact slurm controller (connect failure)",
             "error_number": 1800}]}, status=500),
    ],
)
async def test_unavailable_mapping(
    client: tuple[Fake, SlurmClient], response: Callable[[web.Request], web.Response]
) -> None:
    fake, c = client
    await c.detect_version()
    fake.override["/ping"] = response
    with pytest.raises(SlurmUnavailable):
        await c.ping()


async def test_timeout_is_unavailable(
    fake_server: tuple[Fake, str], token_file: Path
) -> None:
    fake, url = fake_server

    async def slow(r: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.Response(status=200)

    fake.override["/openapi/v3"] = slow
    async with SlurmClient(url, token_file, timeout=0.2) as c:
        with pytest.raises(SlurmUnavailable, match="did not answer"):
            await c.detect_version()


async def test_connection_refused_is_unavailable(token_file: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with SlurmClient(f"http://127.0.0.1:{port}", token_file) as c:
        with pytest.raises(SlurmUnavailable, match="cannot reach") as ei:
            await c.ping()
    assert ei.value.status is None


# ----------------------------------------------------------------------------- token


def rewrite(path: Path, text: str, bump_s: int) -> None:
    st = path.stat()
    path.write_text(text)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + bump_s * 1_000_000_000))


async def test_token_rotation_and_never_logged(
    client: tuple[Fake, SlurmClient], token_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    fake, c = client
    await c.ping()
    assert fake.requests[-1][2]["X-SLURM-USER-TOKEN"] == TOKEN
    # Rotate like a Kubernetes Secret would (new inode via rename), also with scontrol's prefix.
    new = token_file.with_suffix(".new")
    new.write_text(f"SLURM_JWT={TOKEN2}\n")
    os.replace(new, token_file)
    await c.ping()
    assert fake.requests[-1][2]["X-SLURM-USER-TOKEN"] == TOKEN2
    # Same inode, rewritten in place with a different mtime.
    rewrite(token_file, TOKEN + "\n", 1)
    await c.ping()
    assert fake.requests[-1][2]["X-SLURM-USER-TOKEN"] == TOKEN
    # A rejected token: the error does not echo it.
    rewrite(token_file, "bogus-token-value\n", 2)
    with pytest.raises(SlurmError) as ei:
        await c.ping()
    assert ei.value.status == 401
    assert "bogus-token-value" not in str(ei.value)
    for secret in (TOKEN, TOKEN2, "bogus-token-value"):
        assert secret not in caplog.text


async def test_missing_or_empty_token_file(
    fake_server: tuple[Fake, str], tmp_path: Path
) -> None:
    _, url = fake_server
    async with SlurmClient(url, tmp_path / "nope") as c:
        with pytest.raises(SlurmError, match="token file"):
            await c.ping()
    empty = tmp_path / "empty"
    empty.write_text("\n")
    async with SlurmClient(url, empty) as c:
        with pytest.raises(SlurmError, match="empty"):
            await c.ping()


async def test_one_session_reused(client: tuple[Fake, SlurmClient]) -> None:
    _, c = client
    await c.ping()
    s1 = c._http._session
    await asyncio.gather(*(c.jobs() for _ in range(5)))
    assert c._http._session is s1


async def test_cancel_error_inside_a_200_is_raised(client: tuple[Fake, SlurmClient]) -> None:
    """v0.0.42+ answer a DELETE 200 and put the per-job error in status[]: a real error (here
    "Access/permission denied", 2002) is not swallowed; "no such job" (2017) is not an error."""
    fake, c = client
    use40(fake)

    def status(code: int, text: str) -> Callable[[web.Request], web.Response]:
        return lambda _: web.json_response({"meta": META40, "errors": [], "warnings": [],
                                            "status": [{"error": {"code": code, "string": text,
                                                                  "message": text},
                                                        "job_id": nv(7), "step_id": "7"}]})

    fake.override["/job/7"] = status(2002, "Access/permission denied")
    with pytest.raises(SlurmError, match="permission denied") as ei:
        await c.cancel(7)
    assert ei.value.errnos == [2002]
    fake.override["/job/7"] = status(2017, "Invalid job id specified")
    await c.cancel(7)


async def test_a_bare_404_is_not_a_job_gone(client: tuple[Fake, SlurmClient]) -> None:
    """Only Slurm's "Invalid job id" (2017) means a job left Slurm: a 404 from anything else
    (a proxy, a path slurmrestd does not serve) must not make the binder evict Pods."""
    fake, c = client
    use40(fake)
    fake.override["/job/7"] = lambda _: web.Response(status=404, text="Not Found")
    with pytest.raises(SlurmError):
        await c.job(7)
    fake.override["/job/7"] = lambda _: web.json_response(
        {"meta": META40, "warnings": [], "errors": [
            {"description": "Unable to query JobId=7", "error_number": 2017,
             "error": "Invalid job id specified", "source": "_handle_job_get"}]}, status=404)
    assert await c.job(7) is None


async def test_the_whole_job_list_may_take_longer_than_other_requests(
        fake_server: tuple[Fake, str], token_file: Path) -> None:
    """A busy site's whole list takes slurmrestd seconds to write: with the client's short
    timeout the binder's first (and every) whole list would fail, and it would never sync."""
    fake, url = fake_server
    use40(fake)

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(0.6)
        return web.json_response({"meta": META40, "errors": [], "warnings": [], "jobs": [],
                                  "last_update": nv(1796219000)})
    fake.override["/jobs"] = slow
    fake.override["/job/1"] = slow
    async with SlurmClient(url, token_file, timeout=0.3) as c:
        jobs, _ = await c.jobs()
        assert jobs == []
        with pytest.raises(SlurmUnavailable, match=r"did not answer within 0\.3s"):
            await c.job(1)


async def test_our_jobs_are_kept_while_the_whole_list_streams_in(
        client: tuple[Fake, SlurmClient]) -> None:
    """The whole list is the site's: only jobs whose comment is ours are ever kept."""
    fake, c = client
    use40(fake)
    ours = {**JOB40_RUNNING, "job_id": 5, "comment": "slurmgate claim=c5 pod=ns/p"}
    foreign = [{**JOB40_RUNNING, "job_id": 100 + i, "comment": f"someone {i}" * 50}
               for i in range(20_000)]  # about 30 MB of other people's jobs
    fake.override["/jobs"] = lambda _: web.json_response(
        {"meta": META40, "errors": [], "warnings": [], "jobs": [*foreign[:10_000], ours,
                                                                *foreign[10_000:]]})
    jobs = await c.our_jobs("slurmgate ")
    assert [(j.job_id, j.comment) for j in jobs] == [(5, ours["comment"])]
    assert jobs[0].state == "RUNNING"


async def test_a_whole_list_slurm_refuses_or_garbles_is_an_error(
        client: tuple[Fake, SlurmClient]) -> None:
    fake, c = client
    use40(fake)
    fake.override["/jobs"] = lambda _: web.json_response(
        {"meta": META40, "warnings": [], "errors": [
            {"description": "Unable to query jobs", "error_number": 1007,
             "error": "Protocol authentication error"}]}, status=500)
    with pytest.raises(SlurmError, match="Unable to query jobs"):
        await c.our_jobs("slurmgate ")
    fake.override["/jobs"] = lambda _: web.Response(
        status=200, content_type="application/json", text='{"jobs": [{"job_id": 1, "comm')
    with pytest.raises(SlurmError, match="malformed JSON"):
        await c.our_jobs("slurmgate ")
