"""Real Nodes beside the kwok ones: each one its own containerd and its own kubelet, as host
processes, so Pods pinned to them really run (the kwok Nodes only pretend).

    nodes = realnode.start(run_dir / "realnodes", kc, [NodeSpec("real-1"), ...], port_offset)
    realnode.import_image(nodes[0], archive)    # an OCI archive into that node's containerd
    realnode.stop(run_dir / "realnodes")

One containerd per node, never a shared one: a kubelet removes every sandbox in its runtime that
it does not know. Each node has its own containerd root/state/socket, kubelet root dir, ports,
cgroup root (so two kubelets never fight over /kubepods), CNI bridge and /24, all named in
`realnodes.json`, which is written before anything starts so stop() finds whatever a crash left.
Daemons are tracked by PID and carry MARK in their environment (checked before a signal: PIDs
get reused); shims are found by their -address argument (this node's socket), container
processes by this node's cgroups. Needs root, and kube.start(..., node_ip=...).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

from cluster import kube, oci, proc
from cluster import realnode_conf as conf
from cluster import realnode_host as host
from slurmgate import contract

HERE = Path(__file__).resolve().parent
STATE = "realnodes.json"
MARK = "SLURMGATE_REALNODE"  # its value: the node's directory
APT_PACKAGES = ("containerd", "runc", "containernetworking-plugins")
# what a starting kubelet sets machine-wide (protectKernelDefaults off); stop() puts them back
KUBELET_SYSCTLS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")


@dataclass
class NodeSpec:
    """What the caller asks for. No labels and taints: a plain node (e.g. for the webhook and
    binder). A node standing for a Slurm node gets contract.NODE_LABEL and contract.TAINT."""
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict[str, str]] = field(default_factory=list)  # {"key","value","effect"}


@dataclass
class RealNode:
    name: str
    dir: str
    node_ip: str
    containerd_socket: str
    pod_cidr: str
    bridge: str
    cgroup_root: str
    kubelet_port: int
    labels: dict[str, str]
    taints: list[dict[str, str]]
    pids: dict[str, int] = field(default_factory=dict)


def default_node_ip() -> str:
    """The default-route interface's IPv4 address (a kubelet's node IP cannot be loopback)."""
    route = subprocess.run(["ip", "-4", "-o", "route", "show", "default"], check=True,
                           capture_output=True, text=True).stdout.split()
    dev = route[route.index("dev") + 1]
    addr = subprocess.run(["ip", "-4", "-o", "addr", "show", "dev", dev], check=True,
                          capture_output=True, text=True).stdout.split()
    return addr[addr.index("inet") + 1].split("/")[0]


def ensure_packages() -> None:
    """apt-get install containerd, runc and the CNI plugins if one is missing (quiet)."""
    if all(shutil.which(b) for b in ("containerd", "ctr", "runc")) and \
            Path(conf.CNI_BIN_DIR, "bridge").exists():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", *APT_PACKAGES], check=True, env=env,
                   capture_output=True)


def build_kubelet() -> Path:
    """The kubelet binary (build-binaries.sh kubelet: its own cache dir beside the control
    plane's)."""
    out = subprocess.run(["bash", str(HERE / "build-binaries.sh"), "kubelet"], check=True,
                         stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1]) / "kubelet"


def _save(run_dir: Path, node_ip: str, nodes: list[RealNode], sysctls: dict[str, str]) -> None:
    tmp = run_dir / f"{STATE}.tmp"
    tmp.write_text(json.dumps({"node_ip": node_ip, "sysctls": sysctls,
                               "nodes": [asdict(n) for n in nodes]}, indent=2))
    tmp.replace(run_dir / STATE)


def load(run_dir: Path) -> list[RealNode]:
    """The real Nodes started in run_dir ([] if none)."""
    try:
        state = json.loads((run_dir / STATE).read_text())
    except FileNotFoundError:
        return []
    return [RealNode(**n) for n in state["nodes"]]


def _layout(run_dir: Path, specs: list[NodeSpec], node_ip: str, offset: int,
            base_port: int) -> list[RealNode]:
    # a /24 per node in a /16 per port offset, so clusters beside each other do not overlap
    net = 200 + (offset // 1000) % 50
    return [RealNode(
        name=s.name, dir=str(run_dir / s.name), node_ip=node_ip,
        containerd_socket=str(run_dir / s.name / "containerd.sock"),
        pod_cidr=f"10.{net}.{i + 1}.0/24", bridge=f"sgr{offset}n{i + 1}",
        cgroup_root=f"/sgreal-{offset}-{s.name}", kubelet_port=base_port + 2 * i,
        labels={"type": "real", **s.labels, "kubernetes.io/hostname": s.name},
        taints=list(s.taints),
    ) for i, s in enumerate(specs)]


def _network(n: RealNode) -> str:
    return f"sg-{n.bridge}"


def _ours(pid: int, node_dir: str) -> bool:
    return proc.environ(pid).get(MARK) == node_dir


def _stop_node(n: RealNode) -> None:
    kubelet = [p for p in [n.pids.get("kubelet", 0)] if p > 1 and _ours(p, n.dir)]
    proc.signal_and_wait(kubelet, 10.0, group=True)
    # the Pods' processes: whatever is in this node's cgroups (after the kubelet, which
    # would start them again)
    proc.kill_now(host.cgroup_pids(n.cgroup_root))
    sockets = host.shim_sockets(n.dir, n.containerd_socket)
    proc.kill_now(host.shims(n.containerd_socket))
    containerd = [p for p in [n.pids.get("containerd", 0)] if p > 1 and _ours(p, n.dir)]
    proc.signal_and_wait(containerd, 10.0, group=True)
    proc.kill_now(host.shims(n.containerd_socket) + list(host.cgroup_pids(n.cgroup_root)))
    for sock in sockets:
        sock.unlink(missing_ok=True)
    host.remove_cni_cache(_network(n))
    host.unmount_under(Path(n.dir))
    if subprocess.run(["ip", "link", "show", n.bridge], capture_output=True).returncode == 0:
        subprocess.run(["ip", "link", "del", n.bridge], capture_output=True, check=False)
    host.remove_cgroups(n.cgroup_root)
    host.remove_log_links(n.dir)


def stop(run_dir: Path) -> None:
    """Stop every real Node in run_dir and remove what it left on the host (safe to repeat,
    and after a crash: mounts under run_dir go even without the state file)."""
    try:
        state = json.loads((run_dir / STATE).read_text())
    except FileNotFoundError:
        state = {"nodes": [], "sysctls": {}}
    for n in reversed([RealNode(**d) for d in state["nodes"]]):
        _stop_node(n)
    for key, value in state.get("sysctls", {}).items():
        try:
            Path("/proc/sys", key).write_text(value)
        except OSError:
            pass
    host.unmount_under(run_dir)
    if state["nodes"]:
        host.remove_if_dead(host.DEVICE_PLUGIN_SOCKET)
        host.rmdirs(host.DEVICE_PLUGIN_SOCKET.parent, host.DEVICE_PLUGIN_SOCKET.parent.parent,
                    host.CNI_CACHE, host.CNI_CACHE.parent, host.SHIM_SOCKETS,
                    host.SHIM_SOCKETS.parent, host.CONTAINER_LOG_LINKS)
    (run_dir / STATE).unlink(missing_ok=True)


def import_image(node: RealNode | str, archive: Path, timeout: float = 300.0) -> None:
    """Import an OCI (or docker) image archive into a real Node's containerd (`node`: the
    node or its containerd socket), in the CRI's namespace, unpacked."""
    sock = node.containerd_socket if isinstance(node, RealNode) else node
    p = subprocess.run(["ctr", "-n", "k8s.io", "-a", sock, "images", "import", str(archive)],
                       capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"ctr import {archive} into {sock}: {p.stderr.strip()}")


def _prepare(n: RealNode, kc: kube.KubeCluster, pinning: bool = False,
             gpu_devices: dict[str, list[str]] | None = None) -> None:
    d = Path(n.dir)
    for sub in ("containerd", "cni/conf", "cni/ipam", "kubelet", "pki", "pod-logs"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    launcher = None
    slurm_node = n.labels.get(contract.NODE_LABEL)
    if pinning and slurm_node:
        launcher = d / "slurmgate-runc"
        runc = shutil.which("runc") or "/usr/sbin/runc"
        launcher.write_text(conf.runc_launcher(sys.executable, runc, [slurm_node],
                                               (gpu_devices or {}).get(slurm_node)))
        launcher.chmod(0o755)
    (d / "containerd" / "config.toml").write_text(conf.containerd_toml(
        d / "containerd", Path(n.containerd_socket), oci.PAUSE_IMAGE, d / "cni" / "conf",
        launcher))
    (d / "cni" / "conf" / "10-slurmgate.conflist").write_text(
        conf.cni_conflist(_network(n), n.bridge, n.pod_cidr, d / "cni" / "ipam"))
    kube_pki = Path(kc.ca_file).parent
    conf.kubelet_certs(d / "pki", kube_pki, n.name, n.node_ip)
    (d / "kubelet.kubeconfig").write_text(conf.kubeconfig(
        kc.server, kc.ca_file, d / "pki" / "client.crt", d / "pki" / "client.key"))
    (d / "kubelet.yaml").write_text(conf.kubelet_config(
        address=n.node_ip, port=n.kubelet_port, healthz_port=n.kubelet_port + 1,
        cgroup_root=n.cgroup_root, runtime_socket=Path(n.containerd_socket),
        pki_dir=d / "pki", ca_file=kc.ca_file, pod_logs_dir=d / "pod-logs"))
    host.make_cgroups(n.cgroup_root)


def _kubelet_argv(kubelet: Path, n: RealNode) -> list[str]:
    d = Path(n.dir)
    argv = [str(kubelet), f"--config={d / 'kubelet.yaml'}",
            f"--kubeconfig={d / 'kubelet.kubeconfig'}", f"--root-dir={d / 'kubelet'}",
            f"--cert-dir={d / 'pki'}", f"--hostname-override={n.name}",
            f"--node-ip={n.node_ip}", "--v=1",
            "--node-labels=" + ",".join(f"{k}={v}" for k, v in n.labels.items())]
    if n.taints:
        argv.append("--register-with-taints=" + ",".join(
            f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in n.taints))
    return argv


def _containerd_up(sock: str) -> bool:
    return subprocess.run(["ctr", "-a", sock, "version"], capture_output=True, timeout=5,
                          check=False).returncode == 0


def node_ready(kc: kube.KubeCluster, name: str) -> bool:
    p = subprocess.run(["kubectl", f"--kubeconfig={kc.kubeconfig}", "get", "node", name, "-o",
                        "jsonpath={.status.conditions[?(@.type=='Ready')].status}"],
                       capture_output=True, text=True, timeout=20, check=False)
    return p.stdout.strip() == "True"


def start(run_dir: Path, kc: kube.KubeCluster, specs: list[NodeSpec], port_offset: int = 0,
          node_ip: str | None = None, timeout: float = 90.0,
          pinning: bool = False,
          gpu_devices: dict[str, list[str]] | None = None) -> list[RealNode]:
    """Start one containerd + kubelet per spec, registered with the spec's labels and taints,
    the pause image imported; return once every Node is Ready. kc must have been started
    with node_ip (kube-apiserver then reaches the kubelets and the Pods reach it).
    Ports: 16500 + port_offset + 2*i (kubelet), +1 (its healthz, loopback).
    `pinning`: a Node that stands for a Slurm node runs slurmgate-runc in runc's place (its
    marked Pods' containers on their jobs' cores and GPUs; needs an enforcing Slurm);
    `gpu_devices`: Slurm node -> its GPU device files in gres index order."""
    if not kc.node_ip:
        raise ValueError("real Nodes need kube.start(..., node_ip=...)")
    node_ip = node_ip or kc.node_ip
    ensure_packages()
    kubelet = build_kubelet()
    pause = oci.pause_archive()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "log").mkdir(exist_ok=True)
    stop(run_dir)  # what an earlier crash left
    nodes = _layout(run_dir, specs, node_ip, port_offset, 16500 + port_offset)
    proc.check_ports_free([p for n in nodes for p in (n.kubelet_port, n.kubelet_port + 1)])
    sysctls = {k: Path("/proc/sys", k).read_text().strip() for k in KUBELET_SYSCTLS}
    # a Node left by an earlier kubelet of the name still reads Ready for up to 40 s
    subprocess.run(["kubectl", f"--kubeconfig={kc.kubeconfig}", "delete", "node",
                    "--ignore-not-found", "--wait=false", *[n.name for n in nodes]],
                   capture_output=True, timeout=30, check=True)
    _save(run_dir, node_ip, nodes, sysctls)
    log = run_dir / "log"
    try:
        for n in nodes:
            _prepare(n, kc, pinning, gpu_devices or {})
            env = {**os.environ, MARK: n.dir}
            n.pids["containerd"] = proc.spawn(log, f"{n.name}-containerd", [
                "containerd", f"--config={Path(n.dir) / 'containerd' / 'config.toml'}"],
                env=env, suffix=".log").pid
            _save(run_dir, node_ip, nodes, sysctls)
        for n in nodes:
            pid = n.pids["containerd"]
            kube.wait_for(f"{n.name} containerd", partial(_containerd_up, n.containerd_socket),
                          30, pid, log / f"{n.name}-containerd.log")
            import_image(n, pause)
            n.pids["kubelet"] = proc.spawn(log, f"{n.name}-kubelet", _kubelet_argv(kubelet, n),
                                           env={**os.environ, MARK: n.dir}, suffix=".log").pid
            _save(run_dir, node_ip, nodes, sysctls)
        for n in nodes:
            kube.wait_for(f"real Node {n.name} Ready", partial(node_ready, kc, n.name),
                          timeout, n.pids["kubelet"], log / f"{n.name}-kubelet.log",
                          interval=0.5)
    except BaseException:
        stop(run_dir)
        raise
    return nodes
