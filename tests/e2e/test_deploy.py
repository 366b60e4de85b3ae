"""Deployment artefacts against the real apiserver: manifests apply; RBAC is least privilege."""

from __future__ import annotations

import pytest

from cluster.bridge import Bridge
from tests.e2e.conftest import Kubectl

pytestmark = [pytest.mark.e2e, pytest.mark.kube_side, pytest.mark.kube_api]
SA = "system:serviceaccount:slurmgate-system:slurmgate"


def test_base_applies_server_side(admin: Kubectl, bridge: Bridge) -> None:
    p = admin.run("apply", "--dry-run=server", "-k", "kustomize/base")
    for kind in ("deployment.apps/slurmgate", "service/slurmgate-webhook",
                 "poddisruptionbudget.policy/slurmgate",
                 "mutatingwebhookconfiguration.admissionregistration.k8s.io/slurmgate"):
        assert kind in p.stdout, p.stdout


@pytest.mark.parametrize("verb,resource,extra", [
    ("get", "pods", ["-A"]), ("watch", "pods", ["-A"]), ("patch", "pods", ["-n", "default"]),
    ("create", "pods", ["-n", "default", "--subresource=binding"]),
    ("create", "pods", ["-n", "x", "--subresource=eviction"]),
    ("delete", "pods", ["-n", "default"]), ("list", "nodes", []), ("watch", "nodes", []),
    ("patch", "pods", ["-n", "default", "--subresource=status"]),
    ("create", "events", ["-n", "default"]),
    ("create", "leases.coordination.k8s.io", ["-n", "slurmgate-system"]),
    ("update", "leases.coordination.k8s.io/slurmgate-binder", ["-n", "slurmgate-system"]),
])
def test_service_account_may(admin: Kubectl, bridge: Bridge, verb: str, resource: str,
                             extra: list[str]) -> None:
    p = admin.run("auth", "can-i", verb, resource, f"--as={SA}", *extra, check=False)
    assert p.stdout.strip() == "yes", (verb, resource, p.stdout, p.stderr)


@pytest.mark.parametrize("verb,resource,extra", [
    ("get", "secrets", ["-A"]), ("list", "secrets", ["-n", "slurmgate-system"]),
    ("create", "pods", ["-n", "default"]), ("update", "pods", ["-n", "default"]),
    ("patch", "nodes", []), ("delete", "nodes", []), ("patch", "deployments.apps", ["-A"]),
    ("create", "leases.coordination.k8s.io", ["-n", "default"]),
    ("update", "leases.coordination.k8s.io/other", ["-n", "slurmgate-system"]),
    ("patch", "mutatingwebhookconfigurations.admissionregistration.k8s.io", []),
    ("create", "serviceaccounts", ["-n", "slurmgate-system", "--subresource=token"]),
    ("update", "pods", ["-n", "default", "--subresource=status"]),
])
def test_service_account_may_not(admin: Kubectl, bridge: Bridge, verb: str, resource: str,
                                 extra: list[str]) -> None:
    p = admin.run("auth", "can-i", verb, resource, f"--as={SA}", *extra, check=False)
    assert p.stdout.strip() == "no", (verb, resource, p.stdout, p.stderr)
