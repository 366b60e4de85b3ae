"""Tenancy fails closed, end to end (issue 30): `default: deny`, then the policy's ConfigMap
deleted, then present but invalid, then fixed, on the webhook (admission) and on the binder
(the submits it makes itself: a gang's job after its first one was given back).

docs/operator-guide.md "Tenancy": "a missing ConfigMap or key denies every marked Pod
(`TenancyPolicyMissing`);
a policy that does not parse keeps the last good one in force (logged, counted), and denies
(`TenancyPolicyInvalid`, naming the bad field) if there never was one", and "When the policy
changes after admission, the binder does not submit the Pod's (or gang's) job: it records a
Warning Event with the same reason and looks again as soon as the policy changes".
slurmgate/tenancy.py check(): missing and invalid-without-a-last-good refuse with those two
reasons; slurmgate/tenancy_source.py: an invalid text keeps `self._state.policy`, which is
None after `missing`, so invalid right after missing refuses too.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract, reasons
from tests.e2e.conftest import (
    Kubectl,
    marked_pod,
    slurm_idle,
    squeue,
    wait_until,
)
from tests.e2e.faultkit import bound_pods, events_of, fillers_on, pods, scancel_quiet
from tests.e2e.tenantkit import (
    INVALID_FIELD,
    INVALID_POLICY,
    INVALID_SAYS,
    MISSING_SAYS,
    TEAM_A,
    TEAM_A_ALLOWS,
    apply_and_wait,
    binder_state,
    delete_policy,
    fail_closed_reason,
    policy_kept,
    put_policy,
    set_gpus_and_wait,
    user_account,
    webhook_state,
    with_tenant,
)
from tests.e2e.test_gpus import gpu_pod
from tests.e2e.test_tenancy import POLICY_KEY, _denial

pytestmark = pytest.mark.e2e


@pytest.fixture
def listed(admin: Kubectl, local: Local, bridge: Bridge) -> Iterator[str]:
    """A second fresh namespace, the one the test's policy lists (as team A)."""
    name = f"tl-{uuid.uuid4().hex[:6]}"
    admin.run("create", "namespace", name)
    try:
        yield name
    finally:
        admin.run("delete", "pods", "--all", "-n", name, "--grace-period=0", "--force",
                  check=False)
        admin.run("delete", "namespace", name, "--wait=false", check=False)
        slurm_idle(local)


def _deny_others(listed: str) -> str:
    return yaml.safe_dump({"tenants": [{"namespaces": [listed], **TEAM_A}],
                           "default": "deny"})


def _create_refused(admin: Kubectl, ns: str, name: str, *said: str) -> None:
    """A marked Pod really created (not a dry run) is refused with all of `said`, and
    leaves no Pod behind."""
    p = admin.apply(marked_pod(name), "-n", ns, check=False)
    assert p.returncode != 0, f"{ns}/{name} admitted: {p.stdout}"
    for s in said:
        assert s in p.stderr, (s, p.stderr)
    assert admin.run("get", "pod", name, "-n", ns, check=False).returncode != 0


def _jobs_of(local: Local, *namespaces: str) -> list[dict[str, str]]:
    return [r for r in squeue(local) if any(f"={ns}/" in r["comment"] for ns in namespaces)]


def test_default_deny_then_missing_then_invalid_then_fixed(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str, listed: str) -> None:
    """`ns` is in no tenant, `listed` is team A's. Every state is checked on a real create (a
    dry run submits nothing either way) and on the binder's own view of the policy."""
    deny = _deny_others(listed)
    with policy_kept(admin, bridge, ns) as original:
        # default: deny -- the unlisted namespace is refused, the listed one admitted
        apply_and_wait(admin, bridge, deny, lambda: reasons.DENY_NAMESPACE_NOT_IN_TENANCY in
                       _denial(admin, ns, {}), "default: deny", original)
        _create_refused(admin, ns, "unlisted", reasons.DENY_NAMESPACE_NOT_IN_TENANCY,
                        f'namespace "{ns}" belongs to no tenant of the tenancy policy and the '
                        "default is deny")
        assert _denial(admin, listed, {}) == ""

        # the ConfigMap deleted: every marked Pod refused, the listed namespace's too
        delete_policy(admin)
        wait_until("webhook: policy missing", lambda: fail_closed_reason(
            admin, listed) == reasons.DENY_TENANCY_POLICY_MISSING, 30)
        wait_until("binder: policy missing", lambda: binder_state(bridge, "missing"), 30)
        for where in (listed, ns):
            _create_refused(admin, where, "while-missing", reasons.DENY_TENANCY_POLICY_MISSING,
                            MISSING_SAYS)
        # unmarked Pods never depend on slurmgate (the webhook's objectSelector)
        plain = marked_pod("plain")
        plain["metadata"]["labels"] = {"app": "plain"}
        assert admin.run("create", "--dry-run=server", "-f", "-", "-n", listed,
                         stdin=json.dumps(plain), check=False).returncode == 0

        # back, but invalid: with no good policy before it, still refused, naming the field
        put_policy(admin, INVALID_POLICY, original)
        wait_until("webhook: policy invalid", lambda: fail_closed_reason(
            admin, listed) == reasons.DENY_TENANCY_POLICY_INVALID, 30)
        wait_until("binder: policy invalid", lambda: binder_state(bridge, "invalid"), 30)
        for where in (listed, ns):
            _create_refused(admin, where, "while-invalid", reasons.DENY_TENANCY_POLICY_INVALID,
                            "the tenancy policy is invalid: ", INVALID_FIELD, INVALID_SAYS)
        assert _jobs_of(local, ns, listed) == []  # nothing was ever submitted

        # fixed: admitted again, the job runs as the tenant; the default is still deny
        put_policy(admin, deny, original)
        wait_until("webhook: policy fixed", lambda: _denial(admin, listed, {}) == "", 30)
        wait_until("binder: policy ready", lambda: binder_state(bridge, "ready"), 30)
        admin.apply(marked_pod("after-fix"), "-n", listed)
        pod = wait_until("after-fix bound", lambda: (p := admin.get(
            "pod", "after-fix", listed))["spec"].get("nodeName") and p, 30)
        job_id = pod["metadata"]["annotations"][contract.A_JOB_ID]
        assert user_account(local, job_id) == ("sg-team-a", "team-a")
        assert reasons.DENY_NAMESPACE_NOT_IN_TENANCY in _denial(admin, ns, {})


def test_an_invalid_policy_after_a_good_one_keeps_the_good_one(
        admin: Kubectl, bridge: Bridge, ns: str, listed: str) -> None:
    """The other half of "invalid": with a good policy before it, that one stays in force
    (not the invalid text, and not a refusal of everything)."""
    with policy_kept(admin, bridge, ns) as original:
        apply_and_wait(admin, bridge, _deny_others(listed),
                       lambda: reasons.DENY_NAMESPACE_NOT_IN_TENANCY in _denial(admin, ns, {}),
                       "default: deny", original)
        put_policy(admin, INVALID_POLICY, original)
        # its answers do not change, so each process's own gauge says it read the text
        wait_until("binder: policy invalid", lambda: binder_state(bridge, "invalid"), 30)
        wait_until("webhook: policy invalid", lambda: webhook_state(bridge, "invalid"), 30)
        assert _denial(admin, listed, {}) == ""  # the last good policy: listed is team A
        said = _denial(admin, ns, {})
        assert reasons.DENY_NAMESPACE_NOT_IN_TENANCY in said, said  # and its default: deny


# --------------------------------------------------------------------------- the binder


def _gpu_member(name: str, index: int) -> dict[str, Any]:
    return gpu_pod(name, 2, {contract.A_GROUP: "g", contract.A_GROUP_SIZE: "2",
                             contract.A_GROUP_INDEX: str(index)})


def _group_jobs(local: Local, ns: str, states: tuple[str, ...]) -> list[dict[str, str]]:
    return [r for r in squeue(local) if f" group={ns}/g" in r["comment"]
            and r["state"] in states]


ACTIVE = ("PENDING", "CONFIGURING", "RUNNING")


def _refused_both(admin: Kubectl, ns: str, reason: str) -> dict[str, str]:
    """Member -> message of the binder's Warning `reason`, once both members have one."""
    said = {e["involvedObject"]["name"]: e["message"] for e in events_of(admin, ns, reason)
            if e["type"] == "Warning"}
    return said if set(said) >= {"m0", "m1"} else {}


def test_binder_holds_a_gang_while_the_policy_is_missing_or_invalid(
        local: Local, admin: Kubectl, bridge: Bridge, ns: str) -> None:
    """A gang admitted under a good policy has its first job given back by the binder (the
    GPU Nodes it was allocated lost their GPUs: BINDER_GPU_GRACE, docs/operator-guide.md "GPUs"),
    which sends
    the members back to waiting and submits the group again: its own submit, with the policy
    now missing, then invalid. Each time the binder submits nothing and says why on every
    member; fixed, it submits and the gang runs as its tenant."""
    gpu_nodes = [k8s_node_name(n) for n in local.slurm.gpu_nodes]
    fillers: list[str] = []
    with policy_kept(admin, bridge, ns) as original:
        good = with_tenant(original["data"][POLICY_KEY], ns)
        apply_and_wait(admin, bridge, good, lambda: TEAM_A_ALLOWS in _denial(
            admin, ns, {contract.A_ACCOUNT: "team-b"}), f"{ns} as team A", original)
        try:
            # the GPU nodes busy, so the gang's first job waits while the stage is set
            fillers = fillers_on(local, local.slurm.gpu_nodes)
            for i in range(2):
                admin.apply(_gpu_member(f"m{i}", i), "-n", ns)
            (first,) = wait_until("the gang's job waiting", lambda: _group_jobs(
                local, ns, ("PENDING",)), 30)
            # the binder's own submit, read back from Slurm: the tenant's user and account
            assert user_account(local, first["id"]) == ("sg-team-a", "team-a")
            for node in gpu_nodes:  # a device plugin down: the Nodes show no GPUs
                set_gpus_and_wait(admin, node, "0")
            delete_policy(admin)
            wait_until("binder: policy missing", lambda: binder_state(bridge, "missing"), 30)
            scancel_quiet(local, *fillers)  # the job starts on Nodes without the GPUs

            # NodeLacksGPUs, given back after BINDER_GPU_GRACE (8 s here), submit refused
            refused = wait_until("TenancyPolicyMissing on both members", lambda: _refused_both(
                admin, ns, reasons.DENY_TENANCY_POLICY_MISSING), 60)
            for name, message in refused.items():
                assert message == MISSING_SAYS, (name, message)
            assert any(e["involvedObject"]["name"] == "m0" for e in events_of(
                admin, ns, reasons.EV_NODE_LACKS_GPUS)), "the first job was never allocated"
            assert not _group_jobs(local, ns, ACTIVE), "the binder submitted anyway"
            assert first["id"] not in {r["id"] for r in squeue(local) if r["state"] in ACTIVE}
            for name, p in pods(admin, ns).items():  # held: gated, unbound, waiting
                assert not p["spec"].get("nodeName"), name
                assert {"name": contract.GATE} in p["spec"]["schedulingGates"], name
                assert p["metadata"]["annotations"][contract.A_JOB_STATE] == \
                    contract.JOB_STATE_GROUP_PENDING, name

            # back, but invalid (no good policy before it): refused again, naming the field
            put_policy(admin, INVALID_POLICY, original)
            wait_until("binder: policy invalid", lambda: binder_state(bridge, "invalid"), 30)
            refused = wait_until("TenancyPolicyInvalid on both members", lambda: _refused_both(
                admin, ns, reasons.DENY_TENANCY_POLICY_INVALID), 30)
            for name, message in refused.items():
                assert INVALID_FIELD in message and INVALID_SAYS in message, (name, message)
            assert not _group_jobs(local, ns, ACTIVE), "the binder submitted anyway"
            assert not any(p["spec"].get("nodeName") for p in pods(admin, ns).values())

            # fixed (and the GPUs back): the binder submits at once, the gang runs as team A
            for node in gpu_nodes:
                set_gpus_and_wait(admin, node, "4")
            put_policy(admin, good, original)
            wait_until("binder: policy ready", lambda: binder_state(bridge, "ready"), 30)
            got = wait_until("both members bound", lambda: bound_pods(
                admin, ns, ["m0", "m1"]), 60)
        finally:
            scancel_quiet(local, *fillers)
            for node in gpu_nodes:
                set_gpus_and_wait(admin, node, "4")
    (job_id,) = {got[f"m{i}"]["metadata"]["annotations"][contract.A_JOB_ID] for i in range(2)}
    assert job_id != first["id"]
    assert user_account(local, job_id) == ("sg-team-a", "team-a")
    assert {got[f"m{i}"]["spec"]["nodeName"] for i in range(2)} == set(gpu_nodes)

