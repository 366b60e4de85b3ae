"""The jobs the binder submits itself, read back from Slurm (issue 30): a gang's job, and a
single Pod's job submitted again after the binder gave the first one back. The webhook's
submits are read back elsewhere (test_tenancy, test_webhook); the binder builds its own
JobSpec (binder/actions.py submit_group, submit_pod) from the policy in force then, so its
jobs must be checked on their own.

- user and account: docs/operator-guide.md "Tenancy" -- the user "never comes from the Pod",
  the account is the Pod's annotation if the tenant allows it, else the tenant's `account`;
- whole nodes: docs/user-guide.md "The placeholder job" -- exclusive, "a Node runs either a
  Slurm job or a Pod"; a gang is "ONE job `--nodes=N --exclusive`" (docs/user-guide.md
  "Behaviour in detail"). Read back as test_webhook's
  test_placeholder_is_exclusive_read_back_from_slurm does (every CPU of each node allocated,
  OverSubscribe=NO, REST's job_resources.nodes.whole where said).
"""

from __future__ import annotations

import asyncio

import pytest

from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract, hostlist, reasons
from slurmgate.slurm import JobInfo, SlurmClient
from tests.e2e.conftest import Kubectl, job_id_of, marked_pod, scontrol_job, slurm_cli, wait_until
from tests.e2e.faultkit import bound_pods, events_of, fillers_on, pods, scancel_quiet
from tests.e2e.tenantkit import set_gpus_and_wait, team_a_namespace, user_account
from tests.e2e.test_gpus import gpu_pod

pytestmark = pytest.mark.e2e


def rest_job(local: Local, job_id: str) -> JobInfo | None:
    """The job as slurmrestd returns it (GET /job/{id}), in slurmgate's own model."""
    async def get() -> JobInfo | None:
        async with SlurmClient(local.slurm.rest_url, local.slurm.token_file) as c:
            return await c.job(int(job_id))

    return asyncio.run(get())


def node_cpus(local: Local, slurm_node: str) -> tuple[str, str]:
    """(CPUAlloc, CPUTot) of a Slurm node: a job with the whole node holds every CPU."""
    out = slurm_cli(local, "scontrol", "show", "node", "-o", slurm_node)
    fields = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
    return fields["CPUAlloc"], fields["CPUTot"]


def assert_whole_nodes(local: Local, job_id: str, nodes: int) -> list[str]:
    """The RUNNING job holds `nodes` whole nodes, by scontrol, slurmrestd and the nodes
    themselves; returns its Slurm nodes."""
    per_node = local.slurm.node_cpus
    j = scontrol_job(local, job_id)
    assert j["JobState"] == "RUNNING", j["JobState"]
    assert j["NumNodes"].split("-")[0] == str(nodes), j["NumNodes"]
    assert j["OverSubscribe"] == "NO", j["OverSubscribe"]  # exclusive
    assert j["NumCPUs"] == str(nodes * per_node), j["NumCPUs"]  # asked 1 CPU a member
    rest = rest_job(local, job_id)
    assert rest is not None and rest.state == "RUNNING", rest
    assert rest.cpus == nodes * per_node, rest.cpus
    assert rest.whole_nodes in (True, None), rest.whole_nodes  # said outright from v0.0.41
    slurm_nodes = hostlist.expand(j["NodeList"])
    assert len(slurm_nodes) == nodes, slurm_nodes
    for n in slurm_nodes:
        alloc, total = node_cpus(local, n)
        assert alloc == total == str(per_node), (n, alloc, total)
    return slurm_nodes


def test_gang_job_runs_as_the_tenant_on_whole_nodes(local: Local, admin: Kubectl,
                                                    bridge: Bridge, ns: str) -> None:
    with team_a_namespace(admin, bridge, ns):
        for i in range(2):  # the account a member names, which team A may use
            admin.apply(marked_pod(f"w{i}", annotations={
                contract.A_GROUP: "pair", contract.A_GROUP_SIZE: "2",
                contract.A_GROUP_INDEX: str(i), contract.A_ACCOUNT: "shared"}), "-n", ns)
        got = wait_until("both members bound", lambda: bound_pods(admin, ns, ["w0", "w1"]), 60)
    (job_id,) = {got[f"w{i}"]["metadata"]["annotations"][contract.A_JOB_ID] for i in range(2)}
    # the binder submitted it (a gang's job is never the webhook's), and says so
    wait_until("the binder's SlurmJobSubmitted Event", lambda: any(
        f"submitted job {job_id} for 2 nodes" in e["message"]
        for e in events_of(admin, ns, reasons.EV_JOB_SUBMITTED)), 15)
    assert user_account(local, job_id) == ("sg-team-a", "shared")
    rest = rest_job(local, job_id)
    assert rest is not None and rest.user == "sg-team-a", rest
    slurm_nodes = assert_whole_nodes(local, job_id, 2)
    assert [got[f"w{i}"]["spec"]["nodeName"] for i in range(2)] == [
        k8s_node_name(n) for n in slurm_nodes]


def test_resubmitted_job_runs_as_the_tenant_on_a_whole_node(local: Local, admin: Kubectl,
                                                            bridge: Bridge, ns: str) -> None:
    """The binder gives a Pod's job back when the Node Slurm chose lacks the GPUs the Pod asks
    for (docs/operator-guide.md "GPUs": after BINDER_GPU_GRACE, "the job is cancelled and a new one
    submitted"), as test_gpus does; that new job is the binder's own submit."""
    gpu_nodes = [k8s_node_name(n) for n in local.slurm.gpu_nodes]
    fillers: list[str] = []
    with team_a_namespace(admin, bridge, ns):
        try:
            fillers = fillers_on(local, local.slurm.gpu_nodes)  # the Pod's job waits
            admin.apply(gpu_pod("g", 2), "-n", ns)
            first = job_id_of(admin, "g", ns)  # the webhook's
            for node in gpu_nodes:
                set_gpus_and_wait(admin, node, "0")
            scancel_quiet(local, *fillers)  # the job starts where the GPUs are missing

            def given_back() -> str | None:
                p = pods(admin, ns).get("g")
                assert p is not None, "the Pod was deleted instead of waiting for a new job"
                assert not p["spec"].get("nodeName"), "bound to a Node without its GPUs"
                job = p["metadata"]["annotations"].get(contract.A_JOB_ID)
                return job if job and job != first else None

            wait_until("the job given back and another submitted", given_back, 60)
            for node in gpu_nodes:
                set_gpus_and_wait(admin, node, "4")
            pod = wait_until("g bound", lambda: (p := admin.get("pod", "g", ns))["spec"].get(
                "nodeName") and p, 60)
        finally:
            scancel_quiet(local, *fillers)
            for node in gpu_nodes:
                set_gpus_and_wait(admin, node, "4")
    job_id = pod["metadata"]["annotations"][contract.A_JOB_ID]
    assert job_id != first
    # the binder's own submit, and it says so (the webhook's is "... submitted at admission")
    wait_until("the binder's SlurmJobSubmitted Event", lambda: any(
        e["message"] == f"submitted placeholder job {job_id} as Slurm user sg-team-a"
        for e in events_of(admin, ns, reasons.EV_JOB_SUBMITTED)), 15)
    assert user_account(local, job_id) == ("sg-team-a", "team-a")
    assert user_account(local, first) == ("sg-team-a", "team-a")  # as the webhook's was
    rest = rest_job(local, job_id)
    assert rest is not None and rest.user == "sg-team-a", rest
    (slurm_node,) = assert_whole_nodes(local, job_id, 1)
    assert pod["spec"]["nodeName"] == k8s_node_name(slurm_node) in gpu_nodes
