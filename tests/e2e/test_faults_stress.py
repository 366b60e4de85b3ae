"""Load: 1,000 Pods (SLURMGATE_LOAD_PODS) admitted at once while hpc jobs preempt placeholders
and bound Pods are deleted (SLURMGATE_LOAD_CHURN_SECONDS): no Node is shared, no Pod is stuck
gated behind a RUNNING job, nothing leaks. Long: marked `faults` (make test-faults).

Named to sort after the other test_faults_* modules, so that this test still runs last, as it
did in the single test_faults.py: its deleted namespace of 1,000 Pods may still be torn down in
the background when it ends.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from cluster.bridge import Bridge
from cluster.local import Local
from slurmgate import reasons
from tests.e2e.conftest import Kubectl, marked_pod, slurm_cli, wait_until
from tests.e2e.faultkit import assert_no_leak, events_of, jobs_in, record
from tests.e2e.watchers import LoadWatch

pytestmark = pytest.mark.e2e


@pytest.mark.faults
def test_load_burst_with_hpc_churn(local: Local, admin: Kubectl, bridge: Bridge,
                                   ns: str) -> None:
    n_pods = int(os.environ.get("SLURMGATE_LOAD_PODS", "1000"))
    churn_seconds = float(os.environ.get("SLURMGATE_LOAD_CHURN_SECONDS", "90"))
    watch = LoadWatch(local, ns)
    watch.start()
    hpc_ids: list[str] = []
    try:
        t0 = time.monotonic()
        batch = 100
        for start in range(0, n_pods, batch):
            items = [{**marked_pod(f"l{i}"), "metadata": {
                **marked_pod(f"l{i}")["metadata"], "namespace": ns}}
                for i in range(start, min(n_pods, start + batch))]
            admin.run("create", "-f", "-", stdin=json.dumps(
                {"apiVersion": "v1", "kind": "List", "items": items}))
        record(f"load: {n_pods} Pods created (admitted, jobs submitted)", time.monotonic() - t0)
        assert len(jobs_in(local, ns)) == n_pods
        # churn: hpc jobs preempt placeholders; bound Pods are deleted to free nodes
        deadline = time.monotonic() + churn_seconds
        k = 0
        while time.monotonic() < deadline:
            out = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "hpc",
                            "--exclusive", "-N1",
                            "--mem=1000", "-t", "2", "-J", f"hpc-{k}", "--wrap", "sleep 3")
            hpc_ids.append(out.strip().split(";")[0])
            running = [p for p in admin.items("pods", ns=ns)
                       if p["status"].get("phase") == "Running"
                       and not p["metadata"].get("deletionTimestamp")]
            if running:  # may be evicted meanwhile (preempted): not found is fine
                admin.run("delete", "pod", running[0]["metadata"]["name"], "-n", ns,
                          "--wait=false", check=False)
            k += 1
            want = watch.samples + 4  # ~2 s of samples between churn steps
            wait_until("a moment of churn", lambda w=want: watch.samples >= w, 30, interval=0.5)
        record("load: churn iterations", k)
    finally:
        watch.stop_flag.set()
        watch.join(30)
        if hpc_ids:
            slurm_cli(local, "scancel", *hpc_ids)
    record("load: longest gated-with-RUNNING-job", watch.max_unbound_running)
    assert watch.samples > 20
    assert not watch.sharing, watch.sharing[:10]
    assert not watch.stuck, sorted(watch.stuck.items(), key=lambda x: -x[1])[:10]
    evicted = len(events_of(admin, ns, reasons.EV_JOB_PREEMPTED))
    print(f"[load] preemptions seen: {evicted}")
    try:
        # The first hpc job is submitted before any Pod is deleted, onto nodes that all hold a
        # placeholder (more Pods than nodes, all admitted): hpc outranks k8s (PriorityTier 10
        # over 1, PreemptMode=CANCEL), so it preempts one at least. Later ones may find a node
        # freed by a deletion: one is all the setup guarantees. Inside the try: the 1,000 Pods
        # are cleaned up below whatever fails.
        if hpc_ids and n_pods >= len(local.slurm.nodes):
            assert evicted >= 1, (f"preemptions seen: {evicted} ({reasons.EV_JOB_PREEMPTED} "
                                  f"Events) after {len(hpc_ids)} hpc jobs: the churn preempted "
                                  "nothing")
        assert_no_leak(local, admin, ns, timeout=120)
    finally:  # clean up 1,000 Pods here: the ns fixture's 60 s kubectl timeout is too short
        t0 = time.monotonic()
        admin.run("delete", "pods", "--all", "-n", ns, "--wait=false", check=False)
        wait_until("binder cancelled every job of the deleted Pods",
                   lambda: not jobs_in(local, ns), 300, interval=1)
        record(f"load: {n_pods} Pods deleted -> all jobs cancelled", time.monotonic() - t0)
