"""Kubernetes priorities on the real cluster: a Pod's PriorityClass gives its Slurm job the QOS,
partition and nice the operator mapped (read back from Slurm), and kube-scheduler's preemption
never fights Slurm's: it never preempts for our Pods (nobody but the binder places them) and
never makes them victims (only they may tolerate the Slurm Nodes' taint).

Each test maps two fresh namespaces to the local teams (cluster/slurm_accounting.py: team-a may
use QOS normal and batch, team-b only normal) and adds a `priorityClasses` map to the policy
ConfigMap; the original policy and the PriorityClasses (cluster-scoped) are removed afterwards.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from cluster.bridge import NAMESPACE
from cluster.local import Local
from slurmgate import contract, reasons, tenancy
from tests.e2e.conftest import Kubectl, marked_pod, scontrol_job, slurm_idle, wait_until

pytestmark = pytest.mark.e2e

POLICY_CM = "slurmgate-tenancy"
HIGH, LOW = 1_000_000, 10


@dataclass(frozen=True)
class Env:
    a: str  # team A's namespace (QOS normal, batch)
    b: str  # team B's namespace (QOS normal)
    high: str  # PriorityClass mapped to QOS batch, partition k8s, nice 50
    low: str  # PriorityClass mapped to nothing


def _denial(admin: Kubectl, ns: str, pod: dict[str, Any]) -> str:
    """Admission's answer, without creating the Pod (a server-side dry run goes through the
    webhook, which submits nothing for it). Empty when admitted."""
    p = admin.run("create", "--dry-run=server", "-f", "-", "-n", ns, stdin=json.dumps(pod),
                  check=False)
    return "" if p.returncode == 0 else p.stderr


def _with_class(pod: dict[str, Any], pc: str) -> dict[str, Any]:
    pod["spec"]["priorityClassName"] = pc
    return pod


def _plain_pod(name: str, pc: str, cpu: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"priorityClassName": pc, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "x", "resources": {
                         "requests": {"cpu": cpu, "memory": "100Mi"}}}], **spec}}


@pytest.fixture
def env(admin: Kubectl, local: Local, bridge: object) -> Iterator[Env]:
    tag = uuid.uuid4().hex[:6]
    e = Env(f"pa-{tag}", f"pb-{tag}", f"sg-high-{tag}", f"sg-low-{tag}")
    for ns in (e.a, e.b):
        admin.run("create", "namespace", ns)
    for name, value in ((e.high, HIGH), (e.low, LOW)):
        admin.apply({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": name}, "value": value})
    original = admin.get("configmap", POLICY_CM, NAMESPACE)["data"][tenancy.POLICY_KEY]
    doc = {
        "tenants": [
            {"namespaces": [e.a], "user": "sg-team-a", "account": "team-a",
             "qos": ["normal", "batch"], "partitions": ["k8s"]},
            {"namespaces": [e.b], "user": "sg-team-b", "account": "team-b",
             "qos": ["normal"], "partitions": ["k8s"]},
        ],
        "default": yaml.safe_load(original).get("default"),
        "priorityClasses": {e.high: {"qos": "batch", "partition": "k8s", "nice": 50}},
    }
    admin.run("patch", "configmap", POLICY_CM, "-n", NAMESPACE, "--type=merge", "-p",
              json.dumps({"data": {tenancy.POLICY_KEY: yaml.safe_dump(doc)}}))
    # applied (the webhook watches the policy) once the class forbids another QOS
    wait_until("priority mapping applied", lambda: reasons.DENY_CLASS_FORBIDS_QOS in _denial(
        admin, e.a, _with_class(marked_pod("probe", annotations={contract.A_QOS: "normal"}),
                                e.high)), 30)
    try:
        yield e
    finally:
        admin.run("patch", "configmap", POLICY_CM, "-n", NAMESPACE, "--type=merge", "-p",
                  json.dumps({"data": {tenancy.POLICY_KEY: original}}))
        for ns in (e.a, e.b):
            admin.run("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force",
                      check=False)
            admin.run("delete", "namespace", ns, "--wait=false", check=False)
        admin.run("delete", "priorityclass", e.high, e.low, check=False)
        slurm_idle(local)


def _bound(admin: Kubectl, name: str, ns: str) -> dict[str, Any]:
    return wait_until(f"{ns}/{name} bound", lambda: (
        p := admin.get("pod", name, ns))["spec"].get("nodeName") and p, 60)


def test_the_class_gives_the_job_its_qos_partition_and_nice(local: Local, admin: Kubectl,
                                                             env: Env) -> None:
    admin.apply(_with_class(marked_pod("hi"), env.high), "-n", env.a)
    pod = _bound(admin, "hi", env.a)
    # the Priority admission plugin ran before our webhook: the Pod has the class's value
    assert pod["spec"]["priority"] == HIGH
    job = scontrol_job(local, pod["metadata"]["annotations"][contract.A_JOB_ID])
    assert (job["QOS"], job["Partition"], job["Nice"], job["Account"]) == (
        "batch", "k8s", "50", "team-a"), job
    # an annotation the class forbids is denied, naming the class, the field and its value
    msg = _denial(admin, env.a, _with_class(
        marked_pod("x", annotations={contract.A_QOS: "normal"}), env.high))
    assert reasons.DENY_CLASS_FORBIDS_QOS in msg and f'PriorityClass "{env.high}"' in msg, msg
    assert 'QOS "batch"' in msg and contract.A_QOS in msg, msg
    msg = _denial(admin, env.a, _with_class(
        marked_pod("x", annotations={contract.A_PRIORITY: "0"}), env.high))
    assert reasons.DENY_CLASS_FORBIDS_NICE in msg and "nice 50" in msg, msg
    # the mapped QOS is checked against the tenant like an annotation: B may not use batch
    msg = _denial(admin, env.b, _with_class(marked_pod("x"), env.high))
    assert reasons.DENY_QOS_NOT_ALLOWED in msg and f'from PriorityClass "{env.high}"' in msg, msg
    # a class the mapping does not list changes nothing
    assert _denial(admin, env.a, _with_class(
        marked_pod("x", annotations={contract.A_QOS: "normal"}), env.low)) == ""


def test_a_gang_submitted_by_the_binder_gets_the_mapping(local: Local, admin: Kubectl,
                                                         env: Env) -> None:
    for i in range(2):
        admin.apply(_with_class(marked_pod(f"g{i}", annotations={
            contract.A_GROUP: "pair", contract.A_GROUP_SIZE: "2"}), env.high), "-n", env.a)
    pods = [_bound(admin, f"g{i}", env.a) for i in range(2)]
    (job_id,) = {p["metadata"]["annotations"][contract.A_JOB_ID] for p in pods}
    job = scontrol_job(local, job_id)
    assert (job["QOS"], job["Nice"], job["NumNodes"]) == ("batch", "50", "2"), job


@pytest.fixture
def plain_node(admin: Kubectl) -> Iterator[str]:
    """A Node without slurmd and without the taint (kwok runs it), 2 CPUs."""
    name = f"plain-{uuid.uuid4().hex[:6]}"
    alloc = {"cpu": "2", "memory": "4Gi", "pods": "110"}
    admin.apply({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
        "labels": {"type": "kwok", "kubernetes.io/hostname": name}},
        "status": {"allocatable": alloc, "capacity": alloc}})
    try:
        wait_until("plain Node Ready and untainted", lambda: (n := admin.get("node", name))
                   and not n["spec"].get("taints") and any(
                       c["type"] == "Ready" and c["status"] == "True"
                       for c in n["status"].get("conditions") or []), 60)
        yield name
    finally:
        admin.run("delete", "node", name, check=False)


def _preempted(admin: Kubectl) -> list[dict[str, Any]]:
    return [e for e in admin.items("events") if e.get("reason") == "Preempted"]


def test_kube_scheduler_never_preempts_for_our_pods(admin: Kubectl, env: Env,
                                                    plain_node: str) -> None:
    # the plain Node is full with a low-priority Pod; Slurm's Nodes are full with ours
    admin.apply(_plain_pod("filler", env.low, "2"), "-n", env.b)
    wait_until("filler Running on the plain Node", lambda: (
        p := admin.get("pod", "filler", env.b))["status"].get("phase") == "Running"
        and p["spec"]["nodeName"] == plain_node, 60)
    slurm_nodes = len(admin.items("nodes", selector=contract.NODE_LABEL))
    for i in range(slurm_nodes):
        admin.apply(_with_class(marked_pod(f"full{i}", memory="14Gi"), env.low), "-n", env.a)
    for i in range(slurm_nodes):
        _bound(admin, f"full{i}", env.a)
    # a marked Pod of the high class: kube-scheduler would preempt the filler to place it on
    # the plain Node, if it ever scheduled it; it waits for Slurm instead
    admin.apply(_with_class(marked_pod("urgent"), env.high), "-n", env.a)
    wait_until("urgent waits on Slurm", lambda: admin.get("pod", "urgent", env.a)[
        "metadata"]["annotations"].get(contract.A_JOB_REASON), 30)
    # control: an unmarked Pod of the same class does preempt the filler; once it has, the
    # scheduler has been through its queue, and nothing else was preempted
    admin.apply(_plain_pod("control", env.high, "2"), "-n", env.b)
    control_uid = admin.get("pod", "control", env.b)["metadata"]["uid"]
    wait_until("control preempted the filler", lambda: any(
        control_uid in (e.get("message") or "") for e in _preempted(admin)), 60)
    victims = {e["involvedObject"]["name"] for e in _preempted(admin)
               if e["involvedObject"].get("namespace") in (env.a, env.b)}
    assert victims == {"filler"}, victims
    urgent = admin.get("pod", "urgent", env.a)
    assert not urgent["status"].get("nominatedNodeName"), urgent["status"]
    assert not urgent["spec"].get("nodeName")
    assert all(admin.get("pod", f"full{i}", env.a)["spec"].get("nodeName")
               and not admin.get("pod", f"full{i}", env.a)["metadata"].get("deletionTimestamp")
               for i in range(slurm_nodes))


def test_only_our_pods_may_tolerate_the_slurm_taint(admin: Kubectl, env: Env) -> None:
    admin.apply(marked_pod("ours"), "-n", env.a)
    node = _bound(admin, "ours", env.a)["spec"]["nodeName"]
    # an unmarked high-priority Pod aimed at that Node, which it would fit only by preempting
    # ours, is refused as soon as it tolerates the taint (by key or by a bare Exists)
    for tol in (contract.TOLERATION, {"operator": "Exists"},
                {"key": contract.TAINT_KEY, "value": "true"}):
        thief = _plain_pod("thief", env.high, "8", tolerations=[tol],
                           nodeSelector={"kubernetes.io/hostname": node})
        p = admin.apply(thief, "-n", env.b, check=False)
        assert p.returncode != 0 and "SlurmManagedToleration" in p.stderr, (tol, p.stderr)
    # a toleration of another taint is none of our business
    other = _plain_pod("other", env.high, "1", tolerations=[{"key": "x", "operator": "Exists"}])
    assert _denial(admin, env.b, other) == ""
    # nor may one be added later to a Pod admitted without it
    admin.apply(_plain_pod("later", env.low, "1"), "-n", env.b)
    p = admin.run("patch", "pod", "later", "-n", env.b, "--type=json", "-p", json.dumps([
        {"op": "add", "path": "/spec/tolerations/-", "value": contract.TOLERATION}]),
        check=False)
    assert p.returncode != 0 and "SlurmManagedToleration" in p.stderr, p.stderr
    # node infrastructure is the operator's: a namespace labelled as such may
    admin.run("label", "namespace", env.b, f"{contract.INFRA_NAMESPACE_LABEL}=true")
    thief = _plain_pod("thief", env.high, "8", tolerations=[contract.TOLERATION])
    wait_until("infrastructure namespace exempt", lambda: _denial(admin, env.b, thief) == "",
               10)
    ours = admin.get("pod", "ours", env.a)
    assert ours["spec"]["nodeName"] == node and not ours["metadata"].get("deletionTimestamp")
