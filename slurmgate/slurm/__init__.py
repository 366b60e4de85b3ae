"""Slurm through slurmrestd, for the webhook and the binder.

* ``models``: job, node and partition records, errors, the one job-state model;
* ``dialects``: the table of what differs between REST versions, parsing, request bodies;
* ``transport``: token, HTTP session, answers to data or errors (warnings included);
* ``client``: SlurmClient, the operations;
* ``placeholder``: the placeholder job's whole shape, and a Pod's JobSpec.
"""

from slurmgate.slurm.client import SlurmClient
from slurmgate.slurm.dialects import DIALECTS, SUPPORTED_VERSIONS, Dialect
from slurmgate.slurm.models import (
    ENDED_STATES,
    JobInfo,
    JobSpec,
    NodeInfo,
    PartitionInfo,
    SlurmError,
    SlurmIgnoredField,
    SlurmUnavailable,
)
from slurmgate.slurm.placeholder import SCRIPT as PLACEHOLDER_SCRIPT

__all__ = [
    "DIALECTS",
    "ENDED_STATES",
    "PLACEHOLDER_SCRIPT",
    "SUPPORTED_VERSIONS",
    "Dialect",
    "JobInfo",
    "JobSpec",
    "NodeInfo",
    "PartitionInfo",
    "SlurmClient",
    "SlurmError",
    "SlurmIgnoredField",
    "SlurmUnavailable",
]
