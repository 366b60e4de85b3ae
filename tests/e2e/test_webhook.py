"""The admission webhook, called by the real kube-apiserver through a MutatingWebhookConfiguration
over TLS, submitting to real Slurm."""

from __future__ import annotations

import asyncio
import json

import pytest

from cluster.bridge import Bridge
from cluster.local import Local
from slurmgate import contract, preemption
from slurmgate.slurm import JobInfo, SlurmClient
from slurmgate.webhook.orphans import CHECK_EVERY, SETTLE
from tests.e2e.conftest import (
    Kubectl,
    _component_log,
    job_id_of,
    marked_pod,
    scontrol_job,
    squeue,
    wait_until,
)

pytestmark = pytest.mark.e2e


def test_marked_pod_gated_with_sized_placeholder(local: Local, admin: Kubectl, bridge: Bridge,
                                                 ns: str) -> None:
    pod = marked_pod("web", "2Gi", {contract.A_TIME_LIMIT: "1:00:00",
                                    contract.A_PARTITION: "k8s"}, generate=True)
    created = json.loads(admin.apply(pod, "-n", ns, "-o", "json").stdout)
    # what the apiserver stored at creation: gated, our scheduler, job recorded (the default
    # SUBMIT_BUDGET 0 waits for Slurm's answer; test_submit_handoff covers a budget)
    assert created["spec"]["schedulingGates"] == [{"name": contract.GATE}]
    assert created["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    ann = created["metadata"]["annotations"]
    assert ann[contract.A_JOB_STATE] == "PENDING", ann
    job_id = ann[contract.A_JOB_ID]
    job = scontrol_job(local, job_id)
    assert job["MinMemoryNode"] in ("2048M", "2G")
    assert job["NumNodes"].split("-")[0] == "1"
    assert job["Partition"] == "k8s"
    assert job["TimeLimit"] == "01:00:00"
    assert job["OverSubscribe"] == "NO"  # exclusive: a Node runs a job or a Pod, never both
    (row,) = [r for r in squeue(local) if r["id"] == job_id]
    assert row["comment"] == f"{contract.COMMENT_PREFIX}{ann[contract.A_CLAIM]} pod={ns}/web-*"
    assert job["JobName"] == f"k8s:{ns}/web-*"


def test_oversized_pod_refused_by_apiserver(admin: Kubectl, bridge: Bridge, ns: str,
                                            local: Local) -> None:
    before = len(squeue(local))
    p = admin.apply(marked_pod("huge", "15500Mi"), "-n", ns, check=False)
    assert p.returncode != 0
    assert "slurmgate: memory request 15500Mi fits on no Slurm node" in p.stderr
    assert "beside its slurmd container" in p.stderr
    assert len(squeue(local)) == before


def test_bad_annotation_refused_with_field(admin: Kubectl, bridge: Bridge, ns: str) -> None:
    p = admin.apply(marked_pod("bad", annotations={contract.A_TIME_LIMIT: "soon"}), "-n", ns,
                    check=False)
    assert p.returncode != 0 and contract.A_TIME_LIMIT in p.stderr


def test_unmarked_pod_untouched(admin: Kubectl, bridge: Bridge, ns: str) -> None:
    pod = marked_pod("plain")
    pod["metadata"]["labels"] = {"app": "plain"}
    created = json.loads(admin.apply(pod, "-n", ns, "-o", "json").stdout)
    assert not created["spec"].get("schedulingGates")
    assert created["spec"]["schedulerName"] == "default-scheduler"
    assert not any(k.startswith(contract.DOMAIN)
                   for k in created["metadata"].get("annotations", {}))


def test_dry_run_submits_nothing(admin: Kubectl, bridge: Bridge, ns: str, local: Local) -> None:
    before = squeue(local)
    out = json.loads(admin.apply(marked_pod("dry"), "-n", ns, "--dry-run=server",
                                 "-o", "json").stdout)
    assert out["spec"]["schedulingGates"] == [{"name": contract.GATE}]
    assert out["metadata"]["annotations"][contract.A_JOB_STATE] == "DryRun"
    assert squeue(local) == before
    assert admin.run("get", "pod", "dry", "-n", ns, check=False).returncode != 0


def test_kubectl_get_shows_scheduling_gated(admin: Kubectl, bridge: Bridge, ns: str,
                                            local: Local) -> None:
    for i in range(len(local.slurm.nodes) + 1):
        admin.apply(marked_pod(f"p{i}"), "-n", ns)
    wait_until("one Pod SchedulingGated", lambda: "SchedulingGated" in admin.run(
        "get", "pods", "-n", ns).stdout, 30)


def test_placeholder_is_exclusive_read_back_from_slurm(local: Local, admin: Kubectl,
                                                       bridge: Bridge, ns: str) -> None:
    """Whatever the release and its REST dialect, the job Slurm runs for a Pod holds its whole
    node: read back from Slurm (REST and scontrol), not trusted from the request."""
    admin.apply(marked_pod("solo", "1Gi"), "-n", ns)
    job_id = int(job_id_of(admin, "solo", ns))

    async def read_back() -> JobInfo | None:
        async with SlurmClient(local.slurm.rest_url, local.slurm.token_file) as c:
            j = await c.job(job_id)
            return j if j is not None and j.state == "RUNNING" else None

    job = wait_until("placeholder RUNNING", lambda: asyncio.run(read_back()), 30)
    assert job.cpus == local.slurm.node_cpus  # asked for 1 CPU, holds all 8
    assert job.whole_nodes in (True, None)  # said outright from v0.0.41 on
    assert scontrol_job(local, str(job_id))["NumCPUs"] == str(local.slurm.node_cpus)


def test_a_grace_longer_than_the_gracetime_leaves_is_lowered(local: Local, admin: Kubectl,
                                                             bridge: Bridge, ns: str) -> None:
    """LONG_TERMINATION_GRACE=clamp, the default: the Pod is admitted with its grace lowered to
    what the partition's preemption GraceTime leaves once the binder noticed a preemption and
    evicted the Pod; the warning says so and the asked value stays in an annotation. The
    GraceTime is read from Slurm on every release (24.11+ moved it)."""
    async def grace_time() -> int | None:
        async with SlurmClient(local.slurm.rest_url, local.slurm.token_file) as c:
            return {p.name: p.grace_time_seconds for p in await c.partitions()}["k8s"]

    gt = asyncio.run(grace_time())
    assert gt == 20  # cluster/slurm_conf.py
    budget = preemption.stop_budget(gt)
    pod = marked_pod("slow-stop")  # no partition: the default one, k8s
    pod["spec"]["terminationGracePeriodSeconds"] = 600
    p = admin.apply(pod, "-n", ns, "-o", "json")
    assert (f"terminationGracePeriodSeconds 600 lowered to {budget}: partition 'k8s' has "
            f"preemption GraceTime {gt}s") in p.stderr, p.stderr
    created = json.loads(p.stdout)
    assert created["spec"]["terminationGracePeriodSeconds"] == budget == 16
    assert created["metadata"]["annotations"][contract.A_REQUESTED_GRACE] == "600"
    # what the kubelet will use: the stored object, read back
    assert admin.get("pod", "slow-stop", ns)["spec"]["terminationGracePeriodSeconds"] == 16


def test_a_pod_refused_after_its_submit_has_its_job_cancelled_by_the_webhook(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str) -> None:
    """A ResourceQuota refuses the Pod after our mutating webhook submitted its job (quota
    admission runs after mutation): no Pod ever names that job. The webhook looks for the Pod
    by the claim label it wrote and cancels the job, so the binder need not read Slurm's whole
    job list to find it."""
    admin.apply({"apiVersion": "v1", "kind": "ResourceQuota",
                 "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}}, "-n", ns)
    p = admin.apply(marked_pod("over-quota"), "-n", ns, check=False)
    assert p.returncode != 0 and "quota" in p.stderr, (p.stdout, p.stderr)
    jobs = [r for r in squeue(local) if r["comment"].endswith(f"pod={ns}/over-quota")]
    assert len(jobs) == 1, jobs  # the webhook did submit before the quota said no
    job = jobs[0]["id"]
    wait_until("the orphan job cancelled", lambda: not any(
        r["id"] == job and r["state"] != "COMPLETING" for r in squeue(local)),
        SETTLE + 2 * CHECK_EVERY + 10, interval=0.5)
    # the webhook found the Pod missing (the binder's sweep, which reads the whole list
    # every 10 s here, may have cancelled the job first: then the webhook says so)
    wait_until("the webhook says the Pod was never stored", lambda: any(
        "never stored" in line and f'"job": {job}' in line
        for line in _component_log("webhook")), 10)
