"""What admission does with a marked Pod, decided without a server, a Slurm or a clock.

`identify` and `admit` are pure: a Pod, the node inventory, the tenancy policy and the settings
in, a Denial or an Admit out. admission.py performs the result (the submit, the patch, the
metrics); tests/unit/test_admission_decide.py checks the decisions alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slurmgate import contract, names, podrequest, priorities, reasons, tenancy
from slurmgate.groups import Group, Resolved
from slurmgate.nodemap import NodeMap
from slurmgate.podrequest import PodRequest
from slurmgate.slurm.placeholder import pod_display_name

from .config import Settings
from .grace import check_grace
from .validate import check_fit

# A Pod copied from another may carry our status annotations: never trust them.
STALE = contract.STATUS_ANNOTATIONS

# What an admitted Pod gets (the DECISIONS metric's labels)
GATED_GROUP = "gated_group"  # a gang member: the binder submits once all are there
DRY_RUN = "dry_run"  # a dryRun create: nothing is submitted
SUBMIT_PENDING = "gated_submit_pending"  # fail-open, no inventory: the binder submits later
SUBMIT = "submit"  # submit the placeholder job now, then gate


@dataclass(frozen=True)
class Denial:
    reason: str  # reasons.DENY_* (or a verdict's)
    message: str
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Identity:
    namespace: str
    display: str  # the Pod's name, or its generateName with a placeholder


@dataclass(frozen=True)
class Admit:
    """Gate the Pod: write `annotations`, drop `drop`, and for SUBMIT submit `request` first.
    `grace`: the Pod's lowered terminationGracePeriodSeconds, None to keep it."""
    kind: str
    request: PodRequest
    annotations: dict[str, str]
    drop: tuple[str, ...] = STALE
    grace: int | None = None
    warnings: tuple[str, ...] = ()
    claim: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


def identify(req: dict[str, Any], pod: dict[str, Any], meta: dict[str, Any]
             ) -> Identity | Denial:
    """The Pod's namespace and a name fit for its job (the apiserver validates names only after
    admission; ours go into the job's name). Before anything is looked up for the Pod: a Pod
    that names its Node is refused as it stands."""
    namespace = req.get("namespace") or meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        return Denial(reasons.DENY_INVALID_OBJECT, "namespace must be a string")
    name = meta.get("name") or ""
    gen = meta.get("generateName") or ""
    if not isinstance(name, str) or not isinstance(gen, str):
        return Denial(reasons.DENY_INVALID_OBJECT, "metadata.name must be a string")
    if not all(names.DNS_SUBDOMAIN.fullmatch(n) for n in (name, gen.rstrip("-")) if n):
        return Denial(reasons.DENY_INVALID_OBJECT, "metadata.name/generateName must be a DNS "
                      "subdomain (lower case letters, digits, '-', '.')")
    spec = pod.get("spec")
    if isinstance(spec, dict) and spec.get("nodeName"):
        return Denial(reasons.DENY_NODE_NAME_SET, "spec.nodeName is set: Slurm chooses the Node "
                      "for this Pod; remove spec.nodeName or the slurmgate.io/scheduler label")
    return Identity(namespace, pod_display_name(meta))


def admit(pod: dict[str, Any], who: Identity, resolved: Resolved, settings: Settings,
          policy: tenancy.PolicyState, nodes: NodeMap | None, claim: str,
          dry_run: bool = False) -> Admit | Denial:
    """Everything else admission decides about a marked Pod `identify` let through, once its
    gang (if any) is resolved. `claim`: the one a single Pod gets (fresh for each review)."""
    meta = pod.get("metadata") or {}
    spec: dict[str, Any] = pod["spec"] if isinstance(pod.get("spec"), dict) else {}
    own = meta.get("annotations") or {}
    extra = {k: v for k, v in resolved.owner_options.items() if k not in own}
    if extra:  # options from the owning Job/JobSet/LWS, validated like the Pod's own
        pod = {**pod, "metadata": {**meta, "annotations": {**own, **extra}}}
    try:
        r = podrequest.from_pod(pod, settings.default_memory, settings.default_partition)
        # Before the fit check (it sees the tenant's partition) and for gang members too,
        # whose job the binder submits later: a forbidden gang is refused up front. The Pod's
        # PriorityClass (slurmgate.priorities) applies before the tenant's check.
        r = tenancy.check(policy, who.namespace, r, *priorities.of_pod(pod))
    except podrequest.PodRequestError as e:
        return Denial(e.reason, str(e))
    except tenancy.TenancyDenied as e:
        return Denial(e.reason, e.message)
    fit = _fit(r, nodes, settings)
    if isinstance(fit, Denial):
        return fit
    warnings, grace = fit
    if grace is not None:
        extra[contract.A_REQUESTED_GRACE] = str(r.termination_grace_seconds)
    sched = spec.get("schedulerName")
    if sched and sched not in ("default-scheduler", contract.SCHEDULER_NAME):
        warnings.append(f"spec.schedulerName {sched!r} replaced by {contract.SCHEDULER_NAME!r}: "
                        "Slurm places this Pod")
    if resolved.group is not None:
        return _gang_member(resolved.group, r, nodes, extra, grace, tuple(warnings))
    annotations = {**extra, contract.A_CLAIM: claim}
    kind = SUBMIT
    if dry_run:
        kind, annotations[contract.A_JOB_STATE] = DRY_RUN, contract.JOB_STATE_DRY_RUN
    elif nodes is None:  # fail-open without an inventory: never submit unvalidated
        kind, annotations[contract.A_JOB_STATE] = (SUBMIT_PENDING,
                                                   contract.JOB_STATE_SUBMIT_PENDING)
        grace = None  # no inventory: no partition GraceTime to hold it to
    return Admit(kind, r, annotations, grace=grace, warnings=tuple(warnings), claim=claim)


def _fit(r: PodRequest, nodes: NodeMap | None,
         settings: Settings) -> tuple[list[str], int | None] | Denial:
    """(warnings, lowered grace) once the request fits a node beside its slurmd and the
    partition's GraceTime leaves the Pod time to stop."""
    if nodes is None:
        if not settings.fail_open:
            return Denial(reasons.DENY_INVENTORY_UNAVAILABLE, "the Slurm node inventory is not "
                          "loaded (Slurm unreachable since this webhook started?); retry "
                          "shortly")
        return ["Slurm's node inventory is not loaded: the Pod is admitted gated without the "
                "fit check; its job is submitted when Slurm answers"], None
    verdict = check_fit(r, nodes)
    if not verdict.allowed:
        return Denial(verdict.reason, verdict.message, verdict.warnings)
    warnings = list(verdict.warnings)
    held = check_grace(r, nodes, settings.long_grace)
    if not held.allowed:
        return Denial(held.reason, held.message, tuple(warnings))
    if held.warning:
        warnings.append(held.warning)
    return warnings, held.clamp_to


def _gang_member(group: Group, r: PodRequest, nodes: NodeMap | None, extra: dict[str, str],
                 grace: int | None, warnings: tuple[str, ...]) -> Admit | Denial:
    """A gang's job is submitted by the binder once every member is there; a gang larger than
    the nodes that fit one member can never start, so it is refused now."""
    if nodes is not None:
        fitting = [c for c in nodes.in_partition(r.partition)
                   if c.memory_mib >= r.memory_mib and c.cpus >= r.cpus]
        if group.size > len(fitting):
            return Denial(reasons.DENY_GROUP_TOO_LARGE,
                          f"group {group.name!r} needs {group.size} Nodes at once; partition "
                          f"{r.partition or nodes.default_partition!r} has {len(fitting)} that "
                          "fit one member")
    annotations = {**extra, contract.A_GROUP: group.name, contract.A_GROUP_SIZE: str(group.size),
                   contract.A_JOB_STATE: contract.JOB_STATE_GROUP_PENDING}
    if group.index is not None:
        annotations[contract.A_GROUP_INDEX] = str(group.index)
    return Admit(GATED_GROUP, r, annotations, drop=(*STALE, contract.A_CLAIM), grace=grace,
                 warnings=warnings)
