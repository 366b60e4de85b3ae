"""The admission decision and the JSON Patch it returns, against fakes for Slurm."""

from __future__ import annotations

import asyncio
import base64
import json

import jsonpatch
import pytest

from slurmgate import contract
from slurmgate.webhook.admission import Admitter, BadReview
from slurmgate.webhook.config import Settings
from slurmgate.webhook.patch import gate_pod
from tests.unit.fakes import FakeSubmit, marked_pod, node_map, review


def admitter(submit: FakeSubmit | None = None, **kw: object) -> tuple[Admitter, FakeSubmit]:
    s = submit or FakeSubmit()
    nm = node_map()
    return Admitter(s, lambda: nm, Settings(**kw)), s  # type: ignore[arg-type]


def applied(pod: dict, resp: dict) -> dict:
    ops = json.loads(base64.b64decode(resp["response"]["patch"]))
    return jsonpatch.apply_patch(pod, ops)


async def test_marked_pod_is_gated_and_job_submitted() -> None:
    a, s = admitter()
    pod = marked_pod("2Gi", **{contract.A_TIME_LIMIT: "10"})
    out = await a.review(review(pod))
    assert out["response"]["allowed"] is True
    new = applied(pod, out)
    assert new["spec"]["schedulingGates"] == [{"name": contract.GATE}]
    assert new["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    ann = new["metadata"]["annotations"]
    assert ann[contract.A_JOB_ID] == "101"
    (spec,) = s.specs
    assert (spec.memory_mb, spec.cpus, spec.nodes, spec.time_limit_minutes) == (2048, 1, 1, 10)
    assert contract.claim_from_comment(spec.comment) == ann[contract.A_CLAIM]
    assert spec.partition == "k8s" or spec.partition is None


async def test_unmarked_pod_untouched() -> None:
    a, s = admitter()
    pod = marked_pod()
    pod["metadata"]["labels"] = {"app": "web"}
    out = await a.review(review(pod))
    assert out["response"] == {"uid": out["response"]["uid"], "allowed": True}
    assert s.specs == []


async def test_oversized_pod_denied_with_numbers() -> None:
    a, s = admitter()
    out = await a.review(review(marked_pod("15500Mi")))
    r = out["response"]
    assert r["allowed"] is False
    assert r["status"]["reason"] == "MemoryTooLarge"
    assert "14976Mi" in r["status"]["message"] and "slurmd" in r["status"]["message"]
    assert s.specs == []


async def test_fits_exactly_beside_slurmd() -> None:
    a, _ = admitter()
    out = await a.review(review(marked_pod("14976Mi")))
    assert out["response"]["allowed"] is True


async def test_unknown_partition_denied() -> None:
    a, _ = admitter()
    out = await a.review(review(marked_pod(**{contract.A_PARTITION: "nope"})))
    assert out["response"]["status"]["reason"] == "UnknownPartition"
    assert "k8s" in out["response"]["status"]["message"]


async def test_dry_run_submits_nothing() -> None:
    a, s = admitter()
    out = await a.review(review(marked_pod(), dry_run=True))
    assert out["response"]["allowed"] is True
    assert s.specs == []
    assert contract.A_JOB_ID not in applied(marked_pod(), out)["metadata"]["annotations"]


async def test_duplicate_review_yields_one_job() -> None:
    a, s = admitter()
    body = review(marked_pod(), uid="same")
    r1, r2 = await asyncio.gather(a.review(body), a.review(body))
    assert r1 == r2
    assert len(s.specs) == 1


async def test_slurm_down_denies_with_slurm_text() -> None:
    a, _ = admitter(FakeSubmit(fail="Invalid account or account/partition combination"))
    out = await a.review(review(marked_pod()))
    assert out["response"]["allowed"] is False
    assert "Invalid account" in out["response"]["status"]["message"]


async def test_slurm_down_fail_open_gates_for_later_submit() -> None:
    a, _ = admitter(FakeSubmit(fail="connection refused"), fail_open=True)
    out = await a.review(review(marked_pod()))
    assert out["response"]["allowed"] is True
    new = applied(marked_pod(), out)
    assert new["spec"]["schedulingGates"] == [{"name": contract.GATE}]
    assert new["metadata"]["annotations"][contract.A_JOB_STATE] == "SubmitPending"
    assert out["response"]["warnings"]


async def test_copied_status_annotations_are_not_trusted() -> None:
    a, _ = admitter()
    pod = marked_pod(**{contract.A_JOB_ID: "999", contract.A_SLURM_NODE: "n1"})
    new = applied(pod, await a.review(review(pod)))
    assert new["metadata"]["annotations"][contract.A_JOB_ID] == "101"
    assert contract.A_SLURM_NODE not in new["metadata"]["annotations"]


async def test_node_name_set_is_denied() -> None:
    a, _ = admitter()
    pod = marked_pod()
    pod["spec"]["nodeName"] = "kwok-n1"
    out = await a.review(review(pod))
    assert out["response"]["status"]["reason"] == "NodeNameSet"


async def test_slurmd_over_half_warns() -> None:
    s = FakeSubmit()
    nm = node_map(slurmd="9000Mi")
    a = Admitter(s, lambda: nm, Settings())  # type: ignore[arg-type]
    out = await a.review(review(marked_pod()))
    assert any("more than half" in w for w in out["response"]["warnings"])


async def test_non_create_and_non_pod_allowed() -> None:
    a, s = admitter()
    out = await a.review(review(marked_pod(), operation="UPDATE"))
    assert out["response"]["allowed"] and "patch" not in out["response"]
    body = review(marked_pod())
    body["request"]["kind"]["kind"] = "ConfigMap"
    body["request"]["resource"]["resource"] = "configmaps"
    assert "patch" not in (await a.review(body))["response"]
    assert s.specs == []


@pytest.mark.parametrize("body", [None, [], "x", {"apiVersion": "v1"},
                                  {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"},
                                  {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "request": {"uid": 5}}])
async def test_bad_reviews_raise(body: object) -> None:
    a, _ = admitter()
    with pytest.raises(BadReview):
        await a.review(body)


@pytest.mark.parametrize("pod", [
    {"metadata": {}, "spec": {}},
    {"metadata": {"annotations": {"a": "b"}}, "spec": {"schedulingGates": [{"name": "other"}]}},
    {"metadata": {"annotations": None}, "spec": {"schedulingGates": None}},
    {"metadata": {"annotations": {"x/y~z": "1"}},
     "spec": {"schedulingGates": [{"name": contract.GATE}], "schedulerName": "s"}},
])
def test_patch_correct_for_any_starting_point(pod: dict) -> None:
    ops = gate_pod(pod, {contract.A_CLAIM: "c", "a/b~c": "v"})
    new = jsonpatch.apply_patch(pod, ops)
    gates = [g["name"] for g in new["spec"]["schedulingGates"]]
    assert gates.count(contract.GATE) == 1
    assert set(gates) - {contract.GATE} == {g["name"] for g in
                                            (pod["spec"].get("schedulingGates") or [])} - {
        contract.GATE}
    assert new["metadata"]["annotations"][contract.A_CLAIM] == "c"
    assert new["metadata"]["annotations"]["a/b~c"] == "v"
    for k, v in ((pod["metadata"].get("annotations")) or {}).items():
        assert new["metadata"]["annotations"][k] == v
    assert new["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    assert new["spec"]["tolerations"].count(contract.TOLERATION) == 1


@pytest.mark.parametrize("have,added", [
    (None, True),
    ([], True),
    ([{"key": "other", "operator": "Exists"}], True),
    ([contract.TOLERATION], False),
    ([{"operator": "Exists"}], False),  # tolerates every taint already
    ([{"key": contract.TAINT_KEY, "operator": "Equal", "value": "true"}], False),
    # evicted after 60 s: not enough for a Pod that must stay as long as its job
    ([{**contract.TOLERATION, "tolerationSeconds": 60}], True),
    ([{"key": contract.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}], True),
])
def test_toleration_of_slurm_nodes_added_once(have: list | None, added: bool) -> None:
    pod = {"metadata": {}, "spec": {} if have is None else {"tolerations": have}}
    new = jsonpatch.apply_patch(pod, gate_pod(pod, {}))
    assert new["spec"]["tolerations"][:len(have or [])] == (have or [])
    assert len(new["spec"]["tolerations"]) == len(have or []) + added
    if added:
        assert new["spec"]["tolerations"][-1] == contract.TOLERATION


async def test_gang_member_gated_without_a_job_yet() -> None:
    a, s = admitter()
    pod = marked_pod(**{contract.A_GROUP: "pair", contract.A_GROUP_SIZE: "2"})
    out = await a.review(review(pod))
    new = applied(pod, out)
    ann = new["metadata"]["annotations"]
    assert new["spec"]["schedulingGates"] == [{"name": contract.GATE}]
    assert ann[contract.A_JOB_STATE] == "GroupPending"
    assert contract.A_JOB_ID not in ann and contract.A_CLAIM not in ann
    assert s.specs == []  # the binder submits once the group is complete


async def test_gang_larger_than_partition_denied() -> None:
    a, s = admitter()  # the fake inventory has 2 nodes (s: nothing submitted)
    out = await a.review(review(marked_pod(**{contract.A_GROUP: "big",
                                              contract.A_GROUP_SIZE: "3"})))
    assert out["response"]["status"]["reason"] == "GroupTooLarge"
    assert "needs 3 Nodes" in out["response"]["status"]["message"]
    assert s.specs == []


async def test_no_inventory_fail_open_gates_without_submitting() -> None:
    s = FakeSubmit()
    a = Admitter(s, lambda: None, Settings(fail_open=True))  # type: ignore[arg-type]
    out = await a.review(review(marked_pod()))
    assert out["response"]["allowed"] is True
    new = applied(marked_pod(), out)
    assert new["metadata"]["annotations"][contract.A_JOB_STATE] == "SubmitPending"
    assert s.specs == []
    closed = Admitter(s, lambda: None, Settings())  # type: ignore[arg-type]
    out = await closed.review(review(marked_pod()))
    assert out["response"]["status"]["reason"] == "InventoryUnavailable"


async def test_slurm_unreachable_is_not_called_a_refusal() -> None:
    from slurmgate.slurm import SlurmUnavailable

    class Down(FakeSubmit):
        async def __call__(self, spec):  # type: ignore[no-untyped-def]
            raise SlurmUnavailable("slurmrestd did not answer within 5.0s")

    nm = node_map()
    a = Admitter(Down(), lambda: nm, Settings())  # type: ignore[arg-type]
    out = await a.review(review(marked_pod()))
    assert out["response"]["status"]["reason"] == "SlurmUnavailable"
    assert "unreachable" in out["response"]["status"]["message"]
    assert "refused" not in out["response"]["status"]["message"]


@pytest.mark.parametrize("ann", [{contract.A_GROUP_SIZE: "\x07"},
                                 {contract.A_GROUP_INDEX: "-1"}])
async def test_group_fields_validated_even_without_group(ann: dict) -> None:
    a, s = admitter()
    out = await a.review(review(marked_pod(**ann)))
    assert out["response"]["allowed"] is False and s.specs == []
    assert next(iter(ann)) in out["response"]["status"]["message"]
