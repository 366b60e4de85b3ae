"""Deploy slurmgate onto the local cluster the way a user would, with the processes on the host.

    python -m cluster.bridge up     # certs, kubectl apply -k of overlays/local (+ its run-time
                                    # caBundle and URL, overlays/local-run), processes
    python -m cluster.bridge down

The webhook and binder authenticate as the slurmgate ServiceAccount (a token from the
TokenRequest API), so the local runs exercise the least-privilege RBAC for real.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import ssl
import subprocess
import sys
import urllib.request
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import yaml

from cluster import kube, slurm_conf
from cluster.local import DEFAULT_RUN_DIR, PORT_OFFSET, Local, kubectl, load

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "slurmgate-system"
LOCAL_OVERLAY = "local"  # kustomize/overlays/local: git's, renders without the caBundle
WEBHOOK_PORT = 9443 + PORT_OFFSET
BINDER_PORT = 9480 + PORT_OFFSET
# Binder replicas by process name: the first one's port is the one the tests read metrics from
BINDERS = ("binder", "binder-2")


@dataclass
class Bridge:
    run_dir: str
    kubeconfig: str  # the ServiceAccount's
    webhook_url: str
    binder_url: str
    pids: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def _python() -> str:
    return sys.executable


def make_certs(run_dir: Path) -> Path:
    """Certs into run_dir/certs, and kustomize/ copied under run_dir (so clusters of one
    checkout never share what is generated) with overlays/local-run in it: overlays/local plus
    this cluster's caBundle and webhook URL (its port offset), what `up` applies."""
    certs = run_dir / "certs"
    shutil.rmtree(run_dir / "kustomize", ignore_errors=True)
    shutil.copytree(REPO / "kustomize", run_dir / "kustomize",
                    ignore=shutil.ignore_patterns("generated"))
    subprocess.run([_python(), "-m", "slurmgate.certs", "webhook", "--out", str(certs),
                    "--namespace", NAMESPACE, "--service", "slurmgate-webhook",
                    "--ip", "127.0.0.1", "--ca-bundle-out", str(certs / "ca-bundle.b64")],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    out = overlay(run_dir)
    out.mkdir(parents=True)
    subprocess.run([_python(), "-m", "slurmgate.certs", "webhook-patch",
                    "--ca-bundle-file", str(certs / "ca-bundle.b64"),
                    "--url", f"https://127.0.0.1:{WEBHOOK_PORT}/mutate",
                    "--out", str(out / "webhook-patch.yaml")],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    (out / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"../{LOCAL_OVERLAY}"], "patches": [{"path": "webhook-patch.yaml"}],
    }, sort_keys=False))
    return certs


def overlay(run_dir: Path) -> Path:
    """The overlay `up` applies (made by make_certs): overlays/local-run of run_dir's copy."""
    return run_dir / "kustomize" / "overlays" / f"{LOCAL_OVERLAY}-run"


def sa_kubeconfig(local: Local, path: Path) -> None:
    token = kubectl(local.kube, "create", "token", "slurmgate", "-n", NAMESPACE,
                    "--duration=48h").stdout.strip()
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: {local.kube.server}, certificate-authority: {local.kube.ca_file}}}
users:
- name: slurmgate
  user: {{token: {token}}}
contexts:
- name: local
  context: {{cluster: local, user: slurmgate}}
current-context: local
""")
    path.chmod(0o600)


def binder_port(name: str) -> int:
    return BINDER_PORT + 10 * BINDERS.index(name)


def binder_url(name: str) -> str:
    return f"http://127.0.0.1:{binder_port(name)}"


def _ready(url: str, cafile: str | None, standby_counts: bool = False) -> bool:
    ctx = ssl.create_default_context(cafile=cafile) if cafile else None
    with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
        return r.status == 200 and (standby_counts or b"standby" not in r.read())


def _answers(url: str) -> bool:
    try:
        return _ready(url, None)
    except OSError:
        return False


def leading_binder(b: Bridge) -> str | None:
    """The replica that leads, by its own /readyz (None while none does)."""
    return next((n for n in BINDERS if n in b.pids and _answers(f"{binder_url(n)}/readyz")),
                None)


def components_ready(b: Bridge) -> bool:
    """The webhook serves and a binder replica leads, by their own /readyz."""
    ca = str(Path(b.run_dir) / "certs" / "ca.crt")
    return _ready(f"{b.webhook_url}/readyz", ca) and leading_binder(b) is not None


def start_processes(b: Bridge, which: tuple[str, ...] = ("webhook", "binder"),
                    extra_env: dict[str, str] | None = None) -> None:
    """Start the processes; `extra_env` (e.g. a crash point) applies to this start only."""
    run_dir = Path(b.run_dir)
    log_dir = run_dir / "log"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if k != "SLURM_CONF"}, **b.env,
           **(extra_env or {})}
    replicas = [n for n in BINDERS if n in b.pids or n in which]
    for name in which:
        module = "slurmgate.webhook" if name == "webhook" else "slurmgate.binder"
        args = [_python(), "-m", module]
        if name == "webhook":
            args += [f"--listen=127.0.0.1:{WEBHOOK_PORT}",
                     f"--tls-cert-file={run_dir / 'certs' / 'tls.crt'}",
                     f"--tls-key-file={run_dir / 'certs' / 'tls.key'}"]
        else:
            args += [f"--health-listen=127.0.0.1:{binder_port(name)}"]
        log = open(log_dir / f"{name}.log", "ab")  # handed to the child
        proc = subprocess.Popen(args, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        b.pids[name] = proc.pid
    _save(b)
    ca = str(run_dir / "certs" / "ca.crt")
    if "webhook" in which:
        kube.wait_for("webhook /readyz", lambda: _ready(f"{b.webhook_url}/readyz", ca), 60,
                      b.pids["webhook"], log_dir / "webhook.log")
    # alone a binder must lead; beside another replica, standing by is as good as leading
    standby_ok = len(replicas) > 1
    for name in (n for n in BINDERS if n in which):
        url = f"{binder_url(name)}/readyz"
        kube.wait_for(f"{name} /readyz ({'serving' if standby_ok else 'leader'})",
                      partial(_ready, url, None, standby_ok), 60, b.pids[name],
                      log_dir / f"{name}.log")


def stop_processes(b: Bridge, which: tuple[str, ...] = ("webhook", *BINDERS)) -> None:
    kube.stop_pids({k: v for k, v in b.pids.items() if k in which}, timeout=10)
    for k in which:
        b.pids.pop(k, None)
    _save(b)


def local_settings() -> dict[str, str]:
    """What the local cluster tunes, whether slurmgate runs as host processes or as Pods (the
    in-cluster mode puts these in its ConfigMap)."""
    return {
        "DEFAULT_PARTITION": "k8s",
        "LEASE_DURATION_SECONDS": os.environ.get("SLURMGATE_LEASE_SECONDS", "15"),
        # admission -> Pod persisted takes milliseconds here; keep orphan cleanup quick
        "BINDER_ORPHAN_GRACE": "10",
        "BINDER_EVICT_GRACE": "8",  # tests wait for the delete after a refused eviction
        "BINDER_GPU_GRACE": "8",  # test_gpus waits for a job given back from a short Node
        "SLURM_KILL_WAIT": str(slurm_conf.KILL_WAIT),  # as slurm.conf says
        # orphans (a webhook killed after its submit) are found by the whole list: tests wait
        # for their cancel, so read it often here; the busy-site bench keeps the default
        "BINDER_FULL_LIST_INTERVAL": os.environ.get("SLURMGATE_FULL_LIST_INTERVAL", "10"),
    }


def up(local: Local | None = None, fail_open: bool = False, binders: int = 1) -> Bridge:
    """`binders`: how many binder replicas (one leads, the others stand by)."""
    local = local or load()
    run_dir = local.run_dir / "bridge"
    run_dir.mkdir(parents=True, exist_ok=True)
    make_certs(run_dir)
    kubectl(local.kube, "apply", "-k", str(overlay(run_dir)))
    kube.wait_for("slurmgate ServiceAccount", lambda: kubectl(
        local.kube, "get", "sa", "slurmgate", "-n", NAMESPACE, check=False).returncode == 0, 30)
    sa_kc = run_dir / "slurmgate.kubeconfig"
    sa_kubeconfig(local, sa_kc)
    b = Bridge(str(run_dir), str(sa_kc), f"https://127.0.0.1:{WEBHOOK_PORT}",
               binder_url(BINDERS[0]))
    b.env = {
        "KUBECONFIG": str(sa_kc),
        "SLURMREST_URL": local.slurm.rest_url,
        "SLURM_JWT_FILE": str(local.slurm.token_file),
        "SLURM_USER": "root",
        "FAIL_OPEN": "true" if fail_open else "false",
        # the overlay's policy: teams a and b, every other namespace as root (as before)
        "TENANCY_CONFIGMAP": f"{NAMESPACE}/slurmgate-tenancy",
        "LEASE_NAMESPACE": NAMESPACE,
        "PYTHONUNBUFFERED": "1",
        **local_settings(),
    }
    replicas = BINDERS[:binders]
    b.env["SLURM_PUSH_TOKEN_FILE"] = str(push_hook(local, run_dir, replicas))
    if not local.slurm.root:
        # scontrol (node drain/resume on Slurm 22.05 only) reads the cluster's slurm.conf;
        # on newer Slurm everything goes through REST and the binder gets no slurm.conf
        b.env["SLURM_CONF"] = str(local.slurm.conf)
    start_processes(b, ("webhook", *replicas))
    return b


def push_hook(local: Local, run_dir: Path, replicas: tuple[str, ...] = BINDERS[:1]) -> Path:
    """Point the cluster's slurmctld hook at these binder replicas, with a fresh token; returns
    the binders' copy of the token."""
    token = secrets.token_urlsafe(32)
    mine = run_dir / "push-token"
    proc_write(mine, token)
    point_hook(local, [f"127.0.0.1:{binder_port(n)}" for n in replicas], token)
    return mine


def hook_dir(local: Local) -> Path:
    """Where the cluster's slurmctld hook reads its config (`endpoint`, `token`)."""
    return Path(local.slurm.run_dir) / "hook" / "slurmgate"


def point_hook(local: Local, endpoints: list[str], token: str | None = None) -> None:
    """The cluster's slurmctld hook config: the `host:port` lines it pushes to, and (when
    given) the token it presents."""
    conf = hook_dir(local)
    conf.mkdir(parents=True, exist_ok=True)
    if token is not None:
        proc_write(conf / "token", token)
    (conf / "endpoint").write_text("".join(f"{e}\n" for e in endpoints))


def proc_write(path: Path, text: str) -> None:
    path.write_text(text + "\n")
    path.chmod(0o600)


def _save(b: Bridge) -> None:
    (Path(b.run_dir) / "bridge.json").write_text(json.dumps(asdict(b), indent=2))


def load_bridge(run_dir: Path = DEFAULT_RUN_DIR) -> Bridge:
    return Bridge(**json.loads((run_dir / "bridge" / "bridge.json").read_text()))


def down(run_dir: Path = DEFAULT_RUN_DIR) -> None:
    try:
        b = load_bridge(run_dir)
    except FileNotFoundError:
        return
    stop_processes(b)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m cluster.bridge")
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_RUN_DIR)
    a = ap.parse_args()
    if a.action == "up":
        b = up(load(a.dir))
        print(f"webhook: {b.webhook_url}  binder: {b.binder_url}  logs: {b.run_dir}/log")
    else:
        down(a.dir)


if __name__ == "__main__":
    main()
