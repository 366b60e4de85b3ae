"""The binder's decision vocabulary: what a decision is about (a Unit of Pods), what it may
look at besides the Pods and their job (the World), and what it decides (one Decision, with one
of the actions below). decide.py holds the rules; the controller applies the result.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

from slurmgate import contract
from slurmgate.slurm import JobInfo

from .podview import Condition, NodeRef, Pod, claim_of, live, live_claim, size_of


class Action(StrEnum):
    """The one set of actions (its values are the `action` label of the reconcile metric)."""
    NOTHING = "Nothing"
    WAIT = "Wait"
    SUBMIT = "Submit"
    STATUS = "UpdateStatus"
    BIND = "Bind"
    EVICT = "Evict"  # the unit's job ended or left its Nodes: who runs there goes
    # let go, a Pod or a gang alike: evict who runs, send who waits back (a gang member, for
    # the group's next job) or submit it again under its claim (a single Pod), cancel the job
    # once no member occupies its Nodes, tell the members that ended first
    RELEASE = "Release"


# the short names decide.py's rules read with
NOTHING, WAIT, SUBMIT, STATUS, BIND = (Action.NOTHING, Action.WAIT, Action.SUBMIT, Action.STATUS,
                                       Action.BIND)
EVICT, RELEASE = Action.EVICT, Action.RELEASE


@dataclass(frozen=True)
class World:
    slurm_synced: bool  # a poll has asked Slurm about every job our Pods name
    now: float  # wall clock seconds
    node_for: Mapping[str, NodeRef] = field(default_factory=dict)  # Slurm node -> k8s Node
    vanish_grace: float = 60.0  # how long a fresh job may be missing from Slurm's list
    # how long a Submitting Pod waits for the webhook's handed-off submit before we submit
    handoff_grace: float = contract.SUBMIT_HANDOFF_GRACE
    group_timeout: float = 300.0  # after this, an incomplete gang is reported
    failed_nodes: frozenset[str] = frozenset()  # Slurm nodes DOWN or not responding
    # how long a Pod waits, gated, for its allocated Node to show the GPUs it asks for before
    # the job is given back to Slurm (a device plugin re-registering after a kubelet restart
    # briefly reports none)
    gpu_grace: float = 60.0
    # claim -> (job id, wall time) of the jobs this binder submitted lately: the Pod's
    # annotation naming the new job may reach the watch after the old job's end reaches a poll
    submitted: Mapping[str, tuple[int, float]] = field(default_factory=dict)
    # ids of the jobs this binder cancelled lately (a duplicate of a claim among them): a Pod
    # whose annotation names one waits for no "newer" job, it takes the one its claim has
    cancelled: Collection[int] = frozenset()
    # slurm.conf's KillWait: a job cancelled or out of time is SIGKILLed (what the placeholder
    # ignores of SIGTERM) and its Node freed this long after its end
    kill_wait: float = 30.0
    grace_time: Mapping[str, int] = field(default_factory=dict)  # partition -> GraceTime (s)


@dataclass(frozen=True)
class Unit:
    members: tuple[Pod, ...]  # one Pod, or the gang's members the cache holds
    gang: bool = False
    gone_claims: frozenset[str] = frozenset()  # claims of members deleted meanwhile

    @classmethod
    def single(cls, pod: Pod | None, gone_claims: frozenset[str] = frozenset()) -> Unit:
        return cls((pod,) if pod is not None else (), False, gone_claims)

    @property
    def size(self) -> int:
        return size_of(list(self.members)) if self.gang else 1

    def claim(self) -> str | None:
        """The claim of the unit's current job, held by live members."""
        if self.gang:
            return live_claim(list(self.members))
        return next((c for p in self.members if live(p) and (c := claim_of(p))),
                    None)


class Bind(NamedTuple):
    pod: Pod
    node: str  # the Kubernetes Node
    slurm_node: str


@dataclass(frozen=True)
class Decision:
    action: Action
    members: tuple[Pod, ...] = ()  # whom a status, submit, release or wait Event is about
    binds: tuple[Bind, ...] = ()
    evict: tuple[Pod, ...] = ()
    clear: tuple[Pod, ...] = ()  # gang members sent back to waiting for a new job
    resubmit: tuple[Pod, ...] = ()  # single Pods that get a new job under their claim now
    cancel: JobInfo | None = None
    cancel_why: str = ""  # why `cancel` goes (the cancels metric's label)
    job: JobInfo | None = None
    reason: str = ""
    message: str = ""
    status: dict[str, str] = field(default_factory=dict)  # annotations to converge to
    requeue_after: float | None = None
    # when Slurm gives the evicted Pods' Node to the next job (epoch s; None: not before the
    # Pods are gone): they are evicted with no more grace than is left by then
    stop_by: float | None = None
    # the SlurmAllocated condition of members whose condition is out of date, whatever the
    # action: it only shows what Slurm decided
    conditions: tuple[tuple[Pod, Condition], ...] = ()

    @property
    def node(self) -> str | None:
        return self.binds[0].node if self.binds else None


JobOf = Callable[[str], JobInfo | None]
