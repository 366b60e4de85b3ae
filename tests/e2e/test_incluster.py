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
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster import incluster, realnode, slurm_faults
from cluster import local as local_mod
from cluster.realnode import NodeSpec
from slurmgate import contract, reasons
from slurmgate.preemption import stop_budget
from tests.e2e.conftest import Kubectl, slurm_cli, squeue, wait_until
from tests.e2e.faultkit import metric
from tests.e2e.overlap import OverlapSampler

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


def marked(name: str, image: str, script: str, grace: int = 2,
           args: tuple[str, ...] = (), annotations: dict[str, str] | None = None
           ) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"slurmgate.io/scheduler": "slurm"},
                         "annotations": {contract.A_CONSTRAINT: REAL_FEATURE,
                                         **(annotations or {})}},
            "spec": {"terminationGracePeriodSeconds": grace,
                     "containers": [{"name": "main", "image": image,
                                     "imagePullPolicy": "Never",
                                     "command": ["python", "-c", script, *args],
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


# ---------------------------------------------------------------- the invariant, for real
# A Pod that takes its time to stop: it ignores SIGTERM, so the kubelet stops it only with
# SIGKILL at the end of its terminationGracePeriodSeconds. Its marker (argv) lets the sampler
# find its processes in /proc.
STUBBORN = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', sys.argv[1], flush=True); time.sleep(3600)")
GRACE_TIME = 20  # the local k8s partition's (cluster/slurm_conf.py)


def _stubborn_on_n2(admin: Kubectl, image: str, name: str, grace: int,
                    annotations: dict[str, str] | None = None) -> tuple[str, str]:
    """A stubborn marked Pod, running on the real Node that is Slurm node n2: its marker and
    its placeholder job's id."""
    marker = f"sg-inv-{uuid.uuid4().hex[:12]}"
    admin.apply(marked(name, image, STUBBORN, grace=grace, args=(marker,),
                       annotations=annotations), "-n", NS)
    wait_until(f"{name} Running on the real Slurm Node", lambda: (
        (p := _pod(admin, name, NS))["spec"].get("nodeName") == SLURM_REAL
        and (p.get("status") or {}).get("phase") == "Running"), 90)
    wait_until(f"{name}'s container up", lambda: marker in admin.run(
        "logs", "-n", NS, name).stdout, 30)
    return marker, _pod(admin, name, NS)["metadata"]["annotations"][contract.A_JOB_ID]


def _sbatch(cluster: local_mod.Local, *args: str) -> int:
    return int(slurm_cli(cluster, "sbatch", "--parsable", "--output=/dev/null", "-w", "n2",
                         "--mem=256M", *args).strip().split(";")[0])


def _state(cluster: local_mod.Local, job: int) -> str:
    return next((r["state"] for r in squeue(cluster) if r["id"] == str(job)), "gone")


def _reasons(admin: Kubectl, name: str) -> list[str]:
    return [e["reason"] for e in admin.items("events", ns=NS)
            if e["involvedObject"]["name"] == name]


def test_the_sampler_sees_an_overlap(cluster: local_mod.Local, admin: Kubectl,
                                     deployed: incluster.InCluster) -> None:
    """The check below can fail: a plain Pod pinned onto the real Node (bypassing Slurm, from
    a namespace of node infrastructure, which the taint guard lets tolerate the taint) beside
    a batch job on n2 is seen as the overlap it is."""
    marker = f"sg-inv-{uuid.uuid4().hex[:12]}"
    infra = "inv-infra"
    admin.run("create", "namespace", infra, check=False)
    admin.run("label", "namespace", infra, f"{contract.INFRA_NAMESPACE_LABEL}=true",
              "--overwrite")
    job = _sbatch(cluster, "-p", "hpc", "--wrap=sleep 600")
    try:
        wait_until("the batch job RUNNING on n2", lambda: _state(cluster, job) == "RUNNING", 60)
        bypass = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bypass"},
                  "spec": {"nodeName": SLURM_REAL, "terminationGracePeriodSeconds": 0,
                           "tolerations": [{"operator": "Exists"}],
                           "containers": [{"name": "main", "image": deployed.image,
                                           "imagePullPolicy": "Never",
                                           "command": ["python", "-c", STUBBORN, marker]}]}}
        with OverlapSampler(str(cluster.slurm.conf), "n2", marker) as s:
            admin.apply(bypass, "-n", infra)
            wait_until("the sampler saw both at once", lambda: bool(s.overlaps), 60)
        assert s.saw_job(job), s.report()
    finally:
        admin.run("delete", "pod", "bypass", "-n", infra, "--grace-period=0", "--force",
                  check=False)
        slurm_cli(cluster, "scancel", str(job))


def test_a_preempted_pod_is_gone_before_the_preemptor_starts(
        cluster: local_mod.Local, admin: Kubectl, deployed: incluster.InCluster) -> None:
    """An hpc job preempts a bound Pod that ignores SIGTERM and asked for 30 s to stop: the
    webhook lowered its grace to what the k8s partition's GraceTime leaves, the binder evicts
    it on the preemption, and /proc never shows the Pod and the hpc job on the Node at once."""
    marker, placeholder = _stubborn_on_n2(admin, deployed.image, "inv-preempted", grace=30)
    assert _pod(admin, "inv-preempted", NS)["spec"]["terminationGracePeriodSeconds"] == \
        stop_budget(GRACE_TIME)
    with OverlapSampler(str(cluster.slurm.conf), "n2", marker) as s:
        wait_until("the sampler saw the Pod", s.saw_pod, 10)
        hpc = _sbatch(cluster, "-p", "hpc", "--exclusive", "--wrap=sleep 600")
        try:
            wait_until("the hpc job RUNNING on n2", lambda: _state(cluster, hpc) == "RUNNING",
                       GRACE_TIME + 60)
            wait_until("the sampler saw the hpc job's processes", lambda: s.saw_job(hpc), 30)
        finally:
            slurm_cli(cluster, "scancel", str(hpc))
    assert s.saw_pod() and not s.overlaps, s.report()
    assert reasons.EV_JOB_PREEMPTED in _reasons(admin, "inv-preempted")
    assert _state(cluster, int(placeholder)) not in ("RUNNING", "PENDING")


def test_a_pod_starts_only_once_the_batch_job_it_preempts_is_gone(
        cluster: local_mod.Local, admin: Kubectl, deployed: incluster.InCluster) -> None:
    """The other way: a scavenger job that ignores SIGTERM runs on n2; a marked Pod preempts it
    (the k8s partition's tier is higher). The placeholder starts, and the Pod after it, only
    once Slurm has killed the batch job at the end of its GraceTime."""
    batch = _sbatch(cluster, "-p", "scavenger", "--wrap=trap '' TERM; sleep 600 & wait")
    marker = f"sg-inv-{uuid.uuid4().hex[:12]}"
    try:
        wait_until("the batch job RUNNING on n2", lambda: _state(cluster, batch) == "RUNNING",
                   60)
        with OverlapSampler(str(cluster.slurm.conf), "n2", marker) as s:
            wait_until("the sampler saw the batch job", lambda: s.saw_job(batch), 30)
            admin.apply(marked("inv-preemptor", deployed.image, STUBBORN, grace=5,
                               args=(marker,)), "-n", NS)
            wait_until("the Pod's container up on the real Node", s.saw_pod, 120)
        assert not s.overlaps, s.report()
        assert _pod(admin, "inv-preemptor", NS)["spec"]["nodeName"] == SLURM_REAL
    finally:
        admin.run("delete", "pod", "inv-preemptor", "-n", NS, "--wait=false", check=False)
        slurm_cli(cluster, "scancel", str(batch))


def test_a_cancelled_placeholder_holds_the_node_until_the_pod_is_gone(
        cluster: local_mod.Local, admin: Kubectl, deployed: incluster.InCluster) -> None:
    """An operator scancels the placeholder of a stubborn Pod (grace 10 s) while a scavenger
    job waits for n2. Slurm kills the placeholder KillWait (5 s here) after its SIGTERM; the
    Pod is evicted when the binder hears of the end, and takes its grace to stop. The node
    must not go to the waiting job while the Pod still runs."""
    marker, placeholder = _stubborn_on_n2(admin, deployed.image, "inv-cancelled", grace=10)
    waiting = _sbatch(cluster, "-p", "scavenger", "--wrap=sleep 600")
    try:
        with OverlapSampler(str(cluster.slurm.conf), "n2", marker) as s:
            wait_until("the sampler saw the Pod", s.saw_pod, 10)
            assert _state(cluster, waiting) == "PENDING"
            t_cancel = time.time()
            slurm_cli(cluster, "scancel", placeholder)
            wait_until("the waiting job RUNNING on n2",
                       lambda: _state(cluster, waiting) == "RUNNING", 90)
            wait_until("the sampler saw the waiting job", lambda: s.saw_job(waiting), 30)
        said = [e.get("message", "") for e in admin.items("events", ns=NS)
                if e["involvedObject"]["name"] == "inv-cancelled"]
        last_pod = max(x.t for x in s.samples if x.pod) - t_cancel
        first_job = min(x.t for x in s.samples if x.jobs) - t_cancel
        assert not s.overlaps, (f"{s.report()}; after the scancel: the Pod last seen at "
                                f"{last_pod:.2f}s, the job first at {first_job:.2f}s; {said}")
    finally:
        slurm_cli(cluster, "scancel", str(waiting))


def test_a_timed_out_placeholder_holds_the_node_until_the_pod_is_gone(
        cluster: local_mod.Local, admin: Kubectl, deployed: incluster.InCluster) -> None:
    """The same at the end of the job's time limit (a minute): Slurm signals the placeholder,
    kills it KillWait later, and the stubborn Pod (grace 10 s) is evicted as SlurmJobTimeLimit.
    A scavenger job waiting for n2 must not start while the Pod still runs there."""
    marker, placeholder = _stubborn_on_n2(admin, deployed.image, "inv-timeout", grace=10,
                                          annotations={contract.A_TIME_LIMIT: "1"})
    waiting = _sbatch(cluster, "-p", "scavenger", "--wrap=sleep 600")
    try:
        with OverlapSampler(str(cluster.slurm.conf), "n2", marker) as s:
            wait_until("the sampler saw the Pod", s.saw_pod, 10)
            assert _state(cluster, waiting) == "PENDING"
            # slurmctld looks at time limits every 30 s or so: the minute and one look more
            wait_until("the waiting job RUNNING on n2",
                       lambda: _state(cluster, waiting) == "RUNNING", 180)
            wait_until("the sampler saw the waiting job", lambda: s.saw_job(waiting), 30)
        assert s.saw_pod() and not s.overlaps, s.report()
        assert reasons.EV_JOB_TIME_LIMIT in _reasons(admin, "inv-timeout")
        assert _state(cluster, int(placeholder)) not in ("RUNNING", "PENDING")
    finally:
        slurm_cli(cluster, "scancel", str(waiting))


def test_a_failed_node_goes_back_to_slurm_only_once_the_pod_is_gone(
        cluster: local_mod.Local, admin: Kubectl, deployed: incluster.InCluster) -> None:
    """n2's slurmd dies and the node is marked DOWN (as a health check would): Slurm ends the
    placeholder (NODE_FAIL) and the binder evicts the stubborn Pod (grace 10 s) as
    SlurmNodeFailed. But the Node's kubelet never went away: the Pod still runs while its
    node is back in Slurm the moment its slurmd registers again (ReturnToService=2), with a
    scavenger job waiting for it. That job must not start while the Pod runs there."""
    marker, placeholder = _stubborn_on_n2(admin, deployed.image, "inv-nodefail", grace=10)
    waiting = _sbatch(cluster, "-p", "scavenger", "--wrap=sleep 600")
    run_dir, daemon = cluster.slurm.run_dir, "slurmd-n2"
    try:
        with OverlapSampler(str(cluster.slurm.conf), "n2", marker) as s:
            wait_until("the sampler saw the Pod", s.saw_pod, 10)
            assert _state(cluster, waiting) == "PENDING"
            slurm_faults.kill_daemon(run_dir, daemon)
            slurm_cli(cluster, "scontrol", "update", "nodename=n2", "state=down",
                      "reason=e2e node failure")
            wait_until("the Pod evicted as SlurmNodeFailed",
                       lambda: reasons.EV_NODE_FAILED in _reasons(admin, "inv-nodefail"), 60)
            # back at once: the Pod may still be stopping (it ignores SIGTERM)
            slurm_faults.start_daemon(run_dir, daemon)
            wait_until("the waiting job RUNNING on n2",
                       lambda: _state(cluster, waiting) == "RUNNING", 120)
            wait_until("the sampler saw the waiting job", lambda: s.saw_job(waiting), 30)
        assert s.saw_pod() and not s.overlaps, s.report()
        assert _state(cluster, int(placeholder)) not in ("RUNNING", "PENDING")
    finally:
        slurm_cli(cluster, "scancel", str(waiting))
        if not slurm_faults.running(run_dir, daemon):
            slurm_faults.start_daemon(run_dir, daemon)
