"""Slurm's own refusals on the real cluster, in Slurm's own words (issue 29): at admission (the
webhook's denial) and in the binder's Events (a gang's job, which the binder submits).

The refusal: an account slurmdbd does not know. The local cluster enforces associations
(AccountingStorageEnforce=associations,limits,qos, cluster/slurm_accounting.py), so Slurm
refuses such a job at submit on 22.05, 24.11 and 26.05 alike with ESLURM_INVALID_ACCOUNT
("Invalid account or account/partition combination specified"). The webhook's own tenancy
check would deny that account first in every namespace the local policy names (the default
tenant may name no account at all), so the test maps a fresh namespace to a tenant whose
allowed accounts include it: then only Slurm can say no.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
import yaml

from cluster.bridge import NAMESPACE
from cluster.local import Local
from slurmgate import contract, reasons
from tests.e2e.conftest import Kubectl, marked_pod, slurm_idle, squeue, wait_until
from tests.e2e.test_tenancy import POLICY_CM, POLICY_KEY, _denial

pytestmark = pytest.mark.e2e

GHOST = f"ghost-{uuid.uuid4().hex[:6]}"  # an account slurmdbd never heard of
INVALID_ACCOUNT = "Invalid account or account/partition combination specified"  # slurm_strerror


@pytest.fixture
def ghost_ns(admin: Kubectl, local: Local, bridge: object) -> Iterator[str]:
    """A fresh namespace whose tenant (team A's Slurm user) may name GHOST, which the policy
    allows and Slurm does not know."""
    ns = f"tg-{uuid.uuid4().hex[:6]}"
    admin.run("create", "namespace", ns)
    original = admin.get("configmap", POLICY_CM, NAMESPACE)["data"][POLICY_KEY]
    doc = yaml.safe_load(original)
    doc.setdefault("tenants", []).append(
        {"namespaces": [ns], "user": "sg-team-a", "account": "team-a",
         "accounts": ["team-a", GHOST], "qos": ["normal"], "partitions": ["k8s"]})
    admin.run("patch", "configmap", POLICY_CM, "-n", NAMESPACE, "--type=merge", "-p",
              json.dumps({"data": {POLICY_KEY: yaml.safe_dump(doc)}}))
    # applied once the webhook names GHOST among the namespace's allowed accounts
    wait_until("policy applied", lambda: GHOST in _denial(
        admin, ns, {contract.A_ACCOUNT: "team-b"}), 30)
    try:
        yield ns
    finally:
        admin.run("patch", "configmap", POLICY_CM, "-n", NAMESPACE, "--type=merge", "-p",
                  json.dumps({"data": {POLICY_KEY: original}}))
        admin.run("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force",
                  check=False)
        admin.run("delete", "namespace", ns, "--wait=false", check=False)
        slurm_idle(local)


def _jobs_of(local: Local, ns: str) -> list[dict[str, str]]:
    return [r for r in squeue(local) if f"={ns}/" in r["comment"]]


def test_admission_denies_an_unknown_account_in_slurms_words(local: Local, admin: Kubectl,
                                                               ghost_ns: str) -> None:
    p = admin.apply(marked_pod("ghost", annotations={contract.A_ACCOUNT: GHOST}),
                    "-n", ghost_ns, check=False)
    said = p.stderr
    assert p.returncode != 0, p.stdout
    assert "slurmgate: Slurm refused the placeholder job: " in said, said
    assert INVALID_ACCOUNT in said, said  # Slurm's own words, not ours
    assert f"account {GHOST}" in said and "malformed" not in said, said
    # a refusal loses nothing: no Pod, no job
    assert admin.run("get", "pod", "ghost", "-n", ghost_ns, check=False).returncode != 0
    assert _jobs_of(local, ghost_ns) == []


def test_binder_event_of_a_refused_gang_is_slurms_words(local: Local, admin: Kubectl,
                                                        ghost_ns: str) -> None:
    """A gang's job is submitted by the binder, once both members are there."""
    for i in range(2):
        admin.apply(marked_pod(f"m{i}", annotations={
            contract.A_ACCOUNT: GHOST, contract.A_GROUP: "g", contract.A_GROUP_SIZE: "2",
            contract.A_GROUP_INDEX: str(i)}), "-n", ghost_ns)

    def refused() -> dict[str, str]:
        return {e["involvedObject"]["name"]: e["message"]
                for e in admin.items("events", ns=ghost_ns)
                if e["reason"] == reasons.EV_SUBMIT_REFUSED}

    wait_until("SlurmSubmitRefused on both members", lambda: len(refused()) == 2, 30)
    for name, message in refused().items():
        assert message.startswith("Slurm refused the placeholder job: "), (name, message)
        assert INVALID_ACCOUNT in message and f"account {GHOST}" in message, (name, message)
        assert "malformed" not in message, (name, message)
    assert _jobs_of(local, ghost_ns) == []
    assert not any(p["spec"].get("nodeName") for p in admin.items("pods", ns=ghost_ns))
