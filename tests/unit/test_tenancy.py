"""The tenancy policy: parsing (every error names its field), resolve, admit and check."""

from __future__ import annotations

import dataclasses

import pytest

from slurmgate import contract, tenancy
from slurmgate.podrequest import PodRequest
from slurmgate.tenancy import PolicyError, PolicyState, TenancyDenied

POLICY = """
tenants:
  - namespaces: [team-a, team-a-dev]
    user: team-a
    account: team-a
    accounts: [team-a, shared]
    qos: [normal]
    partitions: [k8s, hpc]
  - namespaces: [team-b]
    user: team-b
default: deny
"""


def req(**kw: object) -> PodRequest:
    base = PodRequest(memory_mib=1024, cpus=1, gpus=0, partition=None, qos=None, account=None,
                      time_limit_minutes=None, constraint=None, nice=None,
                      termination_grace_seconds=30)
    return dataclasses.replace(base, **kw)  # type: ignore[arg-type]


def denied(policy: tenancy.Policy, ns: str, r: PodRequest) -> TenancyDenied:
    with pytest.raises(TenancyDenied) as e:
        tenancy.admit(policy, ns, r)
    return e.value


def test_parse_and_resolve() -> None:
    p = tenancy.parse(POLICY)
    a = p.resolve("team-a-dev")
    assert a is not None and a is p.resolve("team-a")
    assert (a.user, a.account, a.accounts, a.qos, a.partitions) == (
        "team-a", "team-a", frozenset({"team-a", "shared"}), frozenset({"normal"}),
        ("k8s", "hpc"))
    b = p.resolve("team-b")
    assert b is not None
    # no account, no accounts: the Pod may name none; no qos: none; no partitions: any
    assert (b.user, b.account, b.accounts, b.qos, b.partitions) == (
        "team-b", None, frozenset(), frozenset(), None)
    assert p.resolve("other") is None
    assert p.default is None


def test_accounts_default_to_the_default_account() -> None:
    p = tenancy.parse("tenants: [{namespaces: [a], user: u, account: acc}]")
    t = p.resolve("a")
    assert t is not None and t.accounts == frozenset({"acc"})
    assert tenancy.parse("tenants: []").resolve("a") is None  # default absent = deny


def test_default_tenant_for_every_other_namespace() -> None:
    p = tenancy.parse("tenants: [{namespaces: [a], user: ua}]\n"
                      "default: {user: nobody, account: misc}")
    assert p.resolve("a") is not None and p.resolve("a").user == "ua"  # type: ignore[union-attr]
    d = p.resolve("anything")
    assert d is not None and (d.user, d.account, d.namespaces) == ("nobody", "misc", ())
    out = tenancy.admit(p, "anything", req())
    assert (out.user, out.account) == ("nobody", "misc")


@pytest.mark.parametrize(("text", "path"), [
    ("tenants: [{namespaces: [a]}]", "tenants[0].user"),
    ("tenants: [{namespaces: [a], user: 'bad user'}]", "tenants[0].user"),
    ("tenants: [{namespaces: [a], user: '1abc'}]", "tenants[0].user"),
    ("tenants: [{user: u}]", "tenants[0].namespaces"),
    ("tenants: [{namespaces: [Team], user: u}]", "tenants[0].namespaces[0]"),
    ("tenants: [{namespaces: a, user: u}]", "tenants[0].namespaces"),
    ("tenants: [{namespaces: [a], user: u}, {namespaces: [b, a], user: v}]",
     "tenants[1].namespaces[1]"),
    ("tenants: [{namespaces: [a], user: u, accounts: [ok, 'no way']}]",
     "tenants[0].accounts[1]"),
    ("tenants: [{namespaces: [a], user: u, account: x, accounts: [y]}]", "tenants[0].account"),
    ("tenants: [{namespaces: [a], user: u, qos: [';rm']}]", "tenants[0].qos[0]"),
    ("tenants: [{namespaces: [a], user: u, partitions: []}]", "tenants[0].partitions"),
    ("tenants: [{namespaces: [a], user: u, acounts: [x]}]", "tenants[0].acounts"),
    ("tenants: [{namespaces: [a], user: u}]\ndefault: allow", "default"),
    ("default: {namespaces: [a], user: u}", "default.namespaces"),
    ("default: {account: x}", "default.user"),
    ("tenants: {a: b}", "tenants"),
    ("tenant: []", "tenant"),
    ("[1, 2]", ""),
])
def test_errors_name_the_field(text: str, path: str) -> None:
    with pytest.raises(PolicyError) as e:
        tenancy.parse(text)
    assert e.value.path == path
    if path:
        assert str(e.value).startswith(f"{path}: ")


@pytest.mark.parametrize("text", ["", "tenants: [\n", "{{{"])
def test_empty_or_broken_yaml_is_an_error(text: str) -> None:
    with pytest.raises(PolicyError):
        tenancy.parse(text)


def test_admit_sets_user_and_default_account() -> None:
    p = tenancy.parse(POLICY)
    out = tenancy.admit(p, "team-a", req(partition="k8s"))
    assert (out.user, out.account, out.partition, out.qos) == ("team-a", "team-a", "k8s", None)
    out = tenancy.admit(p, "team-a", req(account="shared", qos="normal", partition="hpc"))
    assert (out.user, out.account, out.qos, out.partition) == ("team-a", "shared", "normal",
                                                               "hpc")
    # no partition anywhere: the tenant's first, never Slurm's unseen default
    assert tenancy.admit(p, "team-a", req()).partition == "k8s"
    # team-b: any partition, no account
    out = tenancy.admit(p, "team-b", req(partition="anything"))
    assert (out.user, out.account, out.partition) == ("team-b", None, "anything")


def test_namespace_not_in_tenancy() -> None:
    e = denied(tenancy.parse(POLICY), "team-c", req())
    assert e.reason == "NamespaceNotInTenancy"
    assert '"team-c"' in e.message


def test_account_not_allowed_names_everything() -> None:
    e = denied(tenancy.parse(POLICY), "team-a", req(account="team-b"))
    assert e.reason == "AccountNotAllowed"
    assert e.message == ('namespace "team-a" may not use account "team-b" '
                         f"({contract.A_ACCOUNT}); allowed: shared, team-a")
    e = denied(tenancy.parse(POLICY), "team-b", req(account="team-b"))
    assert e.reason == "AccountNotAllowed" and e.message.endswith("allowed: none")


def test_qos_not_allowed() -> None:
    e = denied(tenancy.parse(POLICY), "team-a", req(qos="high"))
    assert e.reason == "QOSNotAllowed"
    assert '"high"' in e.message and contract.A_QOS in e.message and "normal" in e.message
    assert denied(tenancy.parse(POLICY), "team-b", req(qos="normal")).reason == "QOSNotAllowed"


def test_partition_not_allowed_checks_the_effective_partition() -> None:
    e = denied(tenancy.parse(POLICY), "team-a", req(partition="gpu"))
    assert e.reason == "PartitionNotAllowed"
    assert '"gpu"' in e.message and "allowed: hpc, k8s" in e.message
    assert contract.A_PARTITION in e.message and "DEFAULT_PARTITION" in e.message


def test_check_follows_the_source_state() -> None:
    p = tenancy.parse(POLICY)
    r = req(account="team-b")
    # disabled: today's behaviour, nothing checked, no user
    assert tenancy.check(tenancy.STATE_DISABLED, "anywhere", r) is r
    with pytest.raises(TenancyDenied) as e:
        tenancy.check(PolicyState(tenancy.READY, p), "team-a", r)
    assert e.value.reason == "AccountNotAllowed"
    # invalid with a last good policy: that one stays in force
    kept = PolicyState(tenancy.INVALID, p, "tenants[0].user: bad")
    assert tenancy.check(kept, "team-a", req()).user == "team-a"
    cases = [(PolicyState(tenancy.MISSING, None, "ConfigMap x/y not found"),
              "TenancyPolicyMissing", "ConfigMap x/y not found"),
             (PolicyState(tenancy.INVALID, None, "tenants[0].user: bad"),
              "TenancyPolicyInvalid", "tenants[0].user: bad"),
             (tenancy.STATE_LOADING, "TenancyPolicyLoading", "not loaded")]
    for state, reason, text in cases:
        with pytest.raises(TenancyDenied) as e:
            tenancy.check(state, "team-a", req())
        assert e.value.reason == reason and text in e.value.message
