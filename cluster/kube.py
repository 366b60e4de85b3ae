"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kwok (fake kubelets), built from the Go module proxy (build-binaries.sh).

Dev tooling, so plain synchronous code. Every daemon is tracked by its own PID in
`kube.json`; stop() never kills by name. Spawning, waiting and signalling are cluster/proc.py's;
what is here keeps this module's own contract (logs in <name>.log, TimeoutError/RuntimeError).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from cluster import proc
from slurmgate.certs import pki

HERE = Path(__file__).resolve().parent


@dataclass
class KubeCluster:
    run_dir: str
    bin_dir: str
    server: str
    kubeconfig: str
    ca_file: str
    pids: dict[str, int] = field(default_factory=dict)
    # set when started for real Nodes (cluster/realnode.py): the host address Pods on their
    # bridges reach, and the apiserver URL at it
    node_ip: str | None = None
    node_server: str | None = None


def k8s_version() -> str:
    """The Kubernetes release of the local control plane: K8S_VERSION from the environment, else
    the one versions.env pins (as build-binaries.sh picks it)."""
    if v := os.environ.get("K8S_VERSION"):
        return v
    for line in (HERE / "versions.env").read_text().splitlines():
        if line.startswith("K8S_VERSION="):
            return line.split("=", 1)[1].strip()
    raise RuntimeError("cluster/versions.env pins no K8S_VERSION")


def build_binaries() -> Path:
    out = subprocess.run(["bash", str(HERE / "build-binaries.sh")], check=True,
                         stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def _pki(d: Path, node_ip: str | None = None) -> None:
    d.mkdir(parents=True, exist_ok=True)
    if (d / "admin.crt").exists():
        return
    ca_key, ca = pki.make_ca("slurmgate-local-ca", days=3650)
    pki.write_key(d / "ca.key", ca_key)
    pki.write_cert(d / "ca.crt", ca)
    key, cert = pki.make_cert(
        ca_key, ca, "kube-apiserver",
        dns_names=["localhost", "kubernetes", "kubernetes.default",
                   "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"],
        ip_addresses=["127.0.0.1", "10.96.0.1", *([node_ip] if node_ip else [])], days=3650)
    pki.write_key(d / "apiserver.key", key)
    pki.write_cert(d / "apiserver.crt", cert)
    if node_ip:
        # what kube-apiserver shows real kubelets (logs, exec, port-forward); system:masters
        # passes the kubelets' webhook authorization without an RBAC binding of ours
        key, cert = pki.make_cert(ca_key, ca, "kube-apiserver-kubelet-client",
                                  organizations=["system:masters"], client=True, server=False,
                                  days=3650)
        pki.write_key(d / "kubelet-client.key", key)
        pki.write_cert(d / "kubelet-client.crt", cert)
    key, cert = pki.make_cert(ca_key, ca, "admin", organizations=["system:masters"],
                              client=True, server=False, days=3650)
    pki.write_key(d / "admin.key", key)
    pki.write_cert(d / "admin.crt", cert)
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pki.write_key(d / "sa.key", sa)
    (d / "sa.pub").write_bytes(sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))


def _kubeconfig(path: Path, server: str, pki_dir: Path) -> None:
    path.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority: {pki_dir / 'ca.crt'}
users:
- name: admin
  user:
    client-certificate: {pki_dir / 'admin.crt'}
    client-key: {pki_dir / 'admin.key'}
contexts:
- name: local
  context: {{cluster: local, user: admin}}
current-context: local
""")
    path.chmod(0o600)


# re-exported: the e2e tests check their daemons with it
_alive = proc.alive


def _spawn(name: str, argv: list[str], log_dir: Path) -> int:
    return proc.spawn(log_dir, name, argv, suffix=".log").pid


def wait_for(what: str, check: Callable[[], object], timeout: float, pid: int | None = None,
             log: Path | None = None, interval: float = 0.2) -> None:
    """Poll `check` until true (raising counts as not yet); fail early with the log's tail
    if the daemon died (RuntimeError), TimeoutError when the time is up."""
    def quiet() -> bool:
        try:
            return bool(check())
        except Exception:
            return False

    try:
        proc.wait_until(what, quiet, timeout, log,
                        pid_alive=None if pid is None else lambda: proc.alive(pid),
                        interval=interval, recheck_when_dead=False)
    except proc.NotReady as e:
        raise TimeoutError(str(e)) from None


def _https_ok(url: str, pki_dir: Path) -> bool:
    ctx = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
    ctx.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
    return proc.http_status(url, context=ctx) == 200


def _http_ok(url: str) -> bool:
    return proc.http_status(url) == 200


def _real_node_flags(node_ip: str | None, pki_dir: Path) -> list[str]:
    """kube-apiserver flags for real kubelets (none without them: loopback only, as ever)."""
    if node_ip is None:
        return ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"]
    return [
        # Pods on the real Nodes' bridges reach the apiserver at the host's address
        "--bind-address=0.0.0.0", f"--advertise-address={node_ip}",
        # kubelets registered without DNS names: logs/exec go to the InternalIP
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        # no kube-proxy: webhook/aggregated Services are called at their endpoint IPs
        "--enable-aggregator-routing=true",
        f"--kubelet-client-certificate={pki_dir / 'kubelet-client.crt'}",
        f"--kubelet-client-key={pki_dir / 'kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki_dir / 'ca.crt'}",
    ]


def start(run_dir: Path, base_port: int = 16400, node_ip: str | None = None) -> KubeCluster:
    """node_ip: also serve real kubelets and the Pods on their bridges at this host address
    (cluster/realnode.py); None keeps everything on loopback."""
    bin_dir = build_binaries()
    run_dir.mkdir(parents=True, exist_ok=True)
    log_dir = run_dir / "log"
    log_dir.mkdir(exist_ok=True)
    pki_dir = run_dir / "pki"
    _pki(pki_dir, node_ip)
    etcd_port, peer_port, api_port = base_port + 1, base_port + 2, base_port + 43
    sched_port, kcm_port, kwok_port = base_port + 59, base_port + 57, base_port + 47
    server = f"https://127.0.0.1:{api_port}"
    kubeconfig = run_dir / "admin.kubeconfig"
    _kubeconfig(kubeconfig, server, pki_dir)
    kc = KubeCluster(str(run_dir), str(bin_dir), server, str(kubeconfig),
                     str(pki_dir / "ca.crt"), node_ip=node_ip,
                     node_server=f"https://{node_ip}:{api_port}" if node_ip else None)
    b = bin_dir

    kc.pids["etcd"] = _spawn("etcd", [
        str(b / "etcd"), "--name=local", f"--data-dir={run_dir / 'etcd'}",
        f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
        f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
        f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
        f"--initial-cluster=local=http://127.0.0.1:{peer_port}",
        "--listen-metrics-urls=", "--unsafe-no-fsync", "--log-level=warn",
    ], log_dir)
    _save(kc)
    wait_for("etcd", lambda: _http_ok(f"http://127.0.0.1:{etcd_port}/health"), 60,
             kc.pids["etcd"], log_dir / "etcd.log")

    kc.pids["kube-apiserver"] = _spawn("kube-apiserver", [
        str(b / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        *_real_node_flags(node_ip, pki_dir),
        f"--secure-port={api_port}",
        f"--tls-cert-file={pki_dir / 'apiserver.crt'}",
        f"--tls-private-key-file={pki_dir / 'apiserver.key'}",
        f"--client-ca-file={pki_dir / 'ca.crt'}",
        f"--service-account-key-file={pki_dir / 'sa.pub'}",
        f"--service-account-signing-key-file={pki_dir / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc",
        "--service-cluster-ip-range=10.96.0.0/16",
        "--authorization-mode=Node,RBAC", "--allow-privileged=true",
        "--enable-priority-and-fairness=false", "--profiling=false", "--v=1",
    ], log_dir)
    _save(kc)
    wait_for("kube-apiserver", lambda: _https_ok(f"{server}/readyz", pki_dir), 120,
             kc.pids["kube-apiserver"], log_dir / "kube-apiserver.log")

    kc.pids["kube-controller-manager"] = _spawn("kube-controller-manager", [
        str(b / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        f"--service-account-private-key-file={pki_dir / 'sa.key'}",
        f"--root-ca-file={pki_dir / 'ca.crt'}", "--leader-elect=false",
        "--bind-address=127.0.0.1", f"--secure-port={kcm_port}",
        "--controllers=*,-nodeipam,-cloud-node-lifecycle,-route,-service",
        "--v=1",
    ], log_dir)
    kc.pids["kube-scheduler"] = _spawn("kube-scheduler", [
        str(b / "kube-scheduler"), f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--leader-elect=false", "--bind-address=127.0.0.1", f"--secure-port={sched_port}",
        "--v=1",
    ], log_dir)
    kc.pids["kwok"] = _spawn("kwok", [
        str(b / "kwok"), f"--kubeconfig={kubeconfig}", f"--config={b / 'kwok-stages.yaml'}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        "--manage-nodes-with-label-selector=",
        # heartbeat through Leases: without them kube-controller-manager marks every Node
        # Unknown (and taints it unreachable) after 40 s, until kwok's next status write
        "--node-lease-duration-seconds=40",
        "--cidr=10.0.0.1/16", "--node-ip=10.0.0.1", f"--server-address=127.0.0.1:{kwok_port}",
    ], log_dir)
    _save(kc)
    wait_for("kube-scheduler", lambda: _insecure_ok(f"https://127.0.0.1:{sched_port}/healthz"),
             60, kc.pids["kube-scheduler"], log_dir / "kube-scheduler.log")
    wait_for("kube-controller-manager",
             lambda: _insecure_ok(f"https://127.0.0.1:{kcm_port}/healthz"), 60,
             kc.pids["kube-controller-manager"], log_dir / "kube-controller-manager.log")
    wait_for("kwok", lambda: _http_ok(f"http://127.0.0.1:{kwok_port}/healthz"), 60,
             kc.pids["kwok"], log_dir / "kwok.log")
    return kc


def _insecure_ok(url: str) -> bool:
    # component /healthz endpoints serve a self-signed cert and allow anonymous /healthz
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return proc.http_status(url, context=ctx) == 200


def _save(kc: KubeCluster) -> None:
    (Path(kc.run_dir) / "kube.json").write_text(json.dumps(asdict(kc), indent=2))


def load(run_dir: Path) -> KubeCluster:
    return KubeCluster(**json.loads((run_dir / "kube.json").read_text()))


def stop_pids(pids: dict[str, int], timeout: float = 20.0) -> None:
    """SIGTERM each PID we started (its own process group), then SIGKILL what is left."""
    # kill_wait=0: SIGKILL and return at once, as this always has (slurm's stop waits 5 s)
    proc.signal_and_wait(list(pids.values()), timeout, group=True, kill_wait=0.0)


# stopped last, in this order, each once everything before it is gone: the apiserver's
# graceful shutdown writes to etcd (deletes its lease, takes itself out of the `kubernetes`
# Endpoints), so SIGTERMed beside etcd it hangs until the SIGKILL (and etcd waits ~7 s on
# its gRPC streams); kwok, the scheduler and kube-controller-manager only talk to the apiserver
_STOP_LAST = ("kube-apiserver", "etcd")


def stop_in_order(pids: dict[str, int], timeout: float = 20.0) -> None:
    """stop_pids in dependency order: the apiserver's clients (every name not in _STOP_LAST)
    together, then kube-apiserver, then etcd; each tier is waited for -- up to `timeout`,
    then SIGKILLed and waited for that too -- before the next gets its SIGTERM."""
    tiers = [[n for n in pids if n not in _STOP_LAST], *([n] for n in _STOP_LAST if n in pids)]
    tiers = [t for t in tiers if t]
    for i, tier in enumerate(tiers):
        # kill_wait: a tier SIGKILLed must be gone before the next is signalled; the last
        # one returns at once, as stop_pids always has
        proc.signal_and_wait([pids[n] for n in tier], timeout, group=True,
                             kill_wait=5.0 if i < len(tiers) - 1 else 0.0)


def stop(run_dir: Path) -> None:
    try:
        kc = load(run_dir)
    except FileNotFoundError:
        return
    stop_in_order(kc.pids)
    (run_dir / "kube.json").unlink(missing_ok=True)


# ----------------------------------------------------------------------------- fault injection


def _argv_file(run_dir: Path, name: str) -> Path:
    return Path(run_dir) / f"argv-{name}.json"


def kill_daemon(run_dir: Path, name: str, timeout: float = 10.0) -> None:
    """SIGKILL one control-plane daemon by its recorded PID (its command line is kept first,
    so start_daemon() can start it again with the same flags and data dir)."""
    kc = load(Path(run_dir))
    pid = kc.pids[name]
    if proc.alive(pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        _argv_file(run_dir, name).write_text(json.dumps([a.decode() for a in argv]))
    proc.kill_and_wait(pid, name, timeout)


def start_daemon(run_dir: Path, name: str, timeout: float = 120.0) -> int:
    """Start a daemon killed by kill_daemon() again, same argv; wait for kube-apiserver's
    /readyz when it is the apiserver. Records the new PID in kube.json and returns it."""
    run_dir = Path(run_dir)
    kc = load(run_dir)
    argv = json.loads(_argv_file(run_dir, name).read_text())
    pid = _spawn(name, argv, run_dir / "log")
    kc.pids[name] = pid
    _save(kc)
    if name == "kube-apiserver":
        pki_dir = Path(kc.ca_file).parent
        wait_for("kube-apiserver restarted", lambda: _https_ok(f"{kc.server}/readyz", pki_dir),
                 timeout, pid, run_dir / "log" / f"{name}.log")
    return pid


def restart_daemon(run_dir: Path, name: str, down_for: float = 0.0) -> int:
    """kill_daemon, stay down `down_for` seconds, start_daemon. Returns the new PID."""
    kill_daemon(run_dir, name)
    if down_for > 0:
        time.sleep(down_for)
    return start_daemon(run_dir, name)
