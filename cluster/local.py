"""The whole local cluster: real Slurm + real Kubernetes control plane, one Node per Slurm node.

    python -m cluster.local up [--nodes N] [--real-nodes N]   # prints the kubeconfig and
                                                              # slurmrestd URL
    python -m cluster.local down
    python -m cluster.local env              # shell exports for KUBECONFIG, SLURM_CONF, ...
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster import kube, oci, proc, realnode, slurm, slurm_cluster, slurm_files
from slurmgate import contract

DEFAULT_RUN_DIR = Path(os.environ.get("SLURMGATE_RUN_DIR", "/tmp/slurmgate"))
# Shifts every port, so a second cluster (e.g. benchmarks) can run beside the first.
PORT_OFFSET = int(os.environ.get("SLURMGATE_PORT_OFFSET", "0"))
SLURMD_MEMORY = "1Gi"  # what each Node keeps for its slurmd container
SLURM_NS = "slurm-system"
GPU_RESOURCE = "nvidia.com/gpu"


def k8s_node_name(slurm_node: str) -> str:
    # Deliberately not the Slurm name: the binder must map through the label.
    return f"kwok-{slurm_node}"


@dataclass
class Local:
    run_dir: Path
    kube: kube.KubeCluster
    slurm: slurm.SlurmCluster
    # real Nodes (containerd + kubelet; realnode.py): names, node IP, containerd sockets,
    # Pod CIDRs; the apiserver URL their Pods use is kube.node_server
    real: list[realnode.RealNode] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = {
            "KUBECONFIG": self.kube.kubeconfig,
            "SLURM_CONF": str(self.slurm.conf),
            "SLURMREST_URL": self.slurm.rest_url,
            "SLURM_TOKEN_FILE": str(self.slurm.token_file),
            # the name slurmgate's processes and `kubectl slurm` read it by
            "SLURM_JWT_FILE": str(self.slurm.token_file),
            "SLURMGATE_RUN_DIR": str(self.run_dir),
            "SLURM_VERSION": self.slurm.version,
        }
        if self.real:
            env["SLURMGATE_REAL_NODES"] = ",".join(n.name for n in self.real)
            env["SLURMGATE_NODE_SERVER"] = self.kube.node_server or ""
        return env

    def shell_env(self) -> str:
        """env.sh: the variables, and this cluster's own Slurm commands first on PATH."""
        lines = [f"export {k}={v}\n" for k, v in self.env().items()]
        lines.append(f"export PATH={self.slurm.run_dir / 'bin'}:$PATH\n")
        return "".join(lines)


class KubectlError(RuntimeError):
    """kubectl exited non-zero (the API server refused, or could not be reached). Its own type
    so that the e2e tests' polls retry it and nothing else (tests/e2e/waiting.py)."""


def kubectl(kc: kube.KubeCluster, *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["kubectl", f"--kubeconfig={kc.kubeconfig}", *args], input=stdin,
                       text=True, capture_output=True)
    if check and p.returncode != 0:
        raise KubectlError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
    return p


def real_slurm_nodes(real: list[realnode.RealNode]) -> dict[str, str]:
    """Slurm node -> the real Node that stands for it (the one labelled with it)."""
    return {n.labels[contract.NODE_LABEL]: n.name for n in real if contract.NODE_LABEL in n.labels}


def _slurmd_pod(slurm_node: str, k8s_node: str, real: bool) -> dict:
    # slurmd itself runs on the host; its Pod holds the Node's share for it. On a real Node the
    # Pod really runs, so it runs our pause image (imported, never pulled).
    k, v = contract.SLURMD_POD_LABEL.split("=")
    container = {"name": "slurmd", "image": oci.PAUSE_IMAGE if real else "slurmd:local",
                 "resources": {"requests": {"cpu": "500m", "memory": SLURMD_MEMORY}}}
    if real:
        container["imagePullPolicy"] = "Never"
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"slurmd-{slurm_node}", "namespace": SLURM_NS,
                     "labels": {k: v, contract.NODE_LABEL: slurm_node}},
        "spec": {"nodeName": k8s_node, "containers": [container],
                 "tolerations": [{"operator": "Exists"}]},
    }


def _node_objects(s: slurm.SlurmCluster, real: dict[str, str] | None = None) -> list[dict]:
    """The kwok Nodes and every slurmd Pod; `real`: Slurm nodes a real Node stands for (the
    kubelet registers that Node itself)."""
    # slurmd is node infrastructure: its Pods tolerate the Slurm taint (slurmgate-taint-guard)
    objs: list[dict] = [{"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": SLURM_NS,
                                      "labels": {contract.INFRA_NAMESPACE_LABEL: "true"}}}]
    real = real or {}
    for n in s.nodes:
        if n in real:
            objs.append(_slurmd_pod(n, real[n], real=True))
            continue
        name = k8s_node_name(n)
        resources = {"cpu": str(s.node_cpus), "memory": f"{s.node_memory_mb}Mi", "pods": "110"}
        labels = {"type": "kwok", "kubernetes.io/hostname": name, contract.NODE_LABEL: n}
        if n in s.gpu_nodes:
            # what the NVIDIA device plugin would advertise, and the type Slurm knows it by
            resources[GPU_RESOURCE] = str(s.gpus_per_node)
            if s.gpu_type:
                labels[contract.NODE_GPU_TYPE_LABEL] = s.gpu_type
        objs.append({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": labels,
            },
            "spec": {"taints": [contract.TAINT]},
            "status": {"allocatable": dict(resources), "capacity": dict(resources)},
        })
        objs.append(_slurmd_pod(n, name, real=False))
    return objs


def _as_list(objs: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})


def _register_nodes(kc: kube.KubeCluster, s: slurm.SlurmCluster,
                    real: dict[str, str] | None = None) -> None:
    objs = _node_objects(s, real)
    first = [o for o in objs if o["kind"] != "Pod"]
    kubectl(kc, "apply", "-f", "-", stdin=_as_list(first))
    # Pods need their namespace's default ServiceAccount (made by kube-controller-manager)
    kube.wait_for("default ServiceAccounts", lambda: all(
        kubectl(kc, "get", "sa", "default", "-n", n, check=False).returncode == 0
        for n in ("default", SLURM_NS)), 60)
    pods = [o for o in objs if o["kind"] == "Pod"]
    kubectl(kc, "apply", "-f", "-", stdin=_as_list(pods))

    def all_ready() -> bool:
        out = kubectl(kc, "get", "nodes", "-l", contract.NODE_LABEL, "-o",
                      "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')]"
                      ".status}{' '}{end}").stdout.split()
        pods = kubectl(kc, "get", "pods", "-n", SLURM_NS, "-o",
                       "jsonpath={range .items[*]}{.status.phase}{' '}{end}").stdout.split()
        return (len(out) == len(s.nodes) and all(x == "True" for x in out)
                and len(pods) == len(s.nodes) and all(p == "Running" for p in pods))

    kube.wait_for("Slurm's Nodes Ready and slurmd Pods Running", all_ready, 90, interval=0.3)


def _gpu_devices(s: slurm.SlurmCluster) -> dict[str, list[str]]:
    """Slurm GPU node -> its GPU device files in gres index order (all slurmd share them)."""
    files = [str(f) for f in slurm_files.gpu_devices(s)]
    return {n: files for n in s.gpu_nodes}


def _advertise_gpus(kc: kube.KubeCluster, s: slurm.SlurmCluster, real: dict[str, str]) -> None:
    """A real Node standing for a GPU node advertises its GPUs as a kwok Node does (the count
    the NVIDIA device plugin would, the gres type as our label): there is no device plugin
    here, and the kubelet keeps an extended resource patched into its Node's status."""
    for slurm_node, name in real.items():
        if slurm_node not in s.gpu_nodes:
            continue
        if s.gpu_type:
            kubectl(kc, "label", "node", name, "--overwrite",
                    f"{contract.NODE_GPU_TYPE_LABEL}={s.gpu_type}")
        gpus = {GPU_RESOURCE: str(s.gpus_per_node)}
        # allocatable too: the kubelet derives it from capacity only at its next status sync
        kubectl(kc, "patch", "node", name, "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"capacity": gpus, "allocatable": gpus}}))


def _slurmd_nice() -> int:
    text = os.environ.get(slurm_cluster.SLURMD_NICE_ENV) or "0"
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{slurm_cluster.SLURMD_NICE_ENV}={text!r}: a whole number 0..19 "
                         "(nice(1)'s range)") from None


def up(run_dir: Path = DEFAULT_RUN_DIR, nodes: int = 4, node_memory_mb: int = 16000,
       node_cpus: int = 8, slurm_version: str | None = None, gpu_nodes: int = 2,
       gpus_per_node: int = 4, gpu_type: str = "a100",
       real_nodes: int | Sequence[realnode.NodeSpec] = 0,
       features: dict[str, str] | None = None,
       site: slurm.SiteLayout | None = None, enforce: bool = False) -> Local:
    """Start Slurm (release: `slurm_version`, else $SLURM_VERSION, else the newest) and the
    Kubernetes control plane, one kwok Node per Slurm node. The last `gpu_nodes` (at most
    half) have `gpus_per_node` GPUs of `gpu_type` in Slurm (gres) and on their Node
    (nvidia.com/gpu, label slurmgate.io/gpu-type).

    real_nodes: real Nodes (containerd + kubelet) beside the kwok ones; N gives plain
    Nodes real-1..real-N (no labels, no taints), NodeSpecs give names, labels and taints
    (a Node labelled contract.NODE_LABEL=<Slurm node> stands for that Slurm node instead of a
    kwok Node, and carries contract.TAINT like the others). With real Nodes, slurmrestd and the
    apiserver also listen on the Node IP, for Pods on the Nodes' bridges.
    features: Slurm Features= by node (e.g. {"n2": "real"}, asked for with a constraint).
    site: other users' slurmd and partition, and job limits (cluster.slurm_conf.SiteLayout):
    Slurm only, no Node stands for them.
    enforce: slurmd holds every job to its cores and GPUs (cluster/slurm_cgroups.py; node_cpus
    at most the host's), and each real Node standing for a Slurm node runs slurmgate-runc, so
    its marked Pods' containers start on their jobs' cores (pinning/)."""
    down(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    t0 = time.monotonic()
    specs = ([realnode.NodeSpec(f"real-{i + 1}") for i in range(real_nodes)]
             if isinstance(real_nodes, int) else list(real_nodes))
    node_ip = realnode.default_node_ip() if specs else None
    try:
        s = slurm.start(run_dir / "slurm", n_nodes=nodes, cpus=node_cpus,
                        memory_mb=node_memory_mb, base_port=16800 + PORT_OFFSET,
                        version=slurm_version, gpu_nodes=gpu_nodes,
                        gpus_per_node=gpus_per_node, gpu_type=gpu_type,
                        rest_listen_ips=(node_ip,) if node_ip else (), features=features,
                        slurmd_nice=_slurmd_nice(), site=site, enforce=enforce)
        k = kube.start(run_dir / "kube", base_port=16400 + PORT_OFFSET, node_ip=node_ip)
        # the real Nodes register themselves before the slurmd Pods are placed on them
        real = (realnode.start(run_dir / "realnodes", k, specs, port_offset=PORT_OFFSET,
                               pinning=enforce, gpu_devices=_gpu_devices(s)) if specs else [])
        if enforce:
            _advertise_gpus(k, s, real_slurm_nodes(real))
        _register_nodes(k, s, real_slurm_nodes(real))
    except BaseException:
        down(run_dir)
        raise
    local = Local(run_dir, k, s, real)
    (run_dir / "env.json").write_text(json.dumps(local.env(), indent=2))
    (run_dir / "env.sh").write_text(local.shell_env())
    print(f"local cluster (Slurm {s.version}) up in {time.monotonic() - t0:.1f}s",
          file=sys.stderr)
    return local


def load(run_dir: Path = DEFAULT_RUN_DIR) -> Local:
    return Local(run_dir, kube.load(run_dir / "kube"), slurm.load(run_dir / "slurm"),
                 realnode.load(run_dir / "realnodes"))


# where cluster.bridge records the webhook and binder it started (its Bridge.pids). Read here
# as data: importing cluster.bridge would be an import cycle (it imports this module)
BRIDGE_STATE = Path("bridge") / "bridge.json"


def bridge_pids(run_dir: Path) -> dict[str, int]:
    """The webhook and binder host processes cluster.bridge started under run_dir, if any."""
    try:
        state = json.loads((run_dir / BRIDGE_STATE).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(state, dict) or not isinstance(state.get("pids"), dict):
        return {}
    # a recorded PID counts only while it still carries the bridge's kubeconfig: PIDs get reused
    return {str(k): v for k, v in state["pids"].items()
            if isinstance(v, int) and v > 1 and proc.alive(v)
            and proc.environ(v).get("KUBECONFIG") == state.get("kubeconfig")}


def down(run_dir: Path = DEFAULT_RUN_DIR) -> None:
    # the webhook and binder first: left running, they would serve the next cluster started
    # on the same ports (a bench was once measured against an old webhook that way)
    kube.stop_pids(bridge_pids(run_dir), timeout=10)
    # kubelets next: they hold mounts, cgroups and a bridge, and talk to the apiserver
    realnode.stop(run_dir / "realnodes")
    kube.stop(run_dir / "kube")
    slurm.stop(run_dir / "slurm")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m cluster.local")
    ap.add_argument("action", choices=["up", "down", "env"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_RUN_DIR)
    ap.add_argument("--nodes", type=int, default=int(os.environ.get("SLURM_NODES", "4")))
    ap.add_argument("--gpu-nodes", type=int, default=2, help="the last N nodes get GPUs")
    ap.add_argument("--real-nodes", type=int, default=0,
                    help="also N real Nodes (containerd + kubelet) real-1..real-N")
    a = ap.parse_args()
    if a.action == "up":
        local = up(a.dir, a.nodes, gpu_nodes=a.gpu_nodes, real_nodes=a.real_nodes)
        print(f"kubeconfig:     {local.kube.kubeconfig}")
        print(f"Slurm:          {local.slurm.version}")
        print(f"slurmrestd:     {local.slurm.rest_url}")
        print(f"SLURM_CONF:     {local.slurm.conf}")
        for n in local.real:
            print(f"real Node:      {n.name} (containerd {n.containerd_socket}, "
                  f"Pods {n.pod_cidr})")
        if local.real:
            print(f"apiserver for Pods on real Nodes: {local.kube.node_server}")
        print(f"env for shells: source {a.dir / 'env.sh'}")
    elif a.action == "down":
        down(a.dir)
        print("local cluster stopped")
    else:
        print((a.dir / "env.sh").read_text(), end="")


if __name__ == "__main__":
    main()
