"""The binder's one decision: (a unit of Pods, its Slurm job, the world) -> one Decision.

A unit is what Slurm allocates as one job:
- a single Pod, a group of one. Its claim is given at admission and kept for life, so starting
  over means cancelling and resubmitting under the same claim;
- a gang: N Pods sharing one job with --nodes=N. The binder gives the claim once all members
  are there and takes it back when it releases the group, so starting over means waiting for
  the whole group again.
The gang rules are data and small branches below: all-or-nothing bind, rank i -> the job's
i-th node, release on member loss.

Level-triggered and pure: the decision depends only on what is observed now, so a restart at
any moment just decides again. Unit-tested without any cluster.
"""

from __future__ import annotations

import dataclasses

from slurmgate import contract, reasons
from slurmgate.kubeview import PodView
from slurmgate.slurm import (
    ENDING_STATES,
    LAUNCH_FAILED_STATES,
    RUNNING,
    WAITING_STATES,
    JobInfo,
)

from .decision import (
    BIND,
    EVICT,
    NOTHING,
    RELEASE,
    STATUS,
    SUBMIT,
    WAIT,
    Bind,
    Decision,
    JobOf,
    Unit,
    World,
)
from .ending import END_REASONS, end_message, end_reason, end_unclear
from .podview import (
    Condition,
    NodeRef,
    Pod,
    ann,
    bound,
    claim_of,
    condition_stale,
    created,
    expected_condition,
    expected_start_words,
    handoff_left,
    holds_node,
    is_gated,
    job_status,
    lacks_gpus,
    live,
    needs_kill,
    occupies,
    phase,
    rank_key,
    stale_status,
    submitted_at,
)

# re-exported for callers: the rules and their vocabulary are read together
__all__ = ["BIND", "END_REASONS", "EVICT", "NOTHING", "RELEASE", "STATUS", "SUBMIT", "WAIT",
           "Bind", "Decision", "JobOf", "NodeRef", "Unit", "World", "end_reason", "holds_node",
           "is_gated", "job_status"]


def needs_node_states(u: Unit, job_of: JobOf) -> bool:
    """Whether World.failed_nodes matters for this unit: a Pod on a Node whose job is back in
    the queue, or ends without saying why (only then is the Slurm node list worth a REST
    call)."""
    claim = u.claim()
    job = job_of(claim) if claim else None
    return job is not None and (job.state in WAITING_STATES or end_unclear(job)) and any(
        bound(p) and live(p) and claim_of(p) == claim for p in u.members)


def _node_failed(on_nodes: tuple[Pod, ...], w: World) -> bool:
    # the Pods' annotations, not job.nodes: 22.05 lists no nodes for a COMPLETING job
    return any(ann(p).get(contract.A_SLURM_NODE) in w.failed_nodes for p in on_nodes if bound(p))




def decide(u: Unit, job_of: JobOf, w: World) -> Decision:
    d = _decide(u, job_of, w)
    conditions = _conditions(u, job_of, d)
    return dataclasses.replace(d, conditions=conditions) if conditions else d


def _decide(u: Unit, job_of: JobOf, w: World) -> Decision:
    released = _release_stale(u, job_of)
    if released is not None:
        return released
    claim = u.claim()
    if claim is None:
        return _without_claim(u, w)
    holders = tuple(sorted((p for p in u.members if live(p) and claim_of(p) == claim),
                           key=rank_key))
    job = job_of(claim)
    if job is not None and _given_back(job, holders):
        job = None  # the job we cancelled to start over: the Pod waits for its new one
    if job is None:
        return _without_job(u, claim, holders, w)
    if _newer_job_submitted(claim, holders, job, w) or _claim_arriving(u, claim, holders, w):
        return Decision(WAIT, requeue_after=0.5)
    if job.state in LAUNCH_FAILED_STATES and not job.preempted and not any(
            bound(p) for p in holders):
        # Slurm could not start the placeholder (e.g. "Job credential revoked" when a
        # controller that lost its state reuses a job id): the Pods never ran, nothing is
        # lost by trying again, so they get a new job instead of being deleted.
        return _start_over(u, job if needs_kill(job) else None, claim, holders,
                           end_reason(job), f"Slurm job {job.job_id} {job.state} before the "
                           f"Pod started ({job.reason}); submitted a new placeholder job")
    if job.state in ENDING_STATES or job.preempted:
        failed = _node_failed(holders, w)
        return Decision(EVICT, evict=holders, job=job, reason=end_reason(job, failed),
                        status=job_status(job), stop_by=node_freed_at(job, w),
                        message=end_message(job, holders, u.gang, failed))
    succeeded = sum(1 for p in u.members if claim_of(p) == claim and phase(p) == "Succeeded")
    if len(holders) + succeeded < u.size and holds_node(job):
        # members finishing normally keep the group; one that failed or left releases it
        return _start_over(u, job, claim, holders, reasons.EV_GROUP_RELEASED,
                           f"a member of the group left ({len(holders)}/{u.size} remain); the "
                           f"group is released and job {job.job_id} cancelled")
    if job.state in WAITING_STATES:
        return _waiting(u, job, claim, holders, w)
    if job.state == RUNNING:
        return _running(u, job, claim, holders, w)
    return Decision(NOTHING)


def node_freed_at(job: JobInfo, w: World) -> float | None:
    """When Slurm gives the Node of this ending job to the next one at the latest: the end of
    its GraceTime once preempted; KillWait after its end once cancelled or out of time (the
    placeholder ignores SIGTERM, so only Slurm's SIGKILL ends it). None: the placeholder holds
    the Node until we cancel it, after the Pods are gone."""
    if job.preempted and (g := w.grace_time.get(job.partition)):
        return (job.preempt_time or w.now) + g
    if job.state in ENDING_STATES:
        # an end whose time we were not told yet (0) happened at the latest now
        return (job.end_time or w.now) + w.kill_wait
    return None


def _newer_job_submitted(claim: str, holders: tuple[Pod, ...], job: JobInfo,
                         w: World) -> bool:
    """A Pod names a newer job of its claim than Slurm's list shows (we resubmitted a moment
    ago and the next poll has not seen it yet): deciding on the old one would resubmit twice,
    or evict the Pod for the old job's end. The binder's own record of the submit counts too,
    until the watch brings the Pod's new annotation. Only for a fresh submit: after a
    controller lost its state, job ids may start lower. Not for a job we cancelled: two jobs of
    one claim (a fail-open submit Slurm carried out late, beside ours) lose the newer as a
    duplicate, and a Pod naming it waited out vanish_grace before it bound to the other."""
    ids = [n for p in holders if (i := ann(p).get(contract.A_JOB_ID, "")).isdigit()
           and (n := int(i)) not in w.cancelled]
    if ids and max(ids) > job.job_id and (
            w.now - submitted_at(list(holders)) < w.vanish_grace):
        return True
    ours = w.submitted.get(claim)
    return (ours is not None and ours[0] not in w.cancelled and ours[0] > job.job_id
            and w.now - ours[1] < w.vanish_grace)


def _claim_arriving(u: Unit, claim: str, holders: tuple[Pod, ...], w: World) -> bool:
    """We gave a gang this claim a moment ago and the watch has not brought it on every member
    yet (its job may show in a poll first): the members still without a claim have not left,
    so the group is not released for them."""
    ours = w.submitted.get(claim)
    if not u.gang or len(holders) >= u.size or ours is None or w.now - ours[1] >= \
            w.vanish_grace:
        return False
    unclaimed = sum(1 for p in u.members if live(p) and is_gated(p) and not claim_of(p))
    return len(holders) + unclaimed >= u.size


def _release_stale(u: Unit, job_of: JobOf) -> Decision | None:
    """A job no live member holds any more (its Pods finished, were deleted, or are gone) is
    cancelled, but only once none of its Pods still runs on its Node."""
    current = u.claim()
    stale = ({c for p in u.members if not live(p) and (c := claim_of(p))} | u.gone_claims)
    for claim in sorted(stale - {current}):
        job = job_of(claim)
        own = [p for p in u.members if claim_of(p) == claim]
        if job is None or not needs_kill(job) or any(occupies(p) for p in own):
            continue
        if u.gang:
            return Decision(RELEASE, cancel=job, cancel_why="group_released",
                            reason=reasons.EV_GROUP_RELEASED,
                            message=f"no member of the group runs any more; cancelled job "
                                    f"{job.job_id}")
        pod = own[0] if own else None
        why = "deleted" if pod is None or PodView(pod).deleting else phase(pod)
        return Decision(RELEASE, members=tuple(own), cancel=job,
                        cancel_why="pod_finished" if u.members else "pod_deleted",
                        reason=reasons.EV_JOB_RELEASED,
                        message=f"Pod {why} before its job ended; cancelled job {job.job_id} "
                                "to free the node")
    return None


def _without_claim(u: Unit, w: World) -> Decision:
    """No job yet: submit once the whole unit is there (a single Pod always is)."""
    fresh = tuple(sorted((p for p in u.members if live(p) and is_gated(p) and not claim_of(p)),
                         key=rank_key))
    if u.size and len(fresh) >= u.size:
        return Decision(SUBMIT, members=fresh[:u.size], reason=reasons.EV_JOB_SUBMITTED)
    if not fresh:
        return Decision(NOTHING)
    oldest = min(created(p) for p in fresh)
    waited = w.now - oldest
    if oldest and waited > w.group_timeout:
        return Decision(WAIT, members=fresh, requeue_after=w.group_timeout,
                        reason=reasons.EV_GROUP_INCOMPLETE,
                        message=f"group has {len(fresh)} of {u.size} members after "
                                f"{int(waited)}s; its job is submitted when all are there")
    return Decision(WAIT, requeue_after=max(1.0, w.group_timeout - waited))


def _given_back(job: JobInfo, holders: tuple[Pod, ...]) -> bool:
    """Every holder still names `job` but says it was given back (cancelled by us; the new
    submit was refused): whatever Slurm says of it now (ended, or RUNNING until the cancel
    shows), it is not the Pod's, which is held for a new job, never evicted or bound to it."""
    return bool(holders) and all(
        not bound(p) and ann(p).get(contract.A_JOB_STATE) == contract.JOB_STATE_GIVEN_BACK
        and ann(p).get(contract.A_JOB_ID) == str(job.job_id) for p in holders)


def _without_job(u: Unit, claim: str, holders: tuple[Pod, ...], w: World) -> Decision:
    gated = tuple(p for p in holders if not bound(p))
    named = [p for p in holders if ann(p).get(contract.A_JOB_ID)
             and ann(p).get(contract.A_JOB_STATE) not in (contract.JOB_STATE_SUBMIT_PENDING,
                                                          contract.JOB_STATE_GIVEN_BACK)]
    if not named and gated and (left := handoff_left(gated, w.now, w.handoff_grace)) > 0:
        # the webhook's submit outlived its budget and may still land: its job carries the
        # claim, so the poll that sees it brings the Pod back here
        return Decision(WAIT, requeue_after=left)
    if not named:  # fail-open admission left the submit to us, or a handed-off one never came
        return Decision(SUBMIT, members=gated, reason=reasons.EV_JOB_SUBMITTED) if gated \
            else Decision(NOTHING)
    on_nodes = len(gated) < len(holders)
    if not w.slurm_synced:  # never act on an ambiguous Slurm view
        return Decision(NOTHING) if on_nodes else Decision(WAIT, requeue_after=1.0)
    # A job just submitted may miss from a list for a moment; one that was seen RUNNING (a
    # member is bound) has certainly left Slurm.
    if not on_nodes and w.now - submitted_at(list(holders)) < w.vanish_grace:
        return Decision(WAIT, requeue_after=max(1.0, w.vanish_grace / 4))
    job_id = ann(named[0]).get(contract.A_JOB_ID)
    message = (f"the group's job is no longer known to Slurm (claim {claim[:8]})" if u.gang
               else f"job {job_id} is no longer known to Slurm"
               + ("" if on_nodes else "; submitted a new placeholder job"))
    return _start_over(u, None, claim, holders, reasons.EV_JOB_VANISHED, message)


def _start_over(u: Unit, job: JobInfo | None, claim: str, holders: tuple[Pod, ...],
                reason: str, message: str) -> Decision:
    """The unit's job is lost or unusable: members on Nodes are evicted, the waiting ones get a
    new job (a single Pod at once, under its claim; a gang when it is complete again, under a
    new one), and the job is cancelled once no member occupies its Nodes."""
    on_nodes = tuple(p for p in holders if bound(p))
    gated = tuple(p for p in holders if not bound(p))
    occupied = any(occupies(p) for p in u.members if claim_of(p) == claim)
    return Decision(RELEASE, evict=on_nodes, clear=gated if u.gang else (),
                    resubmit=() if u.gang else gated, job=job, reason=reason,
                    cancel=None if occupied else job,
                    cancel_why="group_released" if u.gang else "resubmit", message=message)


def _waiting(u: Unit, job: JobInfo, claim: str, holders: tuple[Pod, ...],
             w: World) -> Decision:
    on_nodes = tuple(p for p in holders if bound(p))
    if on_nodes:
        # Requeued under a running Pod: its Node went back to Slurm. 22.05 requeues the
        # placeholder after a node failure (it ignores requeue=false), so the node's state tells
        # the cause. The requeued job is of no use to a Pod that is evicted: it goes too.
        failed = _node_failed(on_nodes, w)
        reason = reasons.EV_NODE_FAILED if failed else reasons.EV_JOB_REQUEUED
        message = (f"Slurm job {job.job_id} was requeued"
                   + (" after its node failed" if failed else "") + "; the Node goes back to "
                   "Slurm")
        if u.gang:
            return _start_over(u, job, claim, holders, reason, message)
        return Decision(EVICT, evict=on_nodes, cancel=job, cancel_why="requeued", job=job,
                        reason=reason,
                        # requeued: Slurm may have freed the Node already, so the least grace
                        status=job_status(job), stop_by=w.now, message=message)
    st = job_status(job)
    stale = tuple(p for p in holders if stale_status(p, st))
    if not stale:
        return Decision(NOTHING)
    return Decision(STATUS, members=stale, status=st, job=job, reason=reasons.EV_JOB_PENDING,
                    message=f"{'group ' if u.gang else ''}job {job.job_id} {job.state}: "
                            f"{job.reason}{expected_start_words(job)}; the Pod stays gated "
                            f"({contract.GATE}) until Slurm allocates a node")


def _running(u: Unit, job: JobInfo, claim: str, holders: tuple[Pod, ...], w: World) -> Decision:
    astray = [p for p in holders if bound(p) and (n := ann(p).get(contract.A_SLURM_NODE))
              and n not in job.nodes]
    if astray:  # the Node would run a Pod and someone else's Slurm job
        # every member reads the one message: a gang's names the member that is astray
        who = f"member {PodView(astray[0]).name}" if u.gang else "the Pod"
        return Decision(EVICT, evict=holders, job=job, reason=reasons.EV_NODE_MISMATCH,
                        message=f"Slurm job {job.job_id} runs on {','.join(job.nodes)}, not "
                                f"on {ann(astray[0]).get(contract.A_SLURM_NODE)} {who} was "
                                f"bound for; the {'group' if u.gang else 'Pod'} goes so that "
                                "no Node is shared")
    if len(job.nodes) < u.size:  # all or nothing: a gang binds once Slurm allocated it whole
        return Decision(WAIT, requeue_after=0.5)
    # rank i -> the job's i-th node, counting members that already finished (their node is
    # theirs: a live member must not take it)
    ranked = sorted((p for p in u.members if claim_of(p) == claim), key=rank_key)
    binds = []
    for p, slurm_node in zip(ranked, job.nodes, strict=False):
        if bound(p) or not live(p):
            continue
        ref = w.node_for.get(slurm_node)
        if ref is None:  # never ungate blindly
            return Decision(WAIT, members=(p,), requeue_after=5.0,
                            reason=reasons.EV_NODE_NOT_FOUND,
                            message=f"Slurm allocated {slurm_node} but no Kubernetes Node has "
                                    f"label {contract.NODE_LABEL}={slurm_node}")
        if ref.unschedulable:
            return _start_over(u, job, claim, holders, reasons.EV_NODE_CORDONED,
                               f"Slurm allocated {slurm_node} but Node {ref.name} is cordoned; "
                               f"cancelled job {job.job_id}"
                               + (", the group waits again" if u.gang else " and resubmitted"))
        lack = lacks_gpus(p, ref)
        if lack is not None:
            return _node_lacks_gpus(u, job, claim, holders, w, p, slurm_node, ref, lack)
        binds.append(Bind(p, ref.name, slurm_node))
    if binds:
        return Decision(BIND, binds=tuple(binds), job=job, reason=reasons.EV_BOUND,
                        status=job_status(job, job.nodes[0]),
                        message=f"{'group job' if u.gang else 'Slurm job'} {job.job_id}")
    # Each bound member's status follows its own node's share (the allocation arrives with the
    # whole record, after a pushed start bound it); one member a pass, the watch brings the next.
    # A single Pod bound by an older binder that wrote no node gets the job's node.
    for p in holders:
        slurm_node = ann(p).get(contract.A_SLURM_NODE) or ("" if u.gang else job.nodes[0])
        if bound(p) and slurm_node:
            st = job_status(job, slurm_node)
            if stale_status(p, st):
                return Decision(STATUS, members=(p,), status=st, job=job)
    return Decision(NOTHING)


def _node_lacks_gpus(u: Unit, job: JobInfo, claim: str, holders: tuple[Pod, ...], w: World,
                     p: Pod, slurm_node: str, ref: NodeRef, lack: str) -> Decision:
    """Never bind there. Wait a while gated (the Node may be about to report them), then give
    the job back and start over: holding a whole node for a Pod that cannot run on it helps
    nobody."""
    what = f"Slurm allocated {slurm_node} but Node {ref.name} {lack}"
    waited = w.now - job.start_time if job.start_time else 0.0
    if waited < w.gpu_grace:
        return Decision(WAIT, members=(p,), requeue_after=max(0.5, w.gpu_grace - waited),
                        reason=reasons.EV_NODE_LACKS_GPUS,
                        message=f"{what}; the Pod stays gated and job {job.job_id} is given "
                                f"back if the Node still lacks them after {w.gpu_grace:.0f}s")
    return _start_over(u, job, claim, holders, reasons.EV_NODE_LACKS_GPUS,
                       f"{what}; cancelled job {job.job_id}"
                       + (", the group waits again" if u.gang else " and resubmitted"))


def bind_message(d: Decision, b: Bind, gang: bool) -> str:
    rank = f" (rank {rank_key(b.pod)[0]})" if gang else ""
    return f"{d.message} allocated {b.slurm_node}{rank}; bound to Node {b.node}"


def _conditions(u: Unit, job_of: JobOf, d: Decision) -> tuple[tuple[Pod, Condition], ...]:
    if d.action in (RELEASE, EVICT) or (u.gang and d.action == SUBMIT):
        return ()  # members about to go or get a new job: their next state says it
    claim = u.claim()
    job = job_of(claim) if claim else None
    binding = {id(b.pod) for b in d.binds}  # Actions.bind says Allocated once bound
    out = []
    for p in u.members:
        if not live(p) or id(p) in binding:
            continue
        want = expected_condition(p, claim, job, u.gang, u.size)
        if want is not None and condition_stale(p, want):
            out.append((p, want))
    return tuple(out)
