"""What the binder reads of a Pod and of a Slurm job, as plain functions of the objects.

Shared by the decision (decide.py), the index and the actions, so that "bound", "live" or
"the status a job implies" mean one thing everywhere.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from slurmgate import contract, podrequest, quantity, reasons
from slurmgate.kubeview import NodeView, PodView
from slurmgate.slurm import (
    ALLOCATED_STATES,
    MAY_HOLD_NODE_STATES,
    RELEASED_STATES,
    RUNNING,
    STOPPING_STATES,
    WAITING_STATES,
    JobInfo,
)
from slurmgate.timestamps import format_time, parse_time

Pod = dict[str, Any]


@dataclass(frozen=True)
class NodeRef:
    """What the binder reads of a Kubernetes Node (the decision, the index and the drain sync
    alike): its Slurm node label, cordon and GPUs. kwok's and kubelets' status heartbeats
    change none of them, so they need no work."""
    name: str
    unschedulable: bool
    gpus: int = 0  # allocatable GPUs (nvidia.com/gpu, amd.com/gpu)
    gpu_type: str | None = None  # label slurmgate.io/gpu-type; None = unlabelled
    slurm_node: str | None = None  # label slurmgate.io/slurm-node; None: not a Slurm Node


def node_ref(node: dict[str, Any] | None) -> NodeRef | None:
    if node is None:
        return None
    n = NodeView(node)
    alloc = n.allocatable
    gpus = 0
    for g in podrequest.GPU_RESOURCES:
        try:
            gpus += int(quantity.parse(alloc.get(g, "0")))
        except quantity.QuantityError:
            pass  # a Node that states no sane count offers no GPUs
    return NodeRef(n.name, n.unschedulable, gpus, n.labels.get(contract.NODE_GPU_TYPE_LABEL),
                   n.slurm_node)


def ann(pod: Pod) -> Mapping[str, str]:
    return PodView(pod).annotations


def key_of(pod: Pod) -> str:
    return PodView(pod).key


def is_gated(pod: Pod) -> bool:
    return PodView(pod).gated


def bound(pod: Pod) -> bool:
    return PodView(pod).bound


def phase(pod: Pod) -> str | None:
    return PodView(pod).phase


def live(pod: Pod) -> bool:
    """Neither deleted nor finished: it still wants its node."""
    v = PodView(pod)
    return not v.deleting and not v.finished


def occupies(pod: Pod) -> bool:
    """Bound and its containers may still run (a deleted Pod terminates for a while): its job
    must keep the Node until then, or Slurm would start another job beside it."""
    v = PodView(pod)
    return v.bound and not v.finished


def rank_key(pod: Pod) -> tuple[int, str]:
    raw = ann(pod).get(contract.A_GROUP_INDEX)
    idx = int(raw) if raw and raw.isdigit() else 1 << 30
    return idx, PodView(pod).name


def size_of(members: list[Pod]) -> int:
    sizes = [int(s) for p in members if (s := ann(p).get(contract.A_GROUP_SIZE, "")).isdigit()]
    return max(sizes) if sizes else 0


def live_claim(members: list[Pod]) -> str | None:
    """The claim most live members hold: the unit's current job."""
    claims = Counter(c for p in members if live(p) and (c := claim_of(p)))
    return claims.most_common(1)[0][0] if claims else None


def created(pod: Pod) -> float:
    return parse_time(PodView(pod).created) or 0.0


def submitted_at(pods: list[Pod]) -> float:
    """When the newest of these Pods' jobs was submitted (0 when unknown)."""
    try:
        return max((float(ann(p).get(contract.A_SUBMITTED_AT, "0") or 0) for p in pods),
                   default=0.0)
    except ValueError:
        return 0.0


def handoff_left(gated: tuple[Pod, ...], now: float, grace: float) -> float:
    """Seconds the webhook's handed-off submit for these Pods may still be in flight (0: not
    handed off, or past the grace)."""
    if not any(ann(p).get(contract.A_JOB_STATE) == contract.JOB_STATE_SUBMITTING
               for p in gated):
        return 0.0
    # clamped: the annotation is the Pod's, and a clock ahead of ours must not park it
    return min(grace, max(0.0, submitted_at(list(gated)) + grace - now))


def holds_node(job: JobInfo) -> bool:
    """The job's placeholder may still be on its Node (PREEMPTED included, see models.py)."""
    return job.state not in RELEASED_STATES


def placeholder_keeps(job: JobInfo | None, slurm_node: str) -> bool:
    """The job's placeholder runs on this Slurm node, so Slurm keeps the node for it. Not a job
    on its way out (COMPLETING, PREEMPTED): on a node that failed, Slurm frees the node the
    moment its slurmd registers again, with no KillWait or GraceTime for our Pod to use."""
    return (job is not None and slurm_node in job.nodes
            and job.state in ALLOCATED_STATES - MAY_HOLD_NODE_STATES)


def needs_kill(job: JobInfo) -> bool:
    """Releasing the job's Node takes our KILL: it holds the Node and Slurm is not already
    releasing it (COMPLETING is usually our own KILL at work)."""
    return job.state not in STOPPING_STATES


def job_status(job: JobInfo, slurm_node: str | None = None) -> dict[str, str]:
    """The status annotations a Pod of this job converges to (an empty value: none)."""
    start = job.expected_start
    st = {contract.A_JOB_ID: str(job.job_id), contract.A_JOB_STATE: job.state,
          contract.A_JOB_REASON: job.reason if job.reason not in ("", "None") else "",
          contract.A_EXPECTED_START: format_time(start) if start is not None else ""}
    if slurm_node:
        st[contract.A_SLURM_NODE] = slurm_node
        # once read (the whole record after a start); a later answer without it (a list's
        # entry, a pushed start) leaves the annotation as it is
        if (a := job.allocation_on(slurm_node)) is not None:
            st[contract.A_ALLOCATION] = a.describe()
    return st


# Slurm's backfill plans again every cycle and its expected start may drift by seconds as other
# jobs end early: shown again only once it moved by more than this (or came or went), so that a
# busy queue does not cost a Pod patch and an Event per cycle
EXPECTED_START_SLACK = 30.0


# Slurm's expected start is a plan that slips as jobs ahead run to their limits; a waiting Pod
# counts as overdue (slurmgate_binder_overdue_pods, an alert) only once it is this far past it
OVERDUE_AFTER = 300.0


def overdue(pod: Pod, now: float) -> bool:
    """The Pod waits although Slurm expected its job to start over OVERDUE_AFTER ago."""
    expected = parse_time(ann(pod).get(contract.A_EXPECTED_START))
    return expected is not None and not bound(pod) and now - expected > OVERDUE_AFTER


def _same_plan(shown: str, start: float | None) -> bool:
    """The expected start the Pod shows is, within the slack, Slurm's plan `start`."""
    t = parse_time(shown) if shown else None
    return t is not None and start is not None and abs(t - start) <= EXPECTED_START_SLACK


def stale_status(pod: Pod, want: dict[str, str]) -> bool:
    have = ann(pod)
    for k, v in want.items():
        old = have.get(k, "")
        if k == contract.A_EXPECTED_START and v and _same_plan(old, parse_time(v)):
            continue
        if old != v:
            return True
    return False


# --- the Pod condition that shows Slurm's decision (contract.COND_ALLOCATED) ---
Condition = dict[str, str]


def condition(pod: Pod) -> Mapping[str, Any] | None:
    return PodView(pod).condition(contract.COND_ALLOCATED)


def condition_stale(pod: Pod, want: Condition) -> bool:
    have = condition(pod) or {}
    return any(have.get(k) != v for k, v in want.items())


def _reason_word(slurm_reason: str, state: str) -> str:
    """A condition reason is one CamelCase word: Slurm's "ReqNodeNotAvail, UnavailableNodes:n1"
    becomes ReqNodeNotAvail (the message keeps it whole)."""
    word = re.sub(r"[^A-Za-z0-9]", "", re.split(r"[,:( ]", slurm_reason, maxsplit=1)[0])
    return word if slurm_reason not in ("", "None") and word else state.title().replace("_", "")


def expected_start_words(job: JobInfo, shown: str | None = None) -> str:
    """"; Slurm expects it to start at <time>" when Slurm has a plan for the job, else "".
    `shown`: the time the Pod shows already, kept while the plan drifts within the slack (the
    condition then says what the annotation says, and is not written again)."""
    start = job.expected_start
    if start is None:
        return ""
    at = format_time(start)
    if shown and _same_plan(shown, start):
        at = shown
    return f"; Slurm expects it to start at {at}"


def waiting_condition(job: JobInfo, shown: str | None = None) -> Condition:
    why = f": {job.reason}" if job.reason not in ("", "None") else ""
    return {"type": contract.COND_ALLOCATED, "status": "False",
            "reason": _reason_word(job.reason, job.state),
            "message": f"Slurm job {job.job_id} is {job.state} in partition {job.partition}"
                       f"{why}{expected_start_words(job, shown)}; the Pod stays gated "
                       f"({contract.GATE})"
                       " until Slurm allocates a node"}


def allocated_condition(job_id: int | str, slurm_node: str, node: str) -> Condition:
    return {"type": contract.COND_ALLOCATED, "status": "True",
            "reason": reasons.COND_REASON_ALLOCATED,
            "message": f"Slurm job {job_id} runs on Slurm node {slurm_node}; bound to Node "
                       f"{node}"}


def submit_pending_condition() -> Condition:
    return {"type": contract.COND_ALLOCATED, "status": "False",
            "reason": reasons.COND_REASON_SUBMIT_PENDING,
            "message": "Slurm did not take the job at admission; the binder submits it once "
                       f"Slurm answers (the Pod stays gated by {contract.GATE})"}


def group_pending_condition(group: str, size: int) -> Condition:
    return {"type": contract.COND_ALLOCATED, "status": "False",
            "reason": reasons.COND_REASON_GROUP_PENDING,
            "message": f"waiting for all {size} members of group {group}; its Slurm job is "
                       f"submitted then (the Pod stays gated by {contract.GATE})"}


def lacks_gpus(p: Pod, ref: NodeRef) -> str | None:
    """What the Node lacks of the GPUs the Pod asks for, or None. Slurm counted its own gres;
    the kubelet admits the Pod by the Node's allocatable, and a Pod bound where that is short
    fails (OutOfnvidia.com/gpu) instead of running. A Node without the type label is trusted:
    the type is Slurm's notion, and Slurm matched it."""
    gpus, kind = podrequest.gpus_of(p)
    if gpus and ref.gpus < gpus:
        return f"has {ref.gpus} allocatable GPUs, the Pod requests {gpus}"
    if kind and ref.gpu_type is not None and ref.gpu_type != kind:
        return (f"has GPUs of type {ref.gpu_type} ({contract.NODE_GPU_TYPE_LABEL}), the Pod "
                f"asks for {kind}")
    return None


def claim_of(pod: Pod) -> str | None:
    """The claim a Pod holds (its single job's, or its gang's once given), None for none."""
    return ann(pod).get(contract.A_CLAIM) or None


def expected_condition(p: Pod, claim: str | None, job: JobInfo | None, gang: bool,
                       group_size: int) -> Condition | None:
    """The SlurmAllocated condition Pod p should show, given its unit's claim and job (None:
    nothing to say, e.g. a Pod of another claim)."""
    mine = claim_of(p)
    if gang and not mine and is_gated(p):
        return group_pending_condition(ann(p).get(contract.A_GROUP, ""), group_size)
    if mine is None or mine != claim:
        return None
    if job is None:
        pending = ann(p).get(contract.A_JOB_STATE) == contract.JOB_STATE_SUBMIT_PENDING
        return submit_pending_condition() if pending and not bound(p) else None
    if job.state in WAITING_STATES and not bound(p):
        return waiting_condition(job, ann(p).get(contract.A_EXPECTED_START))
    slurm_node = ann(p).get(contract.A_SLURM_NODE)
    if job.state == RUNNING and not job.preempted and bound(p) and slurm_node:
        return allocated_condition(job.job_id, slurm_node, PodView(p).node_name)
    return None
