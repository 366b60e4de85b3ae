"""A marked Pod on a real Node runs on the cores and the GPU Slurm gave its placeholder job and
nowhere else (issue 33, slice 3, Kubernetes' half: slurmgate-runc, pinning/), beside slurmd's
own cgroups holding the job (an enforcing Slurm, cluster/slurm_cgroups.py); and a Pod that
names a job not its own never starts.

The Slurm node real-2 stands for declares one CPU of the host's two, so its whole-node job's
cores are "0": a container left alone would run on "0-1"; of its four stand-in GPUs the job
holds one. Without the wrapper each assertion on the cores and GPUs below fails. Read from the
host (the containers' cgroups, their processes' affinity and /dev), not from anything slurmgate
reports.

Runs with the in-cluster tests (`make test-incluster`, marker `incluster`: real Nodes need
root, apt packages and a kubelet build), on a cluster of its own (run dir, port offset).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import local as local_mod
from cluster import slurm_cgroups
from slurmgate import contract
from tests.e2e.conftest import Kubectl, pause_container, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.incluster]

RUN_DIR = Path(os.environ.get("SLURMGATE_PIN_RUN_DIR", "/tmp/slurmgate-pin"))
# beside the session cluster (0), bench (2000), CI's second cluster (3000), test_real_node (4000)
OFFSET = os.environ.get("SLURMGATE_PIN_PORT_OFFSET", "5000")
ENV = {**os.environ, "SLURMGATE_RUN_DIR": str(RUN_DIR), "SLURMGATE_PORT_OFFSET": OFFSET}
SLURM_NODE = "n2"
NS = "default"
INFRA = "node-agents"

GPUS = 4  # n2's stand-in GPUs (character devices of their own: cluster/slurm_cgroups.py)

UP = f"""
from pathlib import Path
from cluster import bridge, local, realnode
from slurmgate import contract
lc = local.up(Path({str(RUN_DIR)!r}), nodes=2, node_cpus=1, gpu_nodes=1, gpus_per_node={GPUS},
              enforce=True,
              features={{{SLURM_NODE!r}: "real"}}, real_nodes=[
    realnode.NodeSpec("real-2", labels={{contract.NODE_LABEL: {SLURM_NODE!r}}},
                      taints=[contract.TAINT]),
])
bridge.up(lc)
"""


@pytest.fixture(scope="module")
def real() -> Iterator[local_mod.Local]:
    if len(slurm_cgroups.host_cpus()) < 2:
        pytest.skip("a job's cores apart from the Node's others need a host of 2 CPUs or more")
    # a process of its own: cluster.local and cluster.bridge read the port offset when imported
    subprocess.run([sys.executable, "-c", UP], env=ENV, check=True, timeout=900)
    try:
        yield local_mod.load(RUN_DIR)
    finally:
        subprocess.run([sys.executable, "-m", "cluster.local", "down", "--dir", str(RUN_DIR)],
                       env=ENV, check=False, capture_output=True, timeout=180)


@pytest.fixture(scope="module")
def kctl(real: local_mod.Local) -> Kubectl:
    return Kubectl(real.kube.kubeconfig)


def _pod(name: str, annotations: dict[str, str], marked: bool, ns: str = NS,
         gpus: int = 0) -> dict:
    resources: dict = {"requests": {"cpu": "100m", "memory": "64Mi"}}
    if gpus:
        resources["limits"] = {"nvidia.com/gpu": str(gpus)}
    spec: dict = {"containers": [pause_container(resources=resources)]}
    if not marked:  # straight onto the Node, past the taint: what a forger would do
        spec["nodeName"] = "real-2"
        spec["tolerations"] = [contract.TOLERATION]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations,
                         "labels": {contract.MARK_LABEL: contract.MARK_VALUE} if marked else {}},
            "spec": spec}


def _container_cgroups(node_cgroup_root: str, uid: str) -> list[Path]:
    """The Pod's containers' cpuset cgroups (sandbox included) under the Node's cgroup root."""
    base = Path("/sys/fs/cgroup/cpuset") / node_cgroup_root.strip("/")
    return [d for pod in base.rglob(f"pod{uid}") for d in pod.iterdir() if d.is_dir()]


def _job_gpus(real: local_mod.Local, job_id: int) -> set[int]:
    """The gres indices Slurm gave the job (`scontrol -d show job`)."""
    out = real.slurm.cli("scontrol", "-d", "-o", "show", "job", str(job_id)).stdout
    m = re.search(r"GRES=\S*gpu[^(]*\(IDX:([0-9,-]+)\)", out)
    assert m, out
    return set(slurm_cgroups.parse_cpu_list(m.group(1)))


def _device_rules(cg: Path) -> list[str]:
    """The container's device cgroup whitelist (v1 devices.list)."""
    d = Path(str(cg).replace("/cpuset/", "/devices/", 1))
    return (d / "devices.list").read_text().splitlines()


def _dev_names(cg: Path) -> set[str]:
    """What is in /dev of the container's processes (as the host sees their root); empty for
    a container with no process to look through."""
    for pid in (cg / "cgroup.procs").read_text().split():
        try:
            return {p.name for p in Path(f"/proc/{pid}/root/dev").iterdir()}
        except OSError:
            continue
    return set()


def _affinity(pid: str) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return ""


def test_a_marked_pod_runs_on_its_jobs_cores_and_gpu_only(real: local_mod.Local,
                                                         kctl: Kubectl) -> None:
    kctl.apply(_pod("pinned", {contract.A_CONSTRAINT: "real"}, marked=True, gpus=1))
    pod = wait_until("the marked Pod Running on real-2", lambda: (
        p := kctl.get("pod", "pinned", NS))["status"].get("phase") == "Running" and p, 120)
    assert pod["spec"]["nodeName"] == "real-2"
    job_id = int(pod["metadata"]["annotations"][contract.A_JOB_ID])
    job = slurm_cgroups.job_cgroup("cpuset", SLURM_NODE, job_id)
    assert job is not None, f"no cgroup of job {job_id} under slurm_{SLURM_NODE}"
    cores = (job / "cpuset.cpus").read_text().strip()
    assert cores == "0"  # the one CPU the Slurm node declares
    node = next(n for n in real.real if n.name == "real-2")
    cgroups = _container_cgroups(node.cgroup_root, pod["metadata"]["uid"])
    assert len(cgroups) >= 2, cgroups  # the sandbox and the container
    for cg in cgroups:
        assert (cg / "cpuset.cpus").read_text().strip() == cores, cg
        pids = (cg / "cgroup.procs").read_text().split()
        assert pids, cg
        assert {_affinity(p) for p in pids} == {cores}, cg
    # its GPUs: those Slurm gave the job (gres indices), in its device cgroup and its /dev,
    # and none of the Node's others. A whole-node job holds every GPU of its node (22.05 to
    # 26.05: JOB_GRES=gpu:a100:4 for a request of 1), so here "no other" has nothing left to
    # hold back; the unit tests (tests/unit/test_pinning.py) and the sharing modes to come do
    gpus = _job_gpus(real, job_id)
    major = slurm_cgroups.STAND_IN_GPU_MAJOR
    for cg in cgroups:
        allowed = {r for r in _device_rules(cg) if r.startswith(f"c {major}:")}
        assert allowed == {f"c {major}:{i} rw" for i in gpus}, (cg, allowed, gpus)
        names = _dev_names(cg)
        assert names, cg  # a process to look through
        assert {n for n in names if n.startswith("nvidia")} == {f"nvidia{i}" for i in gpus}, (
            cg, names)


def test_a_pod_naming_a_job_not_its_own_never_starts(real: local_mod.Local,
                                                     kctl: Kubectl) -> None:
    holder = wait_until("the marked Pod's job", lambda: kctl.get("pod", "pinned", NS)
                        ["metadata"]["annotations"].get(contract.A_JOB_ID), 60)
    # Only node infrastructure may tolerate Slurm's taint (the taint guard refuses any other
    # Pod): one there that copies a marked Pod's annotations is what the wrapper stops
    kctl.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": INFRA, "labels": {contract.INFRA_NAMESPACE_LABEL: "true"}}})
    kctl.apply(_pod("thief", {contract.A_JOB_ID: holder, contract.A_SLURM_NODE: SLURM_NODE},
                    marked=False, ns=INFRA))
    said = wait_until("the kubelet's Event of the refusal", lambda: [
        e["message"] for e in kctl.items("events", ns=INFRA)
        if e["involvedObject"].get("name") == "thief" and "slurmgate:" in e.get("message", "")],
        90)
    assert f"Slurm job {holder}" in said[0] and f"Pod {INFRA}/thief" in said[0], said
    assert kctl.get("pod", "thief", INFRA)["status"].get("phase") == "Pending"
