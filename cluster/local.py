"""The whole local cluster: real Slurm + real Kubernetes control plane, one Node per Slurm node.

    python -m cluster.local up [--nodes N]   # prints the kubeconfig and slurmrestd URL
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
from dataclasses import dataclass
from pathlib import Path

from cluster import kube, slurm
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

    def env(self) -> dict[str, str]:
        return {
            "KUBECONFIG": self.kube.kubeconfig,
            "SLURM_CONF": str(self.slurm.conf),
            "SLURMREST_URL": self.slurm.rest_url,
            "SLURM_TOKEN_FILE": str(self.slurm.token_file),
            "SLURMGATE_RUN_DIR": str(self.run_dir),
            "SLURM_VERSION": self.slurm.version,
        }

    def shell_env(self) -> str:
        """env.sh: the variables, and this cluster's own Slurm commands first on PATH."""
        lines = [f"export {k}={v}\n" for k, v in self.env().items()]
        lines.append(f"export PATH={self.slurm.run_dir / 'bin'}:$PATH\n")
        return "".join(lines)


def kubectl(kc: kube.KubeCluster, *args: str, stdin: str | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["kubectl", f"--kubeconfig={kc.kubeconfig}", *args], input=stdin,
                       text=True, capture_output=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
    return p


def _node_objects(s: slurm.SlurmCluster) -> list[dict]:
    # slurmd is node infrastructure: its Pods tolerate the Slurm taint (slurmgate-taint-guard)
    objs: list[dict] = [{"apiVersion": "v1", "kind": "Namespace",
                         "metadata": {"name": SLURM_NS,
                                      "labels": {contract.INFRA_NAMESPACE_LABEL: "true"}}}]
    for n in s.nodes:
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
        k, v = contract.SLURMD_POD_LABEL.split("=")
        objs.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"slurmd-{n}", "namespace": SLURM_NS,
                         "labels": {k: v, contract.NODE_LABEL: n}},
            "spec": {
                "nodeName": name,
                "containers": [{"name": "slurmd", "image": "slurmd:local",
                                "resources": {"requests": {"cpu": "500m",
                                                           "memory": SLURMD_MEMORY}}}],
                "tolerations": [{"operator": "Exists"}],
            },
        })
    return objs


def _as_list(objs: list[dict]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})


def _register_nodes(kc: kube.KubeCluster, s: slurm.SlurmCluster) -> None:
    objs = _node_objects(s)
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

    kube.wait_for("kwok Nodes Ready and slurmd Pods Running", all_ready, 90, interval=0.3)


def up(run_dir: Path = DEFAULT_RUN_DIR, nodes: int = 4, node_memory_mb: int = 16000,
       node_cpus: int = 8, slurm_version: str | None = None, gpu_nodes: int = 2,
       gpus_per_node: int = 4, gpu_type: str = "a100") -> Local:
    """Start Slurm (release: `slurm_version`, else $SLURM_VERSION, else the newest) and the
    Kubernetes control plane, one kwok Node per Slurm node. The last `gpu_nodes` (at most
    half) have `gpus_per_node` GPUs of `gpu_type` in Slurm (gres) and on their Node
    (nvidia.com/gpu, label slurmgate.io/gpu-type)."""
    down(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    t0 = time.monotonic()
    try:
        s = slurm.start(run_dir / "slurm", n_nodes=nodes, cpus=node_cpus,
                        memory_mb=node_memory_mb, base_port=16800 + PORT_OFFSET,
                        version=slurm_version, gpu_nodes=gpu_nodes,
                        gpus_per_node=gpus_per_node, gpu_type=gpu_type)
        k = kube.start(run_dir / "kube", base_port=16400 + PORT_OFFSET)
        _register_nodes(k, s)
    except BaseException:
        down(run_dir)
        raise
    local = Local(run_dir, k, s)
    (run_dir / "env.json").write_text(json.dumps(local.env(), indent=2))
    (run_dir / "env.sh").write_text(local.shell_env())
    print(f"local cluster (Slurm {s.version}) up in {time.monotonic() - t0:.1f}s",
          file=sys.stderr)
    return local


def load(run_dir: Path = DEFAULT_RUN_DIR) -> Local:
    return Local(run_dir, kube.load(run_dir / "kube"), slurm.load(run_dir / "slurm"))


def down(run_dir: Path = DEFAULT_RUN_DIR) -> None:
    kube.stop(run_dir / "kube")
    slurm.stop(run_dir / "slurm")


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m cluster.local")
    ap.add_argument("action", choices=["up", "down", "env"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_RUN_DIR)
    ap.add_argument("--nodes", type=int, default=int(os.environ.get("SLURM_NODES", "4")))
    ap.add_argument("--gpu-nodes", type=int, default=2, help="the last N nodes get GPUs")
    a = ap.parse_args()
    if a.action == "up":
        local = up(a.dir, a.nodes, gpu_nodes=a.gpu_nodes)
        print(f"kubeconfig:     {local.kube.kubeconfig}")
        print(f"Slurm:          {local.slurm.version}")
        print(f"slurmrestd:     {local.slurm.rest_url}")
        print(f"SLURM_CONF:     {local.slurm.conf}")
        print(f"env for shells: source {a.dir / 'env.sh'}")
    elif a.action == "down":
        down(a.dir)
        print("local cluster stopped")
    else:
        print((a.dir / "env.sh").read_text(), end="")


if __name__ == "__main__":
    main()
