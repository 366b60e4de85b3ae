"""What Slurm gave a job on each node, read from recorded whole records of every release, and
shown on each Pod of it (its own node's share for a gang member)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from slurmgate import contract
from slurmgate.binder import decide
from slurmgate.slurm import JobInfo, allocation, dialects
from slurmgate.slurm.allocation import NodeAllocation

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "slurm-rest"
EIGHT_SOCKETS = tuple((s, 0) for s in range(8))  # the local slurmd: 8 sockets of one core


def record(release: str, name: str) -> dict:
    return json.loads((FIXTURES / release / name).read_text())["body"]["jobs"][0]


@pytest.mark.parametrize(("release", "name"), [
    ("22.05", "v0.0.38-job.json"), ("24.11", "v0.0.40-job.json"), ("24.11", "v0.0.41-job.json"),
    *[("26.05", f"v0.0.{v}-job.json") for v in (42, 43, 44, 45)],
])
def test_every_release_says_which_cores_and_memory(release: str, name: str) -> None:
    """The recorded placeholders: exclusive, 1000 MB, on one node of 8 one-core sockets."""
    j = dialects.parse_job(record(release, name))
    (node,) = j.nodes
    assert j.allocation == (NodeAllocation(node, EIGHT_SOCKETS, 1000, ()),)
    assert j.allocation_on(node) == j.allocation[0] and j.allocation_on("other") is None


def test_gpu_indices_come_from_gres_detail() -> None:
    j = dialects.parse_job(record("22.05", "v0.0.38-job-gpu.json"))  # an exclusive GPU job
    (a,) = j.allocation
    assert (a.node, a.gpus, a.memory_mb) == ("n4", (0, 1, 2, 3), 1024)
    assert a.describe() == "cores=s0:0,s1:0,s2:0,s3:0,s4:0,s5:0,s6:0,s7:0 memory=1024M gpus=0-3"


@pytest.mark.parametrize(("detail", "want"), [
    ("gpu:a100:2(IDX:0-1)", (0, 1)),
    ("gpu(IDX:0,2)", (0, 2)),
    ("gpu:a100:2(IDX:1,3),nic:1(IDX:0)", (1, 3)),
    ("nic:1(IDX:0),gpu:h100:1(IDX:5)", (5,)),
    ("gpu:1(IDX:N/A)", ()),
    ("gpu:1(IDX:9-2)", ()),
    ("gpu:1(IDX:0-99999999)", ()),
    ("", ()),
    ("garbage", ()),
])
def test_gres_detail_forms(detail: str, want: tuple[int, ...]) -> None:
    assert allocation.gpu_indices(detail) == want


def test_a_record_without_job_resources_says_nothing() -> None:
    rec = record("26.05", "v0.0.45-job.json")
    rec.pop("job_resources")
    assert dialects.parse_job(rec).allocation == ()
    rec["job_resources"] = {"nodes": {"allocation": [{"name": "n3", "sockets": "junk"}]}}
    assert dialects.parse_job(rec).allocation == (NodeAllocation("n3", (), 0, ()),)


def test_several_nodes_keep_slurms_order_with_their_gpus() -> None:
    rec = {"job_resources": {"nodes": {"allocation": [
        {"name": "n2", "memory": {"allocated": 10}, "sockets": [
            {"index": 1, "cores": [{"index": 3, "status": ["ALLOCATED"]},
                                   {"index": 2, "status": ["UNALLOCATED"]}]}]},
        {"name": "n1", "memory": {"allocated": 20}, "sockets": [
            {"index": 0, "cores": [{"index": 0, "status": ["ALLOCATED", "IN_USE"]},
                                   {"index": 1, "status": ["ALLOCATED"]}]}]}]}},
        "gres_detail": ["gpu:a100:1(IDX:3)", "gpu:a100:2(IDX:0-1)"]}
    got = allocation.parse(rec, ["n1", "n2"])
    assert got == (NodeAllocation("n1", ((0, 0), (0, 1)), 20, (3,)),
                   NodeAllocation("n2", ((1, 3),), 10, (0, 1)))
    assert got[0].describe() == "cores=s0:0-1 memory=20M gpus=3"


def test_ranges() -> None:
    assert allocation.ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert allocation.ranges([]) == ""


# ------------------------------------------------------------------- on the Pods

NOW = 2_000_000_000.0
NODES = {f"n{i}": decide.NodeRef(f"kwok-n{i}", False) for i in range(1, 4)}
W = decide.World(slurm_synced=True, now=NOW, node_for=NODES)


def member(i: int, node: str | None = None, **extra: str) -> dict:
    ann = {contract.A_GROUP: "g", contract.A_GROUP_SIZE: "2", contract.A_GROUP_INDEX: str(i),
           contract.A_CLAIM: "c", contract.A_JOB_ID: "9", **extra}
    p: dict = {"metadata": {"name": f"m{i}", "namespace": "ns", "uid": f"u{i}",
                            "annotations": ann},
               "spec": {"schedulingGates": [] if node else [{"name": contract.GATE}]},
               "status": {"phase": "Running" if node else "Pending"}}
    if node:
        p["spec"]["nodeName"] = node
    return p


def running(alloc: tuple[NodeAllocation, ...] = ()) -> JobInfo:
    return JobInfo(job_id=9, name="k8s:ns/group:g", state="RUNNING", reason="None",
                   nodes=("n2", "n1"), comment="slurmgate claim=c group=ns/g", partition="k8s",
                   submit_time=1, start_time=1, end_time=0, allocation=alloc)


SHARES = (NodeAllocation("n2", ((0, 0),), 100, (1,)), NodeAllocation("n1", ((0, 1),), 100, (0,)))


def test_each_bound_member_shows_its_own_nodes_share_once_read() -> None:
    """Bound on a pushed start (no allocation yet), then the whole record comes: each member
    gets its own node's share, one a pass, and nothing more once they show it."""
    bound = [member(0, "kwok-n2", **{contract.A_SLURM_NODE: "n2",
                                     contract.A_JOB_STATE: "RUNNING"}),
             member(1, "kwok-n1", **{contract.A_SLURM_NODE: "n1",
                                     contract.A_JOB_STATE: "RUNNING"})]
    unit = decide.Unit(tuple(bound), gang=True)
    assert decide.decide(unit, lambda c: running(), W).action == decide.NOTHING
    d = decide.decide(unit, lambda c: running(SHARES), W)
    assert d.action == decide.STATUS and [m["metadata"]["name"] for m in d.members] == ["m0"]
    assert d.status[contract.A_ALLOCATION] == "cores=s0:0 memory=100M gpus=1"
    bound[0]["metadata"]["annotations"].update(d.status)
    d = decide.decide(unit, lambda c: running(SHARES), W)
    assert [m["metadata"]["name"] for m in d.members] == ["m1"]
    assert d.status[contract.A_ALLOCATION] == "cores=s0:1 memory=100M gpus=0"
    assert d.status[contract.A_SLURM_NODE] == "n1"
    bound[1]["metadata"]["annotations"].update(d.status)
    assert decide.decide(unit, lambda c: running(SHARES), W).action == decide.NOTHING
    # a later answer without the allocation (a list's entry) leaves what the Pods show
    assert decide.decide(unit, lambda c: running(), W).action == decide.NOTHING


def test_a_bind_made_with_the_record_read_carries_the_share() -> None:
    gated = [member(0), member(1)]
    d = decide.decide(decide.Unit(tuple(gated), gang=True),
                      lambda c: dataclasses.replace(running(SHARES)), W)
    assert d.action == decide.BIND
    # the decision's status names the first node; actions._bind gives each member its own
    assert d.status[contract.A_ALLOCATION] == SHARES[0].describe()
