"""Helpers of the tests that change the tenancy policy's ConfigMap beyond a patch (delete it,
make it invalid) or map a test's namespace to a team: put the policy, watch both processes
take it (the webhook by its answers, the binder by its own metrics), and put the original
back, recreated if the test deleted it.

Both processes watch the one ConfigMap (slurmgate/tenancy_source.py); its states are
`ready`, `missing` (the ConfigMap or its key gone) and `invalid` (the text does not parse).
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from cluster.bridge import NAMESPACE, Bridge
from cluster.local import GPU_RESOURCE, Local
from slurmgate import contract, reasons, tenancy
from tests.e2e.conftest import Kubectl, scontrol_job, wait_until
from tests.e2e.faultkit import metric
from tests.e2e.test_gpus import set_gpus
from tests.e2e.test_tenancy import POLICY_CM, POLICY_KEY, _denial

# team A of the local cluster (cluster/slurm_accounting.py: Unix user sg-team-a with the
# accounts team-a and shared); what a namespace a test maps to it may do
TEAM_A: dict[str, Any] = {"user": "sg-team-a", "account": "team-a",
                          "accounts": ["team-a", "shared"], "qos": ["normal"],
                          "partitions": ["k8s"]}
TEAM_A_ALLOWS = "allowed: shared, team-a"  # how a denial lists team A's accounts
# A policy that does not parse: a misspelt field (tenancy.parse refuses unknown keys, so a
# typo cannot silently widen or narrow anything). What the refusals must name:
INVALID_POLICY = "tenants:\n  - namespaces: [nobody]\n    user: sg-team-a\n    acounts: [team-a]\n"
INVALID_FIELD = "tenants[0].acounts: unknown field"
MISSING_SAYS = (f"the tenancy policy is missing (ConfigMap {NAMESPACE}/{POLICY_CM} not found); "
                "Pods on Slurm are refused until an operator provides it")
INVALID_SAYS = "Pods on Slurm are refused until an operator fixes it"
# a denial that is the policy's state, not a decision of a usable policy
FAIL_CLOSED = (reasons.DENY_TENANCY_POLICY_MISSING, reasons.DENY_TENANCY_POLICY_INVALID,
               reasons.DENY_TENANCY_POLICY_LOADING)


def user_account(local: Local, job_id: str) -> tuple[str, str]:
    """(user, account) of a job as slurmctld holds it (`UserId=sg-team-a(1001)`)."""
    j = scontrol_job(local, job_id)
    return j["UserId"].split("(", 1)[0], j["Account"]


def set_gpus_and_wait(admin: Kubectl, node: str, count: str) -> None:
    """The Node's allocatable GPUs (a device plugin down: 0), as the API server stores them."""
    set_gpus(admin, node, count)
    wait_until(f"{node} shows {count} GPUs", lambda: admin.get("node", node)["status"][
        "allocatable"].get(GPU_RESOURCE) == count, 10)


def policy_object(admin: Kubectl) -> dict[str, Any] | None:
    p = admin.run("get", "configmap", POLICY_CM, "-n", NAMESPACE, "-o", "json", check=False)
    if p.returncode != 0:
        if "NotFound" in p.stderr:
            return None
        raise AssertionError(f"cannot read the policy ConfigMap: {p.stderr.strip()}")
    return json.loads(p.stdout)


def put_policy(admin: Kubectl, text: str, like: dict[str, Any] | None = None) -> None:
    """The policy text into the ConfigMap: patched if it exists, else created (with the
    labels and annotations of `like`, the original object)."""
    if policy_object(admin) is not None:
        admin.run("patch", "configmap", POLICY_CM, "-n", NAMESPACE, "--type=merge", "-p",
                  json.dumps({"data": {POLICY_KEY: text}}))
        return
    meta: dict[str, Any] = {"name": POLICY_CM, "namespace": NAMESPACE}
    for k in ("labels", "annotations"):
        if like and like["metadata"].get(k):
            meta[k] = like["metadata"][k]
    admin.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
                 "data": {POLICY_KEY: text}})


def delete_policy(admin: Kubectl) -> None:
    admin.run("delete", "configmap", POLICY_CM, "-n", NAMESPACE)


def binder_state(bridge: Bridge, state: str) -> bool:
    """The binder's policy source is in `state` (its gauge; it reads the same ConfigMap)."""
    return metric(bridge.binder_url, "slurmgate_binder_tenancy_policy_state",
                  f'state="{state}"') == 1.0


def binder_ready_reloads(bridge: Bridge) -> float:
    """How many usable policies the binder has taken so far (each change counts once)."""
    return metric(bridge.binder_url, "slurmgate_binder_tenancy_reloads_total",
                  'result="ready"')


def _webhook_metrics(bridge: Bridge) -> list[str]:
    """The webhook's /metrics, over TLS (the chain is checked, not the name: in-cluster the
    URL is a Pod's IP)."""
    ctx = ssl.create_default_context(cafile=str(Path(bridge.run_dir) / "certs" / "ca.crt"))
    ctx.check_hostname = False
    with urllib.request.urlopen(f"{bridge.webhook_url}/metrics", timeout=5, context=ctx) as r:
        return r.read().decode().splitlines()


def webhook_state(bridge: Bridge, state: str) -> bool:
    """The webhook's policy source is in `state`."""
    return f'slurmgate_webhook_tenancy_policy_state{{state="{state}"}} 1.0' in \
        _webhook_metrics(bridge)


def webhook_ready_reloads(bridge: Bridge) -> float:
    """The webhook's count of usable policies taken."""
    name = "slurmgate_webhook_tenancy_reloads_total"
    return sum(float(line.rsplit(" ", 1)[1]) for line in _webhook_metrics(bridge)
               if line.startswith(name) and 'result="ready"' in line)


def fail_closed_reason(admin: Kubectl, ns: str) -> str | None:
    """The reason admission refuses a plain marked Pod in `ns` for the policy's own state
    (missing, invalid, loading), or None: the webhook decides by a usable policy."""
    said = _denial(admin, ns, {})
    return next((r for r in FAIL_CLOSED if r in said), None)


def with_tenant(text: str, ns: str, body: dict[str, Any] | None = None) -> str:
    """The policy `text` with namespace `ns` as a tenant of its own (team A by default)."""
    doc = yaml.safe_load(text)
    doc.setdefault("tenants", []).append({"namespaces": [ns], **(body or TEAM_A)})
    return yaml.safe_dump(doc)


def apply_and_wait(admin: Kubectl, bridge: Bridge, text: str, applied: Any,
                   what: str, like: dict[str, Any] | None = None) -> None:
    """Put a usable policy and wait until the webhook answers by it (`applied()`, a probe of
    admission) and the binder took it too (one more ready reload)."""
    before = binder_ready_reloads(bridge)
    put_policy(admin, text, like)
    wait_until(f"webhook applies {what}", applied, 30)
    wait_until(f"binder applies {what}", lambda: binder_ready_reloads(bridge) > before, 30)


def _same_policy(now: str | None, original: str) -> bool:
    """Whether putting `original` back changes nothing the processes would count: the same
    policy (text or meaning) is in force now."""
    if now is None:
        return False
    try:
        return now == original or tenancy.parse(now) == tenancy.parse(original)
    except tenancy.PolicyError:
        return False


@contextmanager
def policy_kept(admin: Kubectl, bridge: Bridge, probe_ns: str) -> Iterator[dict[str, Any]]:
    """Yields the policy ConfigMap as it was; afterwards it is put back as it was (recreated
    if the block deleted it), and both processes run on a usable policy again: the webhook
    no longer refuses a probe in `probe_ns` for the policy's state, and the binder's source
    is ready."""
    original = policy_object(admin)
    assert original is not None, f"no ConfigMap {NAMESPACE}/{POLICY_CM} to start from"
    text = original["data"][POLICY_KEY]
    try:
        yield original
    finally:
        now = policy_object(admin)
        if not _same_policy((now or {}).get("data", {}).get(POLICY_KEY), text):
            binder, webhook = binder_ready_reloads(bridge), webhook_ready_reloads(bridge)
            put_policy(admin, text, original)
            # each process counts the original once more when it takes it back
            wait_until("webhook back on the original policy",
                       lambda: webhook_ready_reloads(bridge) > webhook, 30)
            wait_until("binder back on the original policy",
                       lambda: binder_ready_reloads(bridge) > binder, 30)
        wait_until("webhook on a usable policy",
                   lambda: fail_closed_reason(admin, probe_ns) is None, 30)
        wait_until("binder on a usable policy", lambda: binder_state(bridge, "ready"), 30)


@contextmanager
def team_a_namespace(admin: Kubectl, bridge: Bridge, ns: str) -> Iterator[str]:
    """Namespace `ns` mapped to team A for the block (the policy as it was afterwards)."""
    with policy_kept(admin, bridge, ns) as original:
        apply_and_wait(admin, bridge, with_tenant(original["data"][POLICY_KEY], ns),
                       lambda: TEAM_A_ALLOWS in _denial(admin, ns, {
                           contract.A_ACCOUNT: "team-b"}),
                       f"{ns} as team A")
        yield ns
