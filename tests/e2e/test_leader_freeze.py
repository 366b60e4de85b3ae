"""A leading binder frozen past its Lease (SIGSTOP: a long GC pause, a paused VM), then resumed
(SIGCONT), beside a second replica: the classic split brain (issue 30). Every other leader
fault of the suite is a SIGKILL, after which the old leader never runs again.

What the code promises (binder/leader.py, binder/__main__.py):
- the standby takes the Lease once it expired (LeaderElector._try: `age > leaseDurationSeconds`,
  15 s here: LEASE_DURATION_SECONDS in cluster/bridge.py local_settings);
- the frozen leader, resumed, finds its last renewal older than RENEW_DEADLINE of the Lease
  (keep(): `left <= 0`, by the monotonic clock, which ran on while it was stopped): it logs
  "lease not renewed in time; stepping down" (or, had a renewal been answered, "lease lost to
  another holder"), never writes the Lease again, and the process exits with 1 ("lost
  leadership or failed; exiting so a fresh process starts clean") so that a fresh one starts
  with no stale state.
The danger is what it does between SIGCONT and that exit with a view of the world frozen
before the handover: the new leader submitted a gang's job and bound Pods it never saw.
A stale whole job list would show those jobs as held by no Pod it knows (the orphan sweep
cancels such jobs once older than BINDER_ORPHAN_GRACE); stale gated gang members would be
submitted again; stale gated Pods would be bound again. So the freeze lasts until all that
is true, and afterwards: one job per Pod or gang, one Bound per Pod, every job still running
under its Pod, nothing logged as done by the old replica after it was frozen.
"""

from __future__ import annotations

import os
import signal
import time
import urllib.request
from collections import Counter
from functools import partial
from typing import Any

import pytest

from cluster import bridge as bridge_mod
from cluster import proc
from cluster.bridge import NAMESPACE, Bridge
from cluster.local import Local
from slurmgate import contract
from slurmgate.binder import nodesync
from tests.e2e.conftest import Kubectl, marked_pod, squeue, wait_until
from tests.e2e.faultkit import (
    LEASE,
    ORPHAN_GRACE,
    ann,
    events_of,
    log_lines,
    log_offset,
    pods,
    wait_bound,
)
from tests.e2e.test_gangs import member

# they start a second binder and freeze the first (host processes)
pytestmark = [pytest.mark.e2e, pytest.mark.faults, pytest.mark.hostprocs]

OLD, NEW = bridge_mod.BINDERS  # the session's binder leads; the second one stands by
LEASE_NAME = "slurmgate-binder"
STEPPED_DOWN = ("lease not renewed in time; stepping down", "lease lost to another holder")
EXITING = "lost leadership or failed; exiting so a fresh process starts clean"
# What a binder logs once it changed something in Kubernetes or Slurm (binder/actions.py,
# controller.py, nodesync.py). A resubmit logs nothing of its own: the job count catches it.
ACTED = ("pod bound", "pod evicted", "group job submitted", "group bound", "group released",
         "pod gone; job cancelled", "orphan job cancelled", "duplicate job of a claim cancelled",
         *nodesync.LOG_LINES.values())
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING")
NAMES = ("before", "during", "g0", "g1")  # bound by the old leader, then by the new one


def _readyz(name: str) -> str:
    with urllib.request.urlopen(f"{bridge_mod.binder_url(name)}/readyz", timeout=2) as r:
        return r.read().decode()


def _lease(admin: Kubectl) -> dict[str, Any]:
    spec: dict[str, Any] = admin.get("lease", LEASE_NAME, NAMESPACE)["spec"]
    return spec


def _identity(bridge: Bridge, name: str, offset: int) -> str | None:
    """The Lease identity a replica started with (its "binder starting" line)."""
    return next((line["identity"] for line in log_lines(bridge, name, offset)
                 if line.get("msg") == "binder starting" and line.get("identity")), None)


def _logged(bridge: Bridge, name: str, offset: int, msg: str, pod: str) -> bool:
    return any(line.get("msg") == msg and line.get("pod") == pod
               for line in log_lines(bridge, name, offset))


def _exited(pid: int) -> tuple[int | None] | None:
    """(exit code,) once the process is gone (None as the code when it is not our child), else
    None."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return None if proc.alive(pid) else (None,)
    return (os.waitstatus_to_exitcode(status),) if done else None


def _our_jobs(local: Local, ns: str) -> list[dict[str, str]]:
    """Placeholder jobs of this namespace's Pods and gangs, not yet ending."""
    return [r for r in squeue(local) if r["comment"].startswith(contract.COMMENT_PREFIX)
            and (f" pod={ns}/" in r["comment"] or f" group={ns}/" in r["comment"])
            and r["state"] in ACTIVE]


def _state(admin: Kubectl, ns: str) -> dict[str, tuple[str, str, str, str]]:
    """Per Pod: uid, Node, job id and phase (a Pod being deleted shows as Terminating)."""
    out = {}
    for name, p in pods(admin, ns).items():
        phase = "Terminating" if p["metadata"].get("deletionTimestamp") else \
            p["status"].get("phase", "")
        out[name] = (p["metadata"]["uid"], p["spec"].get("nodeName") or "",
                     ann(p).get(contract.A_JOB_ID, ""), phase)
    return out


def _one_job_each(local: Local, admin: Kubectl, ns: str) -> None:
    """Every Pod's claim has exactly one live job, and every live job a Pod: no second submit
    (a resubmit keeps the claim; a gang submitted again gets a new one), no orphan."""
    per_claim = Counter(contract.claim_from_comment(r["comment"]) for r in _our_jobs(local, ns))
    claims = {ann(p).get(contract.A_CLAIM) for p in pods(admin, ns).values()}
    assert per_claim == Counter(dict.fromkeys(claims, 1)), (per_claim, claims)


def test_leader_frozen_past_its_lease_then_resumed(local: Local, admin: Kubectl,
                                                   bridge: Bridge, ns: str) -> None:
    assert NEW not in bridge.pids, "a second binder is already running"
    wait_until(f"{OLD} leads", lambda: _readyz(OLD) == "ok leader", 30)
    old_pid = bridge.pids[OLD]
    new_log = log_offset(bridge, NEW)
    old_log = log_offset(bridge, OLD)
    try:
        bridge_mod.start_processes(bridge, (NEW,))
        # slurmctld's hook tells both: whichever leads acts on pushes (the polls back it up)
        bridge_mod.point_hook(local, [f"127.0.0.1:{bridge_mod.binder_port(n)}"
                                      for n in (OLD, NEW)])
        assert _readyz(NEW) == "ok standby"
        new_id = wait_until(f"{NEW}'s identity", lambda: _identity(bridge, NEW, new_log), 10)
        before = _lease(admin)
        assert before["holderIdentity"] not in (None, new_id), before

        admin.apply(marked_pod("before"), "-n", ns)
        wait_bound(admin, ns, "before")
        wait_until(f"{OLD} logged its bind", lambda: _logged(
            bridge, OLD, old_log, "pod bound", f"{ns}/before"), 10)
        # its Bound Event goes out in the background: sent before the freeze, so that the
        # count below is not short of one the frozen leader had still to send
        wait_until("before's Bound Event", lambda: any(
            e["involvedObject"]["name"] == "before" for e in events_of(admin, ns, "Bound")), 10)

        frozen_log = log_offset(bridge, OLD)
        os.killpg(old_pid, signal.SIGSTOP)  # the whole process group: a paused container
        try:
            t0 = time.monotonic()
            wait_until(f"{NEW} took the Lease and leads", lambda: _readyz(NEW) == "ok leader",
                       LEASE + 30)
            took = time.monotonic() - t0
            assert _lease(admin)["holderIdentity"] == new_id
            # the new leader acts while the old one is frozen: a Pod's job (the webhook's),
            # a gang's job (its own submit), three binds
            admin.apply(marked_pod("during"), "-n", ns)
            for i in range(2):
                admin.apply(member(f"g{i}", "g", 2, i), "-n", ns)
            for name in ("during", "g0", "g1"):
                wait_bound(admin, ns, name, 60)
                wait_until(f"{NEW} logged the bind of {name}", partial(
                    _logged, bridge, NEW, new_log, "pod bound", f"{ns}/{name}"), 10)
            bound_at = time.monotonic()

            def frozen_long_enough() -> bool:
                # The fault's length: frozen on until every job the new leader made is past
                # BINDER_ORPHAN_GRACE and the old leader's whole job list (every 10 s here) is
                # overdue, so that its stale view would take them for orphans the moment it
                # runs. Each poll checks that the freeze holds meanwhile.
                assert proc.proc_state(old_pid) == "T", "the old leader did not stay frozen"
                return time.monotonic() >= bound_at + ORPHAN_GRACE + 2

            wait_until("the freeze outlasting BINDER_ORPHAN_GRACE", frozen_long_enough,
                       ORPHAN_GRACE + 10, interval=0.5)
            frozen = _state(admin, ns)
            _one_job_each(local, admin, ns)
        finally:
            os.killpg(old_pid, signal.SIGCONT)
        print(f"[timing] standby took over {took:.1f}s after the freeze; frozen "
              f"{time.monotonic() - t0:.1f}s")

        gone = wait_until(f"{OLD} stepped down and exited", lambda: _exited(old_pid), 30)
        code = gone[0] if gone else None
        said = log_lines(bridge, OLD, frozen_log)
        msgs = [line.get("msg", "") for line in said]
        assert any(m in STEPPED_DOWN for m in msgs), msgs[-30:]
        assert EXITING in msgs, msgs[-30:]
        assert code in (1, None), code
        acted = [line for line in said if line.get("msg") in ACTED]
        refused = [line for line in said if line.get("msg") == "reconcile failed; will retry"]
        assert acted == [], (acted, refused)

        # the new leader still holds the Lease, taken once: the old one never wrote it again
        assert _readyz(NEW) == "ok leader"
        after = _lease(admin)
        assert after["holderIdentity"] == new_id, after
        assert after.get("leaseTransitions", 0) == before.get("leaseTransitions", 0) + 1, after
        # nothing undone, nothing doubled
        assert _state(admin, ns) == frozen
        _one_job_each(local, admin, ns)
        jobs = {name: frozen[name][2] for name in NAMES}
        running = {r["id"] for r in squeue(local) if r["state"] == "RUNNING"}
        assert set(jobs.values()) <= running, (jobs, running)
        assert Counter(e["involvedObject"]["name"] for e in events_of(admin, ns, "Bound")) == \
            Counter(dict.fromkeys(NAMES, 1))

        # The new leader acts on: a deleted Pod's job cancelled. By then anything the old
        # process sent before it exited has long reached Slurm and the API server.
        admin.run("delete", "pod", "before", "-n", ns, "--wait=false")
        wait_until("before's job cancelled by the new leader", lambda: jobs["before"] not in {
            r["id"] for r in squeue(local) if r["state"] in ACTIVE}, 30)
        assert _state(admin, ns) == {n: frozen[n] for n in ("during", "g0", "g1")}
        running = {r["id"] for r in squeue(local) if r["state"] == "RUNNING"}
        assert {jobs[n] for n in ("during", "g0", "g1")} <= running
        _one_job_each(local, admin, ns)
    finally:
        try:
            os.killpg(old_pid, signal.SIGCONT)  # never leave it stopped
        except ProcessLookupError:
            pass
        bridge_mod.stop_processes(bridge, (OLD, NEW))
        bridge_mod.point_hook(local, [f"127.0.0.1:{bridge_mod.binder_port(OLD)}"])
        bridge_mod.start_processes(bridge, (OLD,))  # leads once NEW's Lease has expired
