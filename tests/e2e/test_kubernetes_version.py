"""The control plane runs the Kubernetes release it was asked for (K8S_VERSION, else the one
cluster/versions.env pins), as the API server itself reports it: a lane of the matrix that is
meant to test the oldest supported release fails here if it quietly ran another."""

from __future__ import annotations

import json

import pytest

from cluster.kube import k8s_version
from tests.e2e.conftest import Kubectl

pytestmark = pytest.mark.e2e


def test_the_api_server_is_the_kubernetes_release_asked_for(admin: Kubectl) -> None:
    server = json.loads(admin.run("version", "-o", "json").stdout)["serverVersion"]
    want = k8s_version()
    assert server["gitVersion"] == f"v{want}", server
    assert (server["major"], server["minor"]) == tuple(want.split(".")[:2]), server
