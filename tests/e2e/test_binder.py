"""The binder against the real cluster: bind where Slurm allocated; keep both sides in sync."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from cluster import bridge as bridge_mod
from cluster import kube
from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract
from tests.e2e.conftest import Kubectl, marked_pod, slurm_cli, squeue, wait_until

pytestmark = pytest.mark.e2e


def running_pods(admin: Kubectl, ns: str) -> list[dict]:
    return [p for p in admin.items("pods", ns=ns)
            if p["status"].get("phase") == "Running" and not p["metadata"].get(
                "deletionTimestamp")]


def events(admin: Kubectl, ns: str, name: str) -> list[str]:
    return [e["reason"] for e in admin.items("events", ns=ns)
            if e["involvedObject"]["name"] == name]


def our_jobs(local: Local) -> list[dict[str, str]]:
    return [r for r in squeue(local) if r["comment"].startswith(contract.COMMENT_PREFIX)]


def test_pod_bound_where_slurm_allocated(local: Local, admin: Kubectl, bridge: Bridge,
                                         ns: str) -> None:
    admin.apply(marked_pod("one"), "-n", ns)
    pod = wait_until("Pod Running", lambda: (p := admin.get("pod", "one", ns))["status"].get(
        "phase") == "Running" and p, 30)
    ann = pod["metadata"]["annotations"]
    (row,) = [r for r in squeue(local) if r["id"] == ann[contract.A_JOB_ID]]
    assert row["state"] == "RUNNING"
    assert pod["spec"]["nodeName"] == k8s_node_name(row["nodes"])
    assert ann[contract.A_SLURM_NODE] == row["nodes"]
    assert not pod["spec"].get("schedulingGates")
    wait_until("Bound event", lambda: {"SlurmAllocated", "Bound"} <= set(
        events(admin, ns, "one")), 10)
    describe = admin.run("describe", "pod", "one", "-n", ns).stdout
    assert f"{contract.A_JOB_ID}: {row['id']}" in describe
    assert "Bound" in describe
    with urllib.request.urlopen(f"{bridge.binder_url}/metrics", timeout=5) as r:
        prom = r.read().decode()
    for hist in ("running_to_bound", "created_to_bound"):
        count = next(line for line in prom.splitlines()
                     if line.startswith(f"slurmgate_binder_{hist}_seconds_count"))
        assert float(count.split()[-1]) >= 1, count


def test_more_pods_than_nodes_then_freed(local: Local, admin: Kubectl, bridge: Bridge,
                                         ns: str) -> None:
    n = len(local.slurm.nodes)
    for i in range(n + 1):
        admin.apply(marked_pod(f"p{i}"), "-n", ns)
    wait_until(f"{n} Pods Running", lambda: len(running_pods(admin, ns)) == n, 60)
    nodes = {p["spec"]["nodeName"] for p in running_pods(admin, ns)}
    assert len(nodes) == n  # exclusive: one Pod per Node
    (waiting,) = [p for p in admin.items("pods", ns=ns) if p["status"].get("phase") != "Running"]
    name = waiting["metadata"]["name"]
    reason = wait_until("pending reason recorded", lambda: admin.get("pod", name, ns)[
        "metadata"]["annotations"].get(contract.A_JOB_REASON), 15)
    assert reason in ("Resources", "Priority")
    # the apiserver sets PodScheduled=False/SchedulingGated for gated Pods: kubectl shows it
    assert admin.run("get", "pod", name, "-n", ns, "--no-headers").stdout.split()[2] == \
        "SchedulingGated"
    describe = admin.run("describe", "pod", name, "-n", ns).stdout
    # Slurm may switch the reason between Priority and Resources from one cycle to the next
    assert re.search(rf"{contract.A_JOB_REASON}: (Resources|Priority)", describe), describe
    assert "SlurmJobPending" in describe

    victim = running_pods(admin, ns)[0]
    freed = victim["spec"]["nodeName"]
    admin.run("delete", "pod", victim["metadata"]["name"], "-n", ns, "--wait=false")
    pod = wait_until("waiting Pod bound to the freed Node", lambda: (
        p := admin.get("pod", name, ns))["spec"].get("nodeName") and p, 60)
    assert pod["spec"]["nodeName"] == freed
    wait_until("jobs == Pods", lambda: len(our_jobs(local)) == n, 30)


class NodeSharingWatch(threading.Thread):
    """Samples Slurm and Kubernetes: never a non-placeholder job on a Node holding a live Pod."""

    def __init__(self, local: Local, admin: Kubectl, ns: str) -> None:
        super().__init__(daemon=True)
        self.local, self.admin, self.ns = local, admin, ns
        self.stop_flag = threading.Event()
        self.violations: list[str] = []
        self.samples = 0

    def run(self) -> None:
        while not self.stop_flag.is_set():
            hpc = {r["nodes"] for r in squeue(self.local)
                   if r["partition"] == "hpc" and r["state"] == "RUNNING"}
            pod_nodes = {p["spec"].get("nodeName") for p in self.admin.items("pods", ns=self.ns)}
            both = hpc & {n.removeprefix("kwok-") for n in pod_nodes if n}
            if both:
                self.violations.append(f"sample {self.samples}: {sorted(both)}")
            self.samples += 1
            time.sleep(0.2)


def test_slurm_preempts_placeholder_and_pod_is_evicted(local: Local, admin: Kubectl,
                                                       bridge: Bridge, ns: str) -> None:
    n = len(local.slurm.nodes)
    for i in range(n):
        admin.apply(marked_pod(f"p{i}"), "-n", ns)
    wait_until("all Nodes hold a Pod", lambda: len(running_pods(admin, ns)) == n, 60)
    watch = NodeSharingWatch(local, admin, ns)
    watch.start()
    try:
        out = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "hpc",
                        "--exclusive", "-N1",
                        "--mem=1000", "-J", "hpc-train", "--wrap", "sleep 300")
        hpc_id = out.strip().split(";")[0]
        wait_until("hpc job RUNNING", lambda: any(
            r["id"] == hpc_id and r["state"] == "RUNNING" for r in squeue(local)), 120)
    finally:
        watch.stop_flag.set()
        watch.join()
        slurm_cli(local, "scancel", hpc_id)
    assert watch.samples > 5
    assert watch.violations == [], watch.violations
    evicted = [e for e in admin.items("events", ns=ns) if e["reason"] == "SlurmJobPreempted"]
    assert evicted, "no Pod got a SlurmJobPreempted Event"
    assert any(e["reason"] == "Evicted" for e in admin.items("events", ns=ns))


def test_cordon_drains_and_uncordon_resumes(local: Local, admin: Kubectl, bridge: Bridge,
                                            ns: str) -> None:
    slurm_node = local.slurm.nodes[0]
    node = k8s_node_name(slurm_node)

    def sinfo() -> tuple[str, str]:
        out = slurm_cli(local, "sinfo", "-h", "-N", "-n", slurm_node, "-o", "%t|%E").splitlines()
        state, reason = out[0].split("|", 1)
        return state, reason

    admin.run("cordon", node)
    try:
        _, reason = wait_until("Slurm node drained", lambda: (
            s := sinfo())[0].startswith("drain") and s, 20)
        assert reason == f"{contract.DRAIN_REASON_PREFIX} {node}"
        # a drained node gets no placeholder: the Pod lands elsewhere
        admin.apply(marked_pod("elsewhere"), "-n", ns)
        pod = wait_until("Pod Running", lambda: (p := admin.get("pod", "elsewhere", ns))[
            "status"].get("phase") == "Running" and p, 30)
        assert pod["spec"]["nodeName"] != node
    finally:
        admin.run("uncordon", node)
    wait_until("Slurm node resumed", lambda: sinfo()[0] in ("idle", "mix", "alloc"), 20)


@pytest.mark.hostprocs
def test_binder_sigkill_mid_flow_loses_nothing(local: Local, admin: Kubectl, bridge: Bridge,
                                               ns: str) -> None:
    n = len(local.slurm.nodes)
    total = n + 2
    for i in range(total):
        admin.apply(marked_pod(f"k{i}", generate=True), "-n", ns)
        if i == 2:
            os.kill(bridge.pids["binder"], signal.SIGKILL)
    bridge_mod.stop_processes(bridge, ("binder",))
    # while the binder is down, a bound Pod is deleted: its job must still be cancelled later
    victim = next((p for p in running_pods(admin, ns)), None)
    if victim:
        admin.run("delete", "pod", victim["metadata"]["name"], "-n", ns, "--wait=false")
        total -= 1
    bridge_mod.start_processes(bridge, ("binder",))
    wait_until(f"{n} Pods Running", lambda: len(running_pods(admin, ns)) == n, 90)
    pods = admin.items("pods", ns=ns)
    assert len(pods) == total
    claims = {p["metadata"]["annotations"][contract.A_CLAIM] for p in pods}
    # every job belongs to a live Pod and every Pod has exactly one job (orphans cancelled)
    wait_until("jobs match Pods", lambda: sorted(
        contract.claim_from_comment(r["comment"]) or "" for r in our_jobs(local)) == sorted(
        claims), 90)
    for p in pods:
        if p["status"].get("phase") == "Running":
            assert p["spec"]["nodeName"] == k8s_node_name(
                p["metadata"]["annotations"][contract.A_SLURM_NODE])


def _binder_ready(url: str) -> str:
    with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
        return r.read().decode()


@pytest.mark.hostprocs
def test_second_replica_stands_by_and_takes_over(local: Local, admin: Kubectl, bridge: Bridge,
                                                 ns: str) -> None:
    port = bridge_mod.BINDER_PORT + 7
    log = open(Path(bridge.run_dir) / "log" / "binder-2.log", "ab")
    second = subprocess.Popen(
        [sys.executable, "-m", "slurmgate.binder", f"--health-listen=127.0.0.1:{port}"],
        env={**os.environ, **bridge.env}, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_until("second binder answers", lambda: _binder_ready(url), 30) == \
            "ok standby"
        lease = admin.get("lease", "slurmgate-binder", "slurmgate-system")
        first_holder = lease["spec"]["holderIdentity"]
        admin.apply(marked_pod("while-two"), "-n", ns)
        wait_until("bound by the leader", lambda: admin.get("pod", "while-two", ns)[
            "spec"].get("nodeName"), 30)
        assert _binder_ready(url) == "ok standby"  # still standing by: it never acted
        # the leader dies without releasing the Lease; the standby takes over after expiry
        os.kill(bridge.pids["binder"], signal.SIGKILL)
        bridge_mod.stop_processes(bridge, ("binder",))
        wait_until("standby became leader", lambda: _binder_ready(url) == "ok leader", 40)
        assert admin.get("lease", "slurmgate-binder", "slurmgate-system")["spec"][
            "holderIdentity"] != first_holder
        admin.apply(marked_pod("after-takeover"), "-n", ns)
        wait_until("bound by the new leader", lambda: admin.get("pod", "after-takeover", ns)[
            "spec"].get("nodeName"), 30)
    finally:
        kube.stop_pids({"binder-2": second.pid}, timeout=10)
        second.wait(timeout=10)
        bridge_mod.start_processes(bridge, ("binder",))


def test_eviction_refused_by_pdb_then_deleted(local: Local, admin: Kubectl, bridge: Bridge,
                                              ns: str) -> None:
    pod = marked_pod("guarded")
    pod["metadata"]["labels"]["app"] = "guarded"
    admin.apply(pod, "-n", ns)
    admin.apply({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                 "metadata": {"name": "guard"},
                 "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "guarded"}}}},
                "-n", ns)
    running = wait_until("guarded Pod Running", lambda: (p := admin.get("pod", "guarded", ns))[
        "status"].get("phase") == "Running" and p, 30)
    job_id = running["metadata"]["annotations"][contract.A_JOB_ID]
    wait_until("PDB sees the Pod", lambda: admin.get("pdb", "guard", ns).get("status", {}).get(
        "currentHealthy") == 1, 30)
    slurm_cli(local, "scancel", job_id)  # Slurm takes the node back
    wait_until("EvictionRefused Event", lambda: "EvictionRefused" in events(admin, ns, "guarded"),
               30)
    # refused for longer than BINDER_EVICT_GRACE (8 s here): the Pod is deleted anyway
    wait_until("guarded Pod deleted", lambda: admin.run(
        "get", "pod", "guarded", "-n", ns, check=False).returncode != 0, 60)
    reasons = events(admin, ns, "guarded")
    assert "SlurmJobCancelled" in reasons and "Evicted" in reasons
