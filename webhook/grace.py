"""A Pod must stop within what its partition's preemption GraceTime leaves it.

If Slurm preempts a Pod's placeholder, it kills the job at the end of the GraceTime and may
start the preemptor on the Node at once; a Pod still stopping then shares the Node with it. The
binder notices the preemption late by up to one read interval and then evicts the Pod, so a Pod
may take at most slurmgate.preemption.stop_budget(GraceTime) to stop. LONG_TERMINATION_GRACE
says what happens to a Pod asking for longer: `clamp` lowers its terminationGracePeriodSeconds
in the admission patch (and says so), `deny` refuses it.

The apiserver defaults terminationGracePeriodSeconds to 30 before mutating admission, so a Pod
that did not set it is checked as asking for 30.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from slurmgate import reasons
from slurmgate.nodemap import NodeMap
from slurmgate.podrequest import PodRequest
from slurmgate.preemption import EVICT_MARGIN, KUBELET_MIN_GRACE, preempt_every, stop_budget

SETTING = "LONG_TERMINATION_GRACE"


class LongGrace(enum.StrEnum):
    CLAMP = "clamp"
    DENY = "deny"


@dataclass(frozen=True)
class GraceVerdict:
    allowed: bool = True
    reason: str = ""  # CamelCase, when denied
    message: str = ""
    warning: str = ""
    # the Pod's new terminationGracePeriodSeconds; None: as the Pod asked
    clamp_to: int | None = None


def check_grace(req: PodRequest, nodes: NodeMap, mode: LongGrace) -> GraceVerdict:
    partition = req.partition or nodes.default_partition
    part = nodes.partitions.get(partition) if partition else None
    grace_time = part.grace_time_seconds if part else None
    # 0 is how Slurm reports a partition without one: its jobs are not given time to stop, and
    # the binder does not watch them for preemption either
    if not grace_time:
        return GraceVerdict()
    asked = req.termination_grace_seconds
    budget = stop_budget(grace_time)
    every = preempt_every(grace_time)
    why = (f"partition {partition!r} has preemption GraceTime {grace_time}s, less {every:g}s "
           f"to notice a preemption and {EVICT_MARGIN:g}s to evict the Pod")
    if budget < KUBELET_MIN_GRACE:
        # No value can keep the Pod within it: the kubelet waits at least KUBELET_MIN_GRACE
        # between SIGTERM and SIGKILL whatever the spec says.
        if mode is LongGrace.DENY:
            return GraceVerdict(
                False, reasons.DENY_GRACE_TIME_TOO_SHORT,
                f"{why} leaves {max(budget, 0)}s, less than the {KUBELET_MIN_GRACE}s the "
                f"kubelet gives any Pod to stop: a preempted Pod here would still run when "
                f"Slurm starts the next job on its Node. Use a partition with a longer "
                f"GraceTime (or ask the Slurm administrator to raise it)")
        short = (f"; {why} leaves {max(budget, 0)}s, less than the kubelet's least: a "
                 f"preempted Pod here may still run beside the next job")
        if asked > KUBELET_MIN_GRACE:
            return GraceVerdict(warning=f"terminationGracePeriodSeconds {asked} lowered to "
                                        f"{KUBELET_MIN_GRACE}{short}",
                                clamp_to=KUBELET_MIN_GRACE)
        return GraceVerdict(warning=f"terminationGracePeriodSeconds {asked} kept{short}")
    if asked <= budget:
        return GraceVerdict()
    if mode is LongGrace.DENY:
        return GraceVerdict(
            False, reasons.DENY_GRACE_PERIOD_TOO_LONG,
            f"terminationGracePeriodSeconds {asked} is longer than the {budget}s a Pod may take "
            f"to stop: {why}; a longer stop would let Slurm start the next job beside this "
            f"Pod. Set spec.terminationGracePeriodSeconds to at most {budget}, or use a "
            f"partition with a longer GraceTime")
    return GraceVerdict(warning=f"terminationGracePeriodSeconds {asked} lowered to {budget}: "
                                f"{why}; a longer stop would let Slurm start the next job "
                                f"beside this Pod", clamp_to=budget)
