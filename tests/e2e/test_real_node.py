"""Real Nodes (containerd + kubelet, cluster/realnode.py) beside the kwok ones: they register
with the labels and taints asked for, run a Pod for real (logs, a Pod IP the host reaches, the
apiserver reached from the bridge), and `down` leaves nothing on the host.

Runs with the in-cluster tests (`make test-incluster`, marker `incluster`: root, apt packages,
a kubelet build). The cluster is this module's own, in its own run dir and port offset, so the
session cluster is not touched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from cluster import local as local_mod
from slurmgate import contract
from tests.e2e.conftest import Kubectl, pause_container, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.incluster]

RUN_DIR = Path(os.environ.get("SLURMGATE_REAL_RUN_DIR", "/tmp/slurmgate-real"))
# beside the session cluster (0), bench (2000) and CI's second cluster (3000)
OFFSET = os.environ.get("SLURMGATE_REAL_PORT_OFFSET", "4000")
ENV = {**os.environ, "SLURMGATE_RUN_DIR": str(RUN_DIR), "SLURMGATE_PORT_OFFSET": OFFSET}
MAPPED_LABEL = "n2"  # the Slurm node real-2 stands for: its slurmd Pod runs there (pause)

UP = f"""
from pathlib import Path
from cluster import local, realnode
from slurmgate import contract
local.up(Path({str(RUN_DIR)!r}), nodes=2, gpu_nodes=0, real_nodes=[
    realnode.NodeSpec("real-1"),
    realnode.NodeSpec("real-2", labels={{contract.NODE_LABEL: {MAPPED_LABEL!r}}},
                      taints=[contract.TAINT]),
])
"""


def _down() -> None:
    subprocess.run([sys.executable, "-m", "cluster.local", "down", "--dir", str(RUN_DIR)],
                   env=ENV, check=True, capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def real() -> Iterator[local_mod.Local]:
    # a process of its own: cluster.local reads the port offset when imported
    subprocess.run([sys.executable, "-c", UP], env=ENV, check=True, timeout=900)
    try:
        yield local_mod.load(RUN_DIR)
    finally:
        _down()


@pytest.fixture(scope="module")
def kctl(real: local_mod.Local) -> Kubectl:
    return Kubectl(real.kube.kubeconfig)


def _pause_pod(name: str, node: str, args: list[str], restart: str = "Always") -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {
            # pinned: kube-scheduler would as gladly pick a kwok Node, where nothing runs
            "nodeSelector": {"kubernetes.io/hostname": node},
            "tolerations": [contract.TOLERATION],
            "restartPolicy": restart,
            "containers": [pause_container(args=args)],
        },
    }


def test_nodes_registered_as_asked(real: local_mod.Local, kctl: Kubectl) -> None:
    assert [n.name for n in real.real] == ["real-1", "real-2"]
    assert all(Path(n.containerd_socket).is_socket() for n in real.real)
    assert real.kube.node_server == f"https://{real.real[0].node_ip}:{16443 + int(OFFSET)}"
    plain, mapped = kctl.get("node", "real-1"), kctl.get("node", "real-2")
    for node in (plain, mapped):
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True"
        assert node["status"]["nodeInfo"]["kubeletVersion"].startswith("v1.")
        assert "master" not in node["status"]["nodeInfo"]["kubeletVersion"]
    assert contract.NODE_LABEL not in plain["metadata"]["labels"]
    assert not plain["spec"].get("taints")
    assert mapped["metadata"]["labels"][contract.NODE_LABEL] == MAPPED_LABEL
    assert mapped["spec"]["taints"] == [contract.TAINT]


def test_pod_runs_for_real(real: local_mod.Local, kctl: Kubectl) -> None:
    kctl.apply(_pause_pod("serve", "real-1", ["-listen", ":8080"]))
    pod = wait_until("the pause Pod Running", lambda: (
        p := kctl.get("pod", "serve", "default"))["status"].get("phase") == "Running" and p, 60)
    assert "slurmgate-pause" in kctl.run("logs", "serve").stdout
    with urllib.request.urlopen(f"http://{pod['status']['podIP']}:8080/", timeout=5) as r:
        assert r.read() == b"slurmgate-pause\n"


def test_pod_on_the_bridge_reaches_the_apiserver(real: local_mod.Local, kctl: Kubectl) -> None:
    assert real.kube.node_server
    kctl.apply(_pause_pod("probe", "real-2", ["-probe", f"{real.kube.node_server}/readyz"],
                          restart="Never"))
    wait_until("the probe Pod done", lambda: kctl.get("pod", "probe", "default")["status"]
               .get("phase") == "Succeeded", 60)
    assert "status 200" in kctl.run("logs", "probe").stdout


def test_down_leaves_nothing(real: local_mod.Local) -> None:
    _down()
    top = str(RUN_DIR / "realnodes")
    mounts = Path("/proc/self/mountinfo").read_text()
    assert f" {top}/" not in mounts
    links = subprocess.run(["ip", "-j", "link"], capture_output=True, text=True).stdout
    assert not {n.bridge for n in real.real} & {x["ifname"] for x in json.loads(links)}
    assert not list(Path("/sys/fs/cgroup").glob(f"*/sgreal-{OFFSET}-*"))
    for n in real.real:
        assert not any(os.path.exists(f"/proc/{p}") and
                       f"{n.dir}".encode() in Path(f"/proc/{p}/cmdline").read_bytes()
                       for p in n.pids.values())
