"""GPUs: the request and its type, the placeholder's gres per dialect, the inventory per type,
admission's denials, and the binder's refusal of a Node that lacks them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from slurmgate import contract, podrequest, reasons
from slurmgate.binder import decide as state
from slurmgate.binder.podview import NodeRef, node_ref
from slurmgate.nodemap import NodeMap, gpus_by_type
from slurmgate.podrequest import PodRequestError
from slurmgate.slurm import JobInfo, JobSpec, NodeInfo, PartitionInfo
from slurmgate.slurm.dialects import dialect, submit_body
from slurmgate.slurm.placeholder import job_spec
from slurmgate.webhook.validate import check_fit
from tests.unit.fakes import marked_pod

NOW = 1_000_000.0


def gpu_pod(gpus: str = "2", **ann: str) -> dict[str, Any]:
    p = marked_pod(**ann)
    p["spec"]["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": gpus}
    return p


# ------------------------------------------------------------------ the request and its type

def test_gpu_type_annotation_is_read() -> None:
    r = podrequest.from_pod(gpu_pod("2", **{contract.A_GPU_TYPE: "a100"}))
    assert (r.gpus, r.gpu_type) == (2, "a100")
    assert podrequest.gpus_of(gpu_pod("2", **{contract.A_GPU_TYPE: "a100"})) == (2, "a100")
    assert podrequest.gpus_of(marked_pod()) == (0, None)


@pytest.mark.parametrize("value", ["a100:2", "gpu/a100", "a,b", "", "ä100", "-x", "a" * 65])
def test_gpu_type_that_could_reach_a_gres_string_is_denied(value: str) -> None:
    with pytest.raises(PodRequestError) as e:
        podrequest.from_pod(gpu_pod("2", **{contract.A_GPU_TYPE: value}))
    assert e.value.field == f"metadata.annotations[{contract.A_GPU_TYPE}]"


def test_gpu_type_without_gpus_is_denied() -> None:
    with pytest.raises(PodRequestError, match="requests no GPUs"):
        podrequest.from_pod(marked_pod(**{contract.A_GPU_TYPE: "a100"}))


# ------------------------------------------------------------------ the placeholder's gres

@pytest.mark.parametrize(("version", "key", "typed", "untyped"), [
    ("v0.0.38", "gres", "gpu:a100:2", "gpu:2"),
    ("v0.0.42", "tres_per_node", "gres/gpu:a100:2", "gres/gpu:2"),
    ("v0.0.45", "tres_per_node", "gres/gpu:a100:2", "gres/gpu:2"),
])
def test_placeholder_asks_for_typed_gres(version: str, key: str, typed: str,
                                         untyped: str) -> None:
    d = dialect(version)
    r = podrequest.from_pod(gpu_pod("2", **{contract.A_GPU_TYPE: "a100"}))
    spec = job_spec(r, "c1", "default", "p")
    assert submit_body(d, spec)["job"][key] == typed
    assert submit_body(d, dataclasses.replace(spec, gpu_type=None))["job"][key] == untyped
    assert key not in submit_body(d, dataclasses.replace(spec, gpus=0, gpu_type=None))["job"]


def test_job_spec_refuses_a_type_that_would_break_the_gres_string() -> None:
    spec = JobSpec(name="k8s:a", comment="c", memory_mb=1, cpus=1, gpus=1, gpu_type="a:1")
    with pytest.raises(ValueError, match="gpu_type"):
        spec.check()


# ------------------------------------------------------------------ Slurm's gres per release

@pytest.mark.parametrize(("gres", "want"), [
    ("", {}),
    (None, {}),
    ("gpu:4", {"": 4}),
    ("gpu:a100:4", {"a100": 4}),  # 22.05, 24.11, 26.05 (recorded on the local cluster)
    ("gpu:a100:4(S:0)", {"a100": 4}),
    ("gpu:a100:2(S:0,1),gpu:v100:2(S:1)", {"a100": 2, "v100": 2}),
    ("gpu:a100:2,gpu:a100:1", {"a100": 3}),
    ("shard:8,gpu:h100:8(S:0-1)", {"h100": 8}),
    ("bandwidth:lustre:4G", {}),
])
def test_gpus_by_type(gres: str | None, want: dict[str, int]) -> None:
    assert gpus_by_type(gres) == want


def inventory(k8s_gpus: tuple[int, ...] = (0, 0, 4, 4),
              gres: tuple[str, ...] = ("", "", "gpu:a100:4", "gpu:v100:2")) -> NodeMap:
    snodes = [NodeInfo(name=f"n{i}", state="IDLE", flags=frozenset(), cpus=8,
                       real_memory_mb=16000, partitions=("k8s",), reason="", features=(),
                       gres=g) for i, g in enumerate(gres, start=1)]
    knodes = [{"metadata": {"name": f"kwok-n{i}", "labels": {contract.NODE_LABEL: f"n{i}"}},
               "status": {"allocatable": {"cpu": "8", "memory": "16000Mi",
                                          "nvidia.com/gpu": str(n)}}}
              for i, n in enumerate(k8s_gpus, start=1)]
    parts = [PartitionInfo("k8s", tuple(s.name for s in snodes), True, None, "UP")]
    return NodeMap.build(snodes, parts, knodes, [])


def test_inventory_counts_gpus_per_type_capped_by_the_node() -> None:
    nm = inventory()
    assert [nm.nodes[f"n{i}"].gpus for i in range(1, 5)] == [0, 0, 4, 2]
    assert nm.nodes["n3"].gpus_of("a100") == 4 and nm.nodes["n3"].gpus_of("v100") == 0
    assert nm.nodes["n4"].gpus_of("v100") == 2
    # Slurm has 4, the Node offers 1: a Pod can have 1 there
    assert inventory((0, 0, 1, 4)).nodes["n3"].gpus_of("a100") == 1


def fit(pod: dict[str, Any], nm: NodeMap) -> Any:
    return check_fit(podrequest.from_pod(pod), nm)


def test_admission_fits_and_denies_gpus_with_numbers() -> None:
    nm = inventory()
    assert fit(gpu_pod("4"), nm).allowed
    assert fit(gpu_pod("4", **{contract.A_GPU_TYPE: "a100"}), nm).allowed
    too_many = fit(gpu_pod("8"), nm)
    assert (too_many.allowed, too_many.reason) == (False, "GPUTooLarge")
    assert "request of 8 GPUs" in too_many.message and "most any node has is 4" in \
        too_many.message
    typed = fit(gpu_pod("3", **{contract.A_GPU_TYPE: "v100"}), nm)
    assert (typed.reason, "3 v100 GPUs" in typed.message, "is 2" in typed.message) == (
        "GPUTooLarge", True, True)
    unknown = fit(gpu_pod("1", **{contract.A_GPU_TYPE: "h100"}), nm)
    assert (unknown.allowed, unknown.reason) == (False, "UnknownGPUType")
    assert "'h100'" in unknown.message and "a100, v100" in unknown.message


# ------------------------------------------------------------------ the binder's refusal

def knode(gpus: str | None, kind: str | None = None) -> dict[str, Any]:
    labels = {contract.NODE_LABEL: "n3"} | ({contract.NODE_GPU_TYPE_LABEL: kind} if kind else {})
    alloc = {"cpu": "8"} | ({"nvidia.com/gpu": gpus} if gpus is not None else {})
    return {"metadata": {"name": "kwok-n3", "labels": labels}, "status": {"allocatable": alloc}}


def test_node_view_reads_gpus_and_their_type() -> None:
    assert node_ref(knode("4", "a100")) == NodeRef("kwok-n3", False, 4, "a100", "n3")
    assert node_ref(knode(None)) == NodeRef("kwok-n3", False, 0, None, "n3")
    assert node_ref(knode("lots")) == NodeRef("kwok-n3", False, 0, None, "n3")


def bound_pod(gpus: str = "2", **ann: str) -> dict[str, Any]:
    p = gpu_pod(gpus, **ann)
    p["metadata"]["uid"] = "u"
    p["metadata"]["annotations"].update({contract.A_CLAIM: "c1", contract.A_JOB_ID: "7",
                                         contract.A_SUBMITTED_AT: str(int(NOW) - 30)})
    p["spec"]["schedulingGates"] = [{"name": contract.GATE}]
    p["status"] = {"phase": "Pending"}
    return p


def running(started_ago: float) -> JobInfo:
    return JobInfo(job_id=7, name="k8s:x", state="RUNNING", reason="None", nodes=("n3",),
                   comment="slurmgate claim=c1 pod=default/p", partition="k8s",
                   submit_time=int(NOW) - 30, start_time=int(NOW - started_ago), end_time=0)


def world(ref: state.NodeRef) -> state.World:
    return state.World(slurm_synced=True, now=NOW, node_for={"n3": ref}, gpu_grace=60.0)


@pytest.mark.parametrize(("ref", "pod", "bind"), [
    (state.NodeRef("kwok-n3", False, 4, "a100"), bound_pod("2"), True),
    (state.NodeRef("kwok-n3", False, 2, None), bound_pod("2", **{contract.A_GPU_TYPE: "a100"}),
     True),  # no type label: Slurm matched the type
    (state.NodeRef("kwok-n3", False, 0, None), bound_pod("0"), True),
    (state.NodeRef("kwok-n3", False, 1, "a100"), bound_pod("2"), False),
    (state.NodeRef("kwok-n3", False, 0, None), bound_pod("2"), False),
    (state.NodeRef("kwok-n3", False, 4, "v100"), bound_pod("2", **{contract.A_GPU_TYPE: "a100"}),
     False),
])
def test_binder_binds_only_where_the_node_has_the_gpus(ref: state.NodeRef, pod: dict[str, Any],
                                                       bind: bool) -> None:
    d = state.decide(state.Unit.single(pod), lambda _c: running(5), world(ref))
    if bind:
        assert (d.action, d.node) == (state.BIND, "kwok-n3")
        return
    assert (d.action, d.reason, d.binds) == (state.WAIT, reasons.EV_NODE_LACKS_GPUS, ())
    assert "kwok-n3" in d.message and "n3" in d.message and d.members == (pod,)
    assert d.requeue_after == pytest.approx(55.0)


def test_binder_gives_the_job_back_after_the_grace() -> None:
    ref = state.NodeRef("kwok-n3", False, 1, "a100")
    pod = bound_pod("2")
    d = state.decide(state.Unit.single(pod), lambda _c: running(61), world(ref))
    assert (d.action, d.reason) == (state.RELEASE, reasons.EV_NODE_LACKS_GPUS)
    assert d.resubmit == (pod,) and d.evict == () and d.clear == ()
    assert d.cancel is not None and d.cancel.job_id == 7 and d.binds == ()
    assert "has 1 allocatable GPUs, the Pod requests 2" in d.message


def test_gang_with_one_node_short_binds_nobody_and_is_released_after_the_grace() -> None:
    members = []
    for i in range(2):
        p = bound_pod("2", **{contract.A_GROUP: "g", contract.A_GROUP_SIZE: "2",
                              contract.A_GROUP_INDEX: str(i)})
        p["metadata"]["name"], p["metadata"]["uid"] = f"p{i}", f"u{i}"
        members.append(p)
    job = dataclasses.replace(running(5), nodes=("n3", "n4"))
    nodes = {"n3": state.NodeRef("kwok-n3", False, 4, "a100"),
             "n4": state.NodeRef("kwok-n4", False, 0, "a100")}
    w = dataclasses.replace(world(nodes["n3"]), node_for=nodes)
    unit = state.Unit(tuple(members), True)
    d = state.decide(unit, lambda _c: job, w)
    assert (d.action, d.reason, d.binds) == (state.WAIT, reasons.EV_NODE_LACKS_GPUS, ())
    late = dataclasses.replace(job, start_time=int(NOW) - 61)
    d = state.decide(unit, lambda _c: late, w)
    assert (d.action, d.reason) == (state.RELEASE, reasons.EV_NODE_LACKS_GPUS)
    assert {id(p) for p in d.clear} == {id(p) for p in members}
