"""Helpers of the fault tests (test_faults_*.py): look at Pods, placeholder jobs, Events,
metrics and daemon logs; kill and start Slurm daemons; fill the cluster; record recovery times.

Every wait is bounded (wait_until deadlines, never sleeps as synchronisation).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from cluster import kube as kube_mod
from cluster import slurm_faults
from cluster.bridge import Bridge
from cluster.local import Local
from slurmgate import contract
from tests.e2e.conftest import RUN_DIR, Kubectl, marked_pod, restart, slurm_cli, squeue, wait_until

ORPHAN_GRACE = 10.0  # BINDER_ORPHAN_GRACE in the local bridge
SWEEP = 10.0  # the binder's sweep interval
LEASE = 15.0  # a SIGKILLed binder's Lease must expire before the next one leads
# measured recovery times of every fault module, also in <run_dir>/fault-timings.json: one dict
# here, so each record() rewrites the file with all of them, not just its own module's
TIMINGS: dict[str, float] = {}


def record(what: str, seconds: float) -> None:
    TIMINGS[what] = round(seconds, 2)
    print(f"[timing] {what}: {seconds:.2f}s")
    (RUN_DIR / "fault-timings.json").write_text(json.dumps(TIMINGS, indent=1))


def pods(admin: Kubectl, ns: str) -> dict[str, dict[str, Any]]:
    return {p["metadata"]["name"]: p for p in admin.items("pods", ns=ns)}


def node_of(admin: Kubectl, ns: str, name: str) -> str | None:
    return admin.get("pod", name, ns)["spec"].get("nodeName")


def ann(pod: dict[str, Any]) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def jobs_in(local: Local, ns: str) -> list[dict[str, str]]:
    """Our placeholder jobs (pending or running) for Pods of namespace ns."""
    return [r for r in squeue(local) if r["comment"].startswith(contract.COMMENT_PREFIX)
            and f" pod={ns}/" in r["comment"] and r["state"] != "COMPLETING"]


def claims_match(local: Local, admin: Kubectl, ns: str) -> bool:
    """Every placeholder job belongs to a live Pod, and every Pod has exactly one job."""
    live = [p for p in admin.items("pods", ns=ns) if not p["metadata"].get("deletionTimestamp")]
    want = sorted(ann(p).get(contract.A_CLAIM, "") for p in live)
    have = sorted(contract.claim_from_comment(r["comment"]) or "" for r in jobs_in(local, ns))
    return want == have


def assert_no_leak(local: Local, admin: Kubectl, ns: str, timeout: float = 40.0) -> None:
    wait_until("placeholder jobs == live Pods (no orphan, no duplicate)",
               lambda: claims_match(local, admin, ns), timeout, interval=0.5)


def bound(admin: Kubectl, ns: str, name: str) -> str | None:
    p = admin.get("pod", name, ns)
    return p["spec"].get("nodeName") if p["status"].get("phase") == "Running" else None


def bound_pods(admin: Kubectl, ns: str, names: list[str]) -> dict[str, dict[str, Any]]:
    """The namespace's Pods once every one of `names` exists and is bound (else {})."""
    ps = pods(admin, ns)
    return ps if all(ps.get(n, {}).get("spec", {}).get("nodeName") for n in names) else {}


def wait_bound(admin: Kubectl, ns: str, name: str, timeout: float = 60.0) -> str:
    return wait_until(f"Pod {name} bound and Running", lambda: bound(admin, ns, name), timeout)


def wait_gated_pending(admin: Kubectl, ns: str, name: str) -> dict[str, Any]:
    return wait_until(f"Pod {name} gated with a PENDING job", lambda: (
        p := admin.get("pod", name, ns)) and ann(p).get(contract.A_JOB_REASON) and
        not p["spec"].get("nodeName") and p, 30)


def events_of(admin: Kubectl, ns: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in admin.items("events", ns=ns) if e["reason"] == reason]


def metric(url: str, name: str, labels: str = "") -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (not labels or labels in line):
            total += float(line.rsplit(" ", 1)[1])
    return total


def log_path(bridge: Bridge, name: str) -> Path:
    return Path(bridge.run_dir) / "log" / f"{name}.log"


def log_lines(bridge: Bridge, name: str, offset: int) -> list[dict[str, Any]]:
    raw = log_path(bridge, name).read_bytes()[offset:].decode(errors="replace")
    out = []
    for line in raw.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append({"msg": line})
    return out


def log_offset(bridge: Bridge, name: str) -> int:
    p = log_path(bridge, name)
    return p.stat().st_size if p.exists() else 0


def alive(pid: int) -> bool:
    return kube_mod._alive(pid)


def filler_job(local: Local) -> str:
    """A plain (non-slurmgate) job in partition k8s on the one free node: same priority tier,
    so it preempts nothing; cancelling it later frees a node while something is down."""
    out = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "k8s",
                    "--exclusive", "-N1",
                    "--mem=1000", "-J", "filler", "--wrap", "sleep 600")
    job_id = out.strip().split(";")[0]
    wait_until("filler job RUNNING", lambda: any(
        r["id"] == job_id and r["state"] == "RUNNING" for r in squeue(local)), 30)
    return job_id


def fillers_on(local: Local, slurm_nodes: list[str]) -> list[str]:
    """A plain (non-slurmgate) job on each of these nodes, RUNNING on return: the nodes are
    taken, so a Pod's job that can only go there waits (scancel_quiet frees them)."""
    ids: list[str] = []
    try:
        for n in slurm_nodes:
            ids.append(slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p",
                                 "k8s", "--exclusive", "-w", n, "--mem=1000", "-J", "filler",
                                 "--wrap", "sleep 600").strip().split(";")[0])
        wait_until("filler jobs RUNNING", lambda: {
            r["id"] for r in squeue(local) if r["state"] == "RUNNING"} >= set(ids), 30)
    except BaseException:
        scancel_quiet(local, *ids)
        raise
    return ids


def scancel_quiet(local: Local, *ids: str) -> None:
    """scancel that does not mind jobs already gone (Slurm's CLI fails on an unknown id)."""
    if not ids:
        return
    argv, env = local.slurm.command("scancel", *ids)
    subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)


def restart_webhook(bridge: Bridge, extra_env: dict[str, str] | None = None) -> None:
    restart(bridge, "webhook", extra_env)


def snapshot_bound(admin: Kubectl, ns: str, names: list[str]) -> dict[str, tuple[str, str]]:
    ps = pods(admin, ns)
    return {n: (ps[n]["metadata"]["uid"], ps[n]["spec"]["nodeName"]) for n in names}


def fill(local: Local, admin: Kubectl, ns: str) -> tuple[list[str], str, str]:
    """n-1 bound Pods, a filler job on the last node, one gated Pod 'waiting' (PENDING)."""
    n = len(local.slurm.nodes)
    names = [f"b{i}" for i in range(n - 1)]
    for name in names:
        admin.apply(marked_pod(name), "-n", ns)
    for name in names:
        wait_bound(admin, ns, name)
    filler = filler_job(local)
    admin.apply(marked_pod("waiting"), "-n", ns)
    wait_gated_pending(admin, ns, "waiting")
    return names, filler, "waiting"


def kill_slurm(local: Local, name: str, touch_job: str | None = None) -> None:
    if name == "slurmctld" and touch_job:
        # slurmctld writes its job state at most every 5 s (SAVE_MAX_WAIT) and acknowledges
        # submits before that: a SIGKILL right after a change loses it (Slurm's own
        # behaviour, observed while writing these tests). Here, kill a controller whose state is
        # on disk: touch a job so a save is scheduled, and wait for the write.
        state = local.slurm.run_dir / "state" / "job_state"
        t = time.time()
        slurm_cli(local, "scontrol", "update", f"jobid={touch_job}", f"comment=touched-{t}")
        wait_until("slurmctld saved its job state", lambda: state.stat().st_mtime > t, 20)
    slurm_faults.kill_daemon(local.slurm.run_dir, name)


def start_slurm(local: Local, name: str, clear_state: bool = False) -> float:
    t0 = time.monotonic()
    local.slurm.pids[name] = slurm_faults.start_daemon(local.slurm.run_dir, name,
                                                       clear_state=clear_state)
    if name == "slurmctld":
        # until the slurmds re-register, Slurm answers submits with "Required node not
        # available" (errno 2068): where the answer names a job (22.05 queues it anyway) the
        # Pod is admitted, else denied with that text (documented behaviour)
        wait_until("slurmds re-registered", lambda: all(
            not st.endswith("*") and st not in ("unk", "down") for st in (
                line.split()[1] for line in slurm_cli(
                    local, "sinfo", "-h", "-N", "-p", "k8s", "-o", "%N %t").splitlines())), 30)
        record("slurmctld restart -> slurmds re-registered", time.monotonic() - t0)
    return time.monotonic() - t0


def create_expect_denied(admin: Kubectl, ns: str, name: str) -> tuple[str, float]:
    t0 = time.monotonic()
    p = admin.apply(marked_pod(name), "-n", ns, check=False)
    took = time.monotonic() - t0
    assert p.returncode != 0, f"Pod {name} admitted although Slurm is away"
    return p.stderr, took


def create_expect_submit_pending(admin: Kubectl, ns: str, name: str) -> float:
    t0 = time.monotonic()
    admin.apply(marked_pod(name), "-n", ns)
    took = time.monotonic() - t0
    p = admin.get("pod", name, ns)
    assert ann(p).get(contract.A_JOB_STATE) == "SubmitPending", ann(p)
    assert not ann(p).get(contract.A_JOB_ID)
    assert {"name": contract.GATE} in p["spec"]["schedulingGates"]
    assert p["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    return took


def duplicate_claims(local: Local, ns: str) -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for r in jobs_in(local, ns):
        by.setdefault(contract.claim_from_comment(r["comment"]) or "", []).append(
            f"{r['id']}:{r['state']}")
    return {c: ids for c, ids in by.items() if len(ids) > 1}


# The webhook called directly, as the apiserver would: only so can one AdmissionReview be
# delivered twice, or concurrently.
def post_review(bridge: Bridge, body: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=str(Path(bridge.run_dir) / "certs" / "ca.crt"))
    req = urllib.request.Request(f"{bridge.webhook_url}/mutate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, context=ctx, timeout=15) as r:
        return json.loads(r.read())


def admission_review(ns: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()),
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": ns, "operation": "CREATE", "dryRun": False,
                        "object": {**marked_pod(name), "metadata": {
                            **marked_pod(name)["metadata"], "namespace": ns}}}}
