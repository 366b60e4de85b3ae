"""Deploy slurmgate onto the local cluster in-cluster, the way an operator does on a real one:
the image into the Node's runtime, three Secrets, `kubectl apply -k`, wait for the rollout.

    python -m cluster.incluster up      # needs a local cluster with real Nodes (--real-nodes)
    python -m cluster.incluster down

The webhook and binder run as the base's Deployment (two replicas, one binder leading) on the
real Node labelled slurmgate.io/local-role=slurmgate, from the image `make image` built. What only
this running cluster knows (the apiserver's and slurmrestd's addresses on the Node's IP, the
webhook's caBundle, the push token) goes into a small overlay written in the run dir on top of
kustomize/overlays/local-incluster, which stays renderable as it is in git.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster import bridge, kube, realnode
from cluster.local import DEFAULT_RUN_DIR, Local, kubectl, load
from slurmgate import contract

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "slurmgate-system"
OVERLAY = "local-incluster"
ROLE_LABEL = "slurmgate.io/local-role"
SELECTOR = "app.kubernetes.io/name=slurmgate"
BINDER_PORT = 8080  # the Deployment's http-metrics port: health, metrics and the push endpoint
LEASE = "slurmgate-binder"


@dataclass
class InCluster:
    run_dir: str
    image: str
    archive: str  # the image's OCI archive (to import it where workloads run it too)
    node: str  # the real Node the Pods run on
    pods: list[str] = field(default_factory=list)
    settings: dict[str, str] = field(default_factory=dict)


def build_image() -> tuple[Path, str]:
    """`make image`'s script: the OCI archive (cached while the sources are unchanged) and the
    image's name:tag."""
    out = subprocess.run(["bash", str(REPO / "cluster" / "build-image.sh")], check=True,
                         stdout=subprocess.PIPE, text=True, cwd=REPO).stdout.split()
    archive = Path(out[-1])
    return archive, image_name(archive)


def image_name(archive: Path) -> str:
    """The name:tag the archive was exported under (its OCI index's ref annotation)."""
    with tarfile.open(archive) as t:
        member = t.extractfile("index.json")
        if member is None:
            raise RuntimeError(f"{archive}: not an OCI archive (no index.json)")
        index = json.load(member)
    return str(index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])


def control_node(local: Local) -> realnode.RealNode:
    nodes = [n for n in local.real if n.labels.get(ROLE_LABEL)]
    if not nodes:
        raise RuntimeError(f"no real Node labelled {ROLE_LABEL}: start the local cluster with "
                           "real Nodes (python -m cluster.local up --real-nodes 2)")
    return nodes[0]


def _secrets(local: Local, run_dir: Path, push_token: str) -> list[dict[str, Any]]:
    certs = run_dir / "certs"
    subprocess.run([sys.executable, "-m", "slurmgate.certs", "webhook", "--out", str(certs),
                    "--namespace", NAMESPACE, "--service", "slurmgate-webhook",
                    "--secret-manifest", str(certs / "secret.yaml"),
                    "--ca-bundle-out", str(certs / "ca-bundle.b64")],
                   check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    tls = yaml.safe_load((certs / "secret.yaml").read_text())

    def opaque(name: str, value: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "stringData": {"token": value}}

    jwt = Path(local.slurm.token_file).read_text().strip()
    return [tls, opaque("slurmgate-slurm-jwt", jwt), opaque("slurmgate-push-token", push_token)]


def _run_overlay(local: Local, run_dir: Path, image: str, node_ip: str,
                 settings: dict[str, str]) -> Path:
    """kustomize/ copied into the run dir, and beside overlays/local-incluster an overlay of
    this cluster's addresses, caBundle and settings."""
    tree = run_dir / "kustomize"
    shutil.rmtree(tree, ignore_errors=True)
    shutil.copytree(REPO / "kustomize", tree, ignore=shutil.ignore_patterns("generated"))
    api_port = local.kube.server.rsplit(":", 1)[1]
    rest_port = local.slurm.rest_url.rsplit(":", 1)[1]
    ca_bundle = (run_dir / "certs" / "ca-bundle.b64").read_text().strip()
    name, _, tag = image.rpartition(":")
    # no kube-proxy here: the Pods reach the apiserver at the Node's IP, not its ClusterIP
    api_env = [{"name": "KUBERNETES_SERVICE_HOST", "value": node_ip},
               {"name": "KUBERNETES_SERVICE_PORT", "value": api_port}]
    config = {"SLURMREST_URL": f"http://{node_ip}:{rest_port}", **settings}
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [f"../{OVERLAY}"],
        # local-incluster already names the image localhost/slurmgate/slurmgate
        "images": [{"name": "localhost/slurmgate/slurmgate", "newName": name, "newTag": tag}],
        "patches": [
            {"target": {"kind": "ConfigMap", "name": "slurmgate-config"},
             "patch": yaml.safe_dump([{"op": "add", "path": f"/data/{k}", "value": v}
                                      for k, v in config.items()])},
            {"target": {"kind": "Deployment", "name": "slurmgate"},
             # the webhook (container 0) has no env in the base, the binder (1) has POD_NAME
             "patch": yaml.safe_dump(
                 [{"op": "add", "path": "/spec/template/spec/containers/0/env", "value": api_env}]
                 + [{"op": "add", "path": "/spec/template/spec/containers/1/env/-", "value": e}
                    for e in api_env])},
            {"target": {"kind": "MutatingWebhookConfiguration", "name": "slurmgate"},
             "patch": yaml.safe_dump([{"op": "add", "path": "/webhooks/0/clientConfig/caBundle",
                                       "value": ca_bundle}])},
        ],
    }
    out = tree / "overlays" / f"{OVERLAY}-run"
    out.mkdir(parents=True)
    (out / "kustomization.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def up(local: Local | None = None, settings: dict[str, str] | None = None,
       timeout: float = 180.0) -> InCluster:
    """Build (or reuse) the image, import it into the control Node's containerd, create the
    Secrets, apply the overlay and wait until both replicas are Ready and one binder leads.
    `settings`: ConfigMap values on top of the overlay's (the e2e suite shortens graces)."""
    local = local or load()
    run_dir = local.run_dir / "incluster"
    run_dir.mkdir(parents=True, exist_ok=True)
    node = control_node(local)
    archive, image = build_image()
    realnode.import_image(node, archive)
    push_token = secrets.token_urlsafe(32)
    kubectl(local.kube, "create", "namespace", NAMESPACE, check=False)
    kubectl(local.kube, "apply", "-f", "-", stdin=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": _secrets(local, run_dir, push_token)}))
    ic = InCluster(str(run_dir), image, str(archive), node.name, settings=dict(settings or {}))
    overlay = _run_overlay(local, run_dir, image, node.node_ip, ic.settings)
    kubectl(local.kube, "apply", "-k", str(overlay))
    kubectl(local.kube, "-n", NAMESPACE, "rollout", "status", "deployment/slurmgate",
            f"--timeout={int(timeout)}s")
    kube.wait_for("a binder Pod holding the Lease", lambda: leader(local) is not None, 60)
    ic.pods = pod_names(local)
    point_push_hook(local, push_token)
    return ic


def pods(local: Local) -> list[dict[str, Any]]:
    out = kubectl(local.kube, "-n", NAMESPACE, "get", "pods", "-l", SELECTOR, "-o", "json")
    return [p for p in json.loads(out.stdout)["items"]
            if not p["metadata"].get("deletionTimestamp")]


def pod_names(local: Local) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods(local))


def leader(local: Local, names: Collection[str] | None = None) -> str | None:
    """The binder Pod holding the Lease, if its holder is a live Pod of ours (among `names`
    when the caller has just listed them)."""
    p = kubectl(local.kube, "-n", NAMESPACE, "get", "lease", LEASE, "-o", "json", check=False)
    if p.returncode != 0:
        return None
    holder = (json.loads(p.stdout).get("spec") or {}).get("holderIdentity")
    return holder if holder in (pod_names(local) if names is None else names) else None


def push_endpoints(local: Local) -> list[str]:
    """What the Service slurmgate-binder sends to: the Pod the leading binder labelled, by its
    EndpointSlices (kube-controller-manager keeps them; Ready addresses only)."""
    out = kubectl(local.kube, "-n", NAMESPACE, "get", "endpointslices", "-l",
                  "kubernetes.io/service-name=slurmgate-binder", "-o", "json")
    return sorted(a for s in json.loads(out.stdout)["items"] for e in s.get("endpoints") or []
                  if (e.get("conditions") or {}).get("ready") for a in e["addresses"])


def point_push_hook(local: Local, token: str | None = None, timeout: float = 60.0) -> list[str]:
    """slurmctld's hook tells every binder Pod; the leader acts, a standby answers 503. An
    operator points it at the Service slurmgate-binder, which follows the leader (one endpoint,
    test_incluster.py checks it). The host has no kube-proxy to reach a ClusterIP, and the Pod
    IP behind the Service at one moment goes stale when the Lease changes hands (a renewal
    missed under load): so the hook lists each binder Pod's IP, which the hook supports for
    replicas outside a cluster, and a handover between the running Pods loses no push.
    Rewritten when a Pod is replaced (a new IP)."""
    ips: list[str] = []

    def every_pod_and_a_leader() -> bool:
        nonlocal ips
        running = pods(local)
        ips = sorted(p["status"]["podIP"] for p in running
                     if (p.get("status") or {}).get("podIP"))
        return bool(ips) and len(ips) == len(running) and leader(
            local, [p["metadata"]["name"] for p in running]) is not None

    kube.wait_for("every binder Pod with an IP, one leading", every_pod_and_a_leader, timeout)
    bridge.point_hook(local, [f"{ip}:{BINDER_PORT}" for ip in ips], token)
    return ips


def hook_endpoints(local: Local) -> list[str]:
    """The `host:port` lines the hook pushes to now."""
    path = bridge.hook_dir(local) / "endpoint"
    return path.read_text().split() if path.exists() else []


def _ips_and_leader(local: Local) -> tuple[dict[str, str], str | None]:
    """Each binder Pod's IP by name (those with one), and the Pod leading, if it has an IP."""
    ips = {p["metadata"]["name"]: p["status"]["podIP"] for p in pods(local)
           if (p.get("status") or {}).get("podIP")}
    holder = leader(local, ips)
    return ips, holder


def follow_leader(local: Local, b: bridge.Bridge) -> None:
    """Before a test: the Bridge's binder URL (metrics, the push listener) at the Pod leading
    now, and the hook at the Pods running now. Both move only when the Lease or a Pod does."""
    ips, holder = _ips_and_leader(local)
    if holder is not None:
        b.binder_url = f"http://{ips[holder]}:{BINDER_PORT}"
    if sorted(hook_endpoints(local)) != sorted(f"{ip}:{BINDER_PORT}" for ip in ips.values()):
        point_push_hook(local)


def describe(local: Local) -> str:
    """For a failed test's report: who holds the Lease, each Pod's IP and restarts, and where
    the hook pushes."""
    p = kubectl(local.kube, "-n", NAMESPACE, "get", "lease", LEASE, "-o", "json", check=False)
    spec = (json.loads(p.stdout).get("spec") or {}) if p.returncode == 0 else {}
    lines = [f"lease holder {spec.get('holderIdentity')} transitions "
             f"{spec.get('leaseTransitions')} renewed {spec.get('renewTime')}"]
    for pod in pods(local):
        st = pod.get("status") or {}
        restarts = {c["name"]: c.get("restartCount") for c in st.get("containerStatuses") or []}
        labels = pod["metadata"].get("labels") or {}
        lines.append(f"pod {pod['metadata']['name']} ip {st.get('podIP')} restarts {restarts} "
                     f"leader-label {labels.get(contract.LEADER_LABEL)}")
    lines.append(f"hook endpoints {hook_endpoints(local)}")
    return "\n".join(lines)


def as_bridge(local: Local, ic: InCluster) -> bridge.Bridge:
    """The in-cluster deployment in the shape the e2e suite reads of the host-process one: the
    ServiceAccount's kubeconfig, the webhook at a Pod's IP, the leading binder's /metrics and
    push endpoint at its Pod IP (the host reaches the Node's bridge). No PIDs: tests that drive
    the host processes do not run in this mode."""
    run_dir = Path(ic.run_dir)
    sa_kc = run_dir / "slurmgate.kubeconfig"
    bridge.sa_kubeconfig(local, sa_kc)
    ips, holder = _ips_and_leader(local)
    if holder is None:
        raise RuntimeError("no binder Pod leads")
    return bridge.Bridge(str(run_dir), str(sa_kc), f"https://{ips[holder]}:8443",
                         f"http://{ips[holder]}:{BINDER_PORT}", env=dict(ic.settings))


def down(local: Local | None = None, timeout: float = 60.0) -> None:
    """Delete what `up` applied (the Deployment's Pods stop on their Node) and the Secrets."""
    local = local or load()
    overlay = local.run_dir / "incluster" / "kustomize" / "overlays" / f"{OVERLAY}-run"
    if overlay.exists():
        kubectl(local.kube, "delete", "-k", str(overlay), "--ignore-not-found",
                f"--timeout={int(timeout)}s", check=False)
    try:
        kube.wait_for("slurmgate's Pods gone", lambda: not pods(local), timeout, interval=0.5)
    except TimeoutError:
        pass  # best effort: the local cluster's teardown stops the Node and its containers


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m cluster.incluster")
    ap.add_argument("action", choices=["up", "down"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_RUN_DIR)
    a = ap.parse_args()
    local = load(a.dir)
    if a.action == "up":
        ic = up(local)
        print(f"slurmgate in-cluster on {ic.node} ({ic.image}): {', '.join(ic.pods)}; "
              f"leader {leader(local)}")
    else:
        down(local)


if __name__ == "__main__":
    main()
