"""`make demo`: a real Slurm and a real Kubernetes control plane on this machine, slurmgate
deployed with kubectl apply -k, and Pods landing on the Nodes that Slurm chose.

    python -m cluster.demo              # brings the cluster up, runs the story, leaves it running
    python -m cluster.demo --reuse      # on a cluster that is already up
    python -m cluster.demo --in-cluster # slurmgate as Pods from its image on a real Node
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

from cluster import bridge, incluster, local, slurm_release
from cluster.kube import wait_for
from cluster.realnode import NodeSpec
from slurmgate import contract

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
DESCRIBE_SECTIONS = ("Name:", "Namespace:", "Node:", "Status:", "Annotations:", "Conditions:",
                     "Events:")


class Story:
    def __init__(self, lc: local.Local, out: TextIO) -> None:
        self.lc = lc
        self.out = out
        self.env = {**os.environ, **lc.env()}
        # `squeue` and `sinfo` are the cluster's own release (wrappers that enter its root);
        # `kubectl slurm` is the kubectl-slurm the package installed beside this Python
        self.env["PATH"] = (f"{lc.slurm.run_dir / 'bin'}:{Path(sys.executable).parent}:"
                            f"{os.environ.get('PATH', '')}")

    def say(self, text: str) -> None:
        print(f"\n\033[1m==> {text}\033[0m" if self.out.isatty() else f"\n==> {text}",
              file=self.out, flush=True)

    def show(self, *argv: str, check: bool = True) -> str:
        print(f"$ {' '.join(argv)}", file=self.out)
        p = subprocess.run(list(argv), env=self.env, text=True, capture_output=True)
        text = (p.stdout + p.stderr).rstrip()
        print(text, file=self.out, flush=True)
        if check and p.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed: {p.stderr.strip()}")
        return text

    def kubectl(self, *args: str) -> str:
        return subprocess.run(["kubectl", *args], env=self.env, text=True, check=True,
                              capture_output=True).stdout

    def pod(self, name: str) -> dict:
        return json.loads(self.kubectl("get", "pod", name, "-o", "json"))

    def describe(self, name: str) -> str:
        """`kubectl describe pod`, keeping the parts that tell the Slurm story."""
        full = self.kubectl("describe", "pod", name)
        keep, on = [], False
        for line in full.splitlines():
            if line and not line[0].isspace():
                on = line.startswith(DESCRIBE_SECTIONS)
            if on:
                keep.append(line)
        text = "\n".join(keep)
        print(f"$ kubectl describe pod {name}   (abridged)\n{text}", file=self.out, flush=True)
        return text


def run(lc: local.Local, out: TextIO = sys.stdout) -> dict[str, str]:
    """The demo story on a running cluster with slurmgate deployed. Returns what it saw."""
    s = Story(lc, out)
    seen: dict[str, str] = {}
    s.say(f"Slurm's view: four nodes, all idle (Slurm {lc.slurm.version})")
    seen["version"] = s.show("sinfo", "--version")
    s.show("sinfo", "-N", "-p", "k8s")
    s.say("Kubernetes' view: one Node per Slurm node (label slurmgate.io/slurm-node)")
    s.show("kubectl", "get", "nodes", "-L", contract.NODE_LABEL)

    s.say("An ML engineer creates an annotated Pod (examples/inference-pod.yaml)")
    s.show("kubectl", "apply", "-f", str(EXAMPLES / "inference-pod.yaml"))
    wait_for("inference Pod Running", lambda: s.pod("inference")["status"].get("phase")
             == "Running", 60)
    pod = s.pod("inference")
    ann = pod["metadata"]["annotations"]
    seen.update(node=pod["spec"]["nodeName"], slurm_node=ann[contract.A_SLURM_NODE],
                job=ann[contract.A_JOB_ID])
    s.say(f"Slurm chose {seen['slurm_node']} for job {seen['job']}; the Pod runs on "
          f"{seen['node']}, the Node labelled {contract.NODE_LABEL}={seen['slurm_node']}")
    s.show("kubectl", "get", "pod", "inference", "-o", "wide")
    s.describe("inference")
    s.show("squeue", "-o", "%.6i %.9P %.28j %.8T %.10M %.6D %R")

    s.say("Three more Pods take the other three Nodes")
    s.show("kubectl", "apply", "-f", str(EXAMPLES / "batch-pods.yaml"))
    wait_for("workers Running", lambda: all(
        s.pod(f"worker-{i}")["status"].get("phase") == "Running" for i in (1, 2, 3)), 60)

    s.say("A fifth Pod: every Node is taken, so it waits, gated, with Slurm's reason and when "
          "Slurm expects it to start (the inference Pod's 2-hour limit ends)")
    s.show("kubectl", "apply", "-f", str(EXAMPLES / "waiting-pod.yaml"))
    wait_for("pending reason on the waiting Pod", lambda: s.pod("waits-for-a-node")[
        "metadata"]["annotations"].get(contract.A_JOB_REASON) in ("Resources", "Priority"), 30)
    wait_for("Slurm's expected start on the waiting Pod", lambda: contract.A_EXPECTED_START in
             s.pod("waits-for-a-node")["metadata"]["annotations"], 60)
    wait_for("Slurm's decision as a condition", lambda: any(
        c["type"] == contract.COND_ALLOCATED
        for c in s.pod("waits-for-a-node")["status"].get("conditions") or []), 30)
    s.show("kubectl", "get", "pods", "-o", "wide")
    seen["waiting"] = s.describe("waits-for-a-node")
    s.show("squeue", "-o", "%.6i %.9P %.28j %.8T %.10M %.6D %R")
    s.say("The kubectl plugin: every marked Pod with its job and expected start, and who holds "
          "each Node")
    seen["plugin_pods"] = s.show("kubectl", "slurm", "pods")
    seen["plugin_nodes"] = s.show("kubectl", "slurm", "nodes")

    s.say("A Pod too big for any Node beside its slurmd is refused at admission")
    seen["refusal"] = s.show("kubectl", "apply", "-f", str(EXAMPLES / "too-big-pod.yaml"),
                             check=False)

    s.say("Deleting a running Pod frees its Node; Slurm gives it to the waiting Pod")
    freed = s.pod("worker-1")["spec"]["nodeName"]
    s.show("kubectl", "delete", "pod", "worker-1", "--wait=false")
    s.show("kubectl", "wait", f"--for=condition={contract.COND_ALLOCATED}",
           "pod/waits-for-a-node", "--timeout=60s")
    wait_for("waiting Pod bound", lambda: s.pod("waits-for-a-node")["spec"].get("nodeName")
             == freed, 60)
    s.show("kubectl", "get", "pods", "-o", "wide")
    s.show("squeue", "-o", "%.6i %.9P %.28j %.8T %.10M %.6D %R")
    seen["freed"] = freed

    s.say("Namespaces are Slurm users and accounts: team A may not charge team B")
    seen["borrow"] = s.show("kubectl", "apply", "-f", str(EXAMPLES / "team-a-borrows-b.yaml"),
                            check=False)
    s.say("Team A's Pod runs as team A's Slurm user, on its account (the inference Pod makes "
          "room)")
    s.show("kubectl", "delete", "pod", "inference", "--wait=false")
    s.show("kubectl", "apply", "-f", str(EXAMPLES / "team-a-pod.yaml"))
    wait_for("team A's Pod bound", lambda: json.loads(s.kubectl(
        "get", "pod", "trainer-a", "-n", "team-a", "-o", "json"))["spec"].get("nodeName"), 60)
    s.show("squeue", "-o", "%.6i %.9P %.10u %.8a %.8T %.6D %R")
    # slurmdbd records a job a moment after slurmctld starts it
    wait_for("team A's job in sacct", lambda: "sg-team-a" in subprocess.run(
        ["sacct", "-a", "-X", "-n", "-o", "User"], env=s.env, text=True,
        capture_output=True).stdout, 30)
    seen["sacct"] = s.show("sacct", "-a", "-X", "-o", "JobID,JobName%28,User,Account,State")
    return seen


def cleanup(lc: local.Local) -> None:
    env = {**os.environ, **lc.env()}
    for f in ("inference-pod.yaml", "batch-pods.yaml", "waiting-pod.yaml", "team-a-pod.yaml"):
        subprocess.run(["kubectl", "delete", "-f", str(EXAMPLES / f), "--ignore-not-found",
                        "--wait=true", "--timeout=60s"], env=env, capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m cluster.demo")
    ap.add_argument("--reuse", action="store_true", help="use the cluster that is already up")
    ap.add_argument("--dir", type=Path, default=local.DEFAULT_RUN_DIR)
    ap.add_argument("--in-cluster", action="store_true",
                    help="run the webhook and binder as Pods (the image `make image` builds) on "
                         "a real Node (containerd + kubelet), deployed with kubectl apply -k")
    a = ap.parse_args()
    t0 = time.monotonic()
    print(f"==> Starting a local Slurm {slurm_release.release().version} (slurmctld, "
          "4 slurmd, slurmrestd) and a Kubernetes control plane (etcd, kube-apiserver, "
          "kube-scheduler, kube-controller-manager, kwok); SLURM_VERSION=22.05|24.11|26.05 "
          "picks another")
    # in-cluster: one real Node more, for slurmgate's own Pods (never a Slurm node's Node)
    real = [NodeSpec("real-1", labels={incluster.ROLE_LABEL: "slurmgate"})] if a.in_cluster \
        else []
    lc = local.load(a.dir) if a.reuse else local.up(a.dir, nodes=4, real_nodes=real)
    print(f"    up in {time.monotonic() - t0:.1f}s")
    bridge.down(a.dir)
    if a.in_cluster:
        print("==> Deploying slurmgate as a user would: make image, Secrets, kubectl apply -k "
              "kustomize/overlays/local-incluster (two replicas on the real Node real-1)")
        incluster.up(lc)
        Story(lc, sys.stdout).show("kubectl", "get", "pods", "-n", incluster.NAMESPACE, "-o",
                                   "wide")
    else:
        print("==> Deploying slurmgate: kubectl apply -k kustomize/overlays/local (with this "
              "cluster's caBundle), then the webhook and the binder as local processes")
        bridge.up(lc)
    run(lc)
    print(f"\nThe cluster keeps running. Explore it with:\n  source {a.dir / 'env.sh'}\n"
          f"  kubectl get pods -o wide; squeue; sinfo\nStop it with: make cluster-down")


if __name__ == "__main__":
    main()
