"""slurmctld tells the binder of starts and ends (PrologSlurmctld/EpilogSlurmctld running
slurmgate/hooks/slurmgate-notify), on every Slurm release the local cluster runs.

The local cluster's slurm.conf names the hook; the bridge points it at the binder with a fresh
token. A Pod whose job waits behind a full cluster has its start pushed and matched to its Pod; ends
are pushed too; a push without the token is refused and changes nothing.

The hook detaches its send so that it never delays a job, so a poll (every 0.1 s while a job of
ours waits) may see the start first: the push then counts as `known`, not `applied`. That a push
alone binds a Pod is tested where no poll can compete: with slurmrestd down
(tests/e2e/test_faults_slurm.py).
"""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest

from cluster.bridge import Bridge
from cluster.local import Local
from tests.e2e.conftest import (
    Kubectl,
    WaitTimeout,
    marked_pod,
    restart,
    slurm_cli,
    squeue,
    wait_until,
)
from tests.e2e.faultkit import metric, wait_bound

pytestmark = pytest.mark.e2e
PUSHES = "slurmgate_binder_slurm_pushes_total"


def _pushes(bridge: Bridge) -> str:
    with urllib.request.urlopen(f"{bridge.binder_url}/metrics", timeout=5) as r:
        return "; ".join(line for line in r.read().decode().splitlines()
                         if line.startswith(PUSHES))


def _matched_starts(bridge: Bridge) -> float:
    return sum(metric(bridge.binder_url, PUSHES, f'event="started",outcome="{o}"')
               for o in ("applied", "known"))


def test_a_pushed_start_binds_and_an_end_is_pushed(local: Local, admin: Kubectl, bridge: Bridge,
                                                   ns: str) -> None:
    # A binder that lived through the suite's lost-state fault test remembers job ids that
    # slurmctld has handed out again since; it rightly leaves a start under such an id to the
    # polls (outcome "reused"). A fresh binder is what this test is about: the push itself.
    # (In-cluster there are no host processes, and no fault test runs before this one.)
    if bridge.pids:
        restart(bridge, "binder")
    # every node taken by one plain job: the Pod's job waits, and the binder knows it by id
    filler = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "k8s",
                       "--exclusive", f"-N{len(local.slurm.nodes)}", "--mem=1000", "-J",
                       "filler", "--wrap", "sleep 600").strip().split(";")[0]
    try:
        wait_until("filler job RUNNING", lambda: any(
            r["id"] == filler and r["state"] == "RUNNING" for r in squeue(local)), 30)
        matched0 = _matched_starts(bridge)
        ended0 = metric(bridge.binder_url, PUSHES, 'event="ended"')
        admin.apply(marked_pod("p"), "-n", ns)
        wait_until("the Pod's job PENDING behind the filler", lambda: any(
            f"pod={ns}/p" in r["comment"] and r["state"] == "PENDING"
            for r in squeue(local)), 30)
    finally:
        slurm_cli(local, "scancel", filler)
    wait_bound(admin, ns, "p")
    # the start push reached the binder and was matched to our job, whichever came first
    try:
        wait_until("the Pod's start pushed", lambda: _matched_starts(bridge) > matched0, 30)
    except WaitTimeout as e:
        raise AssertionError(f"{e}; push counters: {_pushes(bridge)}") from None
    # the filler's end was pushed as well (not ours: counted, and nothing else)
    wait_until("the filler's end pushed", lambda: metric(
        bridge.binder_url, PUSHES, 'event="ended"') > ended0, 30)


def test_a_push_without_the_token_is_refused(bridge: Bridge) -> None:
    rejected0 = metric(bridge.binder_url, PUSHES, 'outcome="rejected"')
    req = urllib.request.Request(f"{bridge.binder_url}/slurm/v1/job-events",
                                 data=b"job=1&event=started&nodes=n1", method="POST",
                                 headers={"Authorization": "Bearer not-the-token"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=5)
    assert e.value.code == 401
    assert metric(bridge.binder_url, PUSHES, 'outcome="rejected"') == rejected0 + 1
