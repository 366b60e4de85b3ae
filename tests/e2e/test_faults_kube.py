"""kube-apiserver SIGKILLed and started again while Slurm starts a gated Pod's job: the binder
keeps its Lease, binds that Pod once the apiserver is back, rebinds nothing, and binds new Pods.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cluster import kube as kube_mod
from cluster.bridge import Bridge
from cluster.local import Local
from tests.e2e.conftest import Kubectl, marked_pod, slurm_cli, squeue, wait_until
from tests.e2e.faultkit import (
    alive,
    assert_no_leak,
    fill,
    log_lines,
    log_offset,
    record,
    snapshot_bound,
    wait_bound,
    wait_gated_pending,
)

# they kill and restart the host processes, with crash points and env (`hostprocs`)
pytestmark = [pytest.mark.e2e, pytest.mark.hostprocs]


def test_kube_apiserver_restarted(local: Local, admin: Kubectl, bridge: Bridge, ns: str,
                                  restore: None) -> None:
    names, filler, waiting = fill(local, admin, ns)
    before = snapshot_bound(admin, ns, names)
    binder_pid = bridge.pids["binder"]
    off = log_offset(bridge, "binder")
    kdir = Path(local.kube.run_dir)
    kube_mod.kill_daemon(kdir, "kube-apiserver")
    t_down = time.monotonic()
    # while the apiserver is away, Slurm frees a node: the gated Pod's job starts
    slurm_cli(local, "scancel", filler)
    wait_until("waiting's job RUNNING while kube-apiserver is down", lambda: any(
        r["state"] == "RUNNING" and r["comment"].endswith(f"pod={ns}/{waiting}")
        for r in squeue(local)), 30)
    t0 = time.monotonic()
    local.kube.pids["kube-apiserver"] = kube_mod.start_daemon(kdir, "kube-apiserver")
    t_up = time.monotonic()
    record("kube-apiserver restart", t_up - t0)
    record("kube-apiserver outage", t_up - t_down)
    wait_bound(admin, ns, waiting, 60)
    record("kube-apiserver back: Pod whose job ran meanwhile bound after", time.monotonic() - t_up)
    assert snapshot_bound(admin, ns, names) == before  # nothing rebound
    # new Pods still work
    admin.apply(marked_pod("after"), "-n", ns)
    wait_gated_pending(admin, ns, "after")
    admin.run("delete", "pod", names[0], "-n", ns, "--wait=false")
    wait_bound(admin, ns, "after", 60)
    assert alive(binder_pid) and bridge.pids["binder"] == binder_pid, \
        "binder exited (lost its Lease?) during the apiserver restart"
    # nothing rebound: the Pods bound before keep their Node; only the two new ones were bound
    # (duplicate "pod bound"/Bound Events from a stale cache are test_each_pod_bound_once)
    lines = log_lines(bridge, "binder", off)
    bound_lines = {x["pod"] for x in lines if x.get("msg") == "pod bound"}
    assert bound_lines == {f"{ns}/{waiting}", f"{ns}/after"}, bound_lines
    bad = [x for x in lines if "binding" in json.dumps(x).lower() and x.get("level") != "info"]
    assert not bad, bad[:5]  # no binding error (409 already-bound is swallowed, not logged)
    assert_no_leak(local, admin, ns)
