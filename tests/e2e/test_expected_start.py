"""When will my Pod start? A Pod whose job waits shows Slurm's own expected start (its backfill
plan, what `squeue --start` prints) in its annotation, its SlurmAllocated condition and its
pending Event, on every Slurm release the local cluster runs; it goes once the Pod is bound.

The binder adds no Slurm call for it: a waiting job of ours is read whole every DETAIL_EVERY
already (for its reason), and the expected start is a field of that record.
"""

from __future__ import annotations

import datetime as dt
import time

import pytest

from cluster.bridge import Bridge
from cluster.local import Local
from slurmgate import contract, reasons
from slurmgate.timestamps import parse_time
from tests.e2e.conftest import Kubectl, marked_pod, slurm_cli, wait_until
from tests.e2e.faultkit import ann, events_of, wait_bound

pytestmark = pytest.mark.e2e


def _squeue_start(local: Local, job: str) -> float | None:
    """Slurm's own expected start of a pending job (`squeue --start`), as unix time; None while
    it has none (N/A)."""
    out = slurm_cli(local, "squeue", "-h", "-j", job, "--start", "-o", "%S").strip()
    if not out or out in ("N/A", "Unknown"):
        return None
    # squeue prints the local time of the machine it runs on, without a zone
    return dt.datetime.fromisoformat(out).astimezone().timestamp()


def test_a_waiting_pod_shows_slurms_expected_start_until_it_is_bound(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str) -> None:
    # every k8s node taken by a plain job with a 10-minute limit: Slurm can plan the Pod's job
    # for when it ends
    filler = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "k8s",
                       "--exclusive", f"-N{len(local.slurm.nodes)}", "--mem=1000", "-t", "10",
                       "-J", "filler", "--wrap", "sleep 600").strip().split(";")[0]
    try:
        wait_until("the filler RUNNING", lambda: "RUNNING" in slurm_cli(
            local, "squeue", "-h", "-j", filler, "-o", "%T"), 60)
        admin.apply(marked_pod("waiting"), "-n", ns)

        def shown() -> tuple[float, float, dict] | None:
            p = admin.get("pod", "waiting", ns)
            job = ann(p).get(contract.A_JOB_ID)
            ours = parse_time(ann(p).get(contract.A_EXPECTED_START))
            theirs = _squeue_start(local, job) if job else None
            return (ours, theirs, p) if ours and theirs else None

        ours, theirs, pod = wait_until("the Pod shows Slurm's expected start", shown, 90)
        assert abs(ours - theirs) <= 1.0, (ours, theirs)
        # Slurm plans it for when the filler's limit runs out, not for now
        assert ours > time.time() + 60, (ours, time.time())
        when = ann(pod)[contract.A_EXPECTED_START]
        cond = next(c for c in pod["status"].get("conditions") or []
                    if c["type"] == contract.COND_ALLOCATED)
        assert cond["status"] == "False" and when in cond["message"], cond
        assert any(when in e.get("message", "")
                   for e in events_of(admin, ns, reasons.EV_JOB_PENDING)), \
            events_of(admin, ns, reasons.EV_JOB_PENDING)
    finally:
        slurm_cli(local, "scancel", filler)
    wait_bound(admin, ns, "waiting")
    wait_until("the expected start gone once bound", lambda: contract.A_EXPECTED_START not in
               ann(admin.get("pod", "waiting", ns)), 30)
