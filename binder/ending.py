"""Why a Pod is evicted from its job's Node: the Event reason, from what Slurm says ended the
job. One mapping for single Pods and gangs (decide.py uses it for both)."""

from __future__ import annotations

from slurmgate import reasons
from slurmgate.slurm import COMPLETING, JobInfo

from .podview import Pod, bound

# The Event reason that tells a user why Slurm took the Node back, by the job's end state.
# PREEMPTED needs no entry: end_reason() asks JobInfo.preempted, which also covers a job still
# RUNNING through its GraceTime.
END_REASONS = {
    "CANCELLED": reasons.EV_JOB_CANCELLED,
    "TIMEOUT": reasons.EV_JOB_TIME_LIMIT,
    "DEADLINE": reasons.EV_JOB_TIME_LIMIT,
    "NODE_FAIL": reasons.EV_NODE_FAILED,
}
# While the job is COMPLETING its end state may not be known yet (22.05 says only
# COMPLETING), but Slurm's reason already tells a time limit or a node failure.
END_BY_SLURM_REASON = {
    "TimeLimit": reasons.EV_JOB_TIME_LIMIT,
    "Deadline": reasons.EV_JOB_TIME_LIMIT,
    "NodeDown": reasons.EV_NODE_FAILED,
}

# The same, in words, for the Event's message.
ENDED_BY = {
    reasons.EV_JOB_PREEMPTED: "was preempted",
    reasons.EV_JOB_CANCELLED: "was cancelled",
    reasons.EV_JOB_TIME_LIMIT: "hit its time limit",
    reasons.EV_NODE_FAILED: "lost its node",
}


def end_unclear(job: JobInfo) -> bool:
    """Whether Slurm's answer alone cannot tell why the job ends: 22.05 shows a job that is
    COMPLETING without any reason both after a `scancel` and, for a moment before it requeues
    it, after its node went DOWN. The node's state tells them apart."""
    return (not job.preempted and job.state == COMPLETING and job.reason in ("", "None")
            and not any(st in END_REASONS for st in job.state_flags))


def end_reason(job: JobInfo, node_failed: bool = False) -> str:
    """Why a Pod is evicted from its job's Node: from the end state (24.11+ list it beside
    COMPLETING), else from Slurm's reason. A placeholder never exits by itself, so one that is
    COMPLETING with neither was cancelled, unless its node failed (`node_failed`, from the
    node list; see end_unclear)."""
    if job.preempted:
        return reasons.EV_JOB_PREEMPTED
    for st in (job.state, *sorted(job.state_flags)):
        if st in END_REASONS:
            return END_REASONS[st]
    if job.reason in END_BY_SLURM_REASON:
        return END_BY_SLURM_REASON[job.reason]
    if end_unclear(job):
        return reasons.EV_NODE_FAILED if node_failed else reasons.EV_JOB_CANCELLED
    return reasons.EV_JOB_ENDED


def end_message(job: JobInfo, pods: tuple[Pod, ...], gang: bool,
                node_failed: bool = False) -> str:
    """The eviction's message: whose job ended, how, and what happens to the Node."""
    what = ENDED_BY.get(end_reason(job, node_failed), "ended")
    detail = ", ".join(x for x in (job.state, job.reason) if x not in ("", "None"))
    why = f"{'the group' if gang else 'Slurm'}'s job {job.job_id} {what} ({detail})"
    if gang:
        return f"{why}; every member is evicted"
    return why + ("; the Node goes back to Slurm" if any(bound(p) for p in pods)
                  else " before the Pod started")
