"""The plumbing is real: kube-scheduler binds to a kwok Node, kwok runs it; Slurm runs a job."""

from __future__ import annotations

import asyncio
import ssl
import urllib.request

import pytest

from cluster import slurm_release
from cluster.local import Local
from slurmgate import contract
from slurmgate.slurm import JobSpec, SlurmClient
from tests.e2e.conftest import Kubectl, squeue, wait_until

pytestmark = pytest.mark.e2e


def test_apiserver_ready_and_nodes_mapped(local: Local, admin: Kubectl) -> None:
    ctx = ssl.create_default_context(cafile=local.kube.ca_file)
    kc = local.kube.kubeconfig
    pki = kc.rsplit("/", 1)[0] + "/pki"
    ctx.load_cert_chain(f"{pki}/admin.crt", f"{pki}/admin.key")
    with urllib.request.urlopen(f"{local.kube.server}/readyz", context=ctx) as r:
        assert r.read() == b"ok"
    nodes = admin.items("nodes", selector=contract.NODE_LABEL)
    assert sorted(n["metadata"]["labels"][contract.NODE_LABEL] for n in nodes) == \
        sorted(local.slurm.nodes)
    slurmd = admin.items("pods", ns="slurm-system", selector=contract.SLURMD_POD_LABEL)
    assert {p["spec"]["nodeName"] for p in slurmd} == {n["metadata"]["name"] for n in nodes}


def test_kube_scheduler_binds_and_kwok_runs(admin: Kubectl, ns: str) -> None:
    # every kwok Node runs a slurmd and is tainted (test_slurm_nodes.py): this Pod, which only
    # checks the control plane, tolerates the taint, which only node infrastructure may
    admin.run("label", "namespace", ns, f"{contract.INFRA_NAMESPACE_LABEL}=true")
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
             "spec": {"containers": [{"name": "c", "image": "x"}],
                      "tolerations": [contract.TOLERATION]}}
    # the API server's namespace cache sees the label a moment later
    wait_until("plain Pod admitted", lambda: admin.apply(
        plain, "-n", ns, check=False).returncode == 0, 10)
    pod = wait_until("plain Pod Running", lambda: (
        p := admin.get("pod", "plain", ns))["status"].get("phase") == "Running" and p, 60)
    assert pod["spec"]["nodeName"].startswith("kwok-")
    assert pod["spec"].get("schedulerName") == "default-scheduler"


def test_slurm_job_runs_via_rest(local: Local) -> None:
    async def go() -> int:
        async with SlurmClient(local.slurm.rest_url, local.slurm.token_file) as c:
            want = slurm_release.release(local.slurm.version).rest_api
            assert await c.detect_version() == want
            return await c.submit(JobSpec(name="smoke", comment="smoke", memory_mb=100, cpus=1))

    job_id = asyncio.run(go())
    row = wait_until("job RUNNING", lambda: next(
        (r for r in squeue(local) if r["id"] == str(job_id) and r["state"] == "RUNNING"),
        None), 30)
    assert row["nodes"] in local.slurm.nodes

    async def cancel() -> None:
        async with SlurmClient(local.slurm.rest_url, local.slurm.token_file) as c:
            await c.cancel(job_id)

    asyncio.run(cancel())
