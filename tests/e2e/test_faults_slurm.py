"""Slurm outages: slurmrestd or slurmctld SIGKILLed under bound and gated Pods, with
admission denying (the default) or failing open; the binder backs off, and once the daemon is
back everything converges: nothing rebound, evicted, lost or leaked. With slurmrestd down, a job
that slurmctld starts meanwhile is bound all the same: slurmctld's hook pushed its start.

`test_slurmctld_killed_fail_open` is long and marked `faults` (make test-faults).
"""

from __future__ import annotations

import time

import pytest

from cluster.bridge import Bridge
from cluster.local import Local
from slurmgate import contract
from tests.e2e.conftest import Kubectl, marked_pod, slurm_cli, squeue, wait_until
from tests.e2e.faultkit import (
    ORPHAN_GRACE,
    SWEEP,
    ann,
    assert_no_leak,
    create_expect_denied,
    create_expect_submit_pending,
    duplicate_claims,
    events_of,
    fill,
    jobs_in,
    kill_slurm,
    log_lines,
    log_offset,
    metric,
    node_of,
    pods,
    record,
    restart_webhook,
    snapshot_bound,
    start_slurm,
    wait_bound,
)
from tests.e2e.watchers import BoundWatch

# they kill and restart the host processes, with crash points and env (`hostprocs`)
pytestmark = [pytest.mark.e2e, pytest.mark.hostprocs]


def _slurm_outage(daemon: str, fail_open: bool, local: Local, admin: Kubectl, bridge: Bridge,
                  ns: str) -> None:
    """n-1 bound Pods, a filler job, a gated Pod; `daemon` SIGKILLed; admission follows the
    documented policy; the binder backs off; after the restart everything converges."""
    names, filler, waiting = fill(local, admin, ns)
    mode = f"{daemon} down, FAIL_OPEN={str(fail_open).lower()}"
    if fail_open:
        restart_webhook(bridge, {"FAIL_OPEN": "true"})
    watch = BoundWatch(admin, ns, snapshot_bound(admin, ns, names))
    watch.start()
    try:
        errors0 = metric(bridge.binder_url, "slurmgate_binder_slurm_polls_total",
                         'outcome="error"')
        off = log_offset(bridge, "binder")
        kill_slurm(local, daemon, filler)
        t_down = time.monotonic()
        if fail_open:
            # admitted gated with SubmitPending; the binder submits once Slurm answers
            record(f"{mode}: admission latency", create_expect_submit_pending(admin, ns, "new"))
        else:
            msg, took = create_expect_denied(admin, ns, "new")
            record(f"{mode}: denial latency", took)
            assert "slurmgate: Slurm is unreachable" in msg, msg
            assert "failed calling webhook" not in msg, f"webhook timed out: {msg}"
        if daemon == "slurmrestd":
            # slurmctld is up: the gated Pod's job starts while the binder cannot see it
            slurm_cli(local, "scancel", filler)
            wait_until("waiting's job RUNNING behind slurmrestd's back", lambda: any(
                r["state"] == "RUNNING" and r["comment"].endswith(f"pod={ns}/{waiting}")
                for r in squeue(local)), 30)
        # the binder notices and backs off
        wait_until("binder logs 'backing off'", lambda: any(
            "backing off" in str(x.get("msg")) for x in log_lines(bridge, "binder", off)), 30)
        wait_until("binder poll errors counted", lambda: metric(
            bridge.binder_url, "slurmgate_binder_slurm_polls_total",
            'outcome="error"') > errors0, 10)
        backoffs = [x.get("retry_in", 0) for x in log_lines(bridge, "binder", off)
                    if "backing off" in str(x.get("msg"))]
        assert backoffs and max(backoffs) <= 45, backoffs
        if daemon == "slurmrestd":
            # slurmctld told the binder itself (PrologSlurmctld hook): bound without slurmrestd
            wait_bound(admin, ns, waiting, 60)
            record(f"{mode}: Pod whose job started meanwhile bound (pushed) after",
                   time.monotonic() - t_down)
        else:
            assert node_of(admin, ns, waiting) is None
        record(f"{mode}: outage length", time.monotonic() - t_down)
        record(f"{daemon} restart", start_slurm(local, daemon))
        t_up = time.monotonic()
        if fail_open:
            restart_webhook(bridge)  # back to the bridge's FAIL_OPEN=false

        # the binder catches up by itself
        if fail_open:
            wait_until("binder submitted the SubmitPending Pod's job", lambda: ann(
                admin.get("pod", "new", ns)).get(contract.A_JOB_ID), 60)
            record(f"{mode}: SubmitPending Pod submitted after", time.monotonic() - t_up)
            # The job it names is in Slurm. Not at once: the admission's lost submit may have
            # been carried out once slurmctld returned, older than the binder's; the older
            # stays and the binder's is cancelled as the duplicate (CI, 24.11: 83 named,
            # cancelled for 82), and the Pod then names the one left
            wait_until("the Pod names a job of its claim that Slurm has", lambda: any(
                r["id"] == ann(admin.get("pod", "new", ns)).get(contract.A_JOB_ID)
                for r in jobs_in(local, ns)), 30, interval=0.5)
        else:
            admin.apply(marked_pod("new"), "-n", ns)  # admission works again
        if daemon == "slurmctld":
            slurm_cli(local, "scancel", filler)
            wait_bound(admin, ns, waiting, 60)
        # one job per Pod: a submit that timed out while slurmctld was away may still have
        # been carried out by slurmrestd once slurmctld returned
        wait_until("no Pod with two placeholder jobs", lambda: not duplicate_claims(local, ns),
                   30, interval=0.5)
        # new work binds again: free one node, the newest Pod lands there
        watch.release(names[0])
        t0 = time.monotonic()
        admin.run("delete", "pod", names[0], "-n", ns, "--wait=false")
        wait_bound(admin, ns, "new", 60)
        record(f"{mode}: freed node -> next Pod bound", time.monotonic() - t0)
    finally:
        watch.stop()
    watch.check()  # not in `finally`: a failure above must not be hidden behind this one
    assert not events_of(admin, ns, "Evicted"), "a Pod was evicted during the Slurm outage"
    assert not events_of(admin, ns, "SlurmJobVanished")
    assert len(pods(admin, ns)) == len(names) + 1  # b1.., waiting, new (b0 deleted)
    # e.g. the denied Pod's submit, carried out late: an orphan, cancelled after the grace
    assert_no_leak(local, admin, ns, timeout=ORPHAN_GRACE + SWEEP + 20)


@pytest.mark.parametrize("fail_open", [False, True], ids=["deny", "fail_open"])
def test_slurmrestd_down_admission_backoff_catch_up(fail_open: bool, local: Local,
                                                    admin: Kubectl, bridge: Bridge, ns: str,
                                                    restore: None) -> None:
    _slurm_outage("slurmrestd", fail_open, local, admin, bridge, ns)


def test_slurmctld_killed_and_restarted(local: Local, admin: Kubectl, bridge: Bridge, ns: str,
                                        restore: None) -> None:
    _slurm_outage("slurmctld", False, local, admin, bridge, ns)


def test_slurmctld_lost_its_state(local: Local, admin: Kubectl, bridge: Bridge, ns: str,
                                  restore: None) -> None:
    """A controller that lost its state directory (started with -c) forgets every job: a bound
    Pod's Node may now be given to anyone, so the Pod is evicted as SlurmJobVanished; new Pods
    get jobs and bind as before. (The restarts above keep the state, as sites do.)"""
    admin.apply(marked_pod("before"), "-n", ns)
    wait_bound(admin, ns, "before")
    kill_slurm(local, "slurmctld")
    start_slurm(local, "slurmctld", clear_state=True)
    wait_until("the bound Pod evicted", lambda: "before" not in pods(admin, ns), 90)
    assert events_of(admin, ns, "SlurmJobVanished"), "no SlurmJobVanished Event"
    admin.apply(marked_pod("after"), "-n", ns)
    wait_bound(admin, ns, "after")
    assert_no_leak(local, admin, ns)


@pytest.mark.faults
def test_slurmctld_killed_fail_open(local: Local, admin: Kubectl, bridge: Bridge, ns: str,
                                    restore: None) -> None:
    _slurm_outage("slurmctld", True, local, admin, bridge, ns)
