"""A submit Slurm does not answer within the webhook's SUBMIT_BUDGET, for real: slurmrestd is
frozen (SIGSTOP) as a controller too busy to answer would be. The Pod is admitted at once, gated
as Submitting; once Slurm answers, the submit the webhook kept going lands, the binder finds the
job by the Pod's claim, and the Pod is bound: one job, no duplicate, nothing leaked."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cluster import slurm as slurm_mod
from cluster.bridge import Bridge
from cluster.local import Local
from slurmgate import contract
from tests.e2e.conftest import Kubectl, job_id_of, marked_pod, squeue
from tests.e2e.faultkit import (
    ann,
    assert_no_leak,
    duplicate_claims,
    log_lines,
    log_offset,
    record,
    restart_webhook,
    wait_bound,
)

# the webhook runs with another env for this test (`hostprocs`)
pytestmark = [pytest.mark.e2e, pytest.mark.hostprocs]
BUDGET = 0.2


def test_submit_past_the_budget_is_handed_off_and_bound(local: Local, admin: Kubectl,
                                                        bridge: Bridge, ns: str,
                                                        restore: None) -> None:
    restart_webhook(bridge, {"SUBMIT_BUDGET": str(BUDGET)})
    off = log_offset(bridge, "webhook")
    restd = slurm_mod.load(local.slurm.run_dir).pids["slurmrestd"]
    os.kill(restd, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        admin.apply(marked_pod("slow"), "-n", ns)
        took = time.monotonic() - t0
        created = admin.get("pod", "slow", ns)
    finally:
        os.kill(restd, signal.SIGCONT)
    record(f"slurmrestd frozen, SUBMIT_BUDGET={BUDGET}: admission latency", took)
    a = ann(created)
    assert a.get(contract.A_JOB_STATE) == contract.JOB_STATE_SUBMITTING, a
    assert not a.get(contract.A_JOB_ID)
    assert {"name": contract.GATE} in created["spec"]["schedulingGates"]

    node = wait_bound(admin, ns, "slow")
    job_id = job_id_of(admin, "slow", ns)
    # the webhook's own submit landed (the binder, within its grace, submitted none)
    landed = [r for r in log_lines(bridge, "webhook", off)
              if r.get("msg") == "placeholder job submitted after admission"]
    assert [str(r.get("job")) for r in landed] == [job_id], landed
    (row,) = [r for r in squeue(local) if r["id"] == job_id]
    assert row["comment"].startswith(f"{contract.COMMENT_PREFIX}{a[contract.A_CLAIM]} ")
    assert row["state"] == "RUNNING" and node
    assert duplicate_claims(local, ns) == {}  # the binder waited for the webhook's submit
    assert_no_leak(local, admin, ns)
