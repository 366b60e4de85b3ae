"""Tenancy on the real cluster with real accounting (slurmdbd + MariaDB): each namespace is a
Slurm user and account, admission enforces the operator's policy, Slurm's own limits apply per
team and the Pod shows them.

The teams (Unix users sg-team-a/b, accounts team-a/b and shared, QOS normal/batch/prod) are
created by the local cluster (cluster/slurm_accounting.py). Each test maps two fresh namespaces
to the teams by rewriting the policy ConfigMap, and puts the original back afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import yaml

from cluster.bridge import NAMESPACE
from cluster.local import Local
from slurmgate import contract
from tests.e2e.conftest import (
    Kubectl,
    job_id_of,
    marked_pod,
    slurm_cli,
    slurm_idle,
    wait_until,
)

pytestmark = pytest.mark.e2e

POLICY_CM = "slurmgate-tenancy"
POLICY_KEY = "tenancy.yaml"


@dataclass(frozen=True)
class Teams:
    a: str  # namespace of team A
    b: str


def _policy(teams: Teams, default: dict) -> str:
    return yaml.safe_dump({
        "tenants": [
            {"namespaces": [teams.a], "user": "sg-team-a", "account": "team-a",
             "accounts": ["team-a", "shared"], "qos": ["normal", "batch"],
             "partitions": ["k8s"]},
            {"namespaces": [teams.b], "user": "sg-team-b", "account": "team-b",
             "accounts": ["team-b"], "qos": ["normal"], "partitions": ["k8s"]},
        ],
        "default": default,
    })


def _denial(admin: Kubectl, ns: str, annotations: dict[str, str]) -> str:
    """Admission's answer to a Pod, without creating it (a server-side dry run goes through
    the webhook; ours submits nothing for it). Empty when admitted."""
    p = admin.run("create", "--dry-run=server", "-f", "-", "-n", ns, stdin=json.dumps(
        marked_pod(f"probe-{uuid.uuid4().hex[:6]}", annotations=annotations)), check=False)
    return "" if p.returncode == 0 else p.stderr


@pytest.fixture
def teams(admin: Kubectl, local: Local, bridge: object) -> Iterator[Teams]:
    t = Teams(f"ta-{uuid.uuid4().hex[:6]}", f"tb-{uuid.uuid4().hex[:6]}")
    for ns in (t.a, t.b):
        admin.run("create", "namespace", ns)
    cm = admin.get("configmap", POLICY_CM, NAMESPACE)
    original = cm["data"][POLICY_KEY]
    default = yaml.safe_load(original).get("default")
    admin.run("patch", "configmap", POLICY_CM, "-n", NAMESPACE, "--type=merge", "-p",
              json.dumps({"data": {POLICY_KEY: _policy(t, default)}}))
    # the webhook watches the policy: applied once a Pod of A may no longer charge B
    wait_until("policy applied", lambda: "AccountNotAllowed" in _denial(
        admin, t.a, {contract.A_ACCOUNT: "team-b"}), 30)
    try:
        yield t
    finally:
        admin.run("patch", "configmap", POLICY_CM, "-n", NAMESPACE, "--type=merge", "-p",
                  json.dumps({"data": {POLICY_KEY: original}}))
        for ns in (t.a, t.b):
            admin.run("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force",
                      check=False)
            admin.run("delete", "namespace", ns, "--wait=false", check=False)
        slurm_idle(local)


def _sacct(local: Local, job_id: str) -> tuple[str, str]:
    """(user, account) of a job as slurmdbd recorded it."""
    out = slurm_cli(local, "sacct", "-a", "-X", "-n", "-P", "-j", job_id, "-o", "User,Account")
    line = out.strip().splitlines()[0] if out.strip() else ""
    user, _, account = line.partition("|")
    return user, account


def test_a_team_cannot_borrow_another_teams_rights(admin: Kubectl, teams: Teams) -> None:
    msg = _denial(admin, teams.a, {contract.A_ACCOUNT: "team-b"})
    assert "AccountNotAllowed" in msg or "may not use account" in msg, msg
    assert teams.a in msg and "team-b" in msg and "shared, team-a" in msg, msg
    msg = _denial(admin, teams.b, {contract.A_QOS: "batch"})
    assert "QOSNotAllowed" in msg or "qos" in msg.lower(), msg
    assert teams.b in msg and "batch" in msg and "normal" in msg, msg
    msg = _denial(admin, teams.a, {contract.A_PARTITION: "hpc"})
    assert "PartitionNotAllowed" in msg or "partition" in msg, msg
    # what the policy allows passes
    assert _denial(admin, teams.a, {contract.A_ACCOUNT: "shared", contract.A_QOS: "batch"}) == ""


def test_jobs_run_as_the_teams_user_and_account(local: Local, admin: Kubectl,
                                                teams: Teams) -> None:
    admin.apply(marked_pod("a1"), "-n", teams.a)
    admin.apply(marked_pod("a2", annotations={contract.A_ACCOUNT: "shared"}), "-n", teams.a)
    admin.apply(marked_pod("b1"), "-n", teams.b)
    want = {(teams.a, "a1"): ("sg-team-a", "team-a"), (teams.a, "a2"): ("sg-team-a", "shared"),
            (teams.b, "b1"): ("sg-team-b", "team-b")}
    for (ns, name), (user, account) in want.items():
        pod = wait_until(f"{ns}/{name} bound", lambda ns=ns, name=name: (
            p := admin.get("pod", name, ns))["spec"].get("nodeName") and p, 30)
        job_id = pod["metadata"]["annotations"][contract.A_JOB_ID]
        assert wait_until(f"job {job_id} in sacct", lambda job_id=job_id: _sacct(
            local, job_id)[0] and _sacct(local, job_id), 30) == (user, account)


def test_account_limit_keeps_a_pod_gated_with_slurms_reason(local: Local, admin: Kubectl,
                                                            teams: Teams) -> None:
    slurm_cli(local, "sacctmgr", "-i", "modify", "account", "team-a", "set", "MaxJobs=2")
    try:
        for i in range(3):
            admin.apply(marked_pod(f"a{i}"), "-n", teams.a)
        admin.apply(marked_pod("b0"), "-n", teams.b)

        def bound(ns: str) -> list[str]:
            return sorted(p["metadata"]["name"] for p in admin.items("pods", ns=ns)
                          if p["spec"].get("nodeName"))

        wait_until("B's Pod bound beside A's two", lambda: bound(teams.b) == ["b0"]
                   and len(bound(teams.a)) == 2, 30)
        (held,) = [p for p in admin.items("pods", ns=teams.a) if not p["spec"].get("nodeName")]
        name = held["metadata"]["name"]
        # Slurm may first give the new job a passing reason (CI saw "Priority") and name the
        # association's limit on a later scheduler pass: the Pod must follow it there
        wait_until("Slurm's limit reason on the Pod", lambda: admin.get(
            "pod", name, teams.a)["metadata"]["annotations"].get(
                contract.A_JOB_REASON) == "AssocMaxJobsLimit", 30)
        describe = admin.run("describe", "pod", name, "-n", teams.a).stdout
        assert "AssocMaxJobsLimit" in describe  # condition/Event, where users look
        job_id = job_id_of(admin, name, teams.a)
        # fair-share is part of the pending placeholder's priority
        prio = slurm_cli(local, "sprio", "-h", "-j", job_id, "-o", "%i %u %F")
        assert prio.split()[:2] == [job_id, "sg-team-a"], prio
        # one of A's Pods ends: the held one binds
        admin.run("delete", "pod", bound(teams.a)[0], "-n", teams.a, "--wait=false")
        wait_until("the held Pod bound once the limit frees", lambda: admin.get(
            "pod", name, teams.a)["spec"].get("nodeName"), 60)
    finally:
        slurm_cli(local, "sacctmgr", "-i", "modify", "account", "team-a", "set", "MaxJobs=-1")


def test_policy_change_applies_without_restart(admin: Kubectl, teams: Teams) -> None:
    assert _denial(admin, teams.a, {contract.A_QOS: "batch"}) == ""
    doc = yaml.safe_load(admin.get("configmap", POLICY_CM, NAMESPACE)["data"][POLICY_KEY])
    doc["tenants"][0]["qos"] = ["normal"]
    admin.run("patch", "configmap", POLICY_CM, "-n", NAMESPACE, "--type=merge", "-p",
              json.dumps({"data": {POLICY_KEY: yaml.safe_dump(doc)}}))
    wait_until("batch refused to A", lambda: "batch" in _denial(
        admin, teams.a, {contract.A_QOS: "batch"}), 30)
