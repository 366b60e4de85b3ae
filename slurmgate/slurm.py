"""Async slurmrestd client (aiohttp) for the webhook and the binder.

Two JSON dialects are spoken:

* ``v0.0.38`` (Slurm 22.05): plain numbers, ``job_state`` a string, submit body
  ``{"script": ..., "job": {...}}``, environment a dict. Its jobs list carries no
  ``last_update``, so the server's clock is taken from ``GET /diag`` (``req_time``) *before*
  the jobs request: a T that can never be later than the list it goes with.
* ``v0.0.39``-``v0.0.41`` (Slurm 23.02-24.x): numbers as ``{"set", "infinite", "number"}``
  objects, state fields are lists, submit body ``{"job": {"script": ..., ...}}``,
  environment a list of ``K=V`` strings, ``last_update`` in the jobs response, and
  ``POST /node/{name}`` for drain/resume.

Parsing is tolerant (both number forms and both state forms are accepted everywhere), so a
server that mixes them does not break us.

The batch script is always the constant :data:`PLACEHOLDER_SCRIPT`; nothing from a
:class:`JobSpec` ever reaches it or a shell: spec fields go only into JSON fields.
The token is never logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from slurmgate import jsonpool
from slurmgate.hostlist import expand

log = logging.getLogger(__name__)

__all__ = [
    "PLACEHOLDER_SCRIPT",
    "SUPPORTED_VERSIONS",
    "JobInfo",
    "JobSpec",
    "NodeInfo",
    "PartitionInfo",
    "SlurmClient",
    "SlurmError",
    "SlurmUnavailable",
]

# Newest first. v0.0.39+ share the "new" dialect.
SUPPORTED_VERSIONS: tuple[str, ...] = ("v0.0.41", "v0.0.40", "v0.0.39", "v0.0.38")

# The placeholder holds the allocation for a Pod. It ignores SIGTERM (and its `sleep` child
# inherits the ignored disposition), so on preemption it survives Slurm's SIGTERM through
# GraceTime until the binder, once the Pod is gone, cancels the job with SIGKILL.
PLACEHOLDER_SCRIPT = (
    "#!/bin/sh\n"
    "# slurmgate placeholder: holds this allocation for a Kubernetes Pod.\n"
    "# SIGTERM (preemption) is ignored; slurmgate ends the job with SIGKILL once the Pod is gone.\n"
    "trap '' TERM\n"
    "while :; do sleep 3600; done\n"
)
PLACEHOLDER_PATH = "/usr/local/bin:/usr/bin:/bin"
PLACEHOLDER_CWD = "/tmp"

# Slurm error numbers meaning "slurmctld could not be reached", not "your request is wrong".
_UNAVAILABLE_ERRNOS = frozenset(
    {1001, 1002, 1003, 1004, 1800, 1801, 1802, 1803, 1804, 5004, 5005, 110, 111, 113}
)
_ERRNO_INVALID_JOB_ID = 2017
_ERRNO_ALREADY_DONE = 2021

# Base job states Slurm reports; flags (COMPLETING, ...) take precedence in the single-string
# v0.0.38 form, and we reproduce that order for the list form (job_state_string()).
_JOB_FLAG_PRECEDENCE = (
    "COMPLETING",
    "STAGE_OUT",
    "CONFIGURING",
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
    "SIGNALING",
)
ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "PREEMPTED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)
_NODE_BASE_STATES = ("UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE")


# ----------------------------------------------------------------------------- data


@dataclass(frozen=True)
class JobSpec:
    name: str
    comment: str
    memory_mb: int
    cpus: int
    gpus: int = 0
    nodes: int = 1
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    time_limit_minutes: int | None = None
    constraint: str | None = None
    nice: int | None = None


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    name: str
    state: str
    reason: str
    nodes: tuple[str, ...]
    comment: str | None
    partition: str
    submit_time: int
    start_time: int
    end_time: int
    # Every state/flag Slurm reported (v0.0.40+ list form; {state} for v0.0.38).
    state_flags: frozenset[str] = frozenset()
    # When Slurm decided to preempt the job (0 = never); set before the state changes.
    preempt_time: int = 0

    @property
    def ended(self) -> bool:
        """Slurm holds no resources for the job any more (unknown states count as active)."""
        return self.state in ENDED_STATES

    @property
    def active(self) -> bool:
        """Slurm holds, or may still hold, resources for the job."""
        return not self.ended

    @property
    def preempted(self) -> bool:
        return self.preempt_time > 0 or "PREEMPTED" in self.state_flags or (
            self.state == "PREEMPTED"
        )


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    flags: frozenset[str]
    cpus: int
    real_memory_mb: int
    partitions: tuple[str, ...]
    reason: str
    features: tuple[str, ...]
    gres: str


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    nodes: tuple[str, ...]
    default: bool
    max_time_minutes: int | None
    state: str
    # Slurm's preemption GraceTime: how long a preempted job may run on after SIGTERM
    grace_time_seconds: int | None = None


class SlurmError(Exception):
    """slurmrestd or slurmctld refused a request. ``errors`` holds Slurm's own messages."""

    def __init__(
        self, message: str, status: int | None = None, errors: list[str] | None = None
    ) -> None:
        self.message = message
        self.status = status
        self.errors = list(errors or [])
        self.errnos: list[int] = []
        super().__init__(message)

    def __str__(self) -> str:
        s = self.message
        if self.status is not None:
            s += f" (HTTP {self.status})"
        if self.errors:
            s += ": " + "; ".join(self.errors)
        return s


class SlurmUnavailable(SlurmError):
    """slurmrestd/slurmctld cannot be reached (connection refused, timeout, 5xx): retry later."""


# ----------------------------------------------------------------------------- parsing helpers


def _num(v: Any, default: int = 0) -> int:
    """int from a plain number or a v0.0.40 ``{"set", "infinite", "number"}`` object."""
    if v is None or isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, Mapping):
        if not v.get("set", True) or v.get("infinite", False):
            return default
        return _num(v.get("number"), default)
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return default


def _opt_num(v: Any) -> int | None:
    """None for unset/infinite (and v0.0.38's -1/None), else the number."""
    if v is None:
        return None
    if isinstance(v, Mapping):
        if not v.get("set", True) or v.get("infinite", False):
            return None
        return _opt_num(v.get("number"))
    n = _num(v, -1)
    return None if n < 0 else n


def _strs(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if isinstance(v, list | tuple):
        return [str(x) for x in v if x is not None and str(x)]
    return [str(v)]


def _csv(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(x.strip() for x in v.split(",") if x.strip())
    return tuple(_strs(v))


def _str(v: Any, default: str = "") -> str:
    if v is None:
        return default
    return str(v)


def _job_state(v: Any) -> tuple[str, frozenset[str]]:
    states = [s.upper() for s in _strs(v)]
    if not states:
        return "UNKNOWN", frozenset()
    flags = frozenset(states)
    if len(states) == 1:
        return states[0], flags
    for f in _JOB_FLAG_PRECEDENCE:
        if f in flags:
            return f, flags
    return states[0], flags


def parse_job(d: Mapping[str, Any]) -> JobInfo:
    state, flags = _job_state(d.get("job_state"))
    nodes_raw = d.get("nodes")
    try:
        nodes = tuple(expand(nodes_raw if isinstance(nodes_raw, str) else None))
    except ValueError:
        nodes = ()
    comment = d.get("comment")
    reason = _str(d.get("state_reason"), "None") or "None"
    return JobInfo(
        job_id=_num(d.get("job_id")),
        name=_str(d.get("name")),
        state=state,
        reason=reason,
        nodes=nodes,
        comment=comment if isinstance(comment, str) and comment else None,
        partition=_str(d.get("partition")),
        submit_time=_num(d.get("submit_time")),
        start_time=_num(d.get("start_time")),
        end_time=_num(d.get("end_time")),
        state_flags=flags,
        preempt_time=_num(d.get("preempt_time")),
    )


def parse_node(d: Mapping[str, Any]) -> NodeInfo:
    raw = [s.upper() for s in _strs(d.get("state"))]
    flags = {s.upper() for s in _strs(d.get("state_flags"))}
    base = next((s for s in raw if s in _NODE_BASE_STATES), raw[0] if raw else "UNKNOWN")
    flags |= {s for s in raw if s != base}
    return NodeInfo(
        name=_str(d.get("name")),
        state=base,
        flags=frozenset(flags),
        cpus=_num(d.get("cpus")),
        real_memory_mb=_num(d.get("real_memory")),
        partitions=tuple(_strs(d.get("partitions"))),
        reason=_str(d.get("reason")),
        features=_csv(d.get("features")),
        gres=_str(d.get("gres")),
    )


def parse_partition(d: Mapping[str, Any]) -> PartitionInfo:
    nodes_v = d.get("nodes")
    if isinstance(nodes_v, Mapping):  # v0.0.40+: {"configured": "n[1-4]", "total": 4, ...}
        nodes_v = nodes_v.get("configured")
    try:
        nodes = tuple(expand(nodes_v if isinstance(nodes_v, str) else None))
    except ValueError:
        nodes = ()
    part_v = d.get("partition")
    part: Mapping[str, Any] = part_v if isinstance(part_v, Mapping) else {}
    flags = {f.upper() for f in _strs(d.get("flags"))} | {
        f.upper() for f in _strs(part.get("flags"))
    }
    if "max_time_limit" in d:  # v0.0.38: minutes, -1 = INFINITE
        max_time = _opt_num(d.get("max_time_limit"))
    else:
        max_v = d.get("maximums")
        maximums: Mapping[str, Any] = max_v if isinstance(max_v, Mapping) else {}
        max_time = _opt_num(maximums.get("time"))
    state_v = part.get("state") if part else d.get("state")
    states = [s.upper() for s in _strs(state_v)]
    if "preemption_grace_time" in d:  # v0.0.38
        grace = _opt_num(d.get("preemption_grace_time"))
    else:  # v0.0.40+: {"preemption": {"grace_time": {"set": ..., "number": N}}}
        pre_v = d.get("preemption")
        pre: Mapping[str, Any] = pre_v if isinstance(pre_v, Mapping) else {}
        grace = _opt_num(pre.get("grace_time"))
    return PartitionInfo(
        name=_str(d.get("name")),
        nodes=nodes,
        default="DEFAULT" in flags,
        max_time_minutes=max_time,
        state=states[0] if states else "UNKNOWN",
        grace_time_seconds=grace,
    )


def _error_text(e: Any) -> tuple[str, int | None]:
    if not isinstance(e, Mapping):
        return str(e), None
    num = e.get("error_number", e.get("error_code", e.get("errno")))
    errno = num if isinstance(num, int) else None
    desc = _str(e.get("description"))
    err = _str(e.get("error"))
    text = desc or err or "unknown error"
    if desc and err and err not in desc:
        text = f"{desc}: {err}"
    src = _str(e.get("source"))
    if src:
        text += f" [{src}]"
    if errno is not None:
        text += f" (errno {errno})"
    return text, errno


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _is_new_dialect(version: str) -> bool:
    return _version_key(version) >= (0, 0, 39)


# ----------------------------------------------------------------------------- client


class _Token:
    """Token file cache: re-read when the file changes (a rotated Secret), never logged."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: tuple[int, int, int] | None = None
        self._value = ""

    def get(self) -> str:
        try:
            st = os.stat(self.path)
        except OSError as e:
            raise SlurmError(f"cannot read Slurm token file {self.path}: {e}") from None
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        if key != self._key:
            try:
                raw = self.path.read_text()
            except OSError as e:
                raise SlurmError(f"cannot read Slurm token file {self.path}: {e}") from None
            tok = raw.strip()
            if tok.startswith("SLURM_JWT="):  # raw `scontrol token` output
                tok = tok[len("SLURM_JWT=") :].strip()
            if not tok:
                raise SlurmError(f"Slurm token file {self.path} is empty")
            self._value = tok
            self._key = key
        return self._value

    def invalidate(self) -> None:
        self._key = None


class SlurmClient:
    def __init__(
        self,
        base_url: str,
        token_file: Path | str,
        user: str = "root",
        *,
        timeout: float = 5.0,
        api_version: str | None = None,
        connections: int = 16,
    ) -> None:
        if api_version is not None and api_version not in SUPPORTED_VERSIONS:
            raise ValueError(
                f"unsupported Slurm REST version {api_version!r}; supported: "
                f"{', '.join(SUPPORTED_VERSIONS)}"
            )
        self.base_url = base_url.rstrip("/")
        self.user = user
        self._token = _Token(Path(token_file))
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._connections = connections
        self._version = api_version
        self._version_lock = asyncio.Lock()
        self._session: aiohttp.ClientSession | None = None

    # --- lifecycle

    async def __aenter__(self) -> SlurmClient:
        self._ensure_session()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections),
                timeout=self._timeout,
            )
        return self._session

    # --- transport

    def token(self) -> str:
        """The current JWT (for scontrol on Slurm 22.05); never log it."""
        return self._token.get()

    def _headers(self) -> dict[str, str]:
        return {
            "X-SLURM-USER-NAME": self.user,
            "X-SLURM-USER-TOKEN": self._token.get(),
            "Accept": "application/json",
        }

    async def _request(
        self,
        method: str,
        path: str,
        *,
        what: str,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        allow_304: bool = False,
        keep_comment_prefix: str | None = None,
    ) -> tuple[int, dict[str, Any] | None]:
        """One request; returns (status, parsed JSON or None for 304). Raises SlurmError.

        ``keep_comment_prefix``: of a job list keep only the jobs whose comment starts with
        it (dropped while parsing, which big bodies do in a worker process)."""
        session = self._ensure_session()
        url = f"{self.base_url}{path}"
        headers = self._headers()
        try:
            async with session.request(
                method, url, params=params, json=body, headers=headers
            ) as resp:
                status = resp.status
                if status == 304 and allow_304:
                    return status, None
                raw = await resp.read()
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise SlurmUnavailable(
                f"{what}: cannot reach slurmrestd at {self.base_url}: {e}"
            ) from None
        except TimeoutError:
            raise SlurmUnavailable(
                f"{what}: slurmrestd at {self.base_url} did not answer within "
                f"{self._timeout.total}s"
            ) from None
        data: dict[str, Any] | None
        try:
            parsed = await jsonpool.load_async(raw, keep_comment_prefix)
            data = parsed if isinstance(parsed, dict) else None
        except ValueError:
            data = None
        text = raw[:4096].decode("utf-8", errors="replace")  # for error messages only
        if status == 401 or status == 403:
            self._token.invalidate()
        errors: list[str] = []
        errnos: list[int] = []
        if data is not None:
            for item in data.get("errors") or []:
                t, n = _error_text(item)
                errors.append(t)
                if n is not None:
                    errnos.append(n)
        if 200 <= status < 300 and data is None:
            raise SlurmError(f"{what}: slurmrestd sent no JSON object", status, [text[:200]])
        if 200 <= status < 300 and not errors:
            return status, data
        if not errors and text.strip():
            errors = [text.strip()[:500]]
        unavailable = (
            status in (502, 503, 504)
            or (status >= 500 and data is None)
            or any(n in _UNAVAILABLE_ERRNOS for n in errnos)
            or any("Unable to contact slurm controller" in e for e in errors)
        )
        cls = SlurmUnavailable if unavailable else SlurmError
        err = cls(f"{what} failed", status, errors)
        err.errnos = errnos
        raise err

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
                    self._version = v
                    log.info("slurmrestd speaks %s (offers %s)", v, ", ".join(sorted(offered)))
                    return v
            raise SlurmError(
                "slurmrestd offers no supported API version",
                None,
                [f"offered: {', '.join(sorted(offered)) or 'none'}; "
                 f"supported: {', '.join(SUPPORTED_VERSIONS)}"],
            )

    async def _base(self) -> tuple[str, bool]:
        v = await self.detect_version()
        return f"/slurm/{v}", _is_new_dialect(v)

    # --- operations

    async def ping(self) -> None:
        base, _ = await self._base()
        _, data = await self._request("GET", f"{base}/ping", what="ping")
        pings = [p for p in (data or {}).get("pings") or [] if isinstance(p, Mapping)]
        up = [p for p in pings if _str(p.get("pinged", p.get("ping"))).upper() == "UP"]
        if pings and not up:
            raise SlurmUnavailable(
                "ping: no slurmctld answers", None, [json.dumps(p) for p in pings]
            )

    def submit_body(self, spec: JobSpec, new_dialect: bool) -> dict[str, Any]:
        """The JSON body for POST /job/submit (public for tests and dry runs)."""
        _check_spec(spec)
        job: dict[str, Any] = {
            "name": spec.name,
            "comment": spec.comment,
            "minimum_cpus_per_node": spec.cpus,
            "tasks": spec.nodes,
            "requeue": False,
            "current_working_directory": PLACEHOLDER_CWD,
        }
        if new_dialect:
            job["script"] = PLACEHOLDER_SCRIPT
            job["shared"] = ["none"]  # == --exclusive
            job["minimum_nodes"] = spec.nodes
            job["maximum_nodes"] = spec.nodes
            job["memory_per_node"] = {"set": True, "infinite": False, "number": spec.memory_mb}
            job["environment"] = [f"PATH={PLACEHOLDER_PATH}"]
            if spec.gpus:
                job["tres_per_node"] = f"gres/gpu:{spec.gpus}"
            if spec.time_limit_minutes is not None:
                job["time_limit"] = {
                    "set": True,
                    "infinite": False,
                    "number": spec.time_limit_minutes,
                }
        else:
            job["exclusive"] = "exclusive"  # 22.05 parses it like sbatch --exclusive
            job["nodes"] = spec.nodes
            job["memory_per_node"] = spec.memory_mb
            job["environment"] = {"PATH": PLACEHOLDER_PATH}
            if spec.gpus:
                job["gres"] = f"gpu:{spec.gpus}"
            if spec.time_limit_minutes is not None:
                job["time_limit"] = spec.time_limit_minutes
        for key, val in (
            ("partition", spec.partition),
            ("qos", spec.qos),
            ("account", spec.account),
            ("constraints", spec.constraint),
        ):
            if val:
                job[key] = val
        if spec.nice is not None:
            job["nice"] = spec.nice
        if new_dialect:
            return {"job": job}
        return {"script": PLACEHOLDER_SCRIPT, "job": job}

    async def submit(self, spec: JobSpec) -> int:
        base, new = await self._base()
        _, data = await self._request(
            "POST", f"{base}/job/submit", what=f"submit job {spec.name!r}",
            body=self.submit_body(spec, new),
        )
        job_id = _num((data or {}).get("job_id"), -1)
        if job_id <= 0:
            result = (data or {}).get("result")
            if isinstance(result, Mapping):
                job_id = _num(result.get("job_id"), -1)
        if job_id <= 0:
            raise SlurmError(f"submit job {spec.name!r}: slurmrestd returned no job_id")
        return job_id

    async def _server_time(self, base: str) -> int:
        _, data = await self._request("GET", f"{base}/diag", what="diag (server time)")
        stats = (data or {}).get("statistics") or {}
        t = _num(stats.get("req_time"))
        if t <= 0:
            raise SlurmError("diag: no req_time in slurmrestd's answer")
        return t

    async def jobs(
        self, since: int | None = None, *, comment_prefix: str | None = None
    ) -> tuple[list[JobInfo] | None, int]:
        """All jobs, or (None, since) when nothing changed since ``since`` (HTTP 304).

        The returned T is the server's own clock at (or before) the time the list was taken;
        pass it back as ``since`` next time. ``comment_prefix``: parse and return only jobs
        whose comment starts with it (the list is the whole cluster's; parsing every job of
        it was most of a changed poll's cost).
        """
        base, new = await self._base()
        t_before = 0
        if not new:
            t_before = await self._server_time(base)
        params = {"update_time": str(since)} if since is not None else None
        status, data = await self._request(
            "GET", f"{base}/jobs", what="list jobs", params=params, allow_304=True,
            keep_comment_prefix=comment_prefix,
        )
        if status == 304 or data is None:
            return None, since if since is not None else 0
        raw = [j for j in data.get("jobs") or [] if isinstance(j, Mapping)]
        if comment_prefix is not None:  # usually done already while parsing (_request)
            raw = jsonpool.keep_jobs(raw, comment_prefix)
        jobs = [parse_job(j) for j in raw]
        if new:
            t = _num(data.get("last_update"))
            if t <= 0:  # should not happen; fall back to the server's clock, never ours
                t = await self._server_time(base)
        else:
            t = t_before
        return jobs, t

    async def job(self, job_id: int) -> JobInfo | None:
        base, _ = await self._base()
        try:
            _, data = await self._request("GET", f"{base}/job/{int(job_id)}", what=f"job {job_id}")
        except SlurmUnavailable:
            raise
        except SlurmError as e:
            if _ERRNO_INVALID_JOB_ID in e.errnos or e.status == 404:
                return None
            raise
        for j in (data or {}).get("jobs") or []:
            if isinstance(j, Mapping) and _num(j.get("job_id")) == int(job_id):
                return parse_job(j)
        return None

    async def cancel(self, job_id: int, signal: str = "KILL") -> None:
        """Signal/cancel a job. A job that is gone or already ended is not an error."""
        sig = signal.upper().removeprefix("SIG")
        if not re.fullmatch(r"[A-Z0-9]{1,8}", sig):
            raise ValueError(f"bad signal name {signal!r}")
        base, _ = await self._base()
        try:
            await self._request(
                "DELETE", f"{base}/job/{int(job_id)}", what=f"cancel job {job_id}",
                params={"signal": sig},
            )
        except SlurmUnavailable:
            raise
        except SlurmError as e:
            gone = {_ERRNO_INVALID_JOB_ID, _ERRNO_ALREADY_DONE}
            if gone.intersection(e.errnos) or any(
                "already completing or completed" in m.lower() for m in e.errors
            ):
                return
            raise

    async def nodes(self) -> list[NodeInfo]:
        base, _ = await self._base()
        _, data = await self._request("GET", f"{base}/nodes", what="list nodes")
        return [parse_node(n) for n in (data or {}).get("nodes") or [] if isinstance(n, Mapping)]

    async def partitions(self) -> list[PartitionInfo]:
        base, _ = await self._base()
        _, data = await self._request("GET", f"{base}/partitions", what="list partitions")
        return [
            parse_partition(p)
            for p in (data or {}).get("partitions") or []
            if isinstance(p, Mapping)
        ]

    async def _update_node(self, node: str, body: dict[str, Any], what: str) -> None:
        base, new = await self._base()
        if not new:
            raise NotImplementedError(
                f"{what}: slurmrestd {base.rsplit('/', 1)[-1]} (Slurm 22.05) has no node "
                "update endpoint (only GET /node/{name}); POST /node/{name} exists from "
                "v0.0.39 (Slurm 23.02). Use `scontrol update nodename=... state=drain` instead."
            )
        if not re.fullmatch(r"[A-Za-z0-9._-]+", node):
            raise ValueError(f"bad node name {node!r}")
        await self._request("POST", f"{base}/node/{node}", what=what, body=body)

    async def drain(self, node: str, reason: str) -> None:
        if not reason:
            raise ValueError("Slurm requires a reason to drain a node")
        await self._update_node(
            node, {"state": ["DRAIN"], "reason": reason}, f"drain node {node}"
        )

    async def resume(self, node: str) -> None:
        await self._update_node(node, {"state": ["RESUME"]}, f"resume node {node}")


def _check_spec(spec: JobSpec) -> None:
    if spec.memory_mb <= 0:
        raise ValueError(f"memory_mb must be > 0, got {spec.memory_mb}")
    if spec.cpus <= 0:
        raise ValueError(f"cpus must be > 0, got {spec.cpus}")
    if spec.nodes <= 0:
        raise ValueError(f"nodes must be > 0, got {spec.nodes}")
    if spec.gpus < 0:
        raise ValueError(f"gpus must be >= 0, got {spec.gpus}")
    if spec.time_limit_minutes is not None and spec.time_limit_minutes <= 0:
        raise ValueError(f"time_limit_minutes must be > 0, got {spec.time_limit_minutes}")
