"""Slurm through slurmrestd, for the webhook and the binder.

* ``models``: job, node and partition records, errors, the one job-state model;
* ``dialects``: the table of what differs between REST versions, parsing, request bodies;
* ``transport``: token, HTTP session, answers to data or errors (warnings included);
* ``client``: SlurmClient, the operations (``nodeops``: its node and partition ones);
* ``accounting``: slurmdbd's job query, by name or partition (jobs of ours no Pod names);
* ``placeholder``: the placeholder job's whole shape, and a Pod's JobSpec.
"""

from typing import TYPE_CHECKING, Any

from slurmgate.slurm.dialects import DIALECTS, SUPPORTED_VERSIONS, Dialect
from slurmgate.slurm.models import (
    ALLOCATED_STATES,
    COMPLETING,
    CONFIGURING,
    ENDED_STATES,
    ENDING_STATES,
    IN_FLIGHT_STATES,
    LAUNCH_FAILED_STATES,
    MAY_HOLD_NODE_STATES,
    PENDING,
    PREEMPTED,
    QUEUED_OR_RUNNING_STATES,
    RELEASED_STATES,
    REQUEUE_ROUND_STATES,
    RUNNING,
    STOPPING_STATES,
    SUSPENDED,
    WAITING_STATES,
    JobInfo,
    JobSpec,
    NodeInfo,
    PartitionInfo,
    SlurmError,
    SlurmIgnoredField,
    SlurmRefused,
    SlurmUnavailable,
)
from slurmgate.slurm.placeholder import SCRIPT as PLACEHOLDER_SCRIPT

__all__ = [
    "ALLOCATED_STATES",
    "COMPLETING",
    "CONFIGURING",
    "DIALECTS",
    "ENDED_STATES",
    "ENDING_STATES",
    "IN_FLIGHT_STATES",
    "LAUNCH_FAILED_STATES",
    "MAY_HOLD_NODE_STATES",
    "PENDING",
    "PLACEHOLDER_SCRIPT",
    "PREEMPTED",
    "QUEUED_OR_RUNNING_STATES",
    "RELEASED_STATES",
    "REQUEUE_ROUND_STATES",
    "RUNNING",
    "STOPPING_STATES",
    "SUPPORTED_VERSIONS",
    "SUSPENDED",
    "WAITING_STATES",
    "Dialect",
    "JobInfo",
    "JobSpec",
    "NodeInfo",
    "PartitionInfo",
    "SlurmClient",
    "SlurmError",
    "SlurmIgnoredField",
    "SlurmRefused",
    "SlurmUnavailable",
]

if TYPE_CHECKING:
    from slurmgate.slurm.client import SlurmClient


def __getattr__(name: str) -> Any:
    """SlurmClient (and with it aiohttp) loads on first use: the job model and the decisions
    that read it import this package without an HTTP stack."""
    if name == "SlurmClient":
        from slurmgate.slurm.client import SlurmClient
        return SlurmClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
