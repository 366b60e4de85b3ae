"""`kubectl slurm pods` and `kubectl slurm nodes` against the real local cluster: what they print
is what the API server and Slurm hold (squeue is the independent witness), for a Pod of ours, a
plain batch job, and a Pod that waits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract, reasons
from tests.e2e.conftest import Kubectl, marked_pod, slurm_cli, wait_until
from tests.e2e.faultkit import ann, wait_bound

pytestmark = pytest.mark.e2e


def plugin(local: Local, *args: str) -> str:
    """The plugin as kubectl runs it: its own process, the cluster's kubeconfig and slurmrestd
    from the environment."""
    env = {**os.environ, **local.env()}
    return subprocess.run([sys.executable, "-m", "slurmgate.kubectl_plugin", *args], env=env,
                          text=True, capture_output=True, check=True, timeout=60).stdout


def rows(local: Local, *args: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = json.loads(plugin(local, *args, "-o", "json"))
    return out


def test_pods_and_nodes_show_who_holds_each_node(local: Local, admin: Kubectl, bridge: Bridge,
                                                 ns: str) -> None:
    nodes = len(local.slurm.nodes)
    ours: list[str] = []  # the batch jobs this test submits, cancelled by id at the end
    batch = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "hpc",
                      "--exclusive", "-N1", "--mem=1000", "-t", "10", "-J", "plugin-batch",
                      "--wrap", "sleep 300").strip().split(";")[0]
    ours.append(batch)
    try:
        def running_on() -> str | None:
            out = slurm_cli(local, "squeue", "-h", "-j", batch, "-o", "%T %N").split()
            return out[1] if out and out[0] == "RUNNING" else None

        batch_node = wait_until("the batch job RUNNING", running_on, 60)
        admin.apply(marked_pod("one"), "-n", ns)
        wait_bound(admin, ns, "one")
        pod = admin.get("pod", "one", ns)
        job = ann(pod)[contract.A_JOB_ID]
        # the other nodes taken by plain jobs too, so that a second Pod waits
        fill = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "hpc",
                         "--exclusive", f"-N{nodes - 2}", "--mem=1000", "-t", "10", "-J",
                         "plugin-fill", "--wrap", "sleep 300").strip().split(";")[0]
        ours.append(fill)
        wait_until("the fill RUNNING", lambda: "RUNNING" in slurm_cli(
            local, "squeue", "-h", "-j", fill, "-o", "%T"), 60)
        admin.apply(marked_pod("waits"), "-n", ns)
        wait_until("the second Pod waiting with its job id", lambda: contract.A_JOB_ID in ann(
            admin.get("pod", "waits", ns)), 30)

        by_name = {r["name"]: r for r in rows(local, "pods", "-n", ns)}
        assert set(by_name) == {"one", "waits"}, by_name
        assert by_name["one"]["job"] == job and by_name["one"]["state"] == "RUNNING"
        assert by_name["one"]["node"] == pod["spec"]["nodeName"]
        waits = admin.get("pod", "waits", ns)
        assert by_name["waits"]["state"] == "PENDING" and by_name["waits"]["node"] == "-"
        assert by_name["waits"]["job"] == ann(waits)[contract.A_JOB_ID]
        assert by_name["waits"]["reason"] == ann(waits).get(contract.A_JOB_REASON, "-")

        # slurmdbd hears of a job a moment after slurmctld starts it
        want = f"job {batch} (user root, partition hpc)"
        def named() -> dict[str, dict[str, Any]] | None:
            b = {r["node"]: r for r in rows(local, "nodes")}
            return b if b[k8s_node_name(batch_node)]["held_by"] == want else None

        by_node = wait_until("the batch job named as its node's holder", named, 30)
        assert set(by_node) == {k8s_node_name(n) for n in local.slurm.nodes}
        assert all(r["tainted"] for r in by_node.values()), by_node
        assert by_node[pod["spec"]["nodeName"]]["held_by"] == f"pod {ns}/one (job {job})"
        held = by_node[k8s_node_name(batch_node)]
        assert held["slurm_state"] == "ALLOCATED", held

        # one Pod's journey: what the API server and Slurm hold of it, in one place
        x = json.loads(plugin(local, "explain", "waits", "-n", ns, "-o", "json"))
        wjob = ann(waits)[contract.A_JOB_ID]
        assert x["pod"] == f"{ns}/waits" and x["gated"] and x["node"] == "-"
        assert x["annotations"][contract.A_JOB_ID] == wjob
        st = slurm_cli(local, "squeue", "-h", "-j", wjob, "-o", "%T %P %u").split()
        assert [x["job"]["state"], x["job"]["partition"], x["job"]["user"]] == st, (x, st)
        assert x["condition"]["status"] == "False"
        assert reasons.EV_JOB_PENDING in [e["reason"] for e in x["events"]], x["events"]
        text = plugin(local, "explain", "one", "-n", ns)
        assert text.startswith(f"Pod {ns}/one: Running, on Node {pod['spec']['nodeName']}"), text
        assert f"Slurm job {job}: state RUNNING" in text and reasons.EV_BOUND in text, text

        table = plugin(local, "nodes").splitlines()
        assert table[0].split() == ["NODE", "SLURM-NODE", "SLURM-STATE", "KUBERNETES",
                                    "TAINTED", "HELD-BY"]
        assert len(table) == 1 + nodes
    finally:
        # by id: scancel -n takes one name, and a job left running costs the next test the
        # teardown's whole wait for an empty queue
        slurm_cli(local, "scancel", *ours)
