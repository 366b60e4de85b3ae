"""Which gang a Pod belongs to: our annotations, a scheduler-plugins PodGroup, a
LeaderWorkerSet group, a JobSet, or an indexed Job (resolved through ownerReferences).

The webhook resolves it once at admission and writes the result into our own annotations
(group, group-size, group-index), so the binder reads one format only.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from slurmgate import contract, reasons
from slurmgate.kubeview import ObjectView, PodView
from slurmgate.podrequest import PodRequestError

MAX_GROUP = 512
_NAME = re.compile(r"[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?")  # fullmatch: no trailing newline

LWS_NAME = "leaderworkerset.sigs.k8s.io/name"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE = "leaderworkerset.sigs.k8s.io/size"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
POD_GROUP_LABELS = ("scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

Get = Callable[[str], Awaitable[dict[str, Any] | None]]  # API path -> object, None on 404


@dataclass(frozen=True)
class Group:
    name: str
    size: int
    index: int | None
    source: str


@dataclass(frozen=True)
class Resolved:
    group: Group | None
    owner_options: dict[str, str]  # Slurm options from the owning workload's annotations


def _int(value: Any, field: str, lo: int, hi: int) -> int:
    try:
        n = int(str(value))
    except ValueError:
        raise PodRequestError(field, f"must be an integer, got {str(value)[:32]!r}",
                              reasons.DENY_INVALID_GROUP) from None
    if not lo <= n <= hi:
        raise PodRequestError(field, f"must be between {lo} and {hi}", reasons.DENY_INVALID_GROUP)
    return n


def _options(obj: dict[str, Any] | None) -> dict[str, str]:
    ann = ObjectView(obj).annotations
    return {k: v for k, v in ann.items() if k in contract.SLURM_OPTIONS and isinstance(v, str)}


def _owner(pod: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for ref in ObjectView(pod).owner_references:
        if ref.get("kind") == kind and ref.get("controller"):
            return dict(ref)
    return None


def _check_group_numbers(ann: dict[str, Any]) -> None:
    # Checked whatever the gang's source, so a bad number is refused even where it is unused.
    for key, hi in ((contract.A_GROUP_SIZE, MAX_GROUP), (contract.A_GROUP_INDEX, MAX_GROUP - 1)):
        if key in ann:
            _int(ann[key], f"metadata.annotations[{key}]", 0 if key == contract.A_GROUP_INDEX
                 else 1, hi)


def _index_annotation(ann: dict[str, Any], size: int) -> int | None:
    if contract.A_GROUP_INDEX not in ann:
        return None
    return _int(ann[contract.A_GROUP_INDEX], f"metadata.annotations[{contract.A_GROUP_INDEX}]",
                0, size - 1)


def _annotated(ann: dict[str, Any]) -> Group:
    name = ann[contract.A_GROUP]
    field = f"metadata.annotations[{contract.A_GROUP}]"
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise PodRequestError(field, "must be a DNS label (lower case, digits, '-', '.')",
                              reasons.DENY_INVALID_GROUP)
    if contract.A_GROUP_SIZE not in ann:
        raise PodRequestError(f"metadata.annotations[{contract.A_GROUP_SIZE}]",
                              "is required with slurmgate.io/group", reasons.DENY_INVALID_GROUP)
    size = _int(ann[contract.A_GROUP_SIZE],
                f"metadata.annotations[{contract.A_GROUP_SIZE}]", 1, MAX_GROUP)
    return Group(name, size, _index_annotation(ann, size), "annotation")


async def _leaderworkerset(labels: dict[str, Any], ann: dict[str, Any], ns: str,
                           get: Get) -> tuple[Group, dict[str, Any] | None]:
    """The LeaderWorkerSet group and the LeaderWorkerSet (None if gone: its size is on the Pod)."""
    lws = await get(f"/apis/leaderworkerset.x-k8s.io/v1{ns}/leaderworkersets/"
                    f"{labels[LWS_NAME]}")
    size = _int(ann.get(LWS_SIZE, ""), f"metadata.annotations[{LWS_SIZE}]", 1, MAX_GROUP)
    index = _int(labels.get(LWS_WORKER_INDEX, "0"),
                 f"metadata.labels[{LWS_WORKER_INDEX}]", 0, size - 1)
    return Group(f"lws-{labels[LWS_NAME]}-{labels[LWS_GROUP_INDEX]}", size, index,
                 "leaderworkerset"), lws


async def _jobset(labels: dict[str, Any], ann: dict[str, Any], ns: str,
                  get: Get) -> tuple[Group, dict[str, Any]]:
    """The whole JobSet is one gang: its size is every replicated job's Pods together."""
    js = await get(f"/apis/jobset.x-k8s.io/v1alpha2{ns}/jobsets/{labels[JOBSET_NAME]}")
    if js is None:
        raise PodRequestError(f"metadata.labels[{JOBSET_NAME}]",
                              f"JobSet {labels[JOBSET_NAME]!r} not found",
                              reasons.DENY_INVALID_GROUP)
    size, offset = 0, None
    for rj in ObjectView(js).spec.get("replicatedJobs") or []:
        par = ObjectView(rj.get("template")).spec.get("parallelism") or 1
        if rj.get("name") == labels.get(JOBSET_RJOB):
            offset = size
            # the Pod's own labels: malformed is the Pod's fault, not the API's
            job_index = _int(labels.get(JOBSET_JOB_INDEX, "0"),
                             f"metadata.labels[{JOBSET_JOB_INDEX}]", 0, MAX_GROUP)
            offset += job_index * par + _int(ann.get(COMPLETION_INDEX, "0"),
                                             f"metadata.annotations[{COMPLETION_INDEX}]", 0,
                                             MAX_GROUP)
        size += (rj.get("replicas") or 1) * par
    size = _int(size, "JobSet replicatedJobs", 1, MAX_GROUP)
    return Group(f"jobset-{labels[JOBSET_NAME]}", size, offset, "jobset"), js


async def _podgroup(pg_label: str, labels: dict[str, Any], ann: dict[str, Any], ns: str,
                    get: Get) -> tuple[Group, dict[str, Any] | None]:
    """The PodGroup's gang; a PodGroup not (yet) there is sized by our own annotation."""
    pg = await get(f"/apis/scheduling.x-k8s.io/v1alpha1{ns}/podgroups/{labels[pg_label]}")
    size_raw = ObjectView(pg).spec.get("minMember") or ann.get(
        contract.A_GROUP_SIZE)
    if size_raw is None:
        raise PodRequestError(f"metadata.labels[{pg_label}]",
                              "PodGroup not found and no slurmgate.io/group-size given",
                              reasons.DENY_INVALID_GROUP)
    size = _int(size_raw, "PodGroup spec.minMember", 1, MAX_GROUP)
    return Group(f"podgroup-{labels[pg_label]}", size, _index_annotation(ann, size),
                 "podgroup"), pg


def _is_indexed_pod(job: dict[str, Any], ann: dict[str, Any]) -> bool:
    return COMPLETION_INDEX in ann and ObjectView(job).spec.get(
        "completionMode") == "Indexed"


def _indexed_job(job: dict[str, Any], ann: dict[str, Any]) -> Group | None:
    spec = job["spec"]
    par = spec.get("parallelism") or 1
    if (spec.get("completions") or par) != par:
        # waves of Pods (completions > parallelism) are not one allocation: each Pod alone
        return None
    size = _int(par, "Job spec.parallelism", 1, MAX_GROUP)
    index = _int(ann[COMPLETION_INDEX], f"metadata.annotations[{COMPLETION_INDEX}]", 0,
                 10**6)
    view = ObjectView(job)
    return Group(f"job-{view.name}-{view.uid[:8]}", size, index, "indexed-job")


async def resolve(pod: dict[str, Any], namespace: str, get: Get) -> Resolved:
    view = PodView(pod)
    labels, ann = dict(view.labels), dict(view.annotations)
    ns = f"/namespaces/{namespace}"

    # Options on the owning workload apply to its Pods (the Pod's own win).
    job_ref = _owner(pod, "Job")
    job = await get(f"/apis/batch/v1{ns}/jobs/{job_ref['name']}") if job_ref else None
    owner_opts = _options(job)
    _check_group_numbers(ann)

    # The first source that names a gang wins, in this order: our own annotation overrides
    # whatever workload the Pod also belongs to.
    if contract.A_GROUP in ann:
        return Resolved(_annotated(ann), owner_opts)
    if LWS_NAME in labels and LWS_GROUP_INDEX in labels:
        group, lws = await _leaderworkerset(labels, ann, ns, get)
        return Resolved(group, {**_options(lws), **owner_opts})
    if JOBSET_NAME in labels:
        group, js = await _jobset(labels, ann, ns, get)
        return Resolved(group, {**_options(js), **owner_opts})
    pg_label = next((lbl for lbl in POD_GROUP_LABELS if lbl in labels), None)
    if pg_label:
        group, pg = await _podgroup(pg_label, labels, ann, ns, get)
        return Resolved(group, {**_options(pg), **owner_opts})
    if job is not None and _is_indexed_pod(job, ann):
        return Resolved(_indexed_job(job, ann), owner_opts)
    return Resolved(None, owner_opts)
