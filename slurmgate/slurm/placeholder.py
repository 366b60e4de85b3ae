"""The placeholder job for a Pod: its whole shape lives here (webhook and binder both submit).

Every dialect renders these values (slurmgate.slurm.dialects); nothing from a Pod ever reaches
the script or a shell, only JSON fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurmgate import contract
from slurmgate.podrequest import PodRequest
from slurmgate.slurm.models import PENDING, JobSpec, SlurmRefused

# The placeholder holds the allocation for a Pod. It ignores SIGTERM (and its `sleep` child
# inherits the ignored disposition), so on preemption it survives Slurm's SIGTERM through
# GraceTime until the binder, once the Pod is gone, cancels the job with SIGKILL. At the end of
# GraceTime Slurm itself sends SIGKILL (every version), which no trap can outlive.
SCRIPT = (
    "#!/bin/sh\n"
    "# slurmgate placeholder: holds this allocation for a Kubernetes Pod.\n"
    "# SIGTERM (preemption) is ignored; slurmgate ends the job with SIGKILL once the Pod is gone.\n"
    "trap '' TERM\n"
    "while :; do sleep 3600; done\n"
)
PATH = "/usr/local/bin:/usr/bin:/bin"
CWD = "/tmp"
# The placeholder prints nothing; without this Slurm opens /tmp/slurm-<id>.out on the node as
# the job's user, which fails (and fails the launch) when another user's old file has that name.
OUTPUT = "/dev/null"
ENVIRONMENT = {"PATH": PATH}
# Whole nodes, always: a Node runs either a Slurm job or a Pod, never both.
EXCLUSIVE = True


def pod_display_name(meta: Mapping[str, Any]) -> str:
    """The Pod's name, or `generateName*` at admission time when the name is not known yet."""
    return meta.get("name") or f"{meta.get('generateName', '')}*"


def job_name(namespace: str, display: str) -> str:
    """The placeholder job's name: `k8s:<namespace>/<display>` (a Pod's display name, or
    `group:<name>`), as Slurm keeps it (the binder looks lost jobs up by it)."""
    return f"{contract.JOB_NAME_PREFIX}{namespace}/{display}"[:200]


def job_spec(r: PodRequest, claim: str, namespace: str, display: str) -> JobSpec:
    # One node, exclusive (JobSpec's contract): a Node runs a Slurm job or a Pod, never both.
    return JobSpec(
        name=job_name(namespace, display),
        comment=contract.job_comment(claim, namespace, display),
        memory_mb=r.memory_mib, cpus=r.cpus, gpus=r.gpus, gpu_type=r.gpu_type, nodes=1,
        partition=r.partition, qos=r.qos, account=r.account,
        time_limit_minutes=r.time_limit_minutes, constraint=r.constraint, nice=r.nice,
        user=r.user,
    )


def submitted_status(job_id: int, at: float, claim: str | None = None,
                     rank: int | None = None) -> dict[str, str]:
    """The annotations a Pod carries once its placeholder job is submitted, whoever submitted
    it (the webhook at admission, the binder for a gang or a new job): the one place they are
    written, so every path says the same. `claim` and `rank`: a gang's, which the binder gives
    at its submit (a single Pod's claim is the webhook's, written at admission)."""
    status = {contract.A_JOB_ID: str(job_id), contract.A_JOB_STATE: PENDING,
              contract.A_JOB_REASON: "", contract.A_SUBMITTED_AT: str(int(at))}
    if claim is not None:
        status[contract.A_CLAIM] = claim
    if rank is not None:
        status[contract.A_GROUP_INDEX] = str(rank)
    return status


def refusal(e: SlurmRefused, spec: JobSpec) -> str:
    """What a user reads when Slurm refuses a placeholder job (admission's denial, the
    binder's Event): Slurm's own words first, then the options Slurm judged, since an account,
    QOS or partition is what it most often refuses."""
    judged = [f"{k} {v}" for k, v in (("account", spec.account), ("QOS", spec.qos),
                                       ("partition", spec.partition), ("Slurm user", spec.user))
              if v]
    return f"Slurm refused the placeholder job: {e.said}" + (
        f" ({', '.join(judged)})" if judged else "")
