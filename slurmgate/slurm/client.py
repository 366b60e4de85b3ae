"""SlurmClient: the operations slurmgate needs, in whichever dialect the server speaks.

The version is detected once (the newest both sides speak) and cached; each operation asks
the dialect table (slurmgate.slurm.dialects) how to say it. The token is never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from slurmgate import jsonpool
from slurmgate.logs import kv
from slurmgate.slurm import dialects
from slurmgate.slurm.dialects import (
    QUEUED_ANYWAY,
    SUPPORTED_VERSIONS,
    Dialect,
    num,
    parse_job,
    status_errors,
    submitted_id,
    text,
)
from slurmgate.slurm.models import (
    JobInfo,
    JobSpec,
    SlurmError,
    SlurmIgnoredField,
    SlurmRefused,
    SlurmUnavailable,
)
from slurmgate.slurm.nodeops import NodeOperations
from slurmgate.slurm.restmetrics import RestMetrics
from slurmgate.slurm.transport import Transport

log = logging.getLogger("slurmgate.slurm")

_ERRNO_INVALID_JOB_ID = 2017
_ERRNO_ALREADY_DONE = 2021
_GONE = frozenset({_ERRNO_INVALID_JOB_ID, _ERRNO_ALREADY_DONE})
# ids per GET /jobs/state (keeps the URL far below slurmrestd's limits)
STATE_QUERY_CHUNK = 400
# concurrent GET /job/{id} reads: slurmctld serves them one at a time anyway
JOB_READS_AT_ONCE = 8
# A site's whole job list takes slurmrestd minutes to write at 50,000 jobs (130 s on 26.05,
# bench.busy): it gets this long, where every other request keeps the client's timeout.
WHOLE_LIST_TIMEOUT = 600.0


class SlurmClient(NodeOperations):
    def __init__(
        self,
        base_url: str,
        token_file: Path | str,
        user: str = "root",
        *,
        timeout: float = 5.0,
        api_version: str | None = None,
        connections: int = 16,
        json_offload_bytes: int | None = None,
        metrics: RestMetrics | None = None,
    ) -> None:
        if api_version is not None:
            dialects.dialect(api_version)  # ValueError naming the supported ones
        self._timeout = timeout
        self._http = Transport(base_url, token_file, user, timeout, connections,
                               json_offload_bytes, metrics)
        self.base_url = self._http.base_url
        self.user = user
        self._version = api_version
        self.write_guard: Callable[[], None] | None = None
        # whether slurmrestd serves slurmdbd's job list (its OpenAPI document says, and a 404
        # from it says it no longer does; slurmgate.slurm.accounting); assumed until then
        self.serves_dbd_jobs = True
        self._version_lock = asyncio.Lock()

    # --- lifecycle

    async def __aenter__(self) -> SlurmClient:
        self._http.session()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.close()

    def token(self) -> str:
        """The current JWT (for scontrol on Slurm 22.05); never log it."""
        return self._http.token.get()

    async def _request(self, method: str, path: str, **kw: Any) -> tuple[int, dict | None]:
        if method != "GET":
            self.may_write()
        return await self._http.request(method, path, **kw)

    def may_write(self) -> None:
        """Raises if a write is refused now (`write_guard`: the binder's leader fence); every
        write to Slurm asks, scontrol's on 22.05 included."""
        if self.write_guard is not None:
            self.write_guard()

    # --- version

    async def detect_version(self) -> str:
        """Newest REST version both sides speak (cached). GET /openapi/v3, else /openapi."""
        if self._version is not None:
            return self._version
        async with self._version_lock:
            if self._version is not None:
                return self._version
            spec: dict[str, Any] | None = None
            last: SlurmError | None = None
            for path in ("/openapi/v3", "/openapi"):
                try:
                    _, spec = await self._request("GET", path, what="detect Slurm REST version")
                    break
                except SlurmUnavailable:
                    raise
                except SlurmError as e:
                    last = e
            if spec is None:
                raise last or SlurmError("detect Slurm REST version: no OpenAPI document")
            offered = {
                m.group(1)
                for p in (spec.get("paths") or {})
                if (m := re.match(r"^/slurm/(v\d+\.\d+\.\d+)/", str(p)))
            }
            for v in SUPPORTED_VERSIONS:
                if v in offered:
                    self.serves_dbd_jobs = any(str(p).startswith(f"/slurmdb/{v}/jobs")
                                            for p in spec.get("paths") or {})
                    self._version = v
                    log.info("slurmrestd speaks %s (offers %s)", v, ", ".join(sorted(offered)))
                    return v
            raise SlurmError(
                "slurmrestd offers no supported API version",
                None,
                [f"offered: {', '.join(sorted(offered)) or 'none'}; "
                 f"supported: {', '.join(SUPPORTED_VERSIONS)}"],
            )

    async def dialect(self) -> Dialect:
        return dialects.dialect(await self.detect_version())

    async def _base(self) -> tuple[str, Dialect]:
        d = await self.dialect()
        return f"/slurm/{d.version}", d

    # --- operations

    async def ping(self) -> None:
        base, _ = await self._base()
        _, data = await self._request("GET", f"{base}/ping", what="ping")
        pings = [p for p in (data or {}).get("pings") or [] if isinstance(p, Mapping)]
        # v0.0.38: "ping": "UP"; v0.0.40+: "pinged": "UP" or (v0.0.42+) "responding": true
        up = [p for p in pings if p.get("responding") is True
              or text(p.get("pinged", p.get("ping"))).upper() == "UP"]
        if pings and not up:
            raise SlurmUnavailable(
                "ping: no slurmctld answers", None, [json.dumps(p) for p in pings]
            )

    async def submit_body(self, spec: JobSpec) -> dict[str, Any]:
        """The JSON body for POST /job/submit in the server's dialect (tests, dry runs)."""
        return dialects.submit_body(await self.dialect(), spec)

    async def submit(self, spec: JobSpec, seconds: float | None = None) -> int:
        """The id of the job Slurm made. ``seconds``: how long the request may take (default:
        the client's timeout)."""
        base, d = await self._base()
        what = f"submit job {spec.name!r}" + (f" as user {spec.user!r}" if spec.user else "")
        try:
            # as the tenant's user, if the job has one; everything else stays the service's
            _, data = await self._request(
                "POST", f"{base}/job/submit", what=what, body=dialects.submit_body(d, spec),
                user=spec.user, seconds=seconds)
        except SlurmRefused as e:
            made = submitted_id(e.answer or {})
            if made <= 0:
                raise
            if set(e.errnos) and set(e.errnos) <= QUEUED_ANYWAY:
                # slurmctld queued the job as asked and answered an error all the same
                # (proc_req.c): it waits like any pending job, so it is ours, never a refusal
                # that would leave it behind (chaos, 22.05: "Required node not available"
                # while the slurmds re-register after a slurmctld restart)
                log.warning("slurm made the job and answered with errors", extra=kv(
                    job=made, job_name=spec.name, errors="; ".join(e.errors)))
                return made
            # a job made from a body Slurm misread (24.11's v0.0.41 answers an unknown flag
            # with 500, errors[] and the job's id): not what we asked, so taken back
            await asyncio.shield(self._take_back(made, e))  # even if the submit is dropped
            raise
        except SlurmIgnoredField as e:
            # The job exists but is not what we asked for (e.g. not exclusive): take it back.
            bad = submitted_id(e.answer or {})
            if bad > 0:
                await asyncio.shield(self._take_back(bad, e))
            raise
        job_id = submitted_id(data or {})
        if job_id <= 0:
            raise SlurmError(f"{what}: slurmrestd returned no job_id")
        return job_id

    async def _take_back(self, job_id: int, e: SlurmError) -> None:
        try:
            await self.cancel(job_id)
        except SlurmError as ce:
            e.errors.append(f"and cancelling the job it made ({job_id}) failed: {ce}")
        else:
            e.errors.append(f"the job it made ({job_id}) was cancelled")

    async def _server_time(self, base: str) -> int:
        _, data = await self._request("GET", f"{base}/diag", what="diag (server time)")
        stats = (data or {}).get("statistics") or {}
        t = num(stats.get("req_time"))
        if t <= 0:
            raise SlurmError("diag: no req_time in slurmrestd's answer")
        return t

    async def jobs(
        self, since: int | None = None, *, comment_prefix: str | None = None
    ) -> tuple[list[JobInfo] | None, int]:
        """All jobs, or (None, since) when nothing changed since ``since``.

        The returned T is the server's own clock at (or before) the time the list was taken;
        pass it back as ``since`` next time. ``comment_prefix``: parse and return only jobs
        whose comment starts with it (the list is the whole cluster's; parsing every job of
        it was most of a changed poll's cost).
        """
        base, d = await self._base()
        t_before = 0
        if not d.clock_in_jobs:
            t_before = await self._server_time(base)
        if not d.update_time_query:
            since = None  # the full list every time (see the dialect table)
        params = {"update_time": str(since)} if since is not None else None
        status, data = await self._request(
            "GET", f"{base}/jobs", what="list jobs", params=params, allow_304=True,
            keep_comment_prefix=comment_prefix, seconds=max(self._timeout, WHOLE_LIST_TIMEOUT),
        )
        if status == 304 or data is None:
            return None, since if since is not None else 0
        if since is not None and not d.idle_is_304 and dialects.no_changes(data):
            return None, since
        raw = [j for j in data.get("jobs") or [] if isinstance(j, Mapping)]
        if comment_prefix is not None:  # usually done already while parsing (transport)
            raw = jsonpool.keep_jobs(raw, comment_prefix)
        jobs = [parse_job(j) for j in raw]
        if d.clock_in_jobs:
            t = num(data.get("last_update"))
            if t <= 0:  # should not happen; fall back to the server's clock, never ours
                t = await self._server_time(base)
        else:
            t = t_before
        return jobs, t

    async def our_jobs(self, comment_prefix: str) -> list[JobInfo]:
        """The jobs whose comment starts with `comment_prefix`, from Slurm's whole job list
        (GET /jobs), kept while the answer streams in: the list is the site's (tens of
        thousands of jobs, hundreds of MB of JSON); only ours are ever held."""
        base, _ = await self._base()

        def ours(j: Any) -> bool:
            return isinstance(j, Mapping) and isinstance(c := j.get("comment"), str) \
                and c.startswith(comment_prefix)

        kept = await self._http.items(f"{base}/jobs", what="list jobs", prefix="jobs.item",
                                      keep=ours, seconds=max(self._timeout, WHOLE_LIST_TIMEOUT))
        return [parse_job(j) for j in kept]

    async def get(self, path: str, what: str, query: str | None = None) -> dict[str, Any]:
        """GET `path` (with `query`, escaped already): the answer's JSON, or SlurmError."""
        _, data = await self._request("GET", path, what=what, query=query)
        return data or {}

    async def _record(self, path: str, what: str,
                      gone: Callable[[SlurmError], bool]) -> dict[str, Any] | None:
        """GET one record's answer; None where Slurm says it has no such thing (`gone`)."""
        try:
            _, data = await self._request("GET", path, what=what)
        except SlurmUnavailable:
            raise
        except SlurmError as e:
            if gone(e):
                return None
            raise
        return data or {}

    async def job(self, job_id: int) -> JobInfo | None:
        base, _ = await self._base()
        # Slurm's own "Invalid job id" only (404 on 24.11+, 500 on 22.05): a bare 404 (a
        # proxy, a wrong path) must not read as "the job is gone", or Pods would be evicted
        data = await self._record(f"{base}/job/{int(job_id)}", f"job {job_id}",
                                  lambda e: _ERRNO_INVALID_JOB_ID in e.errnos)
        for j in (data or {}).get("jobs") or []:
            if isinstance(j, Mapping) and num(j.get("job_id")) == int(job_id):
                return parse_job(j)
        return None

    async def job_states(self, ids: Iterable[int]) -> dict[int, tuple[str, frozenset[str]]]:
        """The states of just these jobs (ids Slurm no longer knows are left out), from
        GET /jobs/state?job_id=A&job_id=B...: slurmctld looks up each id, so the cost follows
        the ids asked, never the site's job count. Only where ``dialect.state_query``. (The
        OpenAPI document says "CSV list", but 26.05 answers "1,2" with a bare 500: the
        parameter is repeated instead.)"""
        base, d = await self._base()
        if not d.state_query:
            raise NotImplementedError(f"slurmrestd {d.version} has no job_id-filtered "
                                      "GET /jobs/state")
        wanted = sorted({int(i) for i in ids})
        out: dict[int, tuple[str, frozenset[str]]] = {}
        for k in range(0, len(wanted), STATE_QUERY_CHUNK):
            chunk = wanted[k:k + STATE_QUERY_CHUNK]
            try:
                _, data = await self._request(
                    "GET", f"{base}/jobs/state/", what=f"states of {len(chunk)} jobs",
                    params=[("job_id", str(i)) for i in chunk])
            except SlurmUnavailable:
                raise
            except SlurmError as e:
                # ids Slurm does not know are left out of the answer (24.11, 26.05); should a
                # release call them an error instead, only its "Invalid job id" says so
                if _ERRNO_INVALID_JOB_ID in e.errnos:
                    continue
                raise
            for j in (data or {}).get("jobs") or []:
                if isinstance(j, Mapping) and (i := num(j.get("job_id"))) in chunk:
                    out[i] = dialects.job_state(j.get("state"))
        return out

    async def jobs_by_id(self, ids: Iterable[int]) -> dict[int, JobInfo | None]:
        """Each job's whole record (None: Slurm no longer knows it), GET /job/{id} each, at
        most JOB_READS_AT_ONCE at a time: what 22.05 offers instead of a filtered list."""
        gate = asyncio.Semaphore(JOB_READS_AT_ONCE)

        async def one(i: int) -> tuple[int, JobInfo | None]:
            async with gate:
                return i, await self.job(i)

        return dict(await asyncio.gather(*(one(i) for i in sorted(set(ids)))))

    async def cancel(self, job_id: int, signal: str = "KILL") -> None:
        """Signal/cancel a job. A job that is gone or already ended is not an error."""
        sig = signal.upper().removeprefix("SIG")
        if not re.fullmatch(r"[A-Z0-9]{1,8}", sig):
            raise ValueError(f"bad signal name {signal!r}")
        base, d = await self._base()
        what = f"cancel job {job_id}"
        try:
            _, data = await self._request(
                "DELETE", f"{base}/job/{int(job_id)}", what=what, params={"signal": sig})
        except SlurmUnavailable:
            raise
        except SlurmError as e:
            if _GONE.intersection(e.errnos) or any(
                "already completing or completed" in m.lower() for m in e.errors
            ):
                return
            raise
        # v0.0.42+ answer 200 and say per job in status[] what went wrong
        errs = status_errors(data or {}) if d.cancel_status else []
        if errs and not all(n in _GONE for _, n in errs):
            err = SlurmError(f"{what} failed", 200, [t for t, _ in errs])
            err.errnos = [n for _, n in errs if n is not None]
            raise err
