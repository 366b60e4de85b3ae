"""The REST dialects slurmgate speaks, and the ONE table of what differs between them.

=========  ==========  =============================================================
version    Slurm       served by
=========  ==========  =============================================================
v0.0.38    22.05       22.05 (tested: the host's Debian 12 package)
v0.0.40    23.11       23.11, 24.05, 24.11 (tested against 24.11)
v0.0.41    24.05       24.05, 24.11, 25.05 (tested against 24.11)
v0.0.42    24.11       24.11 - 26.05 (tested against 24.11 and 26.05)
v0.0.43    25.05       25.05 - 26.05 (tested against 26.05)
v0.0.44    25.11       25.11, 26.05 (tested against 26.05)
v0.0.45    26.05       26.05 (tested against 26.05)
=========  ==========  =============================================================

Everything that differs is a field of :class:`Dialect`; code elsewhere asks the dialect, never
``if version``. Parsing is tolerant on top of that (both number forms and both state forms are
read everywhere), so a server that mixes them does not break us.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from slurmgate.hostlist import expand
from slurmgate.slurm import allocation, placeholder
from slurmgate.slurm.models import (
    JOB_FLAG_PRECEDENCE,
    NODE_BASE_STATES,
    JobInfo,
    JobSpec,
    NodeInfo,
    PartitionInfo,
)
from slurmgate.slurm.values import num, opt_num, strs


@dataclass(frozen=True)
class Dialect:
    version: str
    # Numbers as {"set", "infinite", "number"} objects (else plain ints, -1 = unset).
    number_objects: bool
    # How a submit asks for whole nodes: v0.0.38 `exclusive: "exclusive"` (what sbatch
    # --exclusive sets); later `shared: ["none"]`. A server that does not know the field says so
    # only in a warning, which the transport turns into an error.
    exclusive: tuple[str, Any]
    # Submit body: {"job": {"script": ...}} (else {"script": ..., "job": {...}}).
    script_in_job: bool
    # Environment as ["K=V", ...] (else {"K": "V"}).
    environment_list: bool
    # Node count: minimum_nodes/maximum_nodes (else an integer `nodes`).
    node_range: bool
    # GPUs: tres_per_node "gres/gpu[:type]:N" (else gres "gpu[:type]:N").
    gpus_as_tres: bool
    # The server's clock for the next update_time: from the jobs answer's last_update (else
    # GET /diag req_time, taken BEFORE the list so it is never later than the list).
    clock_in_jobs: bool
    # GET /jobs?update_time=<epoch> works. 24.11's v0.0.40/v0.0.41 answer it 422 ("Parsing of
    # <T> for timestamp failed"): there every poll is the full list.
    update_time_query: bool
    # An unchanged GET /jobs?update_time=T: 304 without a body (else 200, "jobs": [] and a
    # warning "No job changes since ...", with last_update 0).
    idle_is_304: bool
    # POST /node/{name} exists (drain/resume over REST; else scontrol).
    node_update: bool
    # DELETE /job/{id} reports per-job errors in status[].error (else in errors[]).
    cancel_status: bool
    # Partitions carry their flags (DEFAULT). v0.0.40-v0.0.44 do not: there the default
    # partition is unknown over REST and the webhook needs DEFAULT_PARTITION.
    partition_flags: bool
    # GET /jobs/state?job_id=A,B answers the states of just those jobs: one request whose cost
    # follows our jobs, not the site's (recorded on 24.11 and 26.05 at v0.0.42+). Without it
    # (v0.0.38; v0.0.40/41 untested) each job of ours is read alone with GET /job/{id}.
    state_query: bool
    # slurmdbd's job list (GET /slurmdb/{version}/jobs/), filtered by name, partition and
    # start_time, is usable (slurmgate/slurm/accounting.py). 24.11's v0.0.40/v0.0.41 answer
    # any start_time 422, as they do update_time.
    dbd_jobs: bool
    # ...its start_time is a Unix time (else, v0.0.38, only Slurm's own time forms: "now-N"
    # seconds). Its lists are CSV, the commas escaped (%2C) on every release; an unescaped ':'
    # or '/' makes it "Unable to parse query".
    dbd_since_unix: bool


_V38 = Dialect(
    "v0.0.38", number_objects=False, exclusive=("exclusive", "exclusive"), script_in_job=False,
    environment_list=False, node_range=False, gpus_as_tres=False, clock_in_jobs=False,
    update_time_query=True, idle_is_304=True, node_update=False, cancel_status=False,
    partition_flags=True, state_query=False, dbd_jobs=True, dbd_since_unix=False)
_V42 = Dialect(
    "v0.0.42", number_objects=True, exclusive=("shared", ["none"]), script_in_job=True,
    environment_list=True, node_range=True, gpus_as_tres=True, clock_in_jobs=True,
    update_time_query=True, idle_is_304=False, node_update=True, cancel_status=True,
    partition_flags=False, state_query=True, dbd_jobs=True, dbd_since_unix=True)

DIALECTS: dict[str, Dialect] = {
    "v0.0.38": _V38,
    # recorded from 24.11: a DELETE of a missing job answers 200 with neither status[] nor
    # errors[], and update_time cannot be given
    "v0.0.40": replace(_V42, version="v0.0.40", cancel_status=False, update_time_query=False,
                       state_query=False, dbd_jobs=False),
    "v0.0.41": replace(_V42, version="v0.0.41", cancel_status=False, update_time_query=False,
                       state_query=False, dbd_jobs=False),
    "v0.0.42": _V42,
    "v0.0.43": replace(_V42, version="v0.0.43"),
    "v0.0.44": replace(_V42, version="v0.0.44"),
    "v0.0.45": replace(_V42, version="v0.0.45", partition_flags=True),
}
# Newest first: detection picks the first one the server offers.
SUPPORTED_VERSIONS: tuple[str, ...] = tuple(sorted(
    DIALECTS, key=lambda v: tuple(int(x) for x in re.findall(r"\d+", v)), reverse=True))


def dialect(version: str) -> Dialect:
    try:
        return DIALECTS[version]
    except KeyError:
        raise ValueError(
            f"unsupported Slurm REST version {version!r}; supported: "
            f"{', '.join(SUPPORTED_VERSIONS)}") from None


# ----------------------------------------------------------------------------- values


def _csv(v: Any) -> tuple[str, ...]:
    if isinstance(v, str):
        return tuple(x.strip() for x in v.split(",") if x.strip())
    return tuple(strs(v))


def text(v: Any, default: str = "") -> str:
    return default if v is None else str(v)


def _number(d: Dialect, n: int) -> Any:
    return {"set": True, "infinite": False, "number": n} if d.number_objects else n


# ----------------------------------------------------------------------------- records


def job_state(v: Any) -> tuple[str, frozenset[str]]:
    """A job_state as (the one state the rest of slurmgate reads, every flag Slurm gave)."""
    states = [s.upper() for s in strs(v)]
    if not states:
        return "UNKNOWN", frozenset()
    flags = frozenset(states)
    if len(states) == 1:
        return states[0], flags
    for f in JOB_FLAG_PRECEDENCE:
        if f in flags:
            return f, flags
    return states[0], flags


def _whole_nodes(d: Mapping[str, Any]) -> bool | None:
    res = d.get("job_resources")
    nodes = res.get("nodes") if isinstance(res, Mapping) else None
    whole = nodes.get("whole") if isinstance(nodes, Mapping) else None
    return whole if isinstance(whole, bool) else None


def parse_job(d: Mapping[str, Any]) -> JobInfo:
    state, flags = job_state(d.get("job_state"))
    nodes_raw = d.get("nodes")
    try:
        nodes = tuple(expand(nodes_raw if isinstance(nodes_raw, str) else None))
    except ValueError:
        nodes = ()
    comment = d.get("comment")
    return JobInfo(
        job_id=num(d.get("job_id")),
        name=text(d.get("name")),
        state=state,
        reason=text(d.get("state_reason"), "None") or "None",
        nodes=nodes,
        comment=comment if isinstance(comment, str) and comment else None,
        partition=text(d.get("partition")),
        submit_time=num(d.get("submit_time")),
        start_time=num(d.get("start_time")),
        end_time=num(d.get("end_time")),
        state_flags=flags,
        preempt_time=num(d.get("preempt_time")),
        cpus=num(d.get("cpus")),
        whole_nodes=_whole_nodes(d),
        restarts=num(d.get("restart_cnt")),
        user=text(d.get("user_name")),
        allocation=allocation.parse(d, nodes),
    )


def parse_node(d: Mapping[str, Any]) -> NodeInfo:
    raw = [s.upper() for s in strs(d.get("state"))]
    flags = {s.upper() for s in strs(d.get("state_flags"))}
    base = next((s for s in raw if s in NODE_BASE_STATES), raw[0] if raw else "UNKNOWN")
    flags |= {s for s in raw if s != base}
    return NodeInfo(
        name=text(d.get("name")),
        state=base,
        flags=frozenset(flags),
        cpus=num(d.get("cpus")),
        real_memory_mb=num(d.get("real_memory")),
        partitions=tuple(strs(d.get("partitions"))),
        reason=text(d.get("reason")),
        features=_csv(d.get("features")),
        gres=text(d.get("gres")),
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
    flags = {f.upper() for f in strs(d.get("flags"))} | {
        f.upper() for f in strs(part.get("flags"))
    }
    if "max_time_limit" in d:  # v0.0.38: minutes, -1 = INFINITE
        max_time = opt_num(d.get("max_time_limit"))
    else:
        max_v = d.get("maximums")
        maximums: Mapping[str, Any] = max_v if isinstance(max_v, Mapping) else {}
        max_time = opt_num(maximums.get("time"))
    states = [s.upper() for s in strs(part.get("state") if part else d.get("state"))]
    if "preemption_grace_time" in d:  # v0.0.38
        grace = opt_num(d.get("preemption_grace_time"))
    else:  # v0.0.40+: "grace_time": N (seconds)
        grace = opt_num(d.get("grace_time"))
    return PartitionInfo(
        name=text(d.get("name")),
        nodes=nodes,
        default="DEFAULT" in flags,
        max_time_minutes=max_time,
        state=states[0] if states else "UNKNOWN",
        grace_time_seconds=grace,
    )


# ----------------------------------------------------------------------------- requests


def submit_body(d: Dialect, spec: JobSpec) -> dict[str, Any]:
    """The JSON body for POST /job/submit: the placeholder's shape in this dialect."""
    spec.check()
    job: dict[str, Any] = {
        "name": spec.name,
        "comment": spec.comment,
        "minimum_cpus_per_node": spec.cpus,
        "tasks": spec.nodes,
        "requeue": False,
        "current_working_directory": placeholder.CWD,
        "standard_output": placeholder.OUTPUT,
        "standard_error": placeholder.OUTPUT,
        "memory_per_node": _number(d, spec.memory_mb),
    }
    if placeholder.EXCLUSIVE:
        key, value = d.exclusive
        job[key] = value
    env = placeholder.ENVIRONMENT
    job["environment"] = [f"{k}={v}" for k, v in env.items()] if d.environment_list else dict(env)
    if d.node_range:
        job["minimum_nodes"] = spec.nodes
        job["maximum_nodes"] = spec.nodes
    else:
        job["nodes"] = spec.nodes
    if spec.gpus:
        gres = f"gpu:{spec.gpu_type}:{spec.gpus}" if spec.gpu_type else f"gpu:{spec.gpus}"
        if d.gpus_as_tres:
            job["tres_per_node"] = f"gres/{gres}"
        else:
            job["gres"] = gres
    if spec.time_limit_minutes is not None:
        job["time_limit"] = _number(d, spec.time_limit_minutes)
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
    if d.script_in_job:
        job["script"] = placeholder.SCRIPT
        return {"job": job}
    return {"script": placeholder.SCRIPT, "job": job}


# ----------------------------------------------------------------------------- answers


def error_text(e: Any) -> tuple[str, int | None]:
    """One entry of errors[] / warnings[] (or a DELETE's status[].error) as text and errno."""
    if not isinstance(e, Mapping):
        return str(e), None
    n = e.get("error_number", e.get("error_code", e.get("errno", e.get("code"))))
    errno = n if isinstance(n, int) else None
    desc = text(e.get("description") or e.get("message"))
    err = text(e.get("error") or e.get("string"))
    out = desc or err or "unknown error"
    if desc and err and err not in desc:
        out = f"{desc}: {err}"
    src = text(e.get("source"))
    if src:
        out += f" [{src}]"
    if errno is not None and errno != 0:
        out += f" (errno {errno})"
    return out, errno


def body_warnings(data: Mapping[str, Any]) -> list[str]:
    """Warnings that point into the request body (source "#/job/exclusive/", ...): slurmrestd
    ignored or misread a field we sent. Other warnings (e.g. "No job changes since") are not."""
    out = []
    for w in data.get("warnings") or []:
        if isinstance(w, Mapping) and text(w.get("source")).startswith("#/"):
            out.append(error_text(w)[0])
    return out


def status_errors(data: Mapping[str, Any]) -> list[tuple[str, int | None]]:
    """Per-job errors of a DELETE /job answer (v0.0.42+ status[].error, code 0 = none)."""
    out = []
    for st in data.get("status") or []:
        err = st.get("error") if isinstance(st, Mapping) else None
        if isinstance(err, Mapping) and num(err.get("code")) != 0:
            out.append(error_text(err))
    return out


def no_changes(data: Mapping[str, Any]) -> bool:
    """A 200 answer to GET /jobs?update_time=T that means "nothing changed" (v0.0.40+)."""
    if data.get("jobs"):
        return False
    if num(data.get("last_update")) <= 0:
        return True
    return any("No job changes since" in text(w.get("description"))
               for w in data.get("warnings") or [] if isinstance(w, Mapping))

# Errors slurmctld answers a submit with while it queues the job all the same, with its id
# (slurmctld/proc_req.c): ESLURM_REQUESTED_PART_CONFIG_UNAVAILABLE, ESLURM_JOB_HELD,
# ESLURM_RESERVATION_NOT_USABLE, ESLURM_NODE_NOT_AVAIL, ESLURM_QOS_THRES (slurm_errno.h)
QUEUED_ANYWAY = frozenset({2015, 2042, 2056, 2068, 2074})


def submitted_id(answer: Mapping[str, Any]) -> int:
    """The id of the job a submit's answer names (v0.0.38: job_id; later: also result.job_id);
    -1 if none. An error answer may name one too (QUEUED_ANYWAY, or a body Slurm misread)."""
    job_id = num(answer.get("job_id"), -1)
    if job_id <= 0:
        result = answer.get("result")
        if isinstance(result, Mapping):
            job_id = num(result.get("job_id"), -1)
    return job_id
