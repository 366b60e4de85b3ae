"""Slurm's refusals read as refusals, in Slurm's own words: from the wire (a normal error
answer, and slurmrestd 26.05's garbled one, whose JSON body comes before its status line) to
the webhook's denial and the binder's Event (issue 29)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from slurmgate import contract, reasons
from slurmgate.slurm import JobSpec, SlurmClient, SlurmError, SlurmRefused, SlurmUnavailable
from slurmgate.slurm.transport import _garbled
from slurmgate.webhook.admission import Admitter
from slurmgate.webhook.config import Settings
from tests.unit.fakes import marked_pod, node_map, review
from tests.unit.test_tenancy_enforcement import READY, actions, pending_pod

API = "v0.0.45"  # the version 26.05 speaks; given, so the servers answer only the submit
SPEC = JobSpec(name="x", comment="c", memory_mb=1, cpus=1)
MAX_JOBS = {"description": "MaxJobCount limit reached", "error_number": 2017}
INVALID_ACCOUNT = "Invalid account or account/partition combination specified"



async def submit_one(act: Any, pod: dict) -> float | None:
    """A single Pod's submit, as the controller asks it."""
    return await act.submit(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", [pod],
                            False, lambda: [])

def garbled(errors: list[dict[str, Any]] | None, pretty: bool = False) -> bytes:
    """What slurmrestd 26.05 writes for some errors: the JSON body, then a status line and a
    text/plain answer (tests/unit/fixtures/slurm-rest/26.05/*-job-missing.raw, recorded)."""
    body = (json.dumps({"errors": errors, "warnings": []}, indent=2 if pretty else None)
            .encode() if errors is not None else b"<html>oops</html>")
    return body + (b"HTTP/1.1 500 INTERNAL ERROR\r\nConnection: Close\r\n"
                   b"Content-Type: text/plain\r\nContent-Length: 17\r\n\r\nUnspecified error")


@asynccontextmanager
async def raw_server(data: bytes) -> AsyncIterator[str]:
    """A TCP server that answers each request with ``data`` byte for byte."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        length = 0
        while line := (await reader.readline()).strip():
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
        await reader.readexactly(length)  # read it all: unread bytes would reset the socket
        writer.write(data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def json_server(status: int, answer: dict[str, Any],
                      calls: list[tuple[str, str]] | None = None) -> AsyncIterator[str]:
    """A real aiohttp server answering every request with ``answer`` as JSON; with `calls`,
    each request's method and path is recorded there, and a DELETE (a cancel) succeeds."""
    async def handle(request: web.Request) -> web.Response:
        if calls is not None:
            calls.append((request.method, request.path_qs))
            if request.method == "DELETE":
                return web.json_response({"errors": [], "warnings": []})
        return web.json_response(answer, status=status)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    p = tmp_path / "token"
    p.write_text("t")
    return p


async def submit_error(url: str, token: Path) -> SlurmError:
    async with SlurmClient(url, token, api_version=API, timeout=5.0) as c:
        with pytest.raises(SlurmError) as ei:
            await c.submit(SPEC)
    return ei.value


# ----------------------------------------------------------------------------- the wire


async def test_garbled_26_05_refusal_reads_as_slurms_words(token: Path) -> None:
    async with raw_server(garbled([MAX_JOBS])) as url:
        e = await submit_error(url, token)
    assert isinstance(e, SlurmRefused), repr(e)
    assert str(e) == "Slurm refused to submit job 'x': MaxJobCount limit reached (errno 2017)"
    assert e.errnos == [2017] and e.status == 500


async def test_garbled_26_05_refusal_pretty_printed_full_entry(token: Path) -> None:
    """As 26.05 really writes it: indented, with the entry's error string and source."""
    entry = {**MAX_JOBS, "error": "Unspecified error", "source": "slurm_submit_batch_job()"}
    async with raw_server(garbled([entry], pretty=True)) as url:
        e = await submit_error(url, token)
    assert isinstance(e, SlurmRefused) and not isinstance(e, SlurmUnavailable)
    assert str(e).startswith("Slurm refused to submit job 'x': MaxJobCount limit reached")
    assert "(errno 2017)" in str(e) and "malformed" not in str(e)


@pytest.mark.parametrize("entry", [
    # 24.11 and 26.05 (v0.0.40+): the description says what failed, the error string why
    {"description": "Batch job submission failed", "error_number": 2045,
     "error": INVALID_ACCOUNT, "source": "slurm_submit_batch_job()"},
    # 22.05 (v0.0.38)
    {"error_code": 2045, "error": INVALID_ACCOUNT},
], ids=["v0.0.40+", "v0.0.38"])
async def test_http_500_with_errors_is_a_refusal(token: Path, entry: dict[str, Any]) -> None:
    async with json_server(500, {"meta": {}, "errors": [entry], "warnings": []}) as url:
        e = await submit_error(url, token)
    assert isinstance(e, SlurmRefused) and not isinstance(e, SlurmUnavailable)
    assert str(e).startswith("Slurm refused to submit job 'x': ")
    assert INVALID_ACCOUNT in str(e) and "(errno 2045)" in str(e)
    assert "malformed" not in str(e) and "HTTP 500" not in str(e)
    assert e.errnos == [2045] and e.status == 500  # kept for callers, out of the words


async def test_garbled_without_slurms_words_stays_malformed(token: Path) -> None:
    async with raw_server(garbled(None)) as url:
        e = await submit_error(url, token)
    assert type(e) is SlurmError  # neither a refusal nor "unreachable": we cannot tell
    assert "slurmrestd sent a malformed HTTP answer" in str(e)
    assert e.status == 500  # the status line aiohttp quoted


async def test_unreachable_slurmctld_is_not_a_refusal(token: Path) -> None:
    unreachable = {"error": "Unable to contact slurm controller (connect failure)",
                   "error_number": 1800}
    async with raw_server(garbled([unreachable])) as url:
        e = await submit_error(url, token)
    assert isinstance(e, SlurmUnavailable) and not isinstance(e, SlurmRefused)


@pytest.mark.parametrize("quote", [
    # aiohttp's C parser (llhttp): a bytes repr and a caret
    "Bad status line:\n  Expected HTTP/, RTSP/ or ICE/:\n\n  "
    + repr(garbled([MAX_JOBS], pretty=True)[:-60]) + "\n    ^",
    # its pure-Python parser (AIOHTTP_NO_EXTENSIONS=1): a str repr
    "Bad status line " + repr(garbled([MAX_JOBS]).decode()[:-60]),
    # a quote cut inside the entry: its words are still found
    "Bad status line:\n\n  " + repr(garbled([MAX_JOBS])[:70]),
], ids=["llhttp", "python", "cut"])
def test_either_parsers_quote_gives_slurms_words(quote: str) -> None:
    e = _garbled("submit job 'x'", quote)
    assert isinstance(e, SlurmRefused), repr(e)
    assert str(e).startswith("Slurm refused to submit job 'x': MaxJobCount limit reached")


async def test_a_gone_job_is_a_refusal_cancel_and_job_still_read_as_gone(token: Path) -> None:
    """client.cancel and client.job catch SlurmError and read ``.errnos``: Slurm's "no such
    job" (2017), garbled by 26.05, is a refusal now and still means "already gone"."""
    gone = {"description": "Kill job error", "error_number": 2017,
            "error": "Invalid job id specified", "source": "slurm_kill_job()"}
    async with raw_server(garbled([gone])) as url:
        async with SlurmClient(url, token, api_version=API, timeout=5.0) as c:
            with pytest.raises(SlurmRefused) as ei:
                await c._request("DELETE", f"/slurm/{API}/job/7", what="cancel job 7")
            assert ei.value.errnos == [2017]
            assert str(ei.value).startswith("Slurm refused to cancel job 7: Kill job error")
            await c.cancel(7)
            assert await c.job(7) is None


# ----------------------------------------------------------------------------- webhook


@pytest.mark.parametrize("fail_open", [False, True])
async def test_admission_denies_a_refusal_in_slurms_words(token: Path, fail_open: bool) -> None:
    """The whole way: 26.05's garbled refusal, the real client, the Admitter. Denied even with
    fail-open (Slurm answered, and made no job), with Slurm's own words first."""
    async with raw_server(garbled([MAX_JOBS])) as url:
        async with SlurmClient(url, token, api_version=API, timeout=5.0) as c:
            nm = node_map()
            a = Admitter(c.submit, lambda: nm, Settings(fail_open=fail_open))
            out = await a.review(review(marked_pod(**{contract.A_QOS: "normal"})))
    r = out["response"]
    assert r["allowed"] is False and "patch" not in r
    assert r["status"]["reason"] == reasons.EV_SUBMIT_REFUSED
    msg = r["status"]["message"]
    assert msg.startswith("slurmgate: Slurm refused the placeholder job: "
                          "MaxJobCount limit reached (errno 2017)"), msg
    assert "QOS normal" in msg and "malformed" not in msg


# ----------------------------------------------------------------------------- binder


async def test_binder_event_of_a_refused_submit_is_slurms_words() -> None:
    act, _, events, kube = actions(READY)

    class Refusing:
        async def submit(self, spec: JobSpec) -> int:
            e = SlurmRefused(f"Slurm refused to submit job {spec.name!r}", 500,
                             [f"{INVALID_ACCOUNT} (errno 2045)"])
            e.errnos = [2045]
            raise e

    act.slurm = Refusing()  # type: ignore[assignment]
    with pytest.raises(SlurmRefused):  # raised on: the controller retries as before
        await submit_one(act, pending_pod("team-a"))
    ((_, reason, message, warning),) = events.sent
    assert reason == reasons.EV_SUBMIT_REFUSED and warning
    assert message == (f"Slurm refused the placeholder job: {INVALID_ACCOUNT} (errno 2045) "
                       "(account team-a, partition k8s, Slurm user team-a)")
    assert kube.patches == []  # no job id recorded: there is no job


# --------------------------------------------- a job Slurm made although it answered an error


NODE_NOT_AVAIL = {"error_code": 2068,
                  "error": "Required node not available (down, drained or reserved)"}


async def test_a_job_slurm_queued_with_an_error_is_ours(token: Path) -> None:
    """22.05 after a slurmctld restart (chaos seed 733195740): the submit answered "Required
    node not available" and the job's id. The job waits like any pending one: the submit
    returns it, never a refusal that would leave a job no Pod names."""
    calls: list[tuple[str, str]] = []
    async with json_server(500, {"errors": [NODE_NOT_AVAIL], "job_id": 4},
                                calls) as url:
        async with SlurmClient(url, token, api_version=API, timeout=5.0) as c:
            assert await c.submit(SPEC) == 4
    assert [m for m, _ in calls] == ["POST"]


async def test_a_job_made_from_a_misread_body_is_taken_back(token: Path) -> None:
    """Any other error beside a job id: the job is not what we asked (24.11's v0.0.41 made
    one without the exclusive flag it could not parse), so it is cancelled and the submit
    fails, saying so."""
    calls: list[tuple[str, str]] = []
    flag = {"description": 'Unknown flag "exclusive"', "error_number": 9207,
            "error": "Data parser unable to parse invalid flag"}
    async with json_server(500, {"errors": [flag], "job_id": 3}, calls) as url:
        async with SlurmClient(url, token, api_version=API, timeout=5.0) as c:
            with pytest.raises(SlurmRefused) as ei:
                await c.submit(SPEC)
    assert "(3) was cancelled" in str(ei.value)
    assert ("DELETE", f"/slurm/{API}/job/3?signal=KILL") in calls


async def test_a_refusal_without_a_job_cancels_nothing(token: Path) -> None:
    calls: list[tuple[str, str]] = []
    async with json_server(500, {"errors": [NODE_NOT_AVAIL]}, calls) as url:
        async with SlurmClient(url, token, api_version=API, timeout=5.0) as c:
            with pytest.raises(SlurmRefused):
                await c.submit(SPEC)
    assert [m for m, _ in calls] == ["POST"]
