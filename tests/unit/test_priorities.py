"""PriorityClass -> Slurm QOS/partition/nice: parsing the mapping in the policy document, and
its decisions at admission (webhook) and at the binder's submits (gangs)."""

from __future__ import annotations

from typing import Any

import pytest

from slurmgate import contract, priorities, reasons, tenancy
from slurmgate.tenancy import PolicyState
from tests.unit.fakes import marked_pod, review
from tests.unit.test_tenancy_enforcement import actions, admitter, gang, in_ns, pending_pod

DOC = """
tenants:
  - namespaces: [team-a]
    user: team-a
    account: team-a
    qos: [normal, batch, prod]
    partitions: [k8s, hpc]
  - namespaces: [team-b]
    user: team-b
    account: team-b
    qos: [normal]
    partitions: [k8s]
priorityClasses:
  high: {qos: prod, partition: hpc, nice: 50}
  flexible: {qos: batch, nice: 10, annotationsOverride: true}
  "*": {qos: normal}
"""
READY = PolicyState(tenancy.READY, tenancy.parse(DOC))



async def submit_one(act: Any, pod: dict) -> float | None:
    """A single Pod's submit, as the controller asks it."""
    return await act.submit(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", [pod],
                            False, lambda: [])

def with_class(pod: dict[str, Any], name: str) -> dict[str, Any]:
    pod["spec"]["priorityClassName"] = name
    return pod


# ----------------------------------------------------------------------------- parsing


def test_parse_mapping() -> None:
    rules = READY.policy.priority_classes  # type: ignore[union-attr]
    assert rules["high"] == priorities.Rule("high", "prod", "hpc", 50, False)
    assert rules["flexible"].annotations_override is True
    assert rules["*"] == priorities.Rule("*", qos="normal")
    assert tenancy.parse("default: deny").priority_classes == {}


@pytest.mark.parametrize(("doc", "path"), [
    ("priorityClasses: [high]", "priorityClasses"),
    ("priorityClasses: {High: {qos: prod}}", "priorityClasses.High"),
    ("priorityClasses: {high: prod}", "priorityClasses.high"),
    ("priorityClasses: {high: {qso: prod}}", "priorityClasses.high.qso"),
    ("priorityClasses: {high: {qos: 'a b'}}", "priorityClasses.high.qos"),
    ("priorityClasses: {high: {partition: ';'}}", "priorityClasses.high.partition"),
    ("priorityClasses: {high: {nice: 10001}}", "priorityClasses.high.nice"),
    ("priorityClasses: {high: {nice: '5'}}", "priorityClasses.high.nice"),
    ("priorityClasses: {high: {nice: true}}", "priorityClasses.high.nice"),
    ("priorityClasses: {high: {annotationsOverride: 'yes'}}",
     "priorityClasses.high.annotationsOverride"),
])
def test_parse_errors_name_the_field(doc: str, path: str) -> None:
    with pytest.raises(tenancy.PolicyError) as e:
        tenancy.parse(doc)
    assert e.value.path == path


def test_of_pod() -> None:
    pod = with_class(marked_pod(**{contract.A_QOS: "x", contract.A_CONSTRAINT: "a"}), "high")
    assert priorities.of_pod(pod) == ("high", frozenset({contract.A_QOS, contract.A_CONSTRAINT}))
    assert priorities.of_pod(marked_pod()) == (None, frozenset())


# ----------------------------------------------------------------------------- webhook


async def test_the_class_sets_qos_partition_and_nice() -> None:
    a, s = admitter(READY)
    out = await a.review(in_ns(review(with_class(marked_pod(), "high")), "team-a"))
    assert out["response"]["allowed"] is True
    (spec,) = s.specs
    assert (spec.qos, spec.partition, spec.nice, spec.user) == ("prod", "hpc", 50, "team-a")


async def test_unlisted_or_no_class_takes_the_star_entry() -> None:
    a, s = admitter(READY)
    for pod in (marked_pod(), with_class(marked_pod(), "other")):
        assert (await a.review(in_ns(review(pod), "team-a")))["response"]["allowed"]
    assert [(x.qos, x.partition, x.nice) for x in s.specs] == [("normal", "k8s", None)] * 2


async def test_a_conflicting_annotation_is_denied_naming_class_field_and_value() -> None:
    a, s = admitter(READY)
    cases = [({contract.A_QOS: "batch"}, reasons.DENY_CLASS_FORBIDS_QOS, 'QOS "prod"'),
             ({contract.A_PARTITION: "k8s"}, reasons.DENY_CLASS_FORBIDS_PARTITION,
              'partition "hpc"'),
             ({contract.A_PRIORITY: "0"}, reasons.DENY_CLASS_FORBIDS_NICE, "nice 50")]
    for ann, reason, gives in cases:
        out = await a.review(in_ns(review(with_class(marked_pod(**ann), "high")), "team-a"))
        r = out["response"]
        assert r["allowed"] is False and r["status"]["reason"] == reason, ann
        msg = r["status"]["message"]
        assert 'PriorityClass "high"' in msg and gives in msg, msg
        assert next(iter(ann)) in msg, msg
    # the same value as the class is no conflict
    ok = with_class(marked_pod(**{contract.A_QOS: "prod", contract.A_PRIORITY: "50"}), "high")
    assert (await a.review(in_ns(review(ok), "team-a")))["response"]["allowed"]
    assert len(s.specs) == 1


async def test_annotations_override_where_the_class_allows() -> None:
    a, s = admitter(READY)
    pod = with_class(marked_pod(**{contract.A_QOS: "normal"}), "flexible")
    assert (await a.review(in_ns(review(pod), "team-a")))["response"]["allowed"]
    (spec,) = s.specs
    assert (spec.qos, spec.nice) == ("normal", 10)  # the annotation won; nice from the class


async def test_mapped_values_must_pass_the_tenants_policy() -> None:
    a, s = admitter(READY)
    out = await a.review(in_ns(review(with_class(marked_pod(), "high")), "team-b"))
    r = out["response"]
    assert r["status"]["reason"] == reasons.DENY_QOS_NOT_ALLOWED
    assert r["status"]["message"] == ('slurmgate: namespace "team-b" may not use QOS "prod" '
                                      '(from PriorityClass "high"); allowed: normal')
    assert s.specs == []


async def test_no_mapping_without_the_policy() -> None:
    a, s = admitter(tenancy.STATE_DISABLED)
    assert (await a.review(in_ns(review(with_class(marked_pod(), "high")), "x")))[
        "response"]["allowed"]
    assert (s.specs[0].qos, s.specs[0].nice) == (None, None)


# ----------------------------------------------------------------------------- binder


async def test_binder_applies_the_class_to_single_pods_and_gangs() -> None:
    act, slurm, _, _ = actions(READY)
    assert await submit_one(act, with_class(pending_pod("team-a"), "high")) is None
    members = [with_class(m, "high") for m in gang("team-a")]
    assert await act.submit("team-a/g", members, True, lambda: []) is None
    assert [(x.qos, x.partition, x.nice) for x in slurm.specs] == [("prod", "hpc", 50)] * 2
    assert slurm.specs[1].nodes == 2


async def test_binder_refuses_a_conflict_the_policy_now_forbids() -> None:
    act, slurm, events, _ = actions(READY)
    pod = with_class(pending_pod("team-a", **{contract.A_QOS: "batch"}), "high")
    assert await submit_one(act, pod) is not None
    assert slurm.specs == [] and events.sent[0][1] == reasons.DENY_CLASS_FORBIDS_QOS
