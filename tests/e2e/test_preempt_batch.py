"""A Pod preempts a Slurm batch job: the other direction of "Slurm decides for both kinds of
work". Every node runs an ordinary `sbatch` job in a partition ranked below the Pods' (the
local cluster's `scavenger`, PreemptMode=REQUEUE, and `spot`, PreemptMode=CANCEL); a marked
Pod makes Slurm preempt one of them. The Pod is bound only once that job has ended on the node
(the node-sharing rule, sampled all along), and its Events name the job it displaced.
"""

from __future__ import annotations

import threading
import time

import pytest

from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract, hostlist, reasons
from tests.e2e.conftest import Kubectl, marked_pod, scontrol_job, slurm_cli, squeue, wait_until

pytestmark = pytest.mark.e2e


class SharingWatch(threading.Thread):
    """Samples Slurm and Kubernetes: a Node holding a bound marked Pod never has a job that is
    not its placeholder RUNNING or COMPLETING on its Slurm node."""

    def __init__(self, local: Local, admin: Kubectl, ns: str) -> None:
        super().__init__(daemon=True)
        self.local, self.admin, self.ns = local, admin, ns
        self.stop_flag = threading.Event()
        self.violations: list[str] = []
        self.samples = 0

    def run(self) -> None:
        while not self.stop_flag.is_set():
            # Pods first: a binding is never undone here, so a Pod bound now is still bound
            # when Slurm answers a moment later. The other order flags a job that ended in
            # between, beside a Pod bound after it ended.
            pods = self.admin.items("pods", ns=self.ns)
            busy: dict[str, str] = {}
            for r in squeue(self.local):
                if (r["state"] in ("RUNNING", "COMPLETING") and r["nodes"]
                        and not r["comment"].startswith(contract.COMMENT_PREFIX)):
                    for n in hostlist.expand(r["nodes"]):
                        busy[k8s_node_name(n)] = r["id"]
            for p in pods:
                node = p["spec"].get("nodeName")
                if node in busy and not p["metadata"].get("deletionTimestamp"):
                    self.violations.append(f"sample {self.samples}: Pod "
                                           f"{p['metadata']['name']} on {node} beside job "
                                           f"{busy[node]}")
            self.samples += 1
            time.sleep(0.1)


@pytest.mark.parametrize(("partition", "how"), [("scavenger", "requeued"),
                                                 ("spot", "cancelled")])
def test_a_pod_preempts_a_batch_job(local: Local, admin: Kubectl, bridge: Bridge, ns: str,
                                    partition: str, how: str) -> None:
    batch = [slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", partition,
                       "--exclusive", "-N1", "--mem=1000", "-J", f"batch{i}",
                       "--wrap", "sleep 600").strip().split(";")[0]
             for i in range(len(local.slurm.nodes))]
    watch = SharingWatch(local, admin, ns)
    try:
        wait_until("every node runs a batch job", lambda: sum(
            r["id"] in batch and r["state"] == "RUNNING" for r in squeue(local)) == len(batch),
            30)
        on_node = {r["nodes"]: r["id"] for r in squeue(local) if r["id"] in batch}
        watch.start()
        admin.apply(marked_pod("inference"), "-n", ns)
        pod = wait_until("the Pod bound", lambda: (p := admin.get(
            "pod", "inference", ns))["spec"].get("nodeName") and p, 90)
        slurm_node = pod["metadata"]["annotations"][contract.A_SLURM_NODE]
        victim = on_node[slurm_node]
        state = scontrol_job(local, victim)
        if how == "requeued":
            assert state["JobState"] in ("PENDING", "REQUEUED") and state["Restarts"] == "1", \
                state
        else:
            assert state["JobState"] == "PREEMPTED", state
        # the other batch jobs run on
        assert sum(r["id"] in batch and r["state"] == "RUNNING"
                   for r in squeue(local)) == len(batch) - 1
        said = wait_until("an Event naming the displaced job", lambda: [
            e["message"] for e in admin.items("events", ns=ns)
            if e["reason"] == reasons.EV_DISPLACED], 20)
        assert f"job {victim} " in said[0] and f"partition {partition}" in said[0], said
        assert said[0].endswith(how), said
    finally:
        watch.stop_flag.set()
        if watch.is_alive():
            watch.join()
        slurm_cli(local, "scancel", *batch)
    assert watch.samples > 5
    assert watch.violations == [], watch.violations
