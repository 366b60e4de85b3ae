"""slurmgate deployed like an operator deploys it, on real Nodes (containerd + kubelet): the
image `make image` builds, `kubectl apply -k` of overlays/local-incluster, and a marked Pod that
Slurm places on the real Node that is a Slurm node really runs (`make test-incluster`).

Its own cluster: real Node real-1 runs slurmgate's Pods (no Slurm there), real Node real-2 is
Slurm node n2 (Feature `real`), kwok Node kwok-n1 is Slurm node n1. Nothing here is faked but
the kwok Node.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster import incluster, realnode
from cluster import local as local_mod
from cluster.realnode import NodeSpec
from slurmgate import contract
from tests.e2e.conftest import Kubectl, squeue, wait_until
from tests.e2e.faultkit import metric

pytestmark = [pytest.mark.e2e, pytest.mark.incluster]
RUN_DIR = Path(os.environ.get("SLURMGATE_RUN_DIR", "/tmp/slurmgate"))
CONTROL, SLURM_REAL = "real-1", "real-2"
REAL_FEATURE = "real"
NS = "incluster"


@pytest.fixture(scope="module")
def cluster() -> Iterator[local_mod.Local]:
    real = [NodeSpec(CONTROL, labels={incluster.ROLE_LABEL: "slurmgate"}),
            NodeSpec(SLURM_REAL, labels={contract.NODE_LABEL: "n2"}, taints=[contract.TAINT])]
    lc = local_mod.up(RUN_DIR, nodes=2, gpu_nodes=0, real_nodes=real,
                      features={"n2": REAL_FEATURE})
    try:
        yield lc
    finally:
        local_mod.down(RUN_DIR)


@pytest.fixture(scope="module")
def admin(cluster: local_mod.Local) -> Kubectl:
    return Kubectl(cluster.kube.kubeconfig)


@pytest.fixture(scope="module")
def deployed(cluster: local_mod.Local, admin: Kubectl) -> Iterator[incluster.InCluster]:
    ic = incluster.up(cluster, settings={"LEASE_DURATION_SECONDS": "15",
                                         "BINDER_ORPHAN_GRACE": "10"})
    admin.run("create", "namespace", NS)
    # the workloads below run slurmgate's image too (the one image here with a Python in it)
    (slurm_node,) = [n for n in cluster.real if n.name == SLURM_REAL]
    realnode.import_image(slurm_node, Path(ic.archive))
    try:
        yield ic
    finally:
        incluster.down(cluster)


def _pod(admin: Kubectl, name: str, ns: str) -> dict[str, Any]:
    return admin.get("pod", name, ns)


def _phase(admin: Kubectl, name: str, ns: str) -> str:
    return str((_pod(admin, name, ns).get("status") or {}).get("phase"))


def test_slurmgate_runs_as_pods_on_the_control_node(cluster: local_mod.Local, admin: Kubectl,
                                                    deployed: incluster.InCluster) -> None:
    pods = admin.items("pods", ns=incluster.NAMESPACE, selector=incluster.SELECTOR)
    assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
    # only the leader's Pod is labelled, so the push Service reaches it alone
    leader = incluster.leader(cluster)
    labelled = [p["metadata"]["name"] for p in pods
                if p["metadata"]["labels"].get(contract.LEADER_LABEL) == "true"]
    assert labelled == [leader]
    assert incluster.push_endpoints(cluster) == [
        p["status"]["podIP"] for p in pods if p["metadata"]["name"] == leader]
    for p in pods:
        assert p["spec"]["nodeName"] == CONTROL
        statuses = {c["name"]: c for c in p["status"]["containerStatuses"]}
        assert set(statuses) == {"webhook", "binder"}
        for c in statuses.values():
            assert c["ready"] and "running" in c["state"], c
            assert c["image"].endswith(deployed.image.rsplit("/", 1)[1]), (c["image"],
                                                                             deployed.image)
    # the real kubelet ran them as the image's non-root user, root filesystem read-only
    out = admin.run("exec", "-n", incluster.NAMESPACE, pods[0]["metadata"]["name"], "-c",
                    "binder", "--", "python", "-c",
                    "import os; print(os.getuid())")
    assert out.stdout.strip() == "65532"
    ro = admin.run("exec", "-n", incluster.NAMESPACE, pods[0]["metadata"]["name"], "-c",
                   "webhook", "--", "python", "-c", "open('/probe', 'w')", check=False)
    assert ro.returncode != 0 and "Read-only file system" in ro.stderr, ro.stderr


def marked(name: str, image: str, script: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"slurmgate.io/scheduler": "slurm"},
                         "annotations": {contract.A_CONSTRAINT: REAL_FEATURE}},
            "spec": {"terminationGracePeriodSeconds": 2,
                     "containers": [{"name": "main", "image": image,
                                     "imagePullPolicy": "Never",
                                     "command": ["python", "-c", script],
                                     "resources": {"requests": {"memory": "256Mi",
                                                                "cpu": "500m"}}}]}}


SCRIPT = "import time; print('hello from the node Slurm chose', flush=True); time.sleep(3600)"


def test_marked_pod_runs_where_slurm_placed_it(cluster: local_mod.Local, admin: Kubectl,
                                               deployed: incluster.InCluster) -> None:
    admin.apply(marked("placed", deployed.image, SCRIPT), "-n", NS)
    wait_until("placed Running on the real Slurm Node", lambda: (
        (p := _pod(admin, "placed", NS))["spec"].get("nodeName") == SLURM_REAL
        and (p.get("status") or {}).get("phase") == "Running"), 90)
    job = _pod(admin, "placed", NS)["metadata"]["annotations"][contract.A_JOB_ID]
    assert any(r["id"] == job and r["state"] == "RUNNING" and r["nodes"] == "n2"
               for r in squeue(cluster)), squeue(cluster)
    wait_until("the container's line in kubectl logs", lambda: "hello from the node Slurm chose"
               in admin.run("logs", "-n", NS, "placed").stdout, 30)
    ex = admin.run("exec", "-n", NS, "placed", "--", "python", "-c", "print(6 * 7)")
    assert ex.stdout.strip() == "42"
    admin.run("delete", "pod", "placed", "-n", NS, "--wait=false")
    wait_until("the Pod's job gone from Slurm", lambda: not any(
        r["id"] == job and r["state"] in ("PENDING", "RUNNING") for r in squeue(cluster)), 60)


def test_killing_the_leader_pod_hands_over(cluster: local_mod.Local, admin: Kubectl,
                                           deployed: incluster.InCluster) -> None:
    old = wait_until("a leader", lambda: incluster.leader(cluster), 60)
    # no grace: the leader cannot give its Lease back, the standby takes it when it expires
    admin.run("delete", "pod", "-n", incluster.NAMESPACE, old, "--grace-period=0", "--force")
    new = wait_until("another Pod leading", lambda: (
        (h := incluster.leader(cluster)) is not None and h != old and h), 90)
    assert new != old
    # the Deployment replaces the killed Pod; the hook is pointed at the Pods now running
    wait_until("two slurmgate Pods Ready again", lambda: len([
        p for p in incluster.pods(cluster) if all(
            c.get("ready") for c in (p.get("status") or {}).get("containerStatuses") or [{}])
    ]) == 2, 120)
    # the push Service follows: the new leader's Pod alone is behind it
    by_name = {p["metadata"]["name"]: p["status"].get("podIP") for p in incluster.pods(cluster)}
    wait_until("the push Service at the new leader alone", lambda: incluster.push_endpoints(
        cluster) == [by_name[new]], 60)
    incluster.point_push_hook(cluster)
    new_url = f"http://{by_name[new]}:{incluster.BINDER_PORT}"

    def heard() -> float:  # starts pushed to it and taken, not refused as a standby
        return sum(metric(new_url, "slurmgate_binder_slurm_pushes_total",
                          f'event="started",outcome="{o}"')
                   for o in ("applied", "known", "early", "applied_late"))

    heard0 = heard()
    admin.apply(marked("after-handover", deployed.image, SCRIPT), "-n", NS)
    wait_until("after-handover Running on the real Slurm Node", lambda: (
        (p := _pod(admin, "after-handover", NS))["spec"].get("nodeName") == SLURM_REAL
        and (p.get("status") or {}).get("phase") == "Running"), 90)
    lease = json.loads(admin.run("get", "lease", "-n", incluster.NAMESPACE, incluster.LEASE,
                                 "-o", "json").stdout)
    assert lease["spec"]["holderIdentity"] == new
    # slurmctld's hook reaches the new leader: it heard the start of after-handover's job
    wait_until("the new leader heard a job's start pushed", lambda: heard() > heard0, 30)
