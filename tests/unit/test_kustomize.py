"""`kubectl kustomize` renders the base, its components and every overlay as intended; the
Containerfile builds the image the Deployment runs.

Every overlay renders as it is in git, which the tests prove on a copy of exactly what git
holds (no git-ignored generated/ file). What is per cluster is an overlay made at run time on
top of one in git, in a temporary copy of kustomize/, by the real code: `make certs` and
cluster/bridge.py's make_certs() (overlays/local-run: the caBundle, and the webhook URL with the
port offset), cluster/incluster.py's _run_overlay() (overlays/local-incluster-run).
"""

from __future__ import annotations

import base64
import importlib
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml

from cluster import bridge, incluster
from cluster.local import Local
from slurmgate import contract, tenancy
from slurmgate.webhook import config as webhook_config

ROOT = Path(__file__).resolve().parents[2]
KUSTOMIZE = ROOT / "kustomize"
NS = "slurmgate-system"
LOCAL_URL = "https://127.0.0.1:9443/mutate"
BASES = ["base", "base/core", "base/webhook-config", "base/deployment"]
OVERLAYS = sorted(p.name for p in (KUSTOMIZE / "overlays").iterdir() if p.is_dir())
RUN_WEBHOOK_PORT = 9443 + 37  # a port offset, as SLURMGATE_PORT_OFFSET=37 gives bridge.py
CERT_MANAGER = "components/cert-manager"
WEBHOOK_TLS = "slurmgate-webhook-tls"  # the Secret the Deployment mounts
IMAGE = "ghcr.io/slurmgate/slurmgate"  # the name the base's Deployment uses

Doc = dict[str, Any]


def _kustomization_at(path: Path) -> Doc:
    doc: Doc = yaml.safe_load((path / "kustomization.yaml").read_text())
    return doc


def _kustomization(target: str) -> Doc:
    return _kustomization_at(KUSTOMIZE / target)


# the overlays that take their certificate from cert-manager (and run the Deployment)
CERT_MANAGER_OVERLAYS = [f"overlays/{o}" for o in OVERLAYS
                         if f"../../{CERT_MANAGER}" in (_kustomization(f"overlays/{o}")
                                                       .get("components") or [])]
# everything that deploys the webhook + binder in-cluster (the whole base)
IN_CLUSTER = ["base", *(f"overlays/{o}" for o in OVERLAYS
                        if "../../base" in _kustomization(f"overlays/{o}")["resources"])]
INCLUSTER = "overlays/local-incluster"
LOCAL_IMAGE = "localhost/slurmgate/slurmgate"  # what `make image` builds (mk/image.mk)
PUSH_TOKEN_DIR = "/etc/slurmgate/push-token"

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


def _kubectl_kustomize(path: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("kubectl") is None:
        pytest.skip("needs kubectl")
    return subprocess.run(["kubectl", "kustomize", str(path)], capture_output=True, text=True,
                          check=False)


def _in_git() -> list[Path]:
    """kustomize/'s files as a fresh clone has them once the work tree is committed: tracked
    or untracked, never git-ignored (generated/). Without git: all but generated/ dirs."""
    res = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard",
                          "--", "kustomize"], cwd=ROOT, capture_output=True, check=False)
    if res.returncode != 0:
        return [p.relative_to(KUSTOMIZE) for p in KUSTOMIZE.rglob("*")
                if p.is_file() and "generated" not in p.relative_to(KUSTOMIZE).parts]
    return [Path(f).relative_to("kustomize") for f in res.stdout.decode().split("\0")
            if f and (ROOT / f).is_file()]  # (a file deleted but not yet committed: gone)


def _copy_as_in_git(dst: Path) -> Path:
    for rel in _in_git():
        (dst / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(KUSTOMIZE / rel, dst / rel)
    assert not list(dst.rglob("generated"))
    return dst


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of kustomize/ as git holds it: nothing generated."""
    return _copy_as_in_git(tmp_path_factory.mktemp("kustomize") / "kustomize")


@pytest.fixture(scope="module")
def bridge_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run dir cluster/bridge.py's make_certs() makes (certs, its copy of kustomize/ with
    overlays/local-run), its webhook port offset as SLURMGATE_PORT_OFFSET=37 gives it."""
    run_dir = tmp_path_factory.mktemp("bridge")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bridge, "WEBHOOK_PORT", RUN_WEBHOOK_PORT)
        bridge.make_certs(run_dir)
    return run_dir


def _docs(res: subprocess.CompletedProcess[str]) -> list[Doc]:
    assert res.returncode == 0, res.stderr
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def render(tree: Path, target: str) -> list[Doc]:
    return _docs(_kubectl_kustomize(tree / target))


def by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[Doc], kind: str) -> Doc:
    (d,) = by_kind(docs, kind)
    return d


def webhook_service(docs: list[Doc]) -> Doc:
    (d,) = [s for s in by_kind(docs, "Service") if s["metadata"]["name"] == "slurmgate-webhook"]
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
    assert {"local", "kind", "cert-manager"} <= set(OVERLAYS)
    assert {"overlays/kind", "overlays/cert-manager"} <= set(CERT_MANAGER_OVERLAYS)


def test_tree_is_what_git_holds(tree: Path) -> None:
    """So every render from `tree` is one without generated files, as on a fresh clone."""
    assert not list(tree.rglob("generated"))
    assert {p.name for p in (tree / "overlays").iterdir()} == set(OVERLAYS)
    assert (tree / "overlays/local/kustomization.yaml").is_file()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_renders_without_generated_files(tmp_path: Path, overlay: str) -> None:
    """Every overlay renders out of the box, from what git holds (no generated/), and carries
    nothing per cluster: no caBundle (cert-manager injects it, or a run-time overlay adds it)."""
    copy = _copy_as_in_git(tmp_path / "k")
    text = (copy / "overlays" / overlay / "kustomization.yaml").read_text()
    assert "generated/" not in text.split("apiVersion:", 1)[1]  # comments aside
    docs = _docs(_kubectl_kustomize(copy / "overlays" / overlay))
    assert not by_kind(docs, "Secret")
    assert "caBundle" not in _webhook(docs)["clientConfig"]
    assert bool(by_kind(docs, "Deployment")) == (f"overlays/{overlay}" in IN_CLUSTER)


def _webhook(docs: list[Doc]) -> Doc:
    mwc = one(docs, "MutatingWebhookConfiguration")
    assert mwc["metadata"]["name"] == "slurmgate"
    (hook,) = mwc["webhooks"]
    return hook


@pytest.mark.parametrize("target", ["base", "base/webhook-config"]
                         + [f"overlays/{o}" for o in OVERLAYS])
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

    # the host's webhook process; its caBundle is per cluster (overlays/local-run)
    assert _webhook(render(tree, "overlays/local"))["clientConfig"] == {"url": LOCAL_URL}

    # cert-manager's cainjector fills in the caBundle in the cluster; local-incluster's comes
    # from its run-time overlay (test_incluster_run_overlay)
    for target in [*CERT_MANAGER_OVERLAYS, INCLUSTER]:
        assert _webhook(render(tree, target))["clientConfig"] == {"service": service}, target


def test_bridge_applies_local_run_overlay(bridge_run: Path) -> None:
    """What bridge.up applies: overlays/local-run of make_certs's copy, i.e. overlays/local with
    this cluster's caBundle and the webhook URL on its offset port."""
    run = bridge.overlay(bridge_run)
    assert run == bridge_run / "kustomize/overlays/local-run"
    assert _kustomization_at(run)["resources"] == ["../local"]
    assert not list((bridge_run / "kustomize").rglob("generated"))
    client = _webhook(_docs(_kubectl_kustomize(run)))["clientConfig"]
    assert set(client) == {"url", "caBundle"}
    assert client["url"] == f"https://127.0.0.1:{RUN_WEBHOOK_PORT}/mutate"
    assert base64.b64decode(client["caBundle"]) == (bridge_run / "certs/ca.crt").read_bytes()


def test_local_run_overlay_changes_only_the_client_config(tree: Path, bridge_run: Path) -> None:
    def strip(docs: list[Doc]) -> list[Doc]:
        for d in docs:
            if d["kind"] == "MutatingWebhookConfiguration":
                for hook in d["webhooks"]:
                    hook.pop("clientConfig")
        return docs

    local = render(tree, "overlays/local")
    run = _docs(_kubectl_kustomize(bridge.overlay(bridge_run)))
    assert _webhook(run)["clientConfig"] != _webhook(local)["clientConfig"]
    assert strip(run) == strip(local)


def test_make_certs_renders_local_with_the_ca_bundle(tmp_path: Path) -> None:
    """`make certs` + `make render-local`: the complete local config, with the caBundle, made
    in RUN_DIR; nothing is written into the checkout."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    _kubectl_kustomize(KUSTOMIZE)  # skips without kubectl
    before = sorted(KUSTOMIZE.rglob("*"))
    res = subprocess.run(["make", "-s", "--no-print-directory", "render-local",
                          f"RUN_DIR={tmp_path}", f"PYTHON={sys.executable}", "KUBECTL=kubectl"],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert sorted(KUSTOMIZE.rglob("*")) == before
    # the certificate CLI's report, then the rendered YAML
    docs = [d for d in yaml.safe_load_all(res.stdout[res.stdout.index("apiVersion:"):]) if d]
    client = _webhook(docs)["clientConfig"]
    assert client == {"url": LOCAL_URL, "caBundle": client["caBundle"]}
    assert base64.b64decode(client["caBundle"]) == (tmp_path / "certs/ca.crt").read_bytes()
    run = tmp_path / "kustomize/overlays/local-run"
    assert _kustomization_at(run)["resources"] == ["../local"]
    assert _docs(_kubectl_kustomize(run)) == docs
    assert not list((tmp_path / "kustomize").rglob("generated"))


@pytest.mark.parametrize("target", CERT_MANAGER_OVERLAYS)
def test_cert_manager_issues_the_mounted_certificate(tree: Path, target: str) -> None:
    docs = render(tree, target)
    issuers = {d["metadata"]["name"]: d for d in by_kind(docs, "Issuer")}
    certs = {d["metadata"]["name"]: d for d in by_kind(docs, "Certificate")}
    assert not by_kind(docs, "ClusterIssuer")
    for d in [*issuers.values(), *certs.values()]:
        assert d["apiVersion"] == "cert-manager.io/v1"
        assert d["metadata"]["namespace"] == NS

    # the annotation names an existing Certificate ...
    mwc = one(docs, "MutatingWebhookConfiguration")
    ref = mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    ns, name = ref.split("/")
    assert ns == NS and name in certs
    # ... the one whose Secret the webhook container serves
    serving = certs[name]["spec"]
    dep = one(docs, "Deployment")
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert serving["secretName"] == volumes["tls"]["secret"]["secretName"] == WEBHOOK_TLS
    assert not serving.get("isCA")
    svc = webhook_service(docs)["metadata"]
    host = f"{svc['name']}.{svc['namespace']}.svc"
    assert serving["dnsNames"] == [host, f"{host}.cluster.local"]
    assert "server auth" in serving["usages"]
    # The serving cert's CA Issuer signs with the CA Certificate's Secret, which the
    # self-signed Issuer issues: cainjector's caBundle (the Secret's ca.crt) is that CA.
    ca_issuer = issuers[serving["issuerRef"]["name"]]
    assert serving["issuerRef"]["kind"] == "Issuer"
    (ca_cert,) = [c["spec"] for c in certs.values()
                  if c["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"]]
    assert ca_cert["isCA"] is True and ca_cert["issuerRef"]["kind"] == "Issuer"
    assert issuers[ca_cert["issuerRef"]["name"]]["spec"] == {"selfSigned": {}}


@pytest.mark.parametrize("target", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
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


def test_local_webhook_url_is_the_bridge_default() -> None:
    """overlays/local's committed URL is the port the host's webhook listens on without an
    offset (bridge.py), the one `make certs` patches in (LOCAL_WEBHOOK_URL)."""
    assert LOCAL_URL == "https://127.0.0.1:9443/mutate"
    assert bridge.WEBHOOK_PORT - bridge.PORT_OFFSET == 9443
    mk = (ROOT / "mk/deploy.mk").read_text()
    assert re.search(rf"^LOCAL_WEBHOOK_URL \?= {re.escape(LOCAL_URL)}$", mk, flags=re.M)


def test_config_map(tree: Path) -> None:
    maps = {d["metadata"]["name"]: d for d in by_kind(render(tree, "base"), "ConfigMap")}
    data = maps["slurmgate-config"]["data"]
    assert data["FAIL_OPEN"] == "false"
    # the webhook reads the map as it ships: waits for Slurm's answer, as docs/reference.md says
    assert webhook_config.load([], data).admission.submit_budget == 0.0
    assert webhook_config.load([], data).admission.long_grace == "clamp"
    assert {"SLURMREST_URL", "SLURM_USER", "DEFAULT_PARTITION"} <= set(data)
    # tenancy on by default, pointing at the policy the base deploys
    assert data["TENANCY_CONFIGMAP"] == "slurmgate-system/slurmgate-tenancy"
    # the example policy parses, under the key and name the RBAC grants
    assert tenancy.parse(maps["slurmgate-tenancy"]["data"][tenancy.POLICY_KEY]).tenants


def _image_entry(target: str) -> Doc | None:
    """The `images:` entry of target's kustomization.yaml for IMAGE, if any."""
    entries = [e for e in _kustomization(target).get("images") or [] if e["name"] == IMAGE]
    assert len(entries) <= 1
    return entries[0] if entries else None


def _configured_image(target: str) -> str:
    """The image target deploys: the base's one entry, then the overlay's (if it has one)."""
    base = _image_entry("base/deployment")
    assert base is not None
    name, tag = base.get("newName", IMAGE), base["newTag"]
    if target.startswith("overlays/") and (over := _image_entry(target)) is not None:
        name, tag = over.get("newName", name), over.get("newTag", tag)
    return f"{name}:{tag}"


def test_image_is_configured_in_one_place() -> None:
    """The release image's name and tag are the `images:` entry of base/deployment, nowhere
    else in the base: `kustomize edit set image ghcr.io/slurmgate/slurmgate=...` changes it."""
    kustomizations = sorted(p.parent.relative_to(KUSTOMIZE).as_posix()
                            for p in (KUSTOMIZE / "base").rglob("kustomization.yaml"))
    assert [k for k in kustomizations if _kustomization(k).get("images")] == ["base/deployment"]
    (entry,) = _kustomization("base/deployment")["images"]
    assert entry["name"] == IMAGE and "digest" not in entry
    # the tag is the package version
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert entry["newTag"] == version
    # deployment.yaml names the image only, so the tag cannot drift between the containers
    dep = yaml.safe_load((KUSTOMIZE / "base/deployment/deployment.yaml").read_text())
    assert {c["image"] for c in dep["spec"]["template"]["spec"]["containers"]} == {IMAGE}


@pytest.mark.parametrize("target", IN_CLUSTER)
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
        assert c["image"] == _configured_image(target)
        if target == "overlays/kind":  # loaded into the kind nodes, never pulled
            assert c["image"] == f"{LOCAL_IMAGE}:dev"
            assert c["imagePullPolicy"] == "Never"
        elif target == INCLUSTER:  # imported into the real Node's containerd (test_incluster_*)
            assert c["imagePullPolicy"] == "Never"
        else:
            assert c["imagePullPolicy"] == "IfNotPresent"

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

    # made out of band (base) or by cert-manager (the overlays): never a rendered Secret
    assert tls_name == WEBHOOK_TLS
    assert not by_kind(docs, "Secret")

    svc = webhook_service(docs)
    assert svc["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https",
                                     "protocol": "TCP"}]
    assert svc["spec"]["selector"].items() <= labels.items()
    # the push Service: the Deployment's Pods, and of them only the one the binder labels
    # while it leads (binder/leader.py label_own_pod, from POD_NAME + POD_NAMESPACE)
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    assert set(services) == {"slurmgate-webhook", "slurmgate-binder"}
    push = services["slurmgate-binder"]["spec"]
    assert push["selector"] == {**{k: v for k, v in labels.items()
                                   if k == "app.kubernetes.io/name"},
                                contract.LEADER_LABEL: "true"}
    assert push["ports"] == [{"name": "http-push", "port": 8080, "targetPort": "http-metrics",
                              "protocol": "TCP"}]
    binder_env = {e["name"]: e for e in binder.get("env") or []}
    assert binder_env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.namespace"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] == 1


def _base_tag() -> str:
    (entry,) = _kustomization("base/deployment")["images"]
    return str(entry["newTag"])


def _containers(docs: list[Doc]) -> dict[str, Doc]:
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    return {c["name"]: c for c in pod["containers"]}


def _config(docs: list[Doc], name: str = "slurmgate-config") -> dict[str, str]:
    (cm,) = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"] == name]
    data: dict[str, str] = cm["data"]
    return data


def test_incluster_runs_the_local_image_on_its_node(tree: Path) -> None:
    """overlays/local-incluster: the image `make image` builds, tagged as the release (the
    base's tag), imported into the Node and never pulled; on the real Node that is not a Slurm
    node."""
    docs = render(tree, INCLUSTER)
    assert _base_tag() == tomllib.loads(
        (ROOT / "pyproject.toml").read_text())["project"]["version"]
    containers = _containers(docs)
    assert set(containers) == {"webhook", "binder"}
    for c in containers.values():
        assert c["image"] == f"{LOCAL_IMAGE}:{_base_tag()}"
        assert c["imagePullPolicy"] == "Never"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {incluster.ROLE_LABEL: "slurmgate"}
    assert incluster.ROLE_LABEL == "slurmgate.io/local-role"


@pytest.mark.parametrize("target", IN_CLUSTER)
def test_push_token_secret_is_optional_and_binder_only(tree: Path, target: str) -> None:
    docs = render(tree, target)
    volumes = {v["name"]: v for v in one(docs, "Deployment")["spec"]["template"]["spec"]
               ["volumes"]}
    (name,) = [n for n, v in volumes.items()
               if (v.get("secret") or {}).get("secretName") == "slurmgate-push-token"]
    assert volumes[name]["secret"]["optional"] is True
    containers = _containers(docs)
    mounts = {c: {m["name"]: m["mountPath"] for m in containers[c]["volumeMounts"]}
              for c in containers}
    assert mounts["binder"][name] == PUSH_TOKEN_DIR
    assert name not in mounts["webhook"]
    assert PUSH_TOKEN_DIR not in mounts["webhook"].values()


def test_push_token_file_set_only_in_incluster(tree: Path) -> None:
    """The base turns the push endpoint off (""); local-incluster points it at the binder's
    mount of the Secret that cluster/incluster.py creates."""
    assert _config(render(tree, "base"))["SLURM_PUSH_TOKEN_FILE"] == ""
    data = _config(render(tree, INCLUSTER))
    assert data["SLURM_PUSH_TOKEN_FILE"] == f"{PUSH_TOKEN_DIR}/token"
    assert data["SLURM_USER"] == "root"
    assert _config(render(tree, "base"))["SLURM_USER"] != "root"


def test_kill_wait_is_the_clusters_own(tree: Path) -> None:
    """The binder bounds an eviction's grace by Slurm's KillWait: Slurm's default in the base,
    the local cluster's own in local-incluster (a longer one would let a Pod outlive its
    placeholder's node)."""
    from cluster import slurm_conf

    assert _config(render(tree, "base"))["SLURM_KILL_WAIT"] == "30"
    assert _config(render(tree, INCLUSTER))["SLURM_KILL_WAIT"] == str(slurm_conf.KILL_WAIT)


def test_incluster_tenancy_is_the_local_one(tree: Path) -> None:
    """Both local overlays take the local tenancy policy (components/local-tenancy), not the
    base's example."""
    component = yaml.safe_load(
        (KUSTOMIZE / "components/local-tenancy/tenancy-policy.yaml").read_text())["data"]
    local = _config(render(tree, "overlays/local"), "slurmgate-tenancy")
    assert local == component
    assert _config(render(tree, INCLUSTER), "slurmgate-tenancy") == local
    assert _config(render(tree, "base"), "slurmgate-tenancy") != local
    assert INCLUSTER.removeprefix("overlays/") == incluster.OVERLAY


INCLUSTER_CA_BUNDLE = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nfake\n").decode()


def _incluster_run(run_dir: Path, image: str) -> list[Doc]:
    """cluster/incluster.py's run-time overlay, made in run_dir with a stand-in for the Local
    (it reads kube.server and slurm.rest_url) and a fake caBundle, rendered."""
    (run_dir / "certs").mkdir()
    (run_dir / "certs/ca-bundle.b64").write_text(INCLUSTER_CA_BUNDLE + "\n")
    local = cast(Local, SimpleNamespace(
        kube=SimpleNamespace(server="https://127.0.0.1:16443"),
        slurm=SimpleNamespace(rest_url="http://127.0.0.1:16820")))
    out = incluster._run_overlay(local, run_dir, image, "10.77.0.2",
                                 {"BINDER_ORPHAN_GRACE": "10"})
    assert out == run_dir / "kustomize/overlays/local-incluster-run"  # what down() deletes
    assert not list((run_dir / "kustomize").rglob("generated"))
    return _docs(_kubectl_kustomize(out))


def test_incluster_run_overlay(tmp_path: Path) -> None:
    """cluster/incluster.py's run-time overlay on local-incluster: the apiserver at the Node's
    IP (no kube-proxy), slurmrestd there too, this cluster's caBundle and the image built
    (here `make image`'s default name:tag)."""
    image = f"{LOCAL_IMAGE}:{_base_tag()}"
    docs = _incluster_run(tmp_path, image)

    api_env = [{"name": "KUBERNETES_SERVICE_HOST", "value": "10.77.0.2"},
               {"name": "KUBERNETES_SERVICE_PORT", "value": "16443"}]
    containers = _containers(docs)
    assert containers["webhook"]["env"] == api_env
    assert containers["binder"]["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE",
         "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        *api_env]
    for c in containers.values():
        assert c["image"] == image and c["imagePullPolicy"] == "Never"

    data = _config(docs)
    assert data["SLURMREST_URL"] == "http://10.77.0.2:16820"
    assert data["BINDER_ORPHAN_GRACE"] == "10"
    assert data["SLURM_PUSH_TOKEN_FILE"] == f"{PUSH_TOKEN_DIR}/token"  # the overlay's, kept
    client = _webhook(docs)["clientConfig"]
    assert client["caBundle"] == INCLUSTER_CA_BUNDLE
    assert client["service"]["name"] == "slurmgate-webhook"
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {incluster.ROLE_LABEL: "slurmgate"}
    assert not by_kind(docs, "Secret")


def test_incluster_run_overlay_sets_any_image(tmp_path: Path) -> None:
    """`make image IMAGE_TAG=...` (or IMAGE_NAME=...): the Pods run the image built."""
    image = "localhost/slurmgate/other:0.1.0-abc123"
    for c in _containers(_incluster_run(tmp_path, image)).values():
        assert c["image"] == image


def test_no_secret_values_anywhere(tree: Path) -> None:
    for target in [*BASES, *(f"overlays/{o}" for o in OVERLAYS)]:
        assert not by_kind(render(tree, target), "Secret"), target



def test_local_overlays_tenancy_policy_parses_and_maps_the_local_teams() -> None:
    doc = yaml.safe_load((KUSTOMIZE / "components/local-tenancy/tenancy-policy.yaml").read_text())
    policy = tenancy.parse(doc["data"][tenancy.POLICY_KEY])
    a = policy.resolve("team-a")
    assert a is not None and a.user == "sg-team-a"
    other = policy.resolve("t-12345678")  # the e2e suite's throwaway namespaces
    assert other is not None and other.user == "root"


# --- the Containerfile ---------------------------------------------------------------------

Instruction = tuple[str, str]  # (INSTRUCTION, its arguments)


def _containerfile() -> list[list[Instruction]]:
    """The Containerfile's instructions, split into stages; stage 0 holds what precedes the
    first FROM (the global ARGs). Continuation lines are joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in (ROOT / "Containerfile").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    assert not pending
    stages: list[list[Instruction]] = [[]]
    for line in lines:
        instr, _, args = line.partition(" ")
        if instr.upper() == "FROM":
            stages.append([])
        stages[-1].append((instr.upper(), args.strip()))
    return stages


def _global_args() -> dict[str, str]:
    (pre, *_) = _containerfile()
    assert {i for i, _ in pre} <= {"ARG"}
    return dict(a.split("=", 1) for _, a in pre)


def _from(stage: list[Instruction]) -> tuple[str, str]:
    """(image, stage name) of a stage's FROM, global ARGs substituted."""
    instr, args = stage[0]
    assert instr == "FROM" and "--platform" not in args
    m = re.fullmatch(r"(\S+)(?:\s+as\s+(\S+))?", args, flags=re.I)
    assert m, args
    image, name = m.group(1), m.group(2) or ""
    for k, v in _global_args().items():
        image = image.replace(f"${{{k}}}", v).replace(f"${k}", v)
    assert "$" not in image, image
    return image, name


def test_containerfile_base_is_public_and_pinned() -> None:
    (_, *stages) = _containerfile()
    assert len(stages) >= 2  # a builder, and the runtime stage
    names: set[str] = set()  # the earlier stages' names (a FROM may name one)
    for stage in stages:
        image, name = _from(stage)
        names.add(name)
        if image in names - {name}:
            continue
        ref, _, digest = image.partition("@")
        repo, _, tag = ref.rpartition(":") if ":" in ref.split("/")[-1] else (ref, "", "")
        assert tag or digest, f"unpinned base {image}"
        assert tag != "latest", image
        if digest:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), image
        assert repo.startswith("docker.io/library/python"), image
    # the base can be swapped for a local one: --build-arg BASE=...
    assert "BASE" in _global_args()
    assert [_from(s)[0] for s in stages] == [_global_args()["BASE"]] * len(stages)


def test_containerfile_runtime_stage() -> None:
    """Non-root as the Deployment's user; only the venv comes from the builder; nothing is
    installed or written at build or run time (read-only root: HOME is /tmp)."""
    *_, final = _containerfile()
    users = [a for i, a in final if i == "USER"]
    assert users and users[-1] in {"65532", "65532:65532"}
    pod = yaml.safe_load((KUSTOMIZE / "base/deployment/deployment.yaml").read_text())
    sc = pod["spec"]["template"]["spec"]["securityContext"]
    assert (sc["runAsUser"], sc["runAsGroup"]) == (65532, 65532) and sc["runAsNonRoot"]
    assert "RUN" not in {i for i, _ in final}
    copies = [a for i, a in final if i in {"COPY", "ADD"}]
    assert copies == ["--from=builder /opt/venv /opt/venv"]
    env = " ".join(a for i, a in final if i == "ENV")
    assert "PATH=/opt/venv/bin:" in env and "HOME=/tmp" in env
    assert "PYTHONDONTWRITEBYTECODE=1" in env


def test_containerfile_installs_the_package_with_its_mapped_processes() -> None:
    """pyproject.toml is installed from the checkout (no editable install); the process folders
    it maps into the slurmgate package (package-dir) are copied too, or the install lacks them."""
    (_, builder, *_) = _containerfile()
    assert _from(builder)[1] == "builder"
    copied = {a.split()[0].rstrip("/") for i, a in builder if i == "COPY"}
    mapped = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"].values())
    assert mapped == {"webhook", "binder", "certs", "pinning"}
    assert {"pyproject.toml", "slurmgate", *mapped} <= copied
    runs = " ".join(a for i, a in builder if i == "RUN")
    assert "pip install ." in runs and "-e " not in runs and "--editable" not in runs


def test_deployment_commands_are_console_scripts() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    dep = yaml.safe_load((KUSTOMIZE / "base/deployment/deployment.yaml").read_text())
    containers = dep["spec"]["template"]["spec"]["containers"]
    assert {c["name"] for c in containers} == {"webhook", "binder"}
    for c in containers:
        (cmd,) = c["command"]  # resolved on the image's PATH (/opt/venv/bin)
        assert cmd in scripts, (c["name"], cmd)
        module, _, func = scripts[cmd].partition(":")
        assert callable(getattr(importlib.import_module(module), func)), scripts[cmd]
    assert "slurmgate-certs" in scripts
