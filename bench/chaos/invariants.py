"""The rules a chaos run holds slurmgate to, as pure functions over one snapshot of the cluster
(marked Pods read from the API server, then Slurm's queue read with squeue). Nothing here asks
the binder: the point is to judge it from the outside."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from slurmgate import contract
from slurmgate.slurm.models import ALLOCATED_STATES, QUEUED_OR_RUNNING_STATES, RUNNING

# How precisely squeue states a start time (whole seconds), so a job counts as having run at the
# moment the Pods were read only if it started at least this long before.
START_PRECISION = 1.0
# A process's start time is in clock ticks (1/100 s): a margin of two
PROC_START_PRECISION = 0.02
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})
# the job-state model's own sets (slurmgate/slurm/models.py), never a list of our own
ON_NODE_STATES = ALLOCATED_STATES
QUEUED_OR_RUNNING = QUEUED_OR_RUNNING_STATES


@dataclass(frozen=True)
class Job:
    job_id: int
    state: str
    nodes: tuple[str, ...]
    start: float  # epoch seconds; 0 when Slurm states none (pending)
    partition: str
    name: str
    comment: str

    @property
    def claim(self) -> str | None:
        return contract.claim_from_comment(self.comment)


@dataclass(frozen=True)
class JobProc:
    """A process of a Slurm job, as the node really runs it (under a slurmstepd)."""
    pid: int
    job_id: int
    node: str  # SLURMD_NODENAME
    start: float  # epoch seconds
    name: str = ""  # SLURM_JOB_NAME

    @property
    def placeholder(self) -> bool:
        return self.name.startswith(contract.JOB_NAME_PREFIX)


@dataclass(frozen=True)
class PodView:
    key: str  # namespace/name
    uid: str
    node: str | None  # spec.nodeName
    phase: str
    terminating: bool
    claim: str | None
    gated: bool
    job_id: int | None = None  # the slurmgate.io/job-id annotation

    @property
    def occupies(self) -> bool:
        """On a Node with containers that may still run (a terminating Pod still does)."""
        return bool(self.node) and self.phase not in FINISHED_PHASES

    @property
    def waiting(self) -> bool:
        return not self.node and not self.terminating and self.phase not in FINISHED_PHASES


@dataclass(frozen=True)
class Snapshot:
    t_pods: float  # wall time the Pod list was asked for (before Slurm was read)
    t_slurm: float
    pods: tuple[PodView, ...]
    jobs: tuple[Job, ...]
    procs: tuple[JobProc, ...] = ()  # read after squeue
    ctld_since: float = 0.0  # when the running slurmctld started (0: the cluster's first)
    # (Slurm node, when the fault driver SIGKILLed its slurmd), every such kill so far
    slurmd_kills: tuple[tuple[str, float], ...] = ()
    ctld_down_at: float = 0.0  # when the last slurmctld was SIGKILLed (0: never)
    # (job id, Slurm node): the nodes Slurm had given each job when that slurmctld went down,
    # as squeue samples and slurmctld's own log showed them
    placed_before_crash: frozenset[tuple[int, str]] = frozenset()


def pod_view(p: dict[str, Any]) -> PodView:
    meta = p.get("metadata") or {}
    spec = p.get("spec") or {}
    ann = meta.get("annotations") or {}
    gates = {g.get("name") for g in spec.get("schedulingGates") or []}
    job = ann.get(contract.A_JOB_ID, "")
    return PodView(f"{meta.get('namespace')}/{meta.get('name')}", meta.get("uid", ""),
                   spec.get("nodeName") or None, (p.get("status") or {}).get("phase", ""),
                   bool(meta.get("deletionTimestamp")), ann.get(contract.A_CLAIM) or None,
                   contract.GATE in gates, int(job) if job.isdigit() else None)


def _occupants(s: Snapshot) -> dict[str, list[PodView]]:
    by_node: dict[str, list[PodView]] = {}
    for p in s.pods:
        if p.occupies and p.node:
            by_node.setdefault(p.node, []).append(p)
    return by_node


def _own(p: PodView, job_id: int, claim: str | None) -> bool:
    return job_id == p.job_id or (p.claim is not None and p.claim == claim)


def _beside_pods(s: Snapshot, k8s_node: dict[str, str]) -> list[tuple[JobProc, PodView]]:
    """(process, Pod) pairs: a job's process beside a bound Pod it does not belong to.

    Sound despite the two reads: the process counts only if it started before the Pods were
    read and was still there when the processes were read after them, so both were there at
    once."""
    by_node = _occupants(s)
    claims = {j.job_id: j.claim for j in s.jobs}
    return [(pr, p) for pr in s.procs if pr.start <= s.t_pods - PROC_START_PRECISION
            for p in by_node.get(k8s_node.get(pr.node, ""), ())
            if not _own(p, pr.job_id, claims.get(pr.job_id))]


def _unknown_to_slurm(pr: JobProc, s: Snapshot) -> bool:
    """Slurm does not have this process's job on its node (the id may even be another job's
    now: a controller restarted on an old state hands ids out again)."""
    return not any(j.job_id == pr.job_id and pr.node in j.nodes and j.name == pr.name
                   and j.state in ON_NODE_STATES for j in s.jobs)


def _stray(pr: JobProc, s: Snapshot) -> bool:
    """A placeholder's process on a node where Slurm no longer has its job (the job ended on a
    node whose slurmd was down, or slurmctld lost its start in a crash): it only sleeps, and
    Slurm kills it when the node registers its jobs again."""
    return pr.placeholder and _unknown_to_slurm(pr, s)


def lost_in_crash(pr: JobProc, s: Snapshot) -> bool:
    """A job started by the controller before the running one, which does not know it: the
    SIGKILLed slurmctld had not saved its start, so Slurm itself gives the node out again
    (to a Pod's job or to any batch job) until the node's slurmd registers it."""
    return pr.start < s.ctld_since and _unknown_to_slurm(pr, s)


def sharing(s: Snapshot, k8s_node: dict[str, str]) -> list[str]:
    """A Node holds a Pod while a process of another job really runs on its Slurm node: what
    the node runs, not what slurmctld believes (restarted from its saved state, it shows a job
    that ended just before the crash as running for minutes). A process of a job Slurm no
    longer has there (see leftovers) is judged apart, on what the snapshot proves of it."""
    names = {j.job_id: f"{j.partition} {j.name}" for j in s.jobs}
    out: dict[tuple[int, str], str] = {}
    for pr, p in _beside_pods(s, k8s_node):
        if not _stray(pr, s) and not lost_in_crash(pr, s) and not relocated_in_crash(p, pr, s):
            out.setdefault((pr.job_id, pr.node), (
                f"Node {p.node} holds Pod {p.key} while job {pr.job_id} "
                f"({names.get(pr.job_id, 'not in squeue')}) runs on {pr.node} (pid {pr.pid})"))
    return list(out.values())


def relocated_in_crash(p: PodView, pr: JobProc, s: Snapshot) -> Job | None:
    """The Pod's own job, when Slurm had it on the process's node as slurmctld went down and
    the restarted one (its saved state older than that start) placed it again, elsewhere or
    not yet, and gave the node to the process's job: Slurm forgot the Pod's job there, so the
    Pod, bound where Slurm had put its job, now stands beside a job Slurm started after the
    crash. The binder is held to evicting it (see misplaced)."""
    if not s.ctld_down_at or pr.start <= s.ctld_down_at or _placed_by_slurm(p, pr.node, s):
        return None
    # a job that ended where it ran still lists that node: only a job placed again lacks it
    return next((j for j in s.jobs if _own(p, j.job_id, j.claim) and pr.node not in j.nodes
                 and (j.job_id, pr.node) in s.placed_before_crash), None)


STRAY, LOST_IN_CRASH = "stray placeholder", "batch job lost in a slurmctld crash"
RELOCATED = "Pod's job placed again by a restarted slurmctld"


@dataclass(frozen=True)
class Leftover:
    """A process of a job Slurm no longer has on its node, beside a bound Pod of another job: a
    double booking. It counts against slurmgate unless the snapshot proves it Slurm's own."""
    kind: str  # STRAY or LOST_IN_CRASH
    key: str  # "job@node beside ns/pod": one per leftover job and Pod
    detail: str
    evidence: tuple[str, ...]  # the observations the verdict rests on, either way
    slurms_own: bool


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 100) % 100:02d}"


def _placed_by_slurm(p: PodView, node: str, s: Snapshot) -> Job | None:
    """The Pod's own job as squeue has it on `node`, holding it."""
    return next((j for j in s.jobs if j.state in ON_NODE_STATES and node in j.nodes
                 and _own(p, j.job_id, j.claim)), None)


def _why_slurm_lost_it(pr: JobProc, s: Snapshot) -> list[str]:
    """What made Slurm lose or end the job without its process ending, as the run saw it."""
    why = []
    if pr.start < s.ctld_since:
        why.append(f"slurmctld started again at {_clock(s.ctld_since)}, after the process: "
                   "its saved state may predate the job's start")
    # a job Slurm ended while its node's slurmd was dead runs on until the slurmd, back,
    # registers and is told to kill it
    why += [f"slurmd on {pr.node} was SIGKILLed at {_clock(t)}, while the process ran: "
            "Slurm ended the job without the node" for n, t in s.slurmd_kills
            if n == pr.node and pr.start - PROC_START_PRECISION <= t <= s.t_pods]
    return why


def leftovers(s: Snapshot, k8s_node: dict[str, str]) -> list[Leftover]:
    """Processes beside a bound Pod of jobs Slurm no longer has on that node: a placeholder's
    (stray) or a batch job's the restarted controller lost (lost in a crash).

    Slurm's own double booking, proven, needs both halves in the snapshot: Slurm gave the node
    out again (squeue has the Pod's own job holding it: the binder bound the Pod where Slurm
    ran its job), and a reason Slurm lost the job the process belongs to (a slurmctld restart
    after the process started; for a placeholder also its node's slurmd killed while it ran).
    Without the first, the Pod was bound where Slurm never put its job, which is slurmgate's
    doing; without the second, nothing the run did explains Slurm losing a running job."""
    out: dict[str, Leftover] = {}
    for pr, p in _beside_pods(s, k8s_node):
        stray = _stray(pr, s)
        # A batch job's leftover counts here only when lost in a crash: after a slurmd kill
        # alone it is a workload beside the Pod, and stays a sharing (as before); so is a job
        # Slurm still has on the node
        if not stray and not lost_in_crash(pr, s):
            continue
        key = f"{pr.job_id}@{pr.node} beside {p.key}"
        if key in out:
            continue  # another process of the same job
        seen = [j for j in s.jobs if j.job_id == pr.job_id]
        placed = _placed_by_slurm(p, pr.node, s)
        why = _why_slurm_lost_it(pr, s)
        evidence = (
            f"/proc: pid {pr.pid} of job {pr.job_id} ({pr.name or 'unnamed'}) on {pr.node}, "
            f"started {_clock(pr.start)}, still there after the Pods were read",
            *(f"squeue: job {j.job_id} is {j.name} ({j.state}) on {','.join(j.nodes) or '-'}"
              + (" (the id handed out again)" if j.name != pr.name else "") for j in seen),
            *([] if seen else [f"squeue: no job {pr.job_id}"]),
            f"squeue: the Pod's own job {placed.job_id} ({placed.name}, {placed.state}) holds "
            f"{pr.node}" if placed else f"squeue: no job of Pod {p.key} holds {pr.node}",
            *(why or [f"no slurmctld restart or slurmd kill on {pr.node} since the process "
                      f"started explains Slurm losing job {pr.job_id}"]),
        )
        what = (f"placeholder {pr.job_id} ({pr.name}) still sleeps" if stray else
                f"job {pr.job_id} ({pr.name}) still runs")
        out[key] = Leftover(STRAY if stray else LOST_IN_CRASH, key,
                            f"{what} on {pr.node} (pid {pr.pid}) beside Pod {p.key}; Slurm has "
                            "no such job there", evidence, placed is not None and bool(why))
    return list(out.values())


def relocated(s: Snapshot, k8s_node: dict[str, str]) -> list[Leftover]:
    """A job Slurm started after a slurmctld crash beside a Pod whose own job Slurm had on
    that node before the crash and placed again after it (relocated_in_crash): Slurm's own
    double booking, with the observations that prove it. Without them the pair is a sharing."""
    out: dict[str, Leftover] = {}
    for pr, p in _beside_pods(s, k8s_node):
        own = relocated_in_crash(p, pr, s)
        key = f"{pr.job_id}@{pr.node} beside {p.key}"
        if own is None or key in out or _stray(pr, s) or lost_in_crash(pr, s):
            continue
        evidence = (
            f"before the crash: Slurm had the Pod's job {own.job_id} on {pr.node} (squeue "
            "samples or slurmctld's log, until it was SIGKILLed at "
            f"{_clock(s.ctld_down_at)})",
            f"slurmctld started again at {_clock(s.ctld_since)} on a saved state older than "
            "that start",
            f"squeue: the Pod's job {own.job_id} ({own.name}) is {own.state} on "
            f"{','.join(own.nodes) or '-'}, no longer on {pr.node}",
            f"/proc: pid {pr.pid} of job {pr.job_id} ({pr.name or 'unnamed'}) on {pr.node}, "
            f"started {_clock(pr.start)}, after the crash",
        )
        out[key] = Leftover(RELOCATED, key, f"job {pr.job_id} ({pr.name}) started on {pr.node} "
                            f"beside Pod {p.key}, whose job {own.job_id} Slurm had there "
                            "before slurmctld's crash", evidence, True)
    return list(out.values())


def misplaced(s: Snapshot, k8s_node: dict[str, str]) -> dict[str, str]:
    """Pods (not yet told to go) on a Node whose Slurm node none of their jobs holds while one
    is still queued or running elsewhere: Slurm moved the job (a restart on an old state, a
    requeue), and the binder must evict the Pod: key -> description."""
    slurm_node = {k: n for n, k in k8s_node.items()}
    out = {}
    for p in s.pods:
        node = slurm_node.get(p.node or "")
        if not node or not p.occupies or p.terminating:
            continue
        own = [j for j in s.jobs if _own(p, j.job_id, j.claim)]
        if own and not _placed_by_slurm(p, node, s) and any(
                j.state in QUEUED_OR_RUNNING for j in own):
            out[p.key] = (f"Pod {p.key} on {p.node} while its job "
                          + ", ".join(f"{j.job_id} is {j.state} on {','.join(j.nodes) or '-'}"
                                      for j in own))
    return out


def slurm_view_sharing(s: Snapshot, k8s_node: dict[str, str]) -> list[str]:
    """A job squeue shows on the Pod's node that runs no process there. Only reported: after a
    slurmctld restart its view can hold a job that ended before the crash."""
    by_node = _occupants(s)
    running = {(pr.job_id, pr.node) for pr in s.procs}
    out = []
    for j in s.jobs:
        if j.state not in ON_NODE_STATES or not j.start or j.start > s.t_pods - START_PRECISION:
            continue
        for slurm_node in (n for n in j.nodes if (j.job_id, n) not in running):
            for p in by_node.get(k8s_node.get(slurm_node, ""), ()):
                if not _own(p, j.job_id, j.claim):
                    out.append(f"Node {p.node} holds Pod {p.key} while squeue shows job "
                               f"{j.job_id} ({j.partition} {j.name}, {j.state}) on {slurm_node}")
    return out


def leaked_jobs(s: Snapshot) -> dict[str, str]:
    """Placeholder jobs still queued or running whose claim no Pod holds: id -> description."""
    claims = {p.claim for p in s.pods if p.claim}
    return {str(j.job_id): f"job {j.job_id} ({j.name}, {j.state}) has no Pod"
            for j in s.jobs
            if j.claim and j.claim not in claims and j.state in QUEUED_OR_RUNNING}


def duplicate_jobs(s: Snapshot) -> dict[str, str]:
    """Claims with more than one job queued or running: claim -> description."""
    per: dict[str, list[int]] = {}
    for j in s.jobs:
        if j.claim and j.state in QUEUED_OR_RUNNING:
            per.setdefault(j.claim, []).append(j.job_id)
    return {c: f"claim {c[:8]} has jobs {sorted(ids)}" for c, ids in per.items() if len(ids) > 1}


def waiting_without_job(s: Snapshot) -> dict[str, str]:
    """Gated Pods with no job of their claim in Slurm at all: key -> description."""
    live = {j.claim for j in s.jobs if j.claim}
    return {p.key: f"Pod {p.key} waits with no job for claim {(p.claim or '-')[:8]}"
            for p in s.pods if p.waiting and p.claim and p.claim not in live}


def unbound_while_running(s: Snapshot) -> dict[str, str]:
    """Pods whose job is RUNNING but which are not bound: key -> description."""
    running = {j.claim: j for j in s.jobs if j.claim and j.state == RUNNING}
    return {p.key: f"Pod {p.key} unbound while its job {running[p.claim].job_id} runs"
            for p in s.pods if p.waiting and p.claim in running}


def lost_pods(vanished: dict[str, str], events: list[dict[str, Any]]) -> list[str]:
    """Pods that went away without the harness deleting them (key -> uid) and without an
    Event of ours saying why."""
    told = {(e.get("involvedObject") or {}).get("uid") for e in events
            if e.get("reportingComponent", "").startswith("slurmgate")
            or (e.get("source") or {}).get("component", "").startswith("slurmgate")}
    return [f"Pod {key} vanished with no Event from slurmgate"
            for key, uid in sorted(vanished.items()) if uid not in told]


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    cmdline: str


def orphans(procs: list[Proc], python: str) -> dict[str, str]:
    """Our Python processes adopted by init, pid -> description: a worker or tracker that
    outlived its binder. (The push hook detaches on purpose and is a shell script.)"""
    return {str(p.pid): f"pid {p.pid} orphaned: {p.cmdline[:120]}" for p in procs
            if p.ppid == 1 and p.cmdline.startswith(python)
            and ("multiprocessing" in p.cmdline or "slurmgate" in p.cmdline)}
