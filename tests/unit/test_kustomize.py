"""`kubectl kustomize` renders the base, its components and every overlay as intended.

The overlays need their git-ignored generated/ files; they are made with the real CLI in a
temporary copy of kustomize/, so the checkout stays clean.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmgate import contract, tenancy

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "kustomize"
NS = "slurmgate-system"
LOCAL_URL = "https://127.0.0.1:9443/mutate"
BASES = ["base", "base/core", "base/webhook-config", "base/deployment"]
OVERLAYS = sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir() if p.is_dir())

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl")

Doc = dict[str, Any]

# (kind, namespace, apiGroup, resource, resourceName or "", verb): the whole grant.
EXPECTED_RBAC = {
    *(("ClusterRole", "", "", "pods", "", v) for v in ("get", "list", "watch", "patch", "delete")),
    ("ClusterRole", "", "", "pods/binding", "", "create"),
    ("ClusterRole", "", "", "pods/status", "", "patch"),
    ("ClusterRole", "", "", "pods/eviction", "", "create"),
    *(("ClusterRole", "", "", "nodes", "", v) for v in ("get", "list", "watch")),
    *(("ClusterRole", "", g, "events", "", v) for g in ("", "events.k8s.io")
      for v in ("create", "patch")),
    ("ClusterRole", "", "batch", "jobs", "", "get"),
    ("ClusterRole", "", "jobset.x-k8s.io", "jobsets", "", "get"),
    ("ClusterRole", "", "leaderworkerset.x-k8s.io", "leaderworkersets", "", "get"),
    ("ClusterRole", "", "scheduling.x-k8s.io", "podgroups", "", "get"),
    ("Role", NS, "coordination.k8s.io", "leases", "", "create"),
    ("Role", NS, "coordination.k8s.io", "leases", "slurmgate-binder", "get"),
    ("Role", NS, "coordination.k8s.io", "leases", "slurmgate-binder", "update"),
    *(("Role", NS, "", "configmaps", "slurmgate-tenancy", v) for v in ("get", "list", "watch")),
}


def _cli(*argv: str) -> None:
    subprocess.run([sys.executable, "-m", "slurmgate.certs", *argv], cwd=ROOT, check=True,
                   capture_output=True)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("kustomize")
    dst = tmp / "kustomize"
    shutil.copytree(KUSTOMIZE, dst, ignore=shutil.ignore_patterns("generated"))
    certs = tmp / "certs"
    _cli("webhook", "--out", str(certs), "--ip", "127.0.0.1",
         "--ca-bundle-out", str(certs / "ca-bundle.b64"))
    _cli("webhook-patch", "--ca-bundle-file", str(certs / "ca-bundle.b64"), "--url", LOCAL_URL,
         "--out", str(dst / "overlays/local/generated/webhook-patch.yaml"))
    kind_gen = dst / "overlays/kind/generated"
    _cli("webhook", "--out", str(kind_gen), "--ca-bundle-out", str(kind_gen / "ca-bundle.b64"))
    _cli("webhook-patch", "--ca-bundle-file", str(kind_gen / "ca-bundle.b64"),
         "--out", str(kind_gen / "webhook-patch.yaml"))
    return dst


def render(tree: Path, target: str) -> list[Doc]:
    res = subprocess.run(["kubectl", "kustomize", str(tree / target)], capture_output=True,
                         text=True, check=False)
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str) -> Doc:
    (d,) = by_kind(docs, kind)
    return d


@pytest.mark.parametrize("target", BASES + [f"overlays/{o}" for o in OVERLAYS])
def test_renders(tree: Path, target: str) -> None:
    docs = render(tree, target)
    assert docs
    for d in docs:
        if d["kind"] not in {"Namespace", "ClusterRole", "ClusterRoleBinding",
                             "MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                             "ValidatingAdmissionPolicyBinding"}:
            assert d["metadata"]["namespace"] == NS, d["metadata"]


@pytest.mark.parametrize("target", ["base"] + [f"overlays/{o}" for o in OVERLAYS])
def test_taint_guard_is_deployed(tree: Path, target: str) -> None:
    """Only our Pods may tolerate the Slurm taint (else a Pod could preempt them there); the
    names in its CEL are the contract's."""
    docs = render(tree, target)
    vap = one(docs, "ValidatingAdmissionPolicy")
    binding = one(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == vap["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert vap["spec"]["failurePolicy"] == "Fail"
    cel = " ".join(v["expression"] for v in vap["spec"]["variables"])
    for name in (contract.TAINT_KEY, contract.MARK_LABEL, contract.MARK_VALUE,
                 contract.SCHEDULER_NAME, contract.TAINT_EFFECT):
        assert f"'{name}'" in cel, name
    exprs = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    assert {"key": contract.INFRA_NAMESPACE_LABEL, "operator": "DoesNotExist"} in exprs
    (ops,) = [r["operations"] for r in vap["spec"]["matchConstraints"]["resourceRules"]]
    assert ops == ["CREATE", "UPDATE"]


def test_overlays_exist() -> None:
    assert {"local", "kind"} <= set(OVERLAYS)


def _webhook(docs: list[Doc]) -> Doc:
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["name"] == "slurmgate"
    (hook,) = mwc["webhooks"]
    return hook


@pytest.mark.parametrize("target", ["base", "base/webhook-config", "overlays/local",
                                    "overlays/kind"])
def test_webhook_configuration(tree: Path, target: str) -> None:
    hook = _webhook(render(tree, target))
    assert hook["name"] == "pods.slurmgate.io"
    assert hook["objectSelector"] == {"matchLabels": {contract.MARK_LABEL: contract.MARK_VALUE}}
    assert hook["namespaceSelector"] == {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
        "values": ["kube-system", NS]}]}
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["timeoutSeconds"] == 10
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["matchPolicy"] == "Equivalent"


def test_webhook_client_config(tree: Path) -> None:
    service = {"name": "slurmgate-webhook", "namespace": NS, "path": "/mutate", "port": 443}
    assert _webhook(render(tree, "base"))["clientConfig"] == {"service": service}

    local = _webhook(render(tree, "overlays/local"))["clientConfig"]
    assert set(local) == {"url", "caBundle"} and local["url"] == LOCAL_URL
    ca = (tree.parent / "certs" / "ca.crt").read_bytes()
    assert base64.b64decode(local["caBundle"]) == ca

    kind = _webhook(render(tree, "overlays/kind"))["clientConfig"]
    assert kind["service"] == service
    kind_ca = (tree / "overlays/kind/generated/ca.crt").read_bytes()
    assert base64.b64decode(kind["caBundle"]) == kind_ca


@pytest.mark.parametrize("target", ["base", "overlays/local", "overlays/kind"])
def test_rbac_exact(tree: Path, target: str) -> None:
    docs = render(tree, target)
    got = set()
    for role in by_kind(docs, "ClusterRole") + by_kind(docs, "Role"):
        assert role["metadata"]["name"].startswith("slurmgate")
        for rule in role["rules"]:
            assert "nonResourceURLs" not in rule
            for g in rule["apiGroups"]:
                for r in rule["resources"]:
                    for n in rule.get("resourceNames") or [""]:
                        for v in rule["verbs"]:
                            ns = role["metadata"].get("namespace", "")
                            got.add((role["kind"], ns, g, r, n, v))
    assert got == EXPECTED_RBAC
    assert not any("*" in str(x) for x in got)
    assert not any(r[3].startswith("secrets") for r in got)
    # bound to our ServiceAccount only
    sa = {"kind": "ServiceAccount", "name": "slurmgate", "namespace": NS}
    crb = one(docs, "ClusterRoleBinding")
    assert crb["subjects"] == [sa] and crb["roleRef"]["name"] == "slurmgate"
    rbs = {rb["metadata"]["name"]: rb for rb in by_kind(docs, "RoleBinding")}
    assert set(rbs) == {"slurmgate-leader-election", "slurmgate-tenancy"}
    for name, rb in rbs.items():
        assert rb["subjects"] == [sa] and rb["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name}
    assert one(docs, "ServiceAccount")["automountServiceAccountToken"] is False


def test_local_has_no_workload(tree: Path) -> None:
    kinds = sorted(d["kind"] for d in render(tree, "overlays/local"))
    assert kinds == sorted(["Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "Role", "RoleBinding", "ConfigMap", "MutatingWebhookConfiguration",
                            "Role", "RoleBinding", "ConfigMap",  # + the tenancy policy's
                            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"])


def test_local_needs_generated(tmp_path: Path) -> None:
    shutil.copytree(KUSTOMIZE, tmp_path / "k", ignore=shutil.ignore_patterns("generated"))
    res = subprocess.run(["kubectl", "kustomize", str(tmp_path / "k/overlays/local")],
                         capture_output=True, text=True, check=False)
    assert res.returncode != 0 and "webhook-patch.yaml" in res.stderr


def test_config_map(tree: Path) -> None:
    maps = {d["metadata"]["name"]: d for d in by_kind(render(tree, "base"), "ConfigMap")}
    data = maps["slurmgate-config"]["data"]
    assert data["FAIL_OPEN"] == "false"
    assert {"SLURMREST_URL", "SLURM_USER", "DEFAULT_PARTITION"} <= set(data)
    # tenancy on by default, pointing at the policy the base deploys
    assert data["TENANCY_CONFIGMAP"] == "slurmgate-system/slurmgate-tenancy"
    # the example policy parses, under the key and name the RBAC grants
    assert tenancy.parse(maps["slurmgate-tenancy"]["data"][tenancy.POLICY_KEY]).tenants


@pytest.mark.parametrize("target", ["base", "overlays/kind"])
def test_deployment(tree: Path, target: str) -> None:
    docs = render(tree, target)
    dep = one(docs, "Deployment")
    assert dep["metadata"]["name"] == "slurmgate"
    pod = dep["spec"]["template"]["spec"]
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert contract.MARK_LABEL not in labels  # we never schedule ourselves via Slurm
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pod["serviceAccountName"] == "slurmgate"
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"webhook", "binder"}
    assert containers["webhook"]["command"] == ["slurmgate-webhook"]
    assert containers["binder"]["command"] == ["slurmgate-binder"]
    for c in containers.values():
        sc = c["securityContext"]
        assert sc["runAsNonRoot"] is True
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"] == {"drop": ["ALL"]}
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        assert {"configMapRef": {"name": "slurmgate-config"}} in c["envFrom"]
        for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
            assert c[probe]["httpGet"]["path"] == path
        if target == "overlays/kind":
            assert c["image"] == "slurmgate:dev"
        else:
            assert c["image"] == "ghcr.io/slurmgate/slurmgate:0.1.0"

    web, binder = containers["webhook"], containers["binder"]
    assert web["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    assert web["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert web["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert binder["ports"][0]["containerPort"] == 8080
    assert binder["readinessProbe"]["httpGet"].get("scheme", "HTTP") == "HTTP"

    volumes = {v["name"]: v for v in pod["volumes"]}
    tls_name = volumes["tls"]["secret"]["secretName"]
    assert volumes["slurm-jwt"]["secret"]["secretName"] == "slurmgate-slurm-jwt"
    assert volumes["slurm-jwt"]["secret"]["items"] == [{"key": "token", "path": "token"}]
    # both containers call the API (the webhook reads Nodes and slurmd Pods)
    sa_path = "/var/run/secrets/kubernetes.io/serviceaccount"
    for c in (binder, web):
        assert [m["name"] for m in c["volumeMounts"] if m["mountPath"] == sa_path] == [
            "kube-api-access"]
    assert "tls" not in {m["name"] for m in binder["volumeMounts"]}
    sources = volumes["kube-api-access"]["projected"]["sources"]
    assert any("serviceAccountToken" in s for s in sources)

    if target == "base":
        assert tls_name == "slurmgate-webhook-tls"
        assert not by_kind(docs, "Secret")
    else:  # secretGenerator, name with content hash, referenced by the Deployment
        secret = one(docs, "Secret")
        assert secret["type"] == "kubernetes.io/tls"
        assert secret["metadata"]["name"] == tls_name
        assert tls_name.startswith("slurmgate-webhook-tls-")
        assert set(secret["data"]) == {"tls.crt", "tls.key", "ca.crt"}

    svc = one(docs, "Service")
    assert svc["metadata"]["name"] == "slurmgate-webhook"
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https",
                                     "protocol": "TCP"}]
    assert svc["spec"]["selector"].items() <= labels.items()
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1


def test_no_secret_values_outside_kind(tree: Path) -> None:
    for target in [*BASES, "overlays/local"]:
        assert not by_kind(render(tree, target), "Secret"), target



def test_local_overlays_tenancy_policy_parses_and_maps_the_local_teams() -> None:
    doc = yaml.safe_load((KUSTOMIZE / "overlays/local/tenancy-policy.yaml").read_text())
    policy = tenancy.parse(doc["data"][tenancy.POLICY_KEY])
    a = policy.resolve("team-a")
    assert a is not None and a.user == "sg-team-a"
    other = policy.resolve("t-12345678")  # the e2e suite's throwaway namespaces
    assert other is not None and other.user == "root"
