"""The binder's state machine as a pure function: (Pod, its job, the world) -> one decision.

Level-triggered: the decision depends only on what is observed now, so a restart at any
moment just decides again. Unit-tested without any cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from slurmgate import contract
from slurmgate.slurm import ENDING_STATES, RELEASED_STATES, RUNNING, WAITING_STATES, JobInfo


def holds_node(job: JobInfo) -> bool:
    """The job's placeholder may still be on its Node: releasing it takes our KILL."""
    return job.state not in RELEASED_STATES


# The Event reason that tells a user why Slurm took the Node back, by the job's end state.
# PREEMPTED needs no entry: end_reason() asks JobInfo.preempted, which also covers a job still
# RUNNING through its GraceTime.
END_REASONS = {
    "CANCELLED": contract.EV_JOB_CANCELLED,
    "TIMEOUT": contract.EV_JOB_TIME_LIMIT,
    "DEADLINE": contract.EV_JOB_TIME_LIMIT,
    "NODE_FAIL": contract.EV_NODE_FAILED,
}

NOTHING = "Nothing"
WAIT = "Wait"
SUBMIT = "Submit"
STATUS = "UpdateStatus"
BIND = "Bind"
EVICT = "Evict"
CANCEL = "Cancel"
RESUBMIT = "Resubmit"


@dataclass(frozen=True)
class NodeRef:
    name: str
    unschedulable: bool


@dataclass(frozen=True)
class World:
    slurm_synced: bool  # a full, successful job list has been seen
    now: float  # wall clock seconds
    node_for: dict[str, NodeRef] = field(default_factory=dict)  # Slurm node -> k8s Node
    vanish_grace: float = 60.0  # how long a fresh job may be missing from Slurm's list


@dataclass(frozen=True)
class Decision:
    action: str
    node: str | None = None
    reason: str = ""
    message: str = ""
    status: dict[str, str] = field(default_factory=dict)  # annotations to converge to
    requeue_after: float | None = None


def _ann(pod: dict[str, Any]) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def is_gated(pod: dict[str, Any]) -> bool:
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == contract.GATE for g in gates)


def job_status(job: JobInfo) -> dict[str, str]:
    st = {contract.A_JOB_ID: str(job.job_id), contract.A_JOB_STATE: job.state,
          contract.A_JOB_REASON: job.reason if job.reason not in ("", "None") else ""}
    if job.nodes:
        st[contract.A_SLURM_NODE] = job.nodes[0]
    return st


def _status_if_changed(pod: dict[str, Any], job: JobInfo) -> dict[str, str]:
    want = job_status(job)
    have = _ann(pod)
    return want if any(have.get(k, "") != v for k, v in want.items()) else {}


def end_reason(job: JobInfo) -> str:
    """Why a Pod is evicted from its job's Node; one answer for single Pods and gangs."""
    if job.preempted:
        return contract.EV_JOB_PREEMPTED
    return END_REASONS.get(job.state, contract.EV_JOB_ENDED)


def decide(pod: dict[str, Any], job: JobInfo | None, w: World) -> Decision:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ann = _ann(pod)
    phase = (pod.get("status") or {}).get("phase")
    bound = bool(spec.get("nodeName"))
    job_active = job is not None and holds_node(job)

    # --- Pod going away or done: release Slurm's node, but only once the Pod has stopped.
    if meta.get("deletionTimestamp"):
        if job is not None and job_active and not bound:
            return Decision(CANCEL, reason=contract.EV_JOB_RELEASED,
                            message=f"Pod deleted before it started; cancelled job {job.job_id}")
        return Decision(NOTHING)  # bound: cancel when the Pod is gone (keeps the invariant)
    if phase in ("Succeeded", "Failed"):
        if job is not None and job.state not in ENDING_STATES:
            return Decision(CANCEL, reason=contract.EV_JOB_RELEASED,
                            message=f"Pod {phase}; cancelled job {job.job_id} to free the node")
        return Decision(NOTHING)

    if not bound:
        if job is None:
            if (ann.get(contract.A_JOB_STATE) == contract.JOB_STATE_SUBMIT_PENDING
                    or not ann.get(contract.A_JOB_ID)):
                return Decision(SUBMIT, reason=contract.EV_JOB_SUBMITTED)
            if not w.slurm_synced:
                return Decision(WAIT, requeue_after=1.0)
            try:
                submitted = float(ann.get(contract.A_SUBMITTED_AT, "0"))
            except ValueError:
                submitted = 0.0
            if w.now - submitted < w.vanish_grace:
                return Decision(WAIT, requeue_after=max(1.0, w.vanish_grace / 4))
            return Decision(RESUBMIT, reason=contract.EV_JOB_VANISHED,
                            message=f"job {ann.get(contract.A_JOB_ID)} is no longer known to "
                                    "Slurm; submitted a new placeholder job")
        if job.state in WAITING_STATES:
            st = _status_if_changed(pod, job)
            if not st:
                return Decision(NOTHING)
            return Decision(STATUS, status=st, reason=contract.EV_JOB_PENDING,
                            message=f"job {job.job_id} {job.state}: {job.reason}")
        if job.state == RUNNING and not job.preempted:
            if not job.nodes:
                return Decision(WAIT, requeue_after=0.5)
            ref = w.node_for.get(job.nodes[0])
            if ref is None:
                return Decision(WAIT, requeue_after=5.0, reason=contract.EV_NODE_NOT_FOUND,
                                message=f"Slurm allocated {job.nodes[0]} but no Kubernetes Node "
                                        f"has label {contract.NODE_LABEL}={job.nodes[0]}")
            if ref.unschedulable:
                return Decision(RESUBMIT, reason=contract.EV_NODE_CORDONED,
                                message=f"Slurm allocated {job.nodes[0]} but Node {ref.name} is "
                                        f"cordoned; cancelled job {job.job_id} and resubmitted")
            return Decision(BIND, node=ref.name, status=job_status(job), reason=contract.EV_BOUND,
                            message=f"Slurm job {job.job_id} allocated {job.nodes[0]}; "
                                    f"bound to Node {ref.name}")
        return Decision(EVICT, reason=end_reason(job), status=job_status(job),
                        message=f"Slurm job {job.job_id} ended ({job.state}"
                                + (", preempted" if job.preempted else "")
                                + ") before the Pod started")

    # --- bound: the Pod runs as long as its job holds the node.
    if job is None:
        if not w.slurm_synced or not ann.get(contract.A_JOB_ID):
            return Decision(NOTHING)
        return Decision(EVICT, reason=contract.EV_JOB_VANISHED,
                        message=f"job {ann.get(contract.A_JOB_ID)} is no longer known to Slurm")
    if job.state == RUNNING and not job.preempted:
        st = _status_if_changed(pod, job)
        return Decision(STATUS, status=st) if st else Decision(NOTHING)
    if job.state in ENDING_STATES or job.state in WAITING_STATES or job.preempted:
        return Decision(EVICT, reason=end_reason(job), status=job_status(job),
                        message=f"Slurm job {job.job_id} is {job.state}"
                                + (" (preempted by Slurm)" if job.preempted else "")
                                + (f" ({job.reason})" if job.reason not in ("", "None") else "")
                                + "; the Node goes back to Slurm")
    return Decision(NOTHING)
