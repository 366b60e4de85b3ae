"""GPUs end to end: the local cluster's last two nodes have gres gpu:a100:4 in Slurm and
nvidia.com/gpu: 4 (label slurmgate.io/gpu-type=a100) on their kwok Nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from cluster.bridge import Bridge
from cluster.local import GPU_RESOURCE, Local, k8s_node_name
from slurmgate import contract, reasons
from tests.e2e.conftest import (
    Kubectl,
    marked_pod,
    scontrol_job,
    slurm_cli,
    squeue,
    wait_until,
)

pytestmark = pytest.mark.e2e


def gpu_pod(name: str, gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    p = marked_pod(name, annotations=annotations)
    p["spec"]["containers"][0]["resources"]["limits"] = {GPU_RESOURCE: str(gpus)}
    return p


def pods(admin: Kubectl, ns: str) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in admin.items("pods", ns=ns)}


def gpu_nodes(local: Local) -> set[str]:
    return {k8s_node_name(n) for n in local.slurm.gpu_nodes}


def job_gres(local: Local, job_id: str) -> str:
    """What the job asks per node: TresPerNode on every release (22.05: gres:gpu:2, 24.11+:
    gres/gpu:2), Gres on some."""
    j = scontrol_job(local, job_id)
    return f"{j.get('TresPerNode', '')} {j.get('Gres', '')}"


def bound_node(admin: Kubectl, ns: str, name: str) -> str | None:
    return pods(admin, ns).get(name, {}).get("spec", {}).get("nodeName")


def test_local_cluster_has_gpu_nodes(local: Local, admin: Kubectl) -> None:
    assert local.slurm.gpu_nodes == ["n3", "n4"]
    out = local.slurm.cli("sinfo", "-h", "-N", "-o", "%N %G").stdout.split("\n")
    gres = dict(line.split() for line in out if line.strip())
    assert gres == {"n1": "(null)", "n2": "(null)", "n3": "gpu:a100:4", "n4": "gpu:a100:4"}
    for n in ("n3", "n4"):
        node = admin.get("node", k8s_node_name(n))
        assert node["status"]["allocatable"][GPU_RESOURCE] == "4"
        assert node["metadata"]["labels"][contract.NODE_GPU_TYPE_LABEL] == "a100"
    assert GPU_RESOURCE not in admin.get("node", k8s_node_name("n1"))["status"]["allocatable"]


def test_gpu_pods_land_on_gpu_nodes_and_their_jobs_ask_for_the_gres(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str) -> None:
    admin.apply(gpu_pod("any", 2), "-n", ns)
    admin.apply(gpu_pod("typed", 2, {contract.A_GPU_TYPE: "a100"}), "-n", ns)
    wait_until("both GPU Pods bound", lambda: all(
        bound_node(admin, ns, n) for n in ("any", "typed")), 60)
    got = pods(admin, ns)
    on = {n: got[n]["spec"]["nodeName"] for n in ("any", "typed")}
    assert set(on.values()) == gpu_nodes(local), on  # exclusive: one each, both GPU nodes
    any_job = got["any"]["metadata"]["annotations"][contract.A_JOB_ID]
    typed_job = got["typed"]["metadata"]["annotations"][contract.A_JOB_ID]
    assert "gpu:2" in job_gres(local, any_job) and "a100" not in job_gres(local, any_job)
    assert "gpu:a100:2" in job_gres(local, typed_job), job_gres(local, typed_job)


def test_too_many_gpus_or_an_unknown_type_is_denied_with_the_numbers(
        admin: Kubectl, bridge: Bridge, ns: str) -> None:
    p = admin.apply(gpu_pod("huge", 8), "-n", ns, check=False)
    assert p.returncode != 0
    assert "request of 8 GPUs fits on no Slurm node of partition 'k8s'" in p.stderr, p.stderr
    assert "the most any node has is 4" in p.stderr
    p = admin.apply(gpu_pod("h100", 1, {contract.A_GPU_TYPE: "h100"}), "-n", ns, check=False)
    assert p.returncode != 0
    assert "GPU type 'h100'" in p.stderr and "(types there: a100)" in p.stderr, p.stderr
    p = admin.apply(gpu_pod("a100x5", 5, {contract.A_GPU_TYPE: "a100"}), "-n", ns, check=False)
    assert p.returncode != 0 and "request of 5 a100 GPUs" in p.stderr, p.stderr
    assert pods(admin, ns) == {}


def test_gpu_gang_lands_on_the_gpu_nodes(local: Local, admin: Kubectl, bridge: Bridge,
                                         ns: str) -> None:
    for i in range(2):
        admin.apply(gpu_pod(f"w{i}", 3, {contract.A_GROUP: "g", contract.A_GROUP_SIZE: "2",
                                         contract.A_GROUP_INDEX: str(i)}), "-n", ns)
    wait_until("both members bound", lambda: all(
        bound_node(admin, ns, f"w{i}") for i in range(2)), 60)
    got = pods(admin, ns)
    assert {got[f"w{i}"]["spec"]["nodeName"] for i in range(2)} == gpu_nodes(local)
    (job_id,) = {got[f"w{i}"]["metadata"]["annotations"][contract.A_JOB_ID] for i in range(2)}
    assert "gpu:3" in job_gres(local, job_id)
    assert scontrol_job(local, job_id)["NumNodes"] == "2"


def set_gpus(admin: Kubectl, node: str, count: str) -> None:
    patch = {"status": {"allocatable": {GPU_RESOURCE: count},
                        "capacity": {GPU_RESOURCE: count}}}
    admin.run("patch", "node", node, "--subresource=status", "--type=merge",
              "-p", json.dumps(patch))


@pytest.fixture
def gpus_restored(local: Local, admin: Kubectl) -> Iterator[None]:
    """The GPU Nodes report their 4 GPUs again after the test."""
    try:
        yield
    finally:
        for node in gpu_nodes(local):
            set_gpus(admin, node, "4")


def test_binder_refuses_a_node_without_the_gpus_and_gives_the_job_back(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str, gpus_restored: None) -> None:
    # Admitted while the Nodes show their GPUs (the webhook rightly refuses a Pod no Node can
    # hold), its job kept waiting by plain jobs on the GPU nodes; then the Nodes lose their GPUs
    # (a device plugin down) and the GPU nodes are freed for the job.
    fillers = [slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "k8s",
                         "--exclusive", "-w", n, "--mem=1000", "-J", "filler", "--wrap",
                         "sleep 600").strip().split(";")[0] for n in local.slurm.gpu_nodes]
    try:
        wait_until("the GPU nodes taken", lambda: {r["id"] for r in squeue(local)
                                                   if r["state"] == "RUNNING"} >= set(fillers),
                   30)
        admin.apply(gpu_pod("g", 2), "-n", ns)
        wait_until("the Pod's job waiting", lambda: [
            r for r in squeue(local) if f"pod={ns}/g" in r["comment"]], 30)
        for node in gpu_nodes(local):
            set_gpus(admin, node, "0")
            wait_until(f"{node} shows 0 GPUs", lambda n=node: admin.get("node", n)["status"]
                       ["allocatable"].get(GPU_RESOURCE) == "0", 10)
    finally:
        slurm_cli(local, "scancel", *fillers)
    first = wait_until("a running job for the Pod", lambda: [
        r for r in squeue(local) if f"pod={ns}/g" in r["comment"] and r["state"] == "RUNNING"],
        30)[0]

    def refused() -> list[dict]:
        assert not bound_node(admin, ns, "g"), "bound to a Node without GPUs"
        return [e for e in admin.items("events", ns=ns)
                if e["reason"] == reasons.EV_NODE_LACKS_GPUS and e["type"] == "Warning"]

    (said, *_) = wait_until("a NodeLacksGPUs Warning", refused, 30)
    assert f"Slurm allocated {first['nodes']} but Node {k8s_node_name(first['nodes'])} has 0 " \
           "allocatable GPUs, the Pod requests 2" in said["message"], said["message"]

    def given_back() -> bool:
        assert not bound_node(admin, ns, "g"), "bound to a Node without GPUs"
        job = pods(admin, ns)["g"]["metadata"]["annotations"].get(contract.A_JOB_ID)
        return bool(job) and job != first["id"]

    wait_until("the job given back and a new one submitted", given_back, 40)
    assert first["id"] not in {r["id"] for r in squeue(local) if r["state"] == "RUNNING"}

    for node in gpu_nodes(local):  # the device plugin is back
        set_gpus(admin, node, "4")
    node = wait_until("the Pod bound once a Node has its GPUs again",
                      lambda: bound_node(admin, ns, "g"), 60)
    assert node in gpu_nodes(local)
