"""Gang resolution from each supported form, with a fake API lookup."""

from __future__ import annotations

from typing import Any

import pytest

from slurmgate import contract, groups, reasons
from slurmgate.podrequest import PodRequestError


def lookup(objects: dict[str, dict[str, Any]]):
    async def get(path: str) -> dict[str, Any] | None:
        return objects.get(path)
    return get


def pod(labels: dict | None = None, ann: dict | None = None, owner: str | None = None) -> dict:
    meta: dict = {"name": "p", "labels": labels or {}, "annotations": ann or {}}
    if owner:
        meta["ownerReferences"] = [{"kind": "Job", "name": owner, "controller": True}]
    return {"metadata": meta}


async def test_own_annotations() -> None:
    r = await groups.resolve(pod(ann={contract.A_GROUP: "train", contract.A_GROUP_SIZE: "3",
                                      contract.A_GROUP_INDEX: "2"}), "ns", lookup({}))
    assert r.group == groups.Group("train", 3, 2, "annotation")


@pytest.mark.parametrize("ann,field", [
    ({contract.A_GROUP: "Train!", contract.A_GROUP_SIZE: "3"}, contract.A_GROUP),
    ({contract.A_GROUP: "t"}, contract.A_GROUP_SIZE),
    ({contract.A_GROUP: "t", contract.A_GROUP_SIZE: "0"}, contract.A_GROUP_SIZE),
    ({contract.A_GROUP: "t", contract.A_GROUP_SIZE: "100000"}, contract.A_GROUP_SIZE),
    ({contract.A_GROUP: "t", contract.A_GROUP_SIZE: "two"}, contract.A_GROUP_SIZE),
    ({contract.A_GROUP: "t", contract.A_GROUP_SIZE: "2", contract.A_GROUP_INDEX: "2"},
     contract.A_GROUP_INDEX),
])
async def test_bad_group_annotations_name_the_field(ann: dict, field: str) -> None:
    with pytest.raises(PodRequestError) as e:
        await groups.resolve(pod(ann=ann), "ns", lookup({}))
    assert field in str(e.value) and e.value.reason == "InvalidGroup"


async def test_pod_group_min_member() -> None:
    pg = {"metadata": {"annotations": {contract.A_QOS: "high"}}, "spec": {"minMember": 4}}
    r = await groups.resolve(
        pod(labels={"scheduling.x-k8s.io/pod-group": "pg1"}), "ns",
        lookup({"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/ns/podgroups/pg1": pg}))
    assert r.group == groups.Group("podgroup-pg1", 4, None, "podgroup")
    assert r.owner_options == {contract.A_QOS: "high"}


async def test_pod_group_missing_without_size_is_denied() -> None:
    with pytest.raises(PodRequestError):
        await groups.resolve(pod(labels={"scheduling.x-k8s.io/pod-group": "x"}), "ns",
                             lookup({}))


async def test_leader_worker_set() -> None:
    labels = {groups.LWS_NAME: "llm", groups.LWS_GROUP_INDEX: "1", groups.LWS_WORKER_INDEX: "3"}
    lws = {"metadata": {"annotations": {contract.A_PARTITION: "gpu"}}}
    r = await groups.resolve(
        pod(labels=labels, ann={groups.LWS_SIZE: "4"}), "ns",
        lookup({"/apis/leaderworkerset.x-k8s.io/v1/namespaces/ns/leaderworkersets/llm": lws}))
    assert r.group == groups.Group("lws-llm-1", 4, 3, "leaderworkerset")
    assert r.owner_options == {contract.A_PARTITION: "gpu"}


async def test_jobset_ranks_across_replicated_jobs() -> None:
    js = {"metadata": {"annotations": {}}, "spec": {"replicatedJobs": [
        {"name": "driver", "replicas": 1, "template": {"spec": {"parallelism": 1}}},
        {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2}}}]}}
    labels = {groups.JOBSET_NAME: "js", groups.JOBSET_RJOB: "workers",
              groups.JOBSET_JOB_INDEX: "1"}
    r = await groups.resolve(
        pod(labels=labels, ann={groups.COMPLETION_INDEX: "1"}), "ns",
        lookup({"/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets/js": js}))
    # driver takes rank 0; workers job 0 ranks 1-2; workers job 1 ranks 3-4
    assert r.group == groups.Group("jobset-js", 5, 4, "jobset")


async def test_a_malformed_jobset_index_is_the_pods_fault_not_the_apis() -> None:
    js = {"metadata": {"annotations": {}}, "spec": {"replicatedJobs": [
        {"name": "workers", "replicas": 2, "template": {"spec": {"parallelism": 2}}}]}}
    get = lookup({"/apis/jobset.x-k8s.io/v1alpha2/namespaces/ns/jobsets/js": js})
    for labels, ann in (({groups.JOBSET_JOB_INDEX: "x"}, {}),
                        ({}, {groups.COMPLETION_INDEX: "1.5"})):
        p = pod(labels={groups.JOBSET_NAME: "js", groups.JOBSET_RJOB: "workers", **labels},
                ann=ann)
        with pytest.raises(PodRequestError) as e:
            await groups.resolve(p, "ns", get)
        assert e.value.reason == reasons.DENY_INVALID_GROUP  # not OwnerLookupFailed


async def test_a_group_name_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(PodRequestError):
        await groups.resolve(pod(ann={contract.A_GROUP: "train\n", contract.A_GROUP_SIZE: "2"}),
                             "ns", lookup({}))


async def test_indexed_job_and_owner_options() -> None:
    job = {"metadata": {"name": "train", "uid": "0123456789",
                        "annotations": {contract.A_TIME_LIMIT: "10", "other": "x"}},
           "spec": {"completionMode": "Indexed", "parallelism": 2, "completions": 2}}
    r = await groups.resolve(pod(ann={groups.COMPLETION_INDEX: "1"}, owner="train"), "ns",
                             lookup({"/apis/batch/v1/namespaces/ns/jobs/train": job}))
    assert r.group == groups.Group("job-train-01234567", 2, 1, "indexed-job")
    assert r.owner_options == {contract.A_TIME_LIMIT: "10"}


async def test_plain_and_wave_jobs_are_not_gangs_but_pass_options() -> None:
    plain = {"metadata": {"name": "j", "uid": "u", "annotations": {contract.A_QOS: "low"}},
             "spec": {"parallelism": 3}}
    r = await groups.resolve(pod(owner="j"), "ns",
                             lookup({"/apis/batch/v1/namespaces/ns/jobs/j": plain}))
    assert r.group is None and r.owner_options == {contract.A_QOS: "low"}
    waves = {"metadata": {"name": "w", "uid": "u"},
             "spec": {"completionMode": "Indexed", "parallelism": 2, "completions": 6}}
    r = await groups.resolve(pod(ann={groups.COMPLETION_INDEX: "0"}, owner="w"), "ns",
                             lookup({"/apis/batch/v1/namespaces/ns/jobs/w": waves}))
    assert r.group is None


async def test_lone_pod_is_no_gang() -> None:
    r = await groups.resolve(pod(), "ns", lookup({}))
    assert r == groups.Resolved(None, {})
