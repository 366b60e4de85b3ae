"""What slurmgate knows of Slurm: job, node and partition records, errors, and THE job-state
model every other module uses (never a second list of states elsewhere)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slurmgate import names
from slurmgate.slurm.allocation import NodeAllocation

# Slurm's job states, by what they mean for the Node a placeholder job holds. Every set of
# states elsewhere is derived from these (the binder, the job poller, the benches).
PENDING = "PENDING"
RUNNING = "RUNNING"
COMPLETING = "COMPLETING"
PREEMPTED = "PREEMPTED"
SUSPENDED = "SUSPENDED"
CONFIGURING = "CONFIGURING"  # allocated; PrologSlurmctld (our push hook among them) still runs

# Slurm may still start the job, or has put it back in the queue: no Pod may run on its behalf.
WAITING_STATES = frozenset({PENDING, "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", CONFIGURING,
                            "RESIZING", SUSPENDED, "SIGNALING", "STAGE_OUT"})

# Base job states in which Slurm holds no resources for the job any more. PREEMPTED is here:
# once Slurm reports it as the base state the job's processes are gone (while a preempted job
# still runs out its GraceTime, Slurm reports RUNNING or COMPLETING, plus preempt_time).
ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        PREEMPTED,
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
    }
)

# On its way out or gone: the Node goes back from the Pod to Slurm. COMPLETING: Slurm is
# killing the job's processes. SPECIAL_EXIT: requeued and held after a particular exit code; it
# starts again only if someone releases it.
ENDING_STATES = ENDED_STATES | {COMPLETING, "SPECIAL_EXIT"}

# Ending, yet treated as if the placeholder may still be on the Node, so the binder KILLs the
# job when it releases it. COMPLETING: its processes really are still there. PREEMPTED: ended
# for Slurm (see ENDED_STATES), but a KILL to an ended job is one harmless RPC, and it stays
# on the safe side should a Slurm version report PREEMPTED before the processes are gone.
MAY_HOLD_NODE_STATES = frozenset({COMPLETING, PREEMPTED})
# Ending, and the Node is certainly free: nothing to cancel.
RELEASED_STATES = ENDING_STATES - MAY_HOLD_NODE_STATES
# Released, or being released by Slurm already (COMPLETING: usually our own KILL): a cancel
# adds nothing. PREEMPTED is not here, for the reason above.
STOPPING_STATES = RELEASED_STATES | {COMPLETING}

# A job in one of these is about to change (it starts, or its Node is being freed): while one
# of ours is, the binder polls Slurm fast.
# CONFIGURING too: a started job stays CONFIGURING while PrologSlurmctld runs (the push hook
# among them), and a start must be noticed at once when no push comes. Held or suspended jobs
# wait for a person, not for Slurm.
IN_FLIGHT_STATES = (WAITING_STATES - {SUSPENDED, "REQUEUE_HOLD"}) | {COMPLETING, PREEMPTED}

# Slurm could not start the job at all (slurmd refused it: "Job credential revoked" for an id a
# controller that lost its state reused; the node failed at launch): its Pods never ran, so
# they may simply get a new job.
LAUNCH_FAILED_STATES = frozenset({"FAILED", "BOOT_FAIL", "NODE_FAIL", "LAUNCH_FAILED"})
# Slurm holds nodes for the job, and its processes may be on them (SUSPENDED: stopped but
# resident; CONFIGURING: the prolog runs there). For the binder the job still waits (see
# WAITING_STATES: no Pod may run for it); for a check of who is on a node, it is there.
ALLOCATED_STATES = frozenset({RUNNING, COMPLETING, SUSPENDED, CONFIGURING, "SIGNALING"})
# Queued or running, and not on its way out: a job of ours in one of these still counts.
QUEUED_OR_RUNNING_STATES = WAITING_STATES | {RUNNING}
# A requeued job that already ran once (restarts > 0) shows one of these while it goes round
# again: completing on its old node, waiting, or running elsewhere.
REQUEUE_ROUND_STATES = WAITING_STATES | {RUNNING, COMPLETING}

# Flags that take precedence over the base state in the v0.0.38 single-string form; the list
# form (v0.0.40+) is reduced to one state in this order, so both read alike.
JOB_FLAG_PRECEDENCE = (
    COMPLETING,
    "STAGE_OUT",
    CONFIGURING,
    "RESIZING",
    "REQUEUED",
    "REQUEUE_FED",
    "REQUEUE_HOLD",
    "SPECIAL_EXIT",
    "STOPPED",
    "REVOKED",
    "RESV_DEL_HOLD",
)
# Not above: SIGNALING (a signal on its way to the job's processes, as during a preemption's
# GraceTime on 24.11: RUNNING + SIGNALING) says nothing of where the job is, so the base state
# stands; read as a waiting state, a bound Pod's job being signalled looked requeued
NODE_BASE_STATES = ("UNKNOWN", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "FUTURE")


@dataclass(frozen=True)
class JobSpec:
    name: str
    comment: str
    memory_mb: int
    cpus: int
    gpus: int = 0
    gpu_type: str | None = None  # Slurm gres type (gpu:<type>:N); None = any
    nodes: int = 1
    partition: str | None = None
    qos: str | None = None
    account: str | None = None
    time_limit_minutes: int | None = None
    constraint: str | None = None
    nice: int | None = None
    # Who the job runs as: sent as X-SLURM-USER-NAME of the submit only (the SlurmUser's token
    # may act for any user); None = the client's configured user. Never a body field: on every
    # dialect the header decides the job's owner.
    user: str | None = None

    def check(self) -> None:
        if self.memory_mb <= 0:
            raise ValueError(f"memory_mb must be > 0, got {self.memory_mb}")
        if self.cpus <= 0:
            raise ValueError(f"cpus must be > 0, got {self.cpus}")
        if self.nodes <= 0:
            raise ValueError(f"nodes must be > 0, got {self.nodes}")
        if self.gpus < 0:
            raise ValueError(f"gpus must be >= 0, got {self.gpus}")
        if self.gpu_type is not None and not names.SLURM_NAME.fullmatch(self.gpu_type):
            raise ValueError(f"gpu_type must be a gres type name, got {self.gpu_type[:40]!r}")
        if self.time_limit_minutes is not None and self.time_limit_minutes <= 0:
            raise ValueError(f"time_limit_minutes must be > 0, got {self.time_limit_minutes}")
        if self.user is not None and not names.UNIX_USER.fullmatch(self.user):
            raise ValueError(f"user must be a Unix user name, got {self.user[:40]!r}")


@dataclass(frozen=True)
class JobInfo:
    job_id: int
    name: str
    state: str
    reason: str
    nodes: tuple[str, ...]
    comment: str | None
    partition: str
    submit_time: int
    start_time: int
    end_time: int
    # Every state/flag Slurm reported (v0.0.40+ list form; {state} for v0.0.38).
    state_flags: frozenset[str] = frozenset()
    # When Slurm decided to preempt the job (0 = never); set before the state changes.
    preempt_time: int = 0
    # CPUs Slurm allocated (all of each node's CPUs for an exclusive job); 0 while pending.
    cpus: int = 0
    # Slurm gave the job whole nodes (v0.0.41+ job_resources.nodes.whole; None = not said).
    whole_nodes: bool | None = None
    # How often Slurm requeued the job (a requeue on preemption counts).
    restarts: int = 0
    user: str = ""
    # Which cores, memory and GPUs Slurm gave it on each node, from its whole record (() while
    # pending, or where the answer left it out): slurmgate/slurm/allocation.py
    allocation: tuple[NodeAllocation, ...] = ()

    def allocation_on(self, node: str) -> NodeAllocation | None:
        return next((a for a in self.allocation if a.node == node), None)

    @property
    def ended(self) -> bool:
        """Slurm holds no resources for the job any more (unknown states count as active)."""
        return self.state in ENDED_STATES

    @property
    def active(self) -> bool:
        """Slurm holds, or may still hold, resources for the job."""
        return not self.ended

    @property
    def expected_start(self) -> int | None:
        """When Slurm expects this waiting job to start: a pending job's start_time is its
        backfill scheduler's plan (what `squeue --start` shows), 0 until it has one; a running
        job's start_time is its real start, not a plan."""
        return self.start_time if self.state == PENDING and self.start_time > 0 else None

    @property
    def preempted(self) -> bool:
        return self.preempt_time > 0 or PREEMPTED in self.state_flags or (
            self.state == PREEMPTED
        )


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str
    flags: frozenset[str]
    cpus: int
    real_memory_mb: int
    partitions: tuple[str, ...]
    reason: str
    features: tuple[str, ...]
    gres: str


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    nodes: tuple[str, ...]
    default: bool
    max_time_minutes: int | None
    state: str
    # Slurm's preemption GraceTime: how long a preempted job may run on after SIGTERM
    grace_time_seconds: int | None = None


class SlurmError(Exception):
    """slurmrestd or slurmctld refused a request. ``errors`` holds Slurm's own messages."""

    def __init__(
        self, message: str, status: int | None = None, errors: list[str] | None = None
    ) -> None:
        self.message = message
        self.status = status
        self.errors = list(errors or [])
        self.errnos: list[int] = []
        # the answer's JSON, when it had one: an error answer may still name what Slurm made
        self.answer: dict[str, Any] | None = None
        super().__init__(message)

    def __str__(self) -> str:
        s = self.message
        if self.status is not None:
            s += f" (HTTP {self.status})"
        if self.errors:
            s += ": " + "; ".join(self.errors)
        return s


class SlurmUnavailable(SlurmError):
    """slurmrestd/slurmctld cannot be reached (connection refused, timeout, 5xx): retry later."""


class SlurmRefused(SlurmError):
    """Slurm understood the request and said no: MaxJobCount reached, an association or QOS
    limit, an invalid account, partition or QOS. ``errors`` are Slurm's own descriptions and
    ``errnos`` its error numbers. Unlike SlurmUnavailable, Slurm answered; unlike a plain
    SlurmError (an answer we could not read, a token we could not load), we know what it said,
    and users must read that rather than our guess."""

    @property
    def said(self) -> str:
        """Slurm's own words alone, for a message that names the job its own way."""
        return "; ".join(self.errors) or "no reason given"

    def __str__(self) -> str:
        # No "(HTTP 500)": slurmrestd answers a refusal with 500, 404 or even 200 with
        # errors[], so the status says nothing a user can act on (``.status`` keeps it).
        return f"{self.message}: {self.said}"


class SlurmIgnoredField(SlurmError):
    """slurmrestd accepted a request but dropped or misread a field we sent (a warning that
    points into our body). Never a silent downgrade: e.g. a dropped exclusive flag would let a
    Slurm job share the Node with a Pod. ``answer`` is the 2xx answer all the same (a submit
    may have created a job, which the caller must cancel)."""

    def __init__(self, message: str, status: int | None, errors: list[str],
                 answer: dict[str, Any]) -> None:
        super().__init__(message, status, errors)
        self.answer = answer
