"""Turn a Pod (its requests and our annotations) into what a placeholder Slurm job asks for.

Every rejection names the field, so the apiserver's denial tells the user what to fix.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from slurmgate import contract, names, quantity, reasons
from slurmgate.kubeview import PodView

INVALID = reasons.DENY_INVALID_RESOURCES  # the Pod's resources make no job

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
MAX_MEMORY = Fraction(2**50)  # 1 PiB: beyond any node; larger is a typo
MAX_CPUS = 100_000
MAX_GPUS = 1024
MAX_TIME_LIMIT_MINUTES = 366 * 24 * 60
MAX_NICE = 10_000

# A gres type goes into "gres/gpu:<type>:N": no colon, comma or slash may reach Slurm.
# Slurm feature expressions: names joined by & | , with [] () grouping and *N counts.
_CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.&|,()\[\]*:-]{1,256}$")
_TIME_RE = re.compile(
    r"^(?:(?P<d>\d{1,3})-(?P<dh>\d{1,2})(?::(?P<dm>\d{1,2})(?::(?P<ds>\d{1,2}))?)?"
    r"|(?P<h>\d{1,5}):(?P<m>\d{1,2}):(?P<s>\d{1,2})"
    r"|(?P<mm>\d{1,6}):(?P<ss>\d{1,2})"
    r"|(?P<mo>\d{1,6}))$"
)
# What the time-limit and priority annotations may hold before they are parsed at all.
_TIME_TEXT_RE = re.compile(r"^[0-9:-]{1,16}$")
_NICE_RE = re.compile(r"^[+-]?\d{1,6}$")


class PodRequestError(ValueError):
    """A Pod we must refuse; `field` names what is wrong."""

    def __init__(self, field: str, message: str,
                 reason: str = reasons.DENY_INVALID_ANNOTATION) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class PodRequest:
    memory_mib: int
    cpus: int
    gpus: int
    partition: str | None
    qos: str | None
    account: str | None
    time_limit_minutes: int | None
    constraint: str | None
    nice: int | None
    termination_grace_seconds: int
    # The Slurm user the job runs as: set only by the tenancy policy (slurmgate.tenancy), never
    # from the Pod; None = the service's SLURM_USER.
    user: str | None = None
    # Slurm's gres type of the GPUs (annotation slurmgate.io/gpu-type); None = any type
    gpu_type: str | None = None


def parse_time_limit(text: str) -> int:
    """Slurm time syntax -> minutes, rounded up (Slurm's own rounding)."""
    m = _TIME_RE.match(text)
    if not m:
        raise ValueError("expected MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")
    g = {k: int(v) for k, v in m.groupdict().items() if v is not None}
    if "d" in g:
        seconds = ((g["d"] * 24 + g["dh"]) * 60 + g.get("dm", 0)) * 60 + g.get("ds", 0)
    elif "h" in g:
        seconds = (g["h"] * 60 + g["m"]) * 60 + g["s"]
    elif "mm" in g:
        seconds = g["mm"] * 60 + g["ss"]
    else:
        seconds = g["mo"] * 60
    minutes = -(-seconds // 60)
    if minutes < 1:
        raise ValueError("must be at least one minute")
    if minutes > MAX_TIME_LIMIT_MINUTES:
        raise ValueError("longer than 366 days")
    return minutes


def _text(annotations: dict[str, str], key: str, pattern: re.Pattern[str]) -> str | None:
    value = annotations.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.isascii() or not value.isprintable():
        raise PodRequestError(f"metadata.annotations[{key}]", "must be printable ASCII")
    if not pattern.fullmatch(value):
        raise PodRequestError(
            f"metadata.annotations[{key}]", f"invalid value {value[:64]!r}"
        )
    return value


def _annotations(pod: dict[str, Any]) -> dict[str, str]:
    ann = (pod.get("metadata") or {}).get("annotations") or {}
    if not isinstance(ann, dict):
        raise PodRequestError("metadata.annotations", "must be a map")
    return ann


def _check_unknown(ann: dict[str, str]) -> None:
    ours = {k for k in ann if isinstance(k, str) and k.startswith(contract.DOMAIN + "/")}
    known = set(contract.USER_ANNOTATIONS)
    # Status annotations we write ourselves may be present on re-invocation; they are not input.
    known |= {contract.A_CLAIM, *contract.STATUS_ANNOTATIONS}
    unknown = sorted(ours - known)
    if unknown:
        allowed = ", ".join(sorted(contract.USER_ANNOTATIONS))
        raise PodRequestError(
            f"metadata.annotations[{unknown[0]}]", f"unknown annotation (allowed: {allowed})"
        )


def _container_requests(c: dict[str, Any], name: str) -> dict[str, Fraction]:
    res = c.get("resources") or {}
    if not isinstance(res, dict):
        raise PodRequestError(f"{name}.resources", "must be a map")
    out: dict[str, Fraction] = {}
    # Kubernetes defaults a missing request to the limit; do the same.
    for section in ("limits", "requests"):
        values = res.get(section) or {}
        if not isinstance(values, dict):
            raise PodRequestError(f"{name}.resources.{section}", "must be a map")
        for key, raw in values.items():
            try:
                q = quantity.parse(raw)
            except quantity.QuantityError as e:
                raise PodRequestError(f"{name}.resources.{section}[{key}]", str(e),
                                      INVALID) from None
            if q < 0:
                raise PodRequestError(f"{name}.resources.{section}[{key}]", "is negative",
                                      INVALID)
            out[key] = q
    return out


def effective_requests(pod: dict[str, Any]) -> dict[str, Fraction]:
    """Pod-level request per resource: max(sum of containers, largest init container)."""
    spec = pod.get("spec") or {}
    if not isinstance(spec, dict):
        raise PodRequestError("spec", "must be a map", INVALID)
    total: dict[str, Fraction] = {}
    for section in ("containers", "initContainers"):
        if not isinstance(spec.get(section) or [], list):
            raise PodRequestError(f"spec.{section}", "must be a list", INVALID)
    for i, c in enumerate(spec.get("containers") or []):
        if not isinstance(c, dict):
            raise PodRequestError(f"spec.containers[{i}]", "must be a map", INVALID)
        for k, v in _container_requests(c, f"spec.containers[{i}]").items():
            total[k] = total.get(k, Fraction(0)) + v
    for i, c in enumerate(spec.get("initContainers") or []):
        if not isinstance(c, dict):
            raise PodRequestError(f"spec.initContainers[{i}]", "must be a map", INVALID)
        for k, v in _container_requests(c, f"spec.initContainers[{i}]").items():
            total[k] = max(total.get(k, Fraction(0)), v)
    return total


def _memory(req: dict[str, Fraction], default_memory: str | None) -> Fraction:
    mem = req.get("memory")
    if mem is None or mem == 0:
        if default_memory is None:
            raise PodRequestError(
                "spec.containers[].resources.requests.memory",
                "a memory request is required for Pods scheduled by Slurm "
                "(Slurm sizes the placeholder job from it)",
                reasons.DENY_MISSING_MEMORY_REQUEST,
            )
        mem = quantity.parse(default_memory)
    if mem > MAX_MEMORY:
        raise PodRequestError("spec.containers[].resources.requests.memory",
                              "is absurdly large (over 1 PiB)", INVALID)
    return mem


def _cpus(req: dict[str, Fraction]) -> Fraction:
    cpu = req.get("cpu", Fraction(1))
    if cpu > MAX_CPUS:
        raise PodRequestError("spec.containers[].resources.requests.cpu",
                              f"is absurdly large (over {MAX_CPUS})", INVALID)
    return cpu


def _gpu_sum(req: dict[str, Fraction]) -> Fraction:
    return sum((req.get(g, Fraction(0)) for g in GPU_RESOURCES), Fraction(0))


def _gpus(req: dict[str, Fraction]) -> Fraction:
    gpus = _gpu_sum(req)
    if gpus.denominator != 1 or gpus > MAX_GPUS:
        raise PodRequestError("spec.containers[].resources.requests[nvidia.com/gpu]",
                              "must be a whole number up to 1024", INVALID)
    return gpus


def _time_limit(ann: dict[str, str]) -> int | None:
    raw = _text(ann, contract.A_TIME_LIMIT, _TIME_TEXT_RE)
    if raw is None:
        return None
    try:
        return parse_time_limit(raw)
    except ValueError as e:
        raise PodRequestError(f"metadata.annotations[{contract.A_TIME_LIMIT}]",
                              f"{raw!r}: {e}") from None


def _nice(ann: dict[str, str]) -> int | None:
    raw = _text(ann, contract.A_PRIORITY, _NICE_RE)
    if raw is None:
        return None
    nice = int(raw)
    if abs(nice) > MAX_NICE:
        raise PodRequestError(f"metadata.annotations[{contract.A_PRIORITY}]",
                              f"must be between -{MAX_NICE} and {MAX_NICE}")
    return nice


def _gpu_type(ann: dict[str, str], gpus: Fraction) -> str | None:
    gpu_type = _text(ann, contract.A_GPU_TYPE, names.SLURM_NAME)
    # A type on a Pod without GPUs is a mistake the user should hear of, not a no-op.
    if gpu_type is not None and not gpus:
        raise PodRequestError(f"metadata.annotations[{contract.A_GPU_TYPE}]",
                              f"names GPU type {gpu_type!r} but the Pod requests no GPUs "
                              f"({' or '.join(GPU_RESOURCES)})")
    return gpu_type


def _grace_seconds(pod: dict[str, Any]) -> int:
    return PodView(pod).grace_seconds


def from_pod(pod: dict[str, Any], default_memory: str | None = None,
             default_partition: str | None = None) -> PodRequest:
    # The checks run in this order, and the first failure is the denial the user sees.
    ann = _annotations(pod)
    _check_unknown(ann)
    req = effective_requests(pod)
    mem = _memory(req, default_memory)
    cpu = _cpus(req)
    gpus = _gpus(req)
    time_limit = _time_limit(ann)
    nice = _nice(ann)
    gpu_type = _gpu_type(ann, gpus)
    grace = _grace_seconds(pod)
    return PodRequest(
        memory_mib=max(1, quantity.to_mib_ceil(mem)),
        cpus=max(1, quantity.to_int_ceil(cpu)),
        gpus=int(gpus),
        partition=_text(ann, contract.A_PARTITION, names.SLURM_NAME) or default_partition,
        qos=_text(ann, contract.A_QOS, names.SLURM_NAME),
        account=_text(ann, contract.A_ACCOUNT, names.SLURM_NAME),
        time_limit_minutes=time_limit,
        constraint=_text(ann, contract.A_CONSTRAINT, _CONSTRAINT_RE),
        nice=nice,
        termination_grace_seconds=grace,
        gpu_type=gpu_type,
    )


def gpus_of(pod: dict[str, Any]) -> tuple[int, str | None]:
    """(GPUs, type) a Pod asks for, for the binder's check of a Node; (0, None) for a Pod whose
    requests cannot be read (admission refused those already)."""
    try:
        req = effective_requests(pod)
    except PodRequestError:
        return 0, None
    gpus = _gpu_sum(req)
    value = _annotations_or_empty(pod).get(contract.A_GPU_TYPE)
    kind = value if isinstance(value, str) and names.SLURM_NAME.fullmatch(value) else None
    return int(gpus), kind if gpus else None


def _annotations_or_empty(pod: dict[str, Any]) -> dict[str, Any]:
    return dict(PodView(pod).annotations)
