"""The admission decision alone (webhook/decide.py): a Pod, the inventory, the tenancy policy and
the settings in, a denial or what to gate and submit out. No server, no Slurm, no clock."""

from __future__ import annotations

from typing import Any

from slurmgate import contract, reasons, tenancy
from slurmgate.groups import Group, Resolved
from slurmgate.webhook import decide
from slurmgate.webhook.config import Settings
from tests.unit.fakes import marked_pod, node_map

SINGLE = Resolved(None, {})
CLAIM = "c" * 32


def _admit(pod: dict[str, Any], resolved: Resolved = SINGLE, nodes: Any = "default",
           dry_run: bool = False, **settings: Any) -> decide.Admit | decide.Denial:
    who = decide.identify({"namespace": "ns"}, pod, pod["metadata"])
    assert isinstance(who, decide.Identity)
    return decide.admit(pod, who, resolved, Settings(**settings), tenancy.STATE_DISABLED,
                        node_map() if nodes == "default" else nodes, CLAIM, dry_run)


def test_a_pod_that_fits_is_submitted_under_its_claim() -> None:
    d = _admit(marked_pod("2Gi", **{contract.A_TIME_LIMIT: "10"}))
    assert isinstance(d, decide.Admit) and d.kind == decide.SUBMIT and d.claim == CLAIM
    assert d.annotations == {contract.A_CLAIM: CLAIM}
    assert (d.request.memory_mib, d.request.time_limit_minutes) == (2048, 10)
    assert d.drop == decide.STALE and d.grace is None


def test_a_pod_too_large_for_any_node_is_denied_with_the_numbers() -> None:
    d = _admit(marked_pod("15500Mi"))
    assert isinstance(d, decide.Denial) and d.reason == reasons.DENY_MEMORY_TOO_LARGE
    assert "15500" in d.message


def test_names_and_node_names_are_refused_before_any_lookup() -> None:
    pod = marked_pod()
    pod["spec"]["nodeName"] = "kwok-n1"
    d = decide.identify({}, pod, pod["metadata"])
    assert isinstance(d, decide.Denial) and d.reason == reasons.DENY_NODE_NAME_SET
    pod = marked_pod()
    pod["metadata"]["name"] = "Bad_Name\n"
    d = decide.identify({}, pod, pod["metadata"])
    assert isinstance(d, decide.Denial) and d.reason == reasons.DENY_INVALID_OBJECT
    pod = marked_pod()
    pod["metadata"] = {"generateName": "web-", "labels": pod["metadata"]["labels"]}
    who = decide.identify({}, pod, pod["metadata"])
    assert isinstance(who, decide.Identity) and who.namespace == "default"


def test_a_gang_member_waits_for_its_group_and_a_gang_too_large_is_denied() -> None:
    pod = marked_pod(**{contract.A_CLAIM: "copied", contract.A_JOB_ID: "7"})
    d = _admit(pod, Resolved(Group("g", 2, 1, "annotations"), {}))
    assert isinstance(d, decide.Admit) and d.kind == decide.GATED_GROUP and d.claim is None
    assert d.annotations == {contract.A_GROUP: "g", contract.A_GROUP_SIZE: "2",
                             contract.A_GROUP_INDEX: "1",
                             contract.A_JOB_STATE: contract.JOB_STATE_GROUP_PENDING}
    assert contract.A_CLAIM in d.drop and contract.A_JOB_ID in d.drop  # copied: never trusted
    d = _admit(pod, Resolved(Group("g", 3, None, "annotations"), {}))  # 2 nodes
    assert isinstance(d, decide.Denial) and d.reason == reasons.DENY_GROUP_TOO_LARGE


def test_without_an_inventory_fail_closed_denies_and_fail_open_leaves_it_to_the_binder() -> None:
    d = _admit(marked_pod(), nodes=None)
    assert isinstance(d, decide.Denial) and d.reason == reasons.DENY_INVENTORY_UNAVAILABLE
    d = _admit(marked_pod(), nodes=None, fail_open=True)
    assert isinstance(d, decide.Admit) and d.kind == decide.SUBMIT_PENDING
    assert d.annotations[contract.A_JOB_STATE] == contract.JOB_STATE_SUBMIT_PENDING
    assert any("inventory" in w for w in d.warnings)


def test_a_dry_run_submits_nothing() -> None:
    d = _admit(marked_pod(), dry_run=True)
    assert isinstance(d, decide.Admit) and d.kind == decide.DRY_RUN
    assert d.annotations[contract.A_JOB_STATE] == contract.JOB_STATE_DRY_RUN


def test_the_owners_options_apply_unless_the_pod_sets_its_own() -> None:
    pod = marked_pod(**{contract.A_QOS: "normal"})
    d = _admit(pod, Resolved(None, {contract.A_QOS: "high", contract.A_TIME_LIMIT: "5"}))
    assert isinstance(d, decide.Admit)
    assert d.request.qos == "normal" and d.request.time_limit_minutes == 5
    assert d.annotations[contract.A_TIME_LIMIT] == "5" and contract.A_QOS not in d.annotations


def test_a_bad_annotation_is_denied_with_its_reason() -> None:
    d = _admit(marked_pod(**{contract.A_ACCOUNT: "a b"}))
    assert isinstance(d, decide.Denial) and d.reason == reasons.DENY_INVALID_ANNOTATION
