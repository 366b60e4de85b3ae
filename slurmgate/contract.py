"""The annotation/label contract shared by the webhook, the binder and users.

Everything a user writes or reads on a Pod is named here, once.
"""

from __future__ import annotations

DOMAIN = "slurmgate.io"

# A Pod opts in with this label (value "slurm"). A label, not an annotation, so that the
# MutatingWebhookConfiguration's objectSelector keeps every other Pod away from the webhook.
MARK_LABEL = f"{DOMAIN}/scheduler"
MARK_VALUE = "slurm"

# Set on marked Pods at admission. No scheduler serves it, so between ungating and binding
# nobody but the binder can place the Pod.
SCHEDULER_NAME = "slurmgate"
GATE = f"{DOMAIN}/slurm-allocation"

# --- user-set annotations (Slurm options) ---
A_PARTITION = f"{DOMAIN}/partition"
A_QOS = f"{DOMAIN}/qos"
A_ACCOUNT = f"{DOMAIN}/account"
A_TIME_LIMIT = f"{DOMAIN}/time-limit"  # Slurm syntax: MM, HH:MM:SS, D-HH[:MM[:SS]]
A_CONSTRAINT = f"{DOMAIN}/constraint"  # Slurm feature expression, e.g. "a100&ib"
A_PRIORITY = f"{DOMAIN}/nice"  # Slurm nice value, -10000..10000 (negative needs privilege)
# Slurm's gres type of the GPUs a Pod requests (nvidia.com/gpu: N -> gres gpu:<type>:N)
A_GPU_TYPE = f"{DOMAIN}/gpu-type"

SLURM_OPTIONS = (A_PARTITION, A_QOS, A_ACCOUNT, A_TIME_LIMIT, A_CONSTRAINT, A_PRIORITY,
                 A_GPU_TYPE)

# --- gangs: Pods that need their Nodes all at once (one Slurm job with --nodes=N) ---
A_GROUP = f"{DOMAIN}/group"  # group name, unique within the namespace
A_GROUP_SIZE = f"{DOMAIN}/group-size"  # members; the job is submitted once all are there
A_GROUP_INDEX = f"{DOMAIN}/group-index"  # rank: member i runs on the job's i-th node

USER_ANNOTATIONS = (*SLURM_OPTIONS, A_GROUP, A_GROUP_SIZE, A_GROUP_INDEX)

# --- annotations we write (status, for `kubectl describe pod`) ---
A_CLAIM = f"{DOMAIN}/claim"  # token in the Slurm job's comment; matches Pods with generateName
# The same claim as a label on a Pod whose job the webhook submitted: the webhook finds the Pod
# by it after admission (a Pod refused after our submit leaves an orphan job to cancel)
CLAIM_LABEL = A_CLAIM
A_JOB_ID = f"{DOMAIN}/job-id"
A_JOB_STATE = f"{DOMAIN}/job-state"
A_JOB_REASON = f"{DOMAIN}/job-reason"
A_SLURM_NODE = f"{DOMAIN}/slurm-node"
A_SUBMITTED_AT = f"{DOMAIN}/submitted-at"
# When Slurm expects the waiting job to start (its backfill scheduler's plan, as `squeue --start`
# shows it), an RFC 3339 UTC time; absent when Slurm has no plan for it yet, and once it runs.
A_EXPECTED_START = f"{DOMAIN}/expected-start"
# The terminationGracePeriodSeconds the Pod asked for, when admission lowered it to what its
# partition's preemption GraceTime leaves (slurmgate/preemption.py, LONG_TERMINATION_GRACE)
A_REQUESTED_GRACE = f"{DOMAIN}/requested-termination-grace"
# What Slurm gave the job on the Pod's Slurm node, once it runs, from its whole record:
# "cores=s0:0-3 memory=1024M gpus=0,1" (cores as Slurm's socket:core numbering; see
# slurmgate/slurm/allocation.py)
A_ALLOCATION = f"{DOMAIN}/allocation"

# What the binder mirrors from the Slurm job; a gang member sent back to waiting loses them.
JOB_ANNOTATIONS = (A_JOB_ID, A_JOB_STATE, A_JOB_REASON, A_SLURM_NODE, A_EXPECTED_START,
                   A_ALLOCATION)
# Every status annotation but the claim. A Pod copied from another may carry them: admission
# drops them, never trusts them.
STATUS_ANNOTATIONS = (*JOB_ANNOTATIONS, A_SUBMITTED_AT, A_REQUESTED_GRACE)

# --- values of A_JOB_STATE ---
# Mostly Slurm's own state name, copied verbatim (PENDING, RUNNING, PREEMPTED, ...; see
# slurmgate.slurm.models). These are ours, for a Pod that has no job (yet):
JOB_STATE_SUBMIT_PENDING = "SubmitPending"  # fail-open: the binder submits once Slurm is back
# Slurm did not answer the webhook's submit within its budget: the Pod was admitted while the
# submit goes on; the binder adopts the job by its claim, or submits itself after HANDOFF_GRACE
JOB_STATE_SUBMITTING = "Submitting"
# Longest a handed-off submit can still be in flight in the webhook: the Slurm client's 5 s
# timeout for the dialect probe, the submit and the cancel of a job Slurm changed, plus margin.
SUBMIT_HANDOFF_GRACE = 20.0
JOB_STATE_GROUP_PENDING = "GroupPending"  # a gang's job is submitted once all members are there
JOB_STATE_DRY_RUN = "DryRun"  # a dryRun create: nothing was submitted
# The Pod's job (still A_JOB_ID) was given back to Slurm (a cordoned Node, GPUs that never
# showed) and the tenancy policy refuses its new one for now: submitted when the policy allows
JOB_STATE_GIVEN_BACK = "GivenBack"

# --- Nodes ---
# Each Kubernetes Node that runs a slurmd carries the Slurm node name in this label.
NODE_LABEL = f"{DOMAIN}/slurm-node"
# The GPU type (Slurm's gres type, e.g. a100) of a Node's GPUs, set by whoever labels the Node.
# Our own label, not NVIDIA's nvidia.com/gpu.product: that one holds the marketing name
# (NVIDIA-A100-SXM4-80GB), while a Pod asks for and Slurm schedules by the gres type. The binder
# refuses a Node whose label names another type than the Pod asked for.
NODE_GPU_TYPE_LABEL = f"{DOMAIN}/gpu-type"
# slurmd Pods are found by this label; their memory request is what a Node keeps for slurmd.
SLURMD_POD_LABEL = "app.kubernetes.io/name=slurmd"
# Every Node with a slurmd carries this taint, so that no Pod but ours (which get the
# toleration at admission) and the slurmd's own lands beside a Slurm job. NoExecute: a plain Pod
# already running when the taint is added is evicted by Kubernetes' taint manager.
# Whoever registers the Node sets it (kubelet --register-with-taints, `kubectl taint`, the local
# cluster); the binder has no right to patch Nodes and reports a Slurm Node without it.
TAINT_KEY = f"{DOMAIN}/slurm-managed"
TAINT_EFFECT = "NoExecute"
TAINT = {"key": TAINT_KEY, "value": "true", "effect": TAINT_EFFECT}
TOLERATION = {"key": TAINT_KEY, "operator": "Exists", "effect": TAINT_EFFECT}
# Only our Pods may tolerate that taint (the ValidatingAdmissionPolicy slurmgate-taint-guard,
# kustomize/base/webhook-config): anything else tolerating it could preempt them. Node
# infrastructure (slurmd, DaemonSets) runs in namespaces the operator labels with this.
INFRA_NAMESPACE_LABEL = f"{DOMAIN}/node-infrastructure"
# On the binder Pod that holds the Lease, and only there: the Service slurmgate-binder selects
# it, so slurmctld's push hook reaches the leader and never the standby.
LEADER_LABEL = f"{DOMAIN}/binder-leader"
# Prefix of the Slurm drain reason we set on cordon; resume touches only nodes with it.
DRAIN_REASON_PREFIX = "slurmgate: cordoned"
# ... and while a Pod of ours still stops on a Node whose Slurm node failed: nothing of Slurm's
# holds the node then, and it goes to the next job the moment its slurmd registers again
DRAIN_STOPPING_PREFIX = "slurmgate: Pod still stopping"
OUR_DRAIN_PREFIXES = (DRAIN_REASON_PREFIX, DRAIN_STOPPING_PREFIX)

# --- the Pod condition that shows Slurm's decision (`kubectl describe`, `kubectl wait`) ---
# False while the Pod waits (reason: Slurm's own, e.g. Resources or Priority, or one of ours
# below), True once Slurm allocated a node and the Pod is bound there.
COND_ALLOCATED = f"{DOMAIN}/SlurmAllocated"

# --- Slurm job identity ---
JOB_NAME_PREFIX = "k8s:"
COMMENT_PREFIX = "slurmgate claim="


def job_comment(claim: str, namespace: str, name: str) -> str:
    """The comment carries the claim first; the binder parses only that part."""
    return f"{COMMENT_PREFIX}{claim} pod={namespace}/{name}"


def group_comment(claim: str, namespace: str, group: str) -> str:
    return f"{COMMENT_PREFIX}{claim} group={namespace}/{group}"


def group_from_comment(comment: str | None) -> str | None:
    """`namespace/group` of a gang's job, or None."""
    if not comment or not comment.startswith(COMMENT_PREFIX):
        return None
    for part in comment.split(" ")[2:]:
        if part.startswith("group="):
            return part[len("group="):] or None
    return None


def claim_from_comment(comment: str | None) -> str | None:
    if not comment or not comment.startswith(COMMENT_PREFIX):
        return None
    rest = comment[len(COMMENT_PREFIX):]
    claim = rest.split(" ", 1)[0]
    return claim or None


def is_marked(labels: dict[str, str] | None) -> bool:
    return labels is not None and labels.get(MARK_LABEL) == MARK_VALUE
