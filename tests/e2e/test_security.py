"""Security checks against the running webhook process and the deployed configuration:
TLS only, TLS >= 1.2, certificate reload without a restart, no secrets in logs, Pods only."""

from __future__ import annotations

import hashlib
import http.client
import shutil
import socket
import ssl
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from cluster import bridge as bridge_mod
from cluster.bridge import Bridge
from cluster.kube import _alive
from cluster.local import Local
from slurmgate import contract
from tests.e2e.conftest import Kubectl, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.kube_side, pytest.mark.kube_api]


def _addr(bridge: Bridge) -> tuple[str, int]:
    """Where the webhook serves: 127.0.0.1 as a host process, a Pod IP in-cluster."""
    u = urllib.parse.urlsplit(bridge.webhook_url)
    assert u.hostname and u.port
    return u.hostname, u.port


# a name the serving certificate carries in both modes (the Service's, as the apiserver uses)
SERVER_NAME = "slurmgate-webhook.slurmgate-system.svc"


def _ca(bridge: Bridge) -> str:
    return str(Path(bridge.run_dir) / "certs" / "ca.crt")


def served_cert(bridge: Bridge) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(_addr(bridge), timeout=5) as s, \
            ctx.wrap_socket(s) as t:
        der = t.getpeercert(binary_form=True)
    assert der
    return der


def test_plain_http_to_webhook_fails(bridge: Bridge) -> None:
    conn = http.client.HTTPConnection(*_addr(bridge), timeout=5)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        body = resp.read()
    except (ConnectionError, http.client.HTTPException, OSError):
        return  # refused at the TLS layer: what we want
    finally:
        conn.close()
    assert resp.status >= 400 and body != b"ok", (resp.status, body[:100])


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1])
def test_tls_below_1_2_refused(bridge: Bridge, version: ssl.TLSVersion) -> None:
    ctx = ssl.create_default_context(cafile=_ca(bridge))
    ctx.set_ciphers("DEFAULT:@SECLEVEL=0")  # let the client offer old versions at all
    ctx.minimum_version = version
    ctx.maximum_version = version
    with pytest.raises((ssl.SSLError, ConnectionResetError)), \
            socket.create_connection(_addr(bridge), timeout=5) as s, \
            ctx.wrap_socket(s, server_hostname=SERVER_NAME):
        pass


@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3])
def test_tls_1_2_and_1_3_accepted(bridge: Bridge, version: ssl.TLSVersion) -> None:
    ctx = ssl.create_default_context(cafile=_ca(bridge))
    ctx.minimum_version = ctx.maximum_version = version
    with socket.create_connection(_addr(bridge), timeout=5) as s, \
            ctx.wrap_socket(s, server_hostname=SERVER_NAME) as t:
        assert t.version() == {ssl.TLSVersion.TLSv1_2: "TLSv1.2",
                               ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]


@pytest.mark.hostprocs
def test_certificate_reloaded_without_restart(bridge: Bridge, tmp_path: Path) -> None:
    certs = Path(bridge.run_dir) / "certs"
    pid = bridge.pids["webhook"]
    original = served_cert(bridge)
    keep = tmp_path / "orig"
    keep.mkdir()
    for f in ("tls.crt", "tls.key"):
        shutil.copy2(certs / f, keep / f)
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "certs", "webhook", "--out", str(fresh),
                    "--namespace", bridge_mod.NAMESPACE, "--service", "slurmgate-webhook",
                    "--ip", "127.0.0.1"], check=True, cwd=bridge_mod.REPO,
                   capture_output=True, timeout=60)
    new_der = ssl.PEM_cert_to_DER_cert((fresh / "tls.crt").read_text().split(
        "-----END CERTIFICATE-----")[0] + "-----END CERTIFICATE-----\n")
    assert new_der != original
    try:
        for f in ("tls.key", "tls.crt"):
            shutil.copyfile(fresh / f, certs / f)  # in place, as a Secret update would
        wait_until("webhook serves the new certificate", lambda: served_cert(bridge) == new_der,
                   15)
        assert bridge.pids["webhook"] == pid
        assert _alive(pid), "the webhook restarted instead of reloading"
    finally:
        for f in ("tls.key", "tls.crt"):
            shutil.copyfile(keep / f, certs / f)
        # the apiserver's caBundle is for the original CA: put it back before the next test
        wait_until("webhook serves the original certificate again",
                   lambda: served_cert(bridge) == original, 15)
    digest = hashlib.sha256(new_der).hexdigest()[:12]
    print(f"reloaded to cert sha256 {digest}... and back")


@pytest.mark.hostprocs
def test_no_secret_in_logs(local: Local, bridge: Bridge) -> None:
    jwt = local.slurm.token_file.read_text().strip()
    kc = Path(bridge.kubeconfig).read_text()
    sa_token = kc.split("token:", 1)[1].split("}", 1)[0].strip()
    assert len(jwt) > 40 and len(sa_token) > 40
    secrets = {"slurm JWT": jwt, "JWT signature": jwt.rsplit(".", 1)[-1],
               "ServiceAccount token": sa_token,
               "SA token signature": sa_token.rsplit(".", 1)[-1]}
    logs = sorted((Path(bridge.run_dir) / "log").glob("*.log"))
    assert {p.name for p in logs} >= {"webhook.log", "binder.log"}
    for p in logs:
        text = p.read_text(errors="replace")
        for what, s in secrets.items():
            assert s not in text, f"{what} found in {p}"


def test_webhook_configuration_mutates_only_pod_creation(admin: Kubectl) -> None:
    mwc = admin.get("mutatingwebhookconfiguration", "slurmgate")
    assert len(mwc["webhooks"]) == 1
    (wh,) = mwc["webhooks"]
    assert wh["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                            "resources": ["pods"], "scope": "Namespaced"}]
    assert wh["objectSelector"] == {"matchLabels": {contract.MARK_LABEL: contract.MARK_VALUE}}
    assert wh["sideEffects"] == "NoneOnDryRun"
    assert wh["failurePolicy"] == "Fail"
    # host processes: a URL; in-cluster: the Service (the base's clientConfig)
    assert wh["clientConfig"].get("url", "https://").startswith("https://")
    assert wh["clientConfig"].get("service", {"name": "slurmgate-webhook",
                                             "namespace": "slurmgate-system"}).items() >= {
        "name": "slurmgate-webhook", "namespace": "slurmgate-system"}.items()
    assert ("url" in wh["clientConfig"]) != ("service" in wh["clientConfig"])
    expr = wh["namespaceSelector"]["matchExpressions"]
    assert {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", "slurmgate-system"]} in expr
    # RBAC: it may not touch Secrets at all
    sa = "system:serviceaccount:slurmgate-system:slurmgate"
    for verb in ("get", "list", "watch"):
        p = admin.run("auth", "can-i", verb, "secrets", "--as", sa, "-A", check=False)
        assert p.stdout.strip() == "no", (verb, p.stdout)
