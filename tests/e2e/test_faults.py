"""Fault tests against the real cluster: Slurm daemons, kube-apiserver, webhook and binder are
killed (SIGKILL by recorded PID) and started again; afterwards nothing is lost or leaked.

Every test is bounded (wait_until deadlines, never sleeps as synchronisation) and puts the
cluster back as it found it (daemons up, webhook/binder running with the bridge's env).
The long ones are marked `faults` (make test-faults); the rest run in `make test`.
"""

from __future__ import annotations

import json
import os
import ssl
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster import bridge as bridge_mod
from cluster import kube as kube_mod
from cluster import proc as proc_mod
from cluster import slurm as slurm_mod
from cluster import slurm_faults
from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract
from tests.e2e.conftest import Kubectl, marked_pod, slurm_cli, squeue, wait_until

pytestmark = pytest.mark.e2e

ORPHAN_GRACE = 10.0  # BINDER_ORPHAN_GRACE in the local bridge
SWEEP = 10.0  # the binder's sweep interval
LEASE = 15.0  # a SIGKILLed binder's Lease must expire before the next one leads
TIMINGS: dict[str, float] = {}  # measured recovery times, also in <run_dir>/fault-timings.json
RUN_DIR = Path(os.environ.get("SLURMGATE_RUN_DIR", "/tmp/slurmgate"))


def record(what: str, seconds: float) -> None:
    TIMINGS[what] = round(seconds, 2)
    print(f"[timing] {what}: {seconds:.2f}s")
    (RUN_DIR / "fault-timings.json").write_text(json.dumps(TIMINGS, indent=1))


# --------------------------------------------------------------------------- helpers


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


DIRTY: set[str] = set()  # processes running with a test's extra env, restarted by `restore`


def restart(bridge: Bridge, name: str, extra_env: dict[str, str] | None = None) -> None:
    bridge_mod.stop_processes(bridge, (name,))
    bridge_mod.start_processes(bridge, (name,), extra_env=extra_env)
    if extra_env:
        DIRTY.add(name)
    else:
        DIRTY.discard(name)


def restart_webhook(bridge: Bridge, extra_env: dict[str, str] | None = None) -> None:
    restart(bridge, "webhook", extra_env)


class BoundWatch(threading.Thread):
    """Samples the Pods that were bound at the start: each must stay bound to the same Node,
    with the same uid, not terminating (unless the test itself deleted it: `release`)."""

    def __init__(self, admin: Kubectl, ns: str, bound_at_start: dict[str, tuple[str, str]]):
        super().__init__(daemon=True)
        self.admin, self.ns, self.expect = admin, ns, dict(bound_at_start)
        self.stop_flag = threading.Event()
        self.violations: list[str] = []
        self.samples = 0
        self.lock = threading.Lock()

    def release(self, name: str) -> None:
        with self.lock:
            self.expect.pop(name, None)

    def run(self) -> None:
        while not self.stop_flag.is_set():
            try:
                now = pods(self.admin, self.ns)
            except Exception:  # kube-apiserver down: nothing to sample
                time.sleep(0.3)
                continue
            with self.lock:
                for name, (uid, node) in self.expect.items():
                    p = now.get(name)
                    if p is None:
                        self.violations.append(f"{name} gone")
                    elif p["metadata"]["uid"] != uid or p["spec"].get("nodeName") != node:
                        self.violations.append(f"{name} rebound/replaced")
                    elif p["metadata"].get("deletionTimestamp"):
                        self.violations.append(f"{name} being deleted (evicted?)")
            self.samples += 1
            time.sleep(0.3)

    def finish(self) -> None:
        self.stop_flag.set()
        self.join(10)
        assert self.samples >= 3, "BoundWatch took too few samples"
        assert not self.violations, self.violations[:10]


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


@pytest.fixture
def restore(local: Local, bridge: Bridge) -> Iterator[None]:
    """Whatever a test killed comes back, and the processes run with the bridge's env."""
    yield
    s_dir = local.slurm.run_dir
    for name in ("slurmctld", "slurmrestd"):
        c = slurm_mod.load(s_dir)
        if not proc_mod.alive(c.pids[name]):
            local.slurm.pids[name] = slurm_faults.start_daemon(s_dir, name)
    kc = kube_mod.load(Path(local.kube.run_dir))
    if not alive(kc.pids["kube-apiserver"]):
        local.kube.pids["kube-apiserver"] = kube_mod.start_daemon(
            Path(local.kube.run_dir), "kube-apiserver")
    for name in ("webhook", "binder"):
        pid = bridge.pids.get(name)
        if name in DIRTY or pid is None or not alive(pid):
            restart(bridge, name)


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


def start_slurm(local: Local, name: str) -> float:
    t0 = time.monotonic()
    local.slurm.pids[name] = slurm_faults.start_daemon(local.slurm.run_dir, name)
    if name == "slurmctld":
        # until the slurmds re-register, Slurm refuses submits ("Required node not
        # available", errno 2068) and the webhook denies with that text: documented behaviour
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


# --------------------------------------------------------------------------- Slurm away


def duplicate_claims(local: Local, ns: str) -> dict[str, list[str]]:
    by: dict[str, list[str]] = {}
    for r in jobs_in(local, ns):
        by.setdefault(contract.claim_from_comment(r["comment"]) or "", []).append(
            f"{r['id']}:{r['state']}")
    return {c: ids for c, ids in by.items() if len(ids) > 1}


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
        assert node_of(admin, ns, waiting) is None
        record(f"{mode}: outage length", time.monotonic() - t_down)
        record(f"{daemon} restart", start_slurm(local, daemon))
        t_up = time.monotonic()
        if fail_open:
            restart_webhook(bridge)  # back to the bridge's FAIL_OPEN=false

        # the binder catches up by itself
        if daemon == "slurmrestd":
            wait_bound(admin, ns, waiting, 60)
            record(f"{mode}: Pod whose job ran meanwhile bound after", time.monotonic() - t_up)
        if fail_open:
            job = wait_until("binder submitted the SubmitPending Pod's job", lambda: ann(
                admin.get("pod", "new", ns)).get(contract.A_JOB_ID), 60)
            record(f"{mode}: SubmitPending Pod submitted after", time.monotonic() - t_up)
            assert any(r["id"] == job for r in jobs_in(local, ns))
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
        watch.finish()
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


@pytest.mark.faults
def test_slurmctld_killed_fail_open(local: Local, admin: Kubectl, bridge: Bridge, ns: str,
                                    restore: None) -> None:
    _slurm_outage("slurmctld", True, local, admin, bridge, ns)


# --------------------------------------------------------------------------- kube-apiserver


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


def _post_review(bridge: Bridge, body: dict[str, Any]) -> dict[str, Any]:
    ctx = ssl.create_default_context(cafile=str(Path(bridge.run_dir) / "certs" / "ca.crt"))
    req = urllib.request.Request(f"{bridge.webhook_url}/mutate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, context=ctx, timeout=15) as r:
        return json.loads(r.read())


def _review(ns: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uuid.uuid4()),
                        "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": ns, "operation": "CREATE", "dryRun": False,
                        "object": {**marked_pod(name), "metadata": {
                            **marked_pod(name)["metadata"], "namespace": ns}}}}


def test_duplicate_admission_review_one_job(local: Local, admin: Kubectl, bridge: Bridge,
                                            ns: str) -> None:
    body = _review(ns, "dup")
    first = _post_review(bridge, body)
    second = _post_review(bridge, body)
    assert first == second and first["response"]["allowed"] is True
    # the same review delivered concurrently, too
    body2 = _review(ns, "dup2")
    out: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda: out.append(_post_review(bridge, body2)))
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


# --------------------------------------------------------------------------- load


class LoadWatch(threading.Thread):
    """Samples Slurm and Kubernetes (admin client certs, no kubectl) every ~0.5 s:
    - a Node running an hpc job and holding a Pod at once is a violation;
    - a gated/unbound Pod whose job has been RUNNING for more than `stuck_after` is stuck."""

    def __init__(self, local: Local, ns: str, stuck_after: float = 10.0) -> None:
        super().__init__(daemon=True)
        self.local, self.ns, self.stuck_after = local, ns, stuck_after
        self.stop_flag = threading.Event()
        self.sharing: list[str] = []
        self.stuck: dict[str, float] = {}
        self.running_since: dict[str, float] = {}
        self.samples = 0
        self.max_unbound_running = 0.0
        pki = Path(local.kube.ca_file).parent
        self.ctx = ssl.create_default_context(cafile=local.kube.ca_file)
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def _pods(self) -> list[dict[str, Any]]:
        url = f"{self.local.kube.server}/api/v1/namespaces/{self.ns}/pods"
        with urllib.request.urlopen(url, context=self.ctx, timeout=20) as r:
            return json.loads(r.read())["items"]

    def run(self) -> None:
        while not self.stop_flag.is_set():
            try:
                rows = squeue(self.local)
                items = self._pods()
            except Exception:
                time.sleep(0.5)
                continue
            now = time.monotonic()
            hpc = {r["nodes"] for r in rows if r["partition"] == "hpc" and r["state"] == "RUNNING"}
            pod_nodes = {p["spec"].get("nodeName") for p in items}
            both = hpc & {n.removeprefix("kwok-") for n in pod_nodes if n}
            if both:
                self.sharing.append(f"sample {self.samples}: {sorted(both)}")
            running = {contract.claim_from_comment(r["comment"]) for r in rows
                       if r["state"] == "RUNNING"}
            unbound_running = set()
            for p in items:
                a = ann(p)
                if (not p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
                        and a.get(contract.A_CLAIM) in running):
                    unbound_running.add(p["metadata"]["name"])
            for name in unbound_running:
                since = self.running_since.setdefault(name, now)
                self.max_unbound_running = max(self.max_unbound_running, now - since)
                if now - since > self.stuck_after:
                    self.stuck[name] = now - since
            for name in set(self.running_since) - unbound_running:
                del self.running_since[name]
            self.samples += 1
            time.sleep(0.5)


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
    evicted = len(events_of(admin, ns, "SlurmJobPreempted"))
    print(f"[load] preemptions seen: {evicted}")
    try:
        assert_no_leak(local, admin, ns, timeout=120)
    finally:  # clean up 1,000 Pods here: the ns fixture's 60 s kubectl timeout is too short
        t0 = time.monotonic()
        admin.run("delete", "pods", "--all", "-n", ns, "--wait=false", check=False)
        wait_until("binder cancelled every job of the deleted Pods",
                   lambda: not jobs_in(local, ns), 300, interval=1)
        record(f"load: {n_pods} Pods deleted -> all jobs cancelled", time.monotonic() - t0)


