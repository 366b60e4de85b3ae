"""Crash points and duplicate delivery: the webhook or the binder SIGKILLs itself at a chosen
point (SLURMGATE_CRASH_AT) and is restarted, and the orphan job is cancelled or the Pods bound;
no Pod gets two Bound Events (with no fault injected, too); an AdmissionReview delivered several
times, also concurrently, submits one job.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract
from tests.e2e.conftest import Kubectl, marked_pod, restart, slurm_cli, squeue, wait_until
from tests.e2e.faultkit import (
    LEASE,
    ORPHAN_GRACE,
    SWEEP,
    admission_review,
    alive,
    ann,
    assert_no_leak,
    events_of,
    jobs_in,
    pods,
    post_review,
    record,
    restart_webhook,
    wait_bound,
)

# they kill and restart the host processes, with crash points and env (`hostprocs`)
pytestmark = [pytest.mark.e2e, pytest.mark.hostprocs]


# --------------------------------------------------------------------------- crash points


def test_webhook_crash_after_submit_orphan_cancelled(local: Local, admin: Kubectl,
                                                     bridge: Bridge, ns: str, tmp_path: Path,
                                                     restore: None) -> None:
    env = {"SLURMGATE_CRASH_AT": "webhook_after_submit",
           "SLURMGATE_CRASH_MARKER": str(tmp_path / "crashed")}
    restart_webhook(bridge, env)
    pid = bridge.pids["webhook"]
    p = admin.apply(marked_pod("victim"), "-n", ns, check=False)
    wait_until("webhook SIGKILLed itself after the submit", lambda: not alive(pid), 10)
    assert (tmp_path / "crashed").exists()
    # the apiserver got no answer: failurePolicy Fail refuses the Pod; the job is an orphan
    assert p.returncode != 0, "Pod created although the webhook died mid-request"
    assert "failed calling webhook" in p.stderr, p.stderr
    orphans = [r for r in squeue(local) if r["comment"].endswith(f"pod={ns}/victim")]
    assert len(orphans) == 1, orphans
    submitted = time.monotonic()
    restart(bridge, "webhook")  # no crash point this time
    wait_until("orphan job cancelled by the binder", lambda: not any(
        r["id"] == orphans[0]["id"] and r["state"] != "COMPLETING" for r in squeue(local)),
        ORPHAN_GRACE + SWEEP + 15, interval=0.5)
    record("webhook_after_submit: orphan cancelled after", time.monotonic() - submitted)
    admin.apply(marked_pod("next"), "-n", ns)
    wait_bound(admin, ns, "next")
    assert_no_leak(local, admin, ns)


@pytest.mark.parametrize("point", ["binder_after_ungate", "binder_after_bind"])
def test_binder_crash_point_then_restart(point: str, local: Local, admin: Kubectl,
                                         bridge: Bridge, ns: str, tmp_path: Path,
                                         restore: None) -> None:
    restart(bridge, "binder", {"SLURMGATE_CRASH_AT": point,
                               "SLURMGATE_CRASH_MARKER": str(tmp_path / "crashed")})
    pid = bridge.pids["binder"]
    admin.apply(marked_pod("p0"), "-n", ns)
    admin.apply(marked_pod("p1"), "-n", ns)
    wait_until(f"binder SIGKILLed itself at {point}", lambda: not alive(pid), 30)
    crashed_at = time.monotonic()
    ps = pods(admin, ns)
    ungated = [n for n, p in ps.items() if not p["spec"].get("schedulingGates")]
    assert ungated, "no Pod was ungated before the crash"
    for n in ungated:
        if point == "binder_after_ungate":
            # ungated but unbound: nobody else may place it (schedulerName nobody serves)
            assert not ps[n]["spec"].get("nodeName"), ps[n]["spec"]
    restart(bridge, "binder")  # waits for the dead one's Lease to expire
    for n in ("p0", "p1"):
        node = wait_bound(admin, ns, n, 60)
        p = admin.get("pod", n, ns)
        assert node == k8s_node_name(ann(p)[contract.A_SLURM_NODE])
        assert ann(p)[contract.A_JOB_STATE] == "RUNNING"
    record(f"{point}: crash -> both Pods bound after (incl. {LEASE:.0f}s Lease expiry)",
           time.monotonic() - crashed_at)
    # never bound to two Nodes (a Pod's nodeName is immutable; a second binding is refused)
    for e in events_of(admin, ns, "Bound"):
        pod = admin.get("pod", e["involvedObject"]["name"], ns)
        assert e["message"].endswith(f"bound to Node {pod['spec']['nodeName']}"), e["message"]
    assert len(jobs_in(local, ns)) == 2
    assert_no_leak(local, admin, ns)


# --------------------------------------------------------------------------- bound once


def test_each_pod_bound_once(local: Local, admin: Kubectl, bridge: Bridge, ns: str) -> None:
    """No Pod gets two Bound Events (8 Pods through 4 Nodes, no fault injected)."""
    n = len(local.slurm.nodes)
    names = [f"o{i}" for i in range(2 * n)]
    for name in names[:n]:
        admin.apply(marked_pod(name), "-n", ns)
    for name in names[:n]:
        wait_bound(admin, ns, name)
    for name in names[n:]:
        admin.apply(marked_pod(name), "-n", ns)
    admin.run("delete", "pod", *names[:n], "-n", ns, "--wait=false")
    for name in names[n:]:
        wait_bound(admin, ns, name, 90)
    per_uid: dict[str, int] = {}
    for e in events_of(admin, ns, "Bound"):
        per_uid[e["involvedObject"]["name"]] = per_uid.get(e["involvedObject"]["name"], 0) + 1
    assert per_uid == {name: 1 for name in names}, per_uid


# --------------------------------------------------------------------------- duplicate delivery


def test_duplicate_admission_review_one_job(local: Local, admin: Kubectl, bridge: Bridge,
                                            ns: str) -> None:
    body = admission_review(ns, "dup")
    first = post_review(bridge, body)
    second = post_review(bridge, body)
    assert first == second and first["response"]["allowed"] is True
    # the same review delivered concurrently, too
    body2 = admission_review(ns, "dup2")
    out: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: out.append(post_review(bridge, body2)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(out) == 4 and all(o == out[0] for o in out)
    jobs = wait_until("jobs visible", lambda: jobs_in(local, ns), 10)
    by_pod: dict[str, int] = {}
    for r in jobs:
        pod = r["comment"].split(" pod=", 1)[1]
        by_pod[pod] = by_pod.get(pod, 0) + 1
    assert by_pod == {f"{ns}/dup": 1, f"{ns}/dup2": 1}, by_pod
    # no Pod was ever created: these are orphans; cancel them here rather than wait the grace
    slurm_cli(local, "scancel", "--signal=KILL", *[r["id"] for r in jobs])
