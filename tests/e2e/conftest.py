"""Session fixtures: the real local cluster (Slurm + Kubernetes), and slurmgate deployed on it.

SLURMGATE_REUSE_CLUSTER=1 keeps a cluster that `make cluster-up` started (faster iteration);
otherwise the session starts its own and stops every daemon by PID at the end.
SLURMGATE_E2E_DEPLOY=incluster runs the suite against slurmgate deployed in-cluster (its image,
`kubectl apply -k` of overlays/local-incluster, Pods on a real Node) instead of host processes;
tests marked `hostprocs` (they kill, restart or reconfigure the host processes) skip there.
`restore` (with restart()) puts back what a fault test (test_faults_*.py) killed or reconfigured.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cluster import bridge as bridge_mod
from cluster import incluster, oci, slurm_faults
from cluster import kube as kube_mod
from cluster import local as local_mod
from cluster import proc as proc_mod
from cluster import slurm as slurm_mod
from cluster.local import KubectlError
from cluster.realnode import NodeSpec
from slurmgate import contract
from tests.e2e.waiting import WaitTimeout, wait_until  # tests import it from here, as before

RUN_DIR = Path(os.environ.get("SLURMGATE_RUN_DIR", "/tmp/slurmgate"))
REUSE = os.environ.get("SLURMGATE_REUSE_CLUSTER") == "1"
IN_CLUSTER = os.environ.get("SLURMGATE_E2E_DEPLOY", "processes") == "incluster"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not IN_CLUSTER:
        return
    skip = pytest.mark.skip(reason="drives slurmgate's host processes (kill, restart, env, log "
                                   "files); in-cluster they are Pods (test_incluster.py kills "
                                   "the leading binder Pod)")
    for item in items:
        if "hostprocs" in item.keywords:
            item.add_marker(skip)


def job_id_of(admin: Kubectl, name: str, ns: str, timeout: float = 30.0) -> str:
    """The Pod's Slurm job id: named at admission, or, when the webhook handed a slow submit
    off (job-state Submitting), by the binder once Slurm's list shows the job."""
    return str(wait_until(f"{ns}/{name} names its Slurm job", lambda: admin.get(
        "pod", name, ns)["metadata"]["annotations"].get(contract.A_JOB_ID), timeout))


class Kubectl:
    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig

    def run(self, *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(["kubectl", f"--kubeconfig={self.kubeconfig}", *args], input=stdin,
                           text=True, capture_output=True, timeout=60)
        if check and p.returncode != 0:
            # not an AssertionError: wait_until retries this (a poll during an apiserver
            # restart, an object not created yet) and lets assertions through
            raise KubectlError(f"kubectl {' '.join(args)} failed: {p.stderr.strip()}")
        return p

    def apply(self, obj: dict[str, Any], *extra: str,
              check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run("create", "-f", "-", *extra, stdin=json.dumps(obj), check=check)

    def get(self, kind: str, name: str, ns: str | None = None) -> dict[str, Any]:
        args = ["get", kind, name, "-o", "json"] + (["-n", ns] if ns else [])
        return json.loads(self.run(*args).stdout)

    def items(self, kind: str, ns: str | None = None, selector: str | None = None) -> list[dict]:
        args = ["get", kind, "-o", "json"]
        args += ["-n", ns] if ns else ["-A"]
        if selector:
            args += ["-l", selector]
        return json.loads(self.run(*args).stdout)["items"]


LOG_LINES_ON_FAILURE = 80
# lines that name no Pod but tell what happened meanwhile (pushes, warnings, errors)
UNNAMED_OF_INTEREST = ('"slurmgate.push"', '"level": "warning"', '"level": "error"')


def _during(line: str, since: float) -> bool:
    if not any(mark in line for mark in UNNAMED_OF_INTEREST):
        return False
    try:
        return float(json.loads(line).get("ts", 0)) >= since
    except (ValueError, AttributeError):
        return False


def _component_log(component: str, in_cluster: bool = IN_CLUSTER) -> list[str]:
    """A component's log lines: its file, or in-cluster every Pod's container log."""
    if not in_cluster:
        return (RUN_DIR / "bridge" / "log" / f"{component}.log").read_text(
            errors="replace").splitlines()
    kc = local_mod.load(RUN_DIR).kube.kubeconfig
    p = subprocess.run(["kubectl", f"--kubeconfig={kc}", "logs", "-n", incluster.NAMESPACE,
                        "-l", incluster.SELECTOR, "-c", component, "--tail=-1",
                        "--prefix=false"], text=True, capture_output=True, timeout=30)
    if p.returncode != 0:
        raise OSError(p.stderr.strip())
    return p.stdout.splitlines()


# slurmctld's lines that say who ended a job or why it could not start: a job of ours that
# ends on its own is otherwise a mystery once it has left the queue
CTLD_OF_INTEREST = ("kill_job", "KILL_JOB", "requeue", "Requeue", "launch fail", "credential",
                    "cancel", "preempt", "Preempt", "NodeDown", "not responding")


def _slurmctld_said(lc: local_mod.Local, since: float) -> list[str]:
    """slurmctld's log lines of interest since `since` (its lines start [ISO local time])."""
    try:
        text = (lc.slurm.run_dir / "log" / "ctld.log").read_text(errors="replace")
    except (OSError, AttributeError):
        return []
    out = []
    for line in text.splitlines():
        if not line.startswith("[") or not any(m in line for m in CTLD_OF_INTEREST):
            continue
        try:
            at = datetime.datetime.fromisoformat(line[1:line.index("]")]).timestamp()
        except ValueError:
            continue
        if at >= since - 1:
            out.append(line)
    return out


def _pods_said(admin: Kubectl, ns: str) -> str:
    """Each Pod's Node, phase, gates and slurmgate's annotations: what the binder last wrote."""
    try:
        pods = admin.items("pods", ns=ns)
    except Exception as e:  # the API server may be what a fault test took down
        return f"not readable: {e}"
    rows = []
    for p in pods:
        ours = {k.removeprefix(f"{contract.DOMAIN}/"): v
                for k, v in (p["metadata"].get("annotations") or {}).items()
                if k.startswith(f"{contract.DOMAIN}/")}
        rows.append(f"{p['metadata']['name']} node={p['spec'].get('nodeName', '')} "
                    f"phase={p['status'].get('phase')} "
                    f"gated={bool(p['spec'].get('schedulingGates'))} {ours}")
    return "\n".join(rows) or "no Pods"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed e2e test's report carries what slurmgate and Slurm said meanwhile: the webhook and
    binder log lines naming the test's namespace, and the queue and nodes at the failure.
    CI keeps only pytest's output, and a rare failure is otherwise not diagnosable."""
    outcome = yield
    rep = outcome.get_result()  # type: ignore[attr-defined]
    if rep.when != "call" or not rep.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    name = funcargs.get("ns") or getattr(getattr(item, "module", None), "NS", None)
    # test_incluster.py deploys slurmgate itself (`deployed`) on its own cluster (`cluster`)
    in_cluster = IN_CLUSTER or "deployed" in funcargs
    for component in ("binder", "webhook"):
        try:
            lines = _component_log(component, in_cluster)
        except (OSError, subprocess.SubprocessError):
            continue
        if name:
            lines = [line for line in lines if name in line or _during(line, call.start)]
        if lines:
            rep.sections.append((f"{component} log ({name or 'tail'})",
                                 "\n".join(lines[-LOG_LINES_ON_FAILURE:])))
    admin = funcargs.get("admin")
    if isinstance(admin, Kubectl) and isinstance(name, str):
        rep.sections.append((f"Pods of {name} at failure", _pods_said(admin, name)))
    lc = funcargs.get("local") or funcargs.get("cluster")
    if lc is not None:
        try:
            state = (slurm_cli(lc, "squeue", "-a", "-o", "%i %T %N %r %k")
                     + slurm_cli(lc, "sinfo", "-N", "-o", "%N %t %G %E"))
        except Exception as e:  # Slurm may be what a fault test took down
            state = f"Slurm not readable: {e}"
        rep.sections.append(("slurm at failure", state))
        said = _slurmctld_said(lc, call.start)
        if said:
            rep.sections.append(("slurmctld's kills, requeues and launch failures meanwhile",
                                 "\n".join(said[-LOG_LINES_ON_FAILURE:])))
        if in_cluster:
            try:
                rep.sections.append(("slurmgate's Pods at failure", incluster.describe(lc)))
            except Exception as e:  # the API server may be what a fault test took down
                rep.sections.append(("slurmgate's Pods at failure", f"not readable: {e}"))


@pytest.fixture(scope="session")
def local() -> Iterator[local_mod.Local]:
    if REUSE:
        yield local_mod.load(RUN_DIR)
        return
    # in-cluster: one real Node more, for slurmgate's own Pods (never a Slurm node's Node)
    real = [NodeSpec("real-1", labels={incluster.ROLE_LABEL: "slurmgate"})] if IN_CLUSTER \
        else []
    lc = local_mod.up(RUN_DIR, nodes=4, real_nodes=real)
    try:
        yield lc
    finally:
        bridge_mod.down(RUN_DIR)
        local_mod.down(RUN_DIR)


@pytest.fixture(scope="session")
def admin(local: local_mod.Local) -> Kubectl:
    return Kubectl(local.kube.kubeconfig)


@pytest.fixture(scope="session")
def bridge(local: local_mod.Local) -> Iterator[bridge_mod.Bridge]:
    if IN_CLUSTER:
        ic = incluster.up(local, settings=bridge_mod.local_settings())
        try:
            yield incluster.as_bridge(local, ic)
        finally:
            incluster.down(local)
        return
    bridge_mod.down(RUN_DIR)
    b = bridge_mod.up(local)
    try:
        yield b
    finally:
        bridge_mod.down(RUN_DIR)


@pytest.fixture(autouse=True)
def _follow_the_leading_binder(request: pytest.FixtureRequest) -> None:
    """In-cluster, the Lease may change hands between tests (a renewal missed under load is
    a normal handover): the Bridge's binder URL and the push hook follow it, as the push
    Service does for an operator. Host processes have one binder: nothing to follow."""
    if IN_CLUSTER and "bridge" in request.fixturenames:
        incluster.follow_leader(request.getfixturevalue("local"),
                                request.getfixturevalue("bridge"))


def slurm_cli(local: local_mod.Local, *args: str) -> str:
    """Slurm's own CLI of the cluster's release (argument list, never a shell), to look at
    Slurm independently of us."""
    argv, env = local.slurm.command(*args)
    return subprocess.run(argv, env=env, text=True, capture_output=True, check=True,
                          timeout=30).stdout


def scontrol_job(local: local_mod.Local, job_id: str) -> dict[str, str]:
    """`scontrol show job -o` as a dict (values with spaces, like Comment, come out cut)."""
    out = slurm_cli(local, "scontrol", "show", "job", "-o", job_id)
    return dict(tok.split("=", 1) for tok in out.split() if "=" in tok)


def squeue(local: local_mod.Local) -> list[dict[str, str]]:
    out = slurm_cli(local, "squeue", "-h", "-o", "%i|%T|%N|%r|%k|%P")
    rows = []
    for line in out.splitlines():
        i, st, nodes, reason, comment, part = line.split("|", 5)
        rows.append({"id": i, "state": st, "nodes": nodes, "reason": reason,
                     "comment": comment, "partition": part})
    return rows


# Once a test's namespace is deleted, its Pods are gone and the binder has cancelled their jobs
# within this (it notices a deleted Pod in well under a second; a restarted binder takes its
# start-up list first)
LEAK_DEADLINE = 45.0


@pytest.fixture
def ns(admin: Kubectl, local: local_mod.Local) -> Iterator[str]:
    """A fresh namespace per test. Afterwards its Pods are deleted, and slurmgate must cancel
    their jobs by itself: a job or Pod of the test still there after LEAK_DEADLINE fails the
    test (at teardown, naming what was left), and is then cleaned up so the next test starts
    from an empty Slurm."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    admin.run("create", "namespace", name)
    yield name
    admin.run("delete", "namespace", name, "--wait=false", check=False)
    admin.run("delete", "pods", "--all", "-n", name, "--grace-period=0", "--force",
              check=False)
    left = leftovers(admin, local, name)
    slurm_idle(local)
    if left:
        pytest.fail(f"the test left behind (slurmgate did not clean up within "
                    f"{LEAK_DEADLINE:g}s): " + "; ".join(left), pytrace=False)


def jobs_of_namespace(local: local_mod.Local, name: str) -> list[dict[str, str]]:
    """slurmgate's jobs (a Pod's or a gang's) for namespace `name` that Slurm still holds or
    queues (COMPLETING: our cancel is at work)."""
    return [r for r in squeue(local) if r["comment"].startswith(contract.COMMENT_PREFIX)
            and (f" pod={name}/" in r["comment"] or f" group={name}/" in r["comment"])
            and r["state"] != "COMPLETING"]


def leftovers(admin: Kubectl, local: local_mod.Local, name: str,
              deadline: float = LEAK_DEADLINE) -> list[str]:
    """What slurmgate failed to clean up after namespace `name`'s Pods were deleted."""
    try:
        wait_until(f"slurmgate cancels the jobs of namespace {name}",
                   lambda: not jobs_of_namespace(local, name), deadline)
        jobs: list[dict[str, str]] = []
    except WaitTimeout:
        jobs = jobs_of_namespace(local, name)
    try:
        wait_until(f"the Pods of namespace {name} are gone",
                   lambda: not admin.items("pods", ns=name), deadline)
        pods: list[dict[str, Any]] = []
    except WaitTimeout:
        pods = admin.items("pods", ns=name)
    return ([f"job {r['id']} {r['state']} ({r['comment']})" for r in jobs]
            + [f"Pod {p['metadata']['name']} (gates {p['spec'].get('schedulingGates')}, "
               f"finalizers {p['metadata'].get('finalizers')})" for p in pods])


def slurm_idle(local: local_mod.Local) -> None:
    """Slurm empty again before the next test: the binder cancels jobs of deleted Pods;
    anything left (e.g. a test that stopped the binder) is cancelled here."""
    try:
        wait_until("Slurm queue empty", lambda: not [
            r for r in squeue(local) if r["state"] not in ("COMPLETING",)], 20)
    except WaitTimeout:
        ids = [r["id"] for r in squeue(local)]
        if ids:
            slurm_cli(local, "scancel", "--signal=KILL", *ids)
    wait_until("Slurm nodes idle", lambda: all(
        s.split()[1] in ("idle", "drain", "drng")
        for s in slurm_cli(local, "sinfo", "-h", "-N", "-p", "k8s", "-o", "%N %t")
        .splitlines()), 60)


def pause_container(**fields: Any) -> dict[str, Any]:
    """The pause image as a container that really runs on a real Node (imported, never
    pulled), hardened as a restricted Pod must be; `fields` add to it (args, resources)."""
    return {"name": "pause", "image": oci.PAUSE_IMAGE, "imagePullPolicy": "Never", **fields,
            "securityContext": {
                "runAsNonRoot": True, "runAsUser": 65534, "readOnlyRootFilesystem": True,
                "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                "seccompProfile": {"type": "RuntimeDefault"}}}


def marked_pod(name: str, memory: str = "1Gi", annotations: dict[str, str] | None = None,
               generate: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"labels": {"slurmgate.io/scheduler": "slurm"},
                            "annotations": annotations or {}}
    if generate:
        meta["generateName"] = f"{name}-"
    else:
        meta["name"] = name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"terminationGracePeriodSeconds": 5,
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"requests": {"memory": memory,
                                                                "cpu": "1"}}}]}}


# restart() lives here rather than in tests.e2e.faultkit because `restore` needs its DIRTY set,
# and faultkit imports this module: importing faultkit back would be circular.
DIRTY: set[str] = set()  # processes running with a test's extra env, restarted by `restore`


def restart(bridge: bridge_mod.Bridge, name: str,
            extra_env: dict[str, str] | None = None) -> None:
    bridge_mod.stop_processes(bridge, (name,))
    bridge_mod.start_processes(bridge, (name,), extra_env=extra_env)
    if extra_env:
        DIRTY.add(name)
    else:
        DIRTY.discard(name)


@pytest.fixture
def restore(local: local_mod.Local, bridge: bridge_mod.Bridge) -> Iterator[None]:
    """Whatever a test killed comes back, and the processes run with the bridge's env."""
    yield
    s_dir = local.slurm.run_dir
    for name in ("slurmctld", "slurmrestd"):
        c = slurm_mod.load(s_dir)
        if not proc_mod.alive(c.pids[name]):
            local.slurm.pids[name] = slurm_faults.start_daemon(s_dir, name)
    kc = kube_mod.load(Path(local.kube.run_dir))
    if not proc_mod.alive(kc.pids["kube-apiserver"]):
        local.kube.pids["kube-apiserver"] = kube_mod.start_daemon(
            Path(local.kube.run_dir), "kube-apiserver")
    for name in ("webhook", "binder"):
        pid = bridge.pids.get(name)
        if name in DIRTY or pid is None or not proc_mod.alive(pid):
            restart(bridge, name)
