"""Gangs: the members of a group share ONE Slurm job with --nodes=N and bind all at once.

Pure decision over the whole group, like state.decide() for one Pod. Policy:
- the job is submitted (by the binder) once `size` members are there, gated;
- no member binds until Slurm allocated the whole job; then member of rank i binds to the
  job's i-th node (Slurm's order), all in one reconcile;
- a member deleted or failed releases the group: bound members are evicted, gated ones go
  back to waiting, and the job is cancelled once no member runs on its nodes; members that
  Succeeded are finishing normally: the job is cancelled when the last member is done;
- the job preempted, cancelled or ended: every member is evicted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from binder.state import World, end_reason, holds_node, is_gated, job_status
from slurmgate import contract
from slurmgate.kube import parse_time
from slurmgate.slurm import ENDING_STATES, RUNNING, WAITING_STATES, JobInfo

NOTHING, WAIT, SUBMIT, STATUS, BIND, RELEASE, EVICT = (
    "Nothing", "Wait", "Submit", "UpdateStatus", "Bind", "Release", "Evict")


@dataclass(frozen=True)
class GroupDecision:
    action: str
    members: tuple[dict[str, Any], ...] = ()  # who it applies to (rank order for SUBMIT)
    binds: tuple[tuple[dict[str, Any], str, str], ...] = ()  # (pod, k8s Node, Slurm node)
    evict: tuple[dict[str, Any], ...] = ()
    clear: tuple[dict[str, Any], ...] = ()  # gated members sent back to waiting
    cancel: JobInfo | None = None
    reason: str = ""
    message: str = ""
    status: dict[str, str] = field(default_factory=dict)
    requeue_after: float | None = None


def _ann(p: dict[str, Any]) -> dict[str, str]:
    return (p.get("metadata") or {}).get("annotations") or {}


def live(p: dict[str, Any]) -> bool:
    return not (p.get("metadata") or {}).get("deletionTimestamp") and (
        p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def bound(p: dict[str, Any]) -> bool:
    return bool((p.get("spec") or {}).get("nodeName"))


def rank_key(p: dict[str, Any]) -> tuple[int, str]:
    raw = _ann(p).get(contract.A_GROUP_INDEX)
    idx = int(raw) if raw and raw.isdigit() else 1 << 30
    return idx, (p.get("metadata") or {}).get("name", "")


def size_of(members: list[dict[str, Any]]) -> int:
    sizes = [int(s) for p in members if (s := _ann(p).get(contract.A_GROUP_SIZE, "")).isdigit()]
    return max(sizes) if sizes else 0


def current_claim(members: list[dict[str, Any]]) -> str | None:
    """The claim most live members hold: the group's current job."""
    claims = Counter(c for p in members if live(p) and (c := _ann(p).get(contract.A_CLAIM)))
    return claims.most_common(1)[0][0] if claims else None


def _created(p: dict[str, Any]) -> float:
    return parse_time((p.get("metadata") or {}).get("creationTimestamp")) or 0.0


def decide_group(members: list[dict[str, Any]], job_of: Callable[[str], JobInfo | None],
                 w: World, timeout: float = 300.0) -> GroupDecision:
    size = size_of(members)
    claim = current_claim(members)
    if claim is None:
        # Only finished/deleted members still name an earlier job: make sure it is gone.
        for old in {c for p in members if (c := _ann(p).get(contract.A_CLAIM))}:
            j = job_of(old)
            if j is not None and holds_node(j):
                return GroupDecision(RELEASE, cancel=j, reason=contract.EV_GROUP_RELEASED,
                                     message=f"no member of the group runs any more; "
                                             f"cancelled job {j.job_id}")
    job = job_of(claim) if claim else None
    holders = [p for p in members if claim and _ann(p).get(contract.A_CLAIM) == claim]
    holders_live = sorted((p for p in holders if live(p)), key=rank_key)
    fresh = sorted((p for p in members if live(p) and is_gated(p)
                    and not _ann(p).get(contract.A_CLAIM)), key=rank_key)

    if claim is not None:
        if job is None:
            if not w.slurm_synced:
                return GroupDecision(WAIT, requeue_after=1.0)
            try:
                submitted = max(float(_ann(p).get(contract.A_SUBMITTED_AT, "0") or 0)
                                for p in holders)
            except ValueError:
                submitted = 0.0
            if w.now - submitted < w.vanish_grace:
                return GroupDecision(WAIT, requeue_after=max(1.0, w.vanish_grace / 4))
            # the job is gone: evict what runs, let the rest wait for a new job
            return GroupDecision(
                RELEASE, evict=tuple(p for p in holders_live if bound(p)),
                clear=tuple(p for p in holders_live if not bound(p)),
                reason=contract.EV_JOB_VANISHED,
                message=f"the group's job is no longer known to Slurm (claim {claim[:8]})")
        active = holds_node(job)
        if job.state in ENDING_STATES or job.preempted:
            targets = tuple(p for p in holders_live)
            if not targets:
                return GroupDecision(NOTHING)
            return GroupDecision(EVICT, evict=targets, reason=end_reason(job),
                                 status=job_status(job),
                                 message=f"the group's Slurm job {job.job_id} is {job.state}; "
                                         "every member is evicted")
        succeeded = sum(1 for p in holders if (p.get("status") or {}).get("phase") == "Succeeded")
        if holders_live and len(holders_live) + succeeded >= size:
            pass  # members finishing normally: the job goes when the last one is done
        elif len(holders_live) < size and active:
            running = tuple(p for p in holders_live if bound(p))
            return GroupDecision(
                RELEASE, evict=running, clear=tuple(p for p in holders_live if not bound(p)),
                cancel=None if running else job, reason=contract.EV_GROUP_RELEASED,
                message=f"a member of the group left ({len(holders_live)}/{size} remain); the "
                        f"group is released and job {job.job_id} cancelled")
        if job.state in WAITING_STATES:
            st = job_status(job)
            st.pop(contract.A_SLURM_NODE, None)
            stale = tuple(p for p in holders_live
                          if any(_ann(p).get(k, "") != v for k, v in st.items()))
            if not stale:
                return GroupDecision(NOTHING)
            return GroupDecision(STATUS, members=stale, status=st, reason=contract.EV_JOB_PENDING,
                                 message=f"group job {job.job_id} {job.state}: {job.reason}")
        if job.state == RUNNING:
            if len(job.nodes) < size:
                return GroupDecision(WAIT, requeue_after=0.5)
            binds = []
            for p, slurm_node in zip(holders_live, job.nodes, strict=False):
                if bound(p):
                    continue
                ref = w.node_for.get(slurm_node)
                if ref is None:
                    return GroupDecision(WAIT, members=(p,), requeue_after=5.0,
                                         reason=contract.EV_NODE_NOT_FOUND,
                                         message=f"Slurm allocated {slurm_node} but no Node has "
                                                 f"label {contract.NODE_LABEL}={slurm_node}")
                if ref.unschedulable:
                    running = tuple(q for q in holders_live if bound(q))
                    return GroupDecision(
                        RELEASE, clear=tuple(q for q in holders_live if not bound(q)),
                        cancel=None if running else job, evict=running,
                        reason=contract.EV_NODE_CORDONED,
                        message=f"Slurm allocated {slurm_node} but Node {ref.name} is "
                                f"cordoned; cancelled job {job.job_id}, the group waits again")
                binds.append((p, ref.name, slurm_node))
            if not binds:
                return GroupDecision(NOTHING)
            return GroupDecision(BIND, binds=tuple(binds), status=job_status(job),
                                 reason=contract.EV_BOUND, message=f"group job {job.job_id}")
        return GroupDecision(NOTHING)

    # No job yet: submit once the whole group is there.
    if size and len(fresh) >= size:
        return GroupDecision(SUBMIT, members=tuple(fresh[:size]), reason=contract.EV_JOB_SUBMITTED)
    if fresh:
        oldest = min(_created(p) for p in fresh)
        if oldest and w.now - oldest > timeout:
            return GroupDecision(WAIT, members=tuple(fresh), requeue_after=timeout,
                                 reason=contract.EV_GROUP_INCOMPLETE,
                                 message=f"group has {len(fresh)} of {size} members after "
                                         f"{int(w.now - oldest)}s; its job is submitted when "
                                         "all are there")
        return GroupDecision(WAIT, requeue_after=max(1.0, timeout - (w.now - oldest)))
    return GroupDecision(NOTHING)
