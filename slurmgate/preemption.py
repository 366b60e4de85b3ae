"""How long a Pod may take to stop once Slurm preempts its placeholder job.

Slurm marks a preempted job (preempt_time) at once but leaves it RUNNING until its partition's
GraceTime is over; then it kills it and may start the preemptor on the Node. Nothing tells the
binder of the mark but a whole read of the job, so it reads each running job of ours in a
partition with a GraceTime every `preempt_every` seconds (binder/jobpoll.py), then evicts the
Pod. For a Node never to run that next job beside the Pod, the Pod must stop within what is
left: `stop_budget`. The webhook holds each Pod's terminationGracePeriodSeconds to it
(webhook/grace.py). Both sides use these numbers, so they live here.

Slurm's KillWait (SIGKILL that long after the SIGTERM the placeholder ignores) is not counted:
it is the site's setting, not read by slurmgate, and the budget must hold without it.
"""

from __future__ import annotations

import math

# A preempted job of ours is read whole every tenth of its GraceTime...
PREEMPT_NOTICE_SHARE = 0.1
# ...but at most once a second: a 5 s GraceTime would otherwise mean a read every 0.5 s per job
PREEMPT_NOTICE_MIN = 1.0
# From the read that shows preempt_time to the kubelet's SIGTERM: the read's answer, one
# eviction call, and the kubelet's watch seeing the Pod's deletion. Each took tens of ms in the
# busy-site bench (docs/benchmarks.md); 2 s leaves room for a slurmrestd or an apiserver slowed by
# load.
EVICT_MARGIN = 2.0
# The kubelet gives every container at least this long between SIGTERM and SIGKILL, whatever
# the Pod asks for (kuberuntime's minimumGracePeriodInSeconds); 0 or 1 would stop no faster
KUBELET_MIN_GRACE = 2


def preempt_every(grace_time: int) -> float:
    """Seconds between whole reads of a running job in a partition with this GraceTime."""
    return max(PREEMPT_NOTICE_MIN, grace_time * PREEMPT_NOTICE_SHARE)


def stop_budget(grace_time: int) -> int:
    """Longest terminationGracePeriodSeconds (whole seconds) a Pod in a partition with this
    GraceTime may have: GraceTime less one notice interval less EVICT_MARGIN. Below
    KUBELET_MIN_GRACE (even negative) for a GraceTime too short for any Pod."""
    return math.floor(grace_time - preempt_every(grace_time) - EVICT_MARGIN)


# From an eviction call to the container's death: the call, the kubelet's watch, and the
# SIGKILL the grace ends with. 1 s was too little on a loaded machine: in CI (stop 40, right
# after the chaos stage) a Pod evicted with 4 s left got 3 s and was still alive 0.8 s after
# Slurm started the next job on its Node; 2 s, as EVICT_MARGIN allows above
STOP_MARGIN = 2.0


def evict_grace(own: int, node_freed_at: float, now: float) -> int | None:
    """The gracePeriodSeconds to evict a Pod with when Slurm gives its Node to the next job at
    `node_freed_at` (epoch s): what is left before then, never under the kubelet's minimum;
    None when the Pod's own terminationGracePeriodSeconds (`own`) already fits."""
    left = max(KUBELET_MIN_GRACE, math.floor(node_freed_at - now - STOP_MARGIN))
    return left if left < own else None
