"""The placeholder job for a Pod: one place decides its shape (webhook and binder both submit)."""

from __future__ import annotations

from slurmgate import contract
from slurmgate.podrequest import PodRequest
from slurmgate.slurm import JobSpec


def pod_display_name(meta: dict) -> str:
    """The Pod's name, or `generateName*` at admission time when the name is not known yet."""
    return meta.get("name") or f"{meta.get('generateName', '')}*"


def job_spec(r: PodRequest, claim: str, namespace: str, display: str) -> JobSpec:
    # One node, exclusive (JobSpec's contract): a Node runs a Slurm job or a Pod, never both.
    return JobSpec(
        name=f"{contract.JOB_NAME_PREFIX}{namespace}/{display}"[:200],
        comment=contract.job_comment(claim, namespace, display),
        memory_mb=r.memory_mib, cpus=r.cpus, gpus=r.gpus, nodes=1,
        partition=r.partition, qos=r.qos, account=r.account,
        time_limit_minutes=r.time_limit_minutes, constraint=r.constraint, nice=r.nice,
    )
