"""A job of ours that no Pod names (a submit whose answer was lost, whose Pod then went) is found
and cancelled by the binder through slurmdbd's filtered job query (binder/lostjobs.py), and the
binder never reads Slurm's whole job list for it: on a busy site that list is the site's, and at
50,000 jobs it took slurmrestd 24.11 down (bench.busy)."""

from __future__ import annotations

import time
import uuid

import pytest

from cluster.bridge import Bridge
from cluster.local import Local
from tests.e2e.conftest import slurm_cli, squeue, wait_until
from tests.e2e.faultkit import ORPHAN_GRACE, SWEEP, metric, record

pytestmark = pytest.mark.e2e
REQUESTS = "slurmgate_binder_slurmrestd_requests_total"


def test_an_orphan_is_found_in_slurmdbd_without_the_whole_list(local: Local, bridge: Bridge,
                                                               ns: str) -> None:
    claim = uuid.uuid4().hex
    # what a webhook submit leaves behind when its answer is lost and its Pod is gone: our
    # name and comment, and a node it holds until found (not held: slurmctld tells slurmdbd
    # of a job only once it is eligible, and our placeholders never are held)
    out = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "k8s",
                    "--exclusive", "-N1", "--mem=1000", "-J", f"k8s:{ns}/ghost",
                    f"--comment=slurmgate claim={claim} pod={ns}/ghost", "--wrap", "sleep 600")
    job_id = out.strip().split(";")[0]
    t0 = time.monotonic()
    dbd0 = metric(bridge.binder_url, REQUESTS, 'endpoint="slurmdb/jobs"')
    wait_until("the orphan cancelled by the binder", lambda: not any(
        r["id"] == job_id and r["state"] not in ("COMPLETING", "CANCELLED")
        for r in squeue(local)), ORPHAN_GRACE + SWEEP + 30, interval=0.5)
    record("an orphan no Pod names: found and cancelled after", time.monotonic() - t0)
    assert metric(bridge.binder_url, REQUESTS, 'endpoint="slurmdb/jobs"') > dbd0
    # not once since this binder started: its safety net asked slurmdbd for partition k8s
    assert metric(bridge.binder_url, REQUESTS, 'endpoint="jobs"') == 0
