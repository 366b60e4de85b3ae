"""Gangs on the real cluster: one Slurm job with --nodes=N, all members bound at once."""

from __future__ import annotations

import re

import pytest

from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract, hostlist
from tests.e2e.conftest import (
    Kubectl,
    marked_pod,
    scontrol_job,
    slurm_cli,
    squeue,
    wait_until,
)

pytestmark = pytest.mark.e2e


def member(name: str, group: str, size: int, index: int) -> dict:
    return marked_pod(name, annotations={contract.A_GROUP: group,
                                         contract.A_GROUP_SIZE: str(size),
                                         contract.A_GROUP_INDEX: str(index)})


def pods(admin: Kubectl, ns: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in admin.items("pods", ns=ns)}


def scontrol_shares(local: Local, job_id: str) -> dict[str, tuple[str, str]]:
    """Slurm node -> (memory MB, GPU indices) of the job, from `scontrol -d show job`."""
    out = slurm_cli(local, "scontrol", "-d", "-o", "show", "job", job_id)
    told = {}
    for expr, mem, gres in re.findall(r"Nodes=(\S+) CPU_IDs=\S+ Mem=(\d+) GRES=(\S*)", out):
        idx = re.search(r"gpu[^(]*\(IDX:([^)]*)\)", gres)
        for node in hostlist.expand(expr):
            told[node] = (mem, idx.group(1) if idx else "")
    return told


def group_jobs(local: Local) -> list[dict[str, str]]:
    return [r for r in squeue(local) if " group=" in r["comment"]]


def test_group_waits_for_whole_allocation_then_binds_together(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str) -> None:
    for i in range(2):  # two of four Nodes busy
        admin.apply(marked_pod(f"busy{i}"), "-n", ns)
    wait_until("2 busy Pods Running", lambda: sum(
        p["status"].get("phase") == "Running" for p in pods(admin, ns).values()) == 2, 30)
    for i in range(3):
        admin.apply(member(f"train{i}", "train", 3, i), "-n", ns)
    (row,) = wait_until("one 3-node job pending", lambda: [
        r for r in group_jobs(local) if r["state"] == "PENDING"], 30)
    wait_until("members show the pending reason", lambda: all(
        pods(admin, ns)[f"train{i}"]["metadata"]["annotations"].get(contract.A_JOB_REASON)
        for i in range(3)), 15)
    assert not any(pods(admin, ns)[f"train{i}"]["spec"].get("nodeName") for i in range(3))

    admin.run("delete", "pod", "busy0", "busy1", "-n", ns, "--wait=false")
    wait_until("all members bound", lambda: all(
        pods(admin, ns)[f"train{i}"]["spec"].get("nodeName") for i in range(3)), 60)
    got = pods(admin, ns)
    job_ids = {got[f"train{i}"]["metadata"]["annotations"][contract.A_JOB_ID] for i in range(3)}
    (job_id,) = job_ids  # one job for the whole group
    if job_id != row["id"]:
        # Only a start Slurm refused may replace the pending job: after the fault test in which
        # slurmctld lost its state, ids are reused and slurmd revokes the credential of a job id
        # it killed shortly before. The binder must have said so.
        said = [e["message"] for e in admin.items("events", ns=ns)]
        assert any(f"Slurm job {row['id']} " in m and "before the Pod started" in m
                   for m in said), (job_id, row["id"], said)
    (running,) = [r for r in squeue(local) if r["id"] == job_id]
    nodes = hostlist.expand(running["nodes"])
    assert len(nodes) == 3
    # rank i on the job's i-th node, three distinct Nodes
    assert [got[f"train{i}"]["spec"]["nodeName"] for i in range(3)] == [
        k8s_node_name(n) for n in nodes]
    assert [got[f"train{i}"]["metadata"]["annotations"][contract.A_SLURM_NODE]
            for i in range(3)] == nodes
    # each member shows its own node's share, as Slurm's own CLI tells it
    def shown() -> list[str]:
        got = pods(admin, ns)
        out = [got[f"train{i}"]["metadata"]["annotations"].get(contract.A_ALLOCATION, "")
               for i in range(3)]
        return out if all(out) else []

    shares = wait_until("each member shows its node's allocation", shown, 30)
    told = scontrol_shares(local, job_id)
    for node, share in zip(nodes, shares, strict=True):
        mem, gpus = told[node]
        assert f"memory={mem}M" in share, (node, share, told)
        assert (f"gpus={gpus}" in share) if gpus else ("gpus=" not in share), (share, told)


def test_indexed_job_is_one_allocation(local: Local, admin: Kubectl, bridge: Bridge,
                                       ns: str) -> None:
    tmpl = marked_pod("x")
    tmpl["spec"]["restartPolicy"] = "Never"
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "trainer", "annotations": {contract.A_TIME_LIMIT: "10"}},
           "spec": {"completionMode": "Indexed", "completions": 2, "parallelism": 2,
                    "template": {"metadata": {"labels": tmpl["metadata"]["labels"]},
                                 "spec": tmpl["spec"]}}}
    admin.apply(job, "-n", ns)
    bound = wait_until("both indexed Pods bound", lambda: (ps := [
        p for p in admin.items("pods", ns=ns) if p["spec"].get("nodeName")]) and len(ps) == 2
        and ps, 60)
    by_index = {int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]):
                p for p in bound}
    anns = [by_index[i]["metadata"]["annotations"] for i in (0, 1)]
    assert anns[0][contract.A_JOB_ID] == anns[1][contract.A_JOB_ID]  # one Slurm job
    assert anns[0][contract.A_GROUP_SIZE] == "2"
    job_id = anns[0][contract.A_JOB_ID]
    # kwok completes Job Pods at once; when both succeeded the allocation is released
    wait_until("group job released", lambda: not [
        r for r in squeue(local) if r["id"] == job_id], 30)
    # (read after the end: while a job completes, Slurm shows only its nodes still completing)
    info = scontrol_job(local, job_id)
    assert info["NumNodes"] == "2"  # one 2-node allocation
    assert info["TimeLimit"] == "00:10:00"  # the Job's own Slurm option applied to its Pods
    nodes = hostlist.expand(info["NodeList"])
    assert info["BatchHost"] == nodes[0]
    # index 0 on the job's first node, index 1 on the second
    for i in (0, 1):
        assert anns[i][contract.A_SLURM_NODE] == nodes[i]
        assert by_index[i]["spec"]["nodeName"] == k8s_node_name(nodes[i])


def test_preempting_group_job_evicts_every_member(local: Local, admin: Kubectl,
                                                  bridge: Bridge, ns: str) -> None:
    for i in range(2):
        admin.apply(member(f"g{i}", "pair", 2, i), "-n", ns)
    wait_until("pair bound", lambda: (ps := pods(admin, ns)) and len(ps) == 2 and all(
        p["status"].get("phase") == "Running" for p in ps.values()), 60)
    out = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "hpc", "--exclusive",
                    f"-N{len(local.slurm.nodes) - 1}", "--mem=1000", "--wrap", "sleep 300")
    hpc = out.strip().split(";")[0]
    try:
        wait_until("every member evicted", lambda: not pods(admin, ns), 90)
        wait_until("hpc job RUNNING", lambda: any(
            r["id"] == hpc and r["state"] == "RUNNING" for r in squeue(local)), 90)
    finally:
        slurm_cli(local, "scancel", hpc)
    reasons = [e["reason"] for e in admin.items("events", ns=ns)]
    assert reasons.count("SlurmJobPreempted") >= 2, reasons
