"""Every reason slurmgate gives a user, once: Event reasons on Pods, admission denials (the
AdmissionReview's status.reason, and the Events the binder writes when it refuses the same
thing), and the reasons of the SlurmAllocated condition.

Users, alerts and scripts match on these (`kubectl get events --field-selector reason=...`),
so they are CamelCase, stable, and never retyped elsewhere: tests/unit/test_reasons.py fails
when a product module, a bench or the chaos invariants spell one out instead of naming it here.
"""

from __future__ import annotations

from slurmgate import contract


class Denied(Exception):
    """A refusal with one of the CamelCase reasons below: admission denies with it, the binder
    emits it as a Warning Event when it refuses the same thing later."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# --- Event reasons on Pods (`kubectl describe pod`) ---
EV_JOB_SUBMITTED = "SlurmJobSubmitted"
# Slurm answered the submit and said no (an invalid account or QOS, MaxJobCount reached): the
# message starts with Slurm's own words. SlurmSubmitFailed: anything else (Slurm unreachable,
# an answer we could not read).
EV_SUBMIT_REFUSED = "SlurmSubmitRefused"
EV_SUBMIT_FAILED = "SlurmSubmitFailed"
EV_INVALID_REQUEST = "InvalidSlurmRequest"  # the binder could not make a job of the Pod
EV_MISSING_CLAIM = "MissingClaim"  # a marked Pod the webhook never saw
EV_JOB_PENDING = "SlurmJobPending"
EV_ALLOCATED = "SlurmAllocated"
EV_BOUND = "Bound"
EV_DISPLACED = "DisplacedSlurmJob"  # the Pod's placeholder preempted a batch job on its node
EV_NODE_NOT_FOUND = "NodeNotFound"  # Slurm allocated a node no Kubernetes Node is labelled with
EV_NODE_CORDONED = "NodeCordoned"
# Slurm allocated a node whose Kubernetes Node lacks the GPUs (count or type) the Pod asks for
EV_NODE_LACKS_GPUS = "NodeLacksGPUs"
EV_JOB_VANISHED = "SlurmJobVanished"
EV_JOB_RELEASED = "SlurmJobReleased"  # the Pod ended or went away first: its job is cancelled
# Why the Pod is evicted: the job ended. One per cause a user would act on differently.
EV_JOB_PREEMPTED = "SlurmJobPreempted"
EV_JOB_CANCELLED = "SlurmJobCancelled"
EV_JOB_TIME_LIMIT = "SlurmJobTimeLimit"
EV_NODE_FAILED = "SlurmNodeFailed"
EV_JOB_REQUEUED = "SlurmJobRequeued"  # back in Slurm's queue (an admin's requeue, ...)
EV_JOB_ENDED = "SlurmJobEnded"  # any other end
# the job runs on other Slurm nodes than the one the Pod was bound for (a push Slurm's next
# answer contradicts, a requeue and restart between two polls): the Pod must not stay
EV_NODE_MISMATCH = "SlurmNodeMismatch"
EV_EVICTED = "Evicted"
EV_EVICTION_REFUSED = "EvictionRefused"  # a PodDisruptionBudget said no; deleted after a grace
# Gangs
EV_GROUP_INCOMPLETE = "GroupIncomplete"
EV_GROUP_RELEASED = "GroupReleased"

# --- admission denials (the webhook's; the binder reuses them for what it refuses) ---
DENY_INVALID_OBJECT = "InvalidObject"  # the AdmissionReview's object is not a readable Pod
DENY_NODE_NAME_SET = "NodeNameSet"  # a marked Pod that names its Node bypasses Slurm
DENY_OWNER_LOOKUP_FAILED = "OwnerLookupFailed"
DENY_INVENTORY_UNAVAILABLE = "InventoryUnavailable"  # no Slurm node list to check against yet
DENY_GROUP_TOO_LARGE = "GroupTooLarge"
DENY_SLURM_UNAVAILABLE = "SlurmUnavailable"
DENY_INVALID_ANNOTATION = "InvalidAnnotation"
DENY_INVALID_RESOURCES = "InvalidResources"
DENY_MISSING_MEMORY_REQUEST = "MissingMemoryRequest"
DENY_INVALID_GROUP = "InvalidGroup"
DENY_UNKNOWN_PARTITION = "UnknownPartition"
DENY_NO_SLURM_NODES = "NoSlurmNodes"
DENY_UNKNOWN_GPU_TYPE = "UnknownGPUType"
DENY_MEMORY_TOO_LARGE = "MemoryTooLarge"
DENY_CPU_TOO_LARGE = "CPUTooLarge"
DENY_GPU_TOO_LARGE = "GPUTooLarge"
DENY_NO_SINGLE_NODE_FITS = "NoSingleNodeFits"
DENY_GRACE_TIME_TOO_SHORT = "GraceTimeTooShort"
DENY_GRACE_PERIOD_TOO_LONG = "GracePeriodTooLong"
# tenancy (slurmgate/tenancy.py): also the binder's Event when it holds a job back
DENY_NAMESPACE_NOT_IN_TENANCY = "NamespaceNotInTenancy"
DENY_ACCOUNT_NOT_ALLOWED = "AccountNotAllowed"
DENY_QOS_NOT_ALLOWED = "QOSNotAllowed"
DENY_PARTITION_NOT_ALLOWED = "PartitionNotAllowed"
DENY_TENANCY_POLICY_MISSING = "TenancyPolicyMissing"
DENY_TENANCY_POLICY_INVALID = "TenancyPolicyInvalid"
DENY_TENANCY_POLICY_LOADING = "TenancyPolicyLoading"
# PriorityClass mapping (slurmgate/priorities.py)
DENY_CLASS_FORBIDS_QOS = "PriorityClassForbidsQOS"
DENY_CLASS_FORBIDS_PARTITION = "PriorityClassForbidsPartition"
DENY_CLASS_FORBIDS_NICE = "PriorityClassForbidsNice"

# --- reasons of the SlurmAllocated condition (besides Slurm's own: Resources, Priority, ...) ---
COND_REASON_SUBMIT_PENDING = contract.JOB_STATE_SUBMIT_PENDING
COND_REASON_GROUP_PENDING = contract.JOB_STATE_GROUP_PENDING
COND_REASON_ALLOCATED = "Allocated"


def all_reasons() -> dict[str, str]:
    """Name -> value of every reason above (for the tests and the reference)."""
    return {k: v for k, v in globals().items()
            if k.startswith(("EV_", "DENY_", "COND_")) and isinstance(v, str)}
