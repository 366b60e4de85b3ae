"""`kubectl slurm`'s pure parts: a Pod's row from its annotations, the holders slurmdbd names,
the table. The e2e test (tests/e2e/test_kubectl_plugin.py) runs it against the real cluster."""

from __future__ import annotations

import asyncio

import pytest

from slurmgate import contract
from slurmgate.kubectl_plugin import (
    NODE_HEADERS,
    NodeRow,
    _holders,
    _kube_state,
    _parser,
    _pods_by_node,
    explain_text,
    explanation,
    job_view,
    pod_row,
    run,
    table,
)
from slurmgate.kubeview import NodeView
from slurmgate.slurm import JobInfo
from slurmgate.slurm.accounting import running_on


def pod(name: str, node: str = "", phase: str = "Pending", **ann: str) -> dict:
    return {"metadata": {"namespace": "ns", "name": name, "annotations": ann},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


def test_a_pods_row_is_what_its_annotations_say() -> None:
    r = pod_row(pod("w", **{contract.A_JOB_ID: "7", contract.A_JOB_STATE: "PENDING",
                            contract.A_JOB_REASON: "Resources",
                            contract.A_EXPECTED_START: "2026-12-07T02:00:00Z",
                            contract.A_PARTITION: "k8s"}))
    assert (r.job, r.state, r.reason, r.expected_start, r.partition, r.account, r.node) == (
        "7", "PENDING", "Resources", "2026-12-07T02:00:00Z", "k8s", "-", "-")
    # a Pod the webhook has not seen (nothing yet) shows dashes, not a crash
    assert pod_row({"metadata": {"name": "x"}}).job == "-"


def test_only_pods_still_on_a_node_hold_it() -> None:
    held = _pods_by_node([pod("a", "kwok-n1", "Running", **{contract.A_JOB_ID: "3"}),
                          pod("done", "kwok-n2", "Succeeded"), pod("gated")])
    assert held == {"kwok-n1": ["pod ns/a (job 3)"]}


def test_holders_are_running_jobs_on_that_node_whatever_the_server_filtered() -> None:
    # a server that ignored the node and state filters answers other nodes' and ended jobs
    data = {"jobs": [
        {"job_id": 5, "state": {"current": ["RUNNING"]}, "nodes": "n[1-2]", "user": "ada",
         "partition": "hpc"},
        {"job_id": 6, "state": {"current": ["RUNNING"]}, "nodes": "n3", "user": "bob"},
        {"job_id": 7, "state": {"current": ["COMPLETED"]}, "nodes": "n2", "user": "cy"},
        {"job_id": 8, "state": "RUNNING", "nodes": "n[2", "user": "bad hostlist"},
    ]}
    assert _holders(running_on(data, "n2")) == "job 5 (user ada, partition hpc)"
    assert running_on({}, "n2") == []
    assert _holders([]) == "a Slurm job (slurmdbd has none yet)"
    assert _holders(None) == "a Slurm job (no slurmdbd to ask which)"


@pytest.mark.parametrize("argv", [["pods", "-n", "../nodes"], ["pods", "-n", "Ns"],
                                  ["explain", "a/b"], ["explain", "x", "-n", "a b"]])
def test_names_that_go_into_url_paths_are_checked_before_any_request(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    # no kubeconfig is read: the check comes first, and says what is wrong
    with pytest.raises(SystemExit) as e:
        asyncio.run(run([*argv, "--kubeconfig", "/nonexistent"], env={}))
    assert e.value.code == 2
    assert "name" in capsys.readouterr().err


def test_the_parser_takes_a_namespace_and_a_pod() -> None:
    a = _parser().parse_args(["explain", "web-0", "-n", "ml"])
    assert (a.what, a.pod, a.namespace) == ("explain", "web-0", "ml")


def test_kubernetes_state_says_cordoned() -> None:
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    assert _kube_state(NodeView(ready)) == "Ready"
    assert _kube_state(NodeView({**ready, "spec": {"unschedulable": True}})) == \
        "Ready,SchedulingDisabled"
    assert _kube_state(NodeView({})) == "NotReady"


def test_the_table_aligns_its_columns() -> None:
    out = table([NodeRow("kwok-n1", "n1", "IDLE", "Ready", True, "-"),
                 NodeRow("kwok-n10", "n10", "ALLOCATED", "Ready", True, "pod ns/a (job 3)")],
                NODE_HEADERS).splitlines()
    assert out[0].split() == list(NODE_HEADERS)
    starts = {ln.index(ln.split()[1], len(ln.split()[0])) for ln in out}
    assert len(starts) == 1, out  # the second column starts at one place on every line


def test_explain_puts_the_pod_its_job_and_its_events_on_one_screen() -> None:
    p = pod("w", **{contract.A_JOB_ID: "7", contract.A_JOB_STATE: "PENDING",
                    "other.io/x": "not ours"})
    p["spec"]["schedulingGates"] = [{"name": contract.GATE}]
    p["status"]["conditions"] = [{"type": contract.COND_ALLOCATED, "status": "False",
                                  "reason": "Resources", "message": "job 7 waits"}]
    job = job_view(JobInfo(job_id=7, name="n", state="PENDING", reason="Resources", nodes=(),
                           comment="", partition="k8s", submit_time=1_800_000_000,
                           start_time=1_800_000_600, end_time=0, user="ada"), "7")
    assert job["expected_start"] == "2027-01-15T08:10:00Z" and "started" not in job
    ev = [{"lastTimestamp": "t1", "type": "Normal", "reason": "SlurmJobPending",
           "message": "job 7 PENDING", "count": 3}]
    x = explanation(p, job, ev)
    assert x["gated"] and x["annotations"] == {contract.A_JOB_ID: "7",
                                                contract.A_JOB_STATE: "PENDING"}
    text = explain_text(x)
    assert text.splitlines()[0] == f"Pod ns/w: Pending, on Node -, gated ({contract.GATE})"
    assert "Slurm job 7: state PENDING, reason Resources, partition k8s, user ada" in text
    assert "SlurmJobPending" in text and "(x3)" in text
    # a job Slurm forgot, and a Pod with no job yet, say so
    assert "no longer known to Slurm" in explain_text(explanation(p, job_view(None, "7"), []))
    assert "Slurm: no job yet" in explain_text(explanation(pod("new"), None, []))


def test_explain_says_what_a_running_job_holds_on_each_node() -> None:
    from slurmgate.slurm.allocation import NodeAllocation
    job = job_view(JobInfo(job_id=8, name="n", state="RUNNING", reason="None",
                           nodes=("n1", "n2"), comment="", partition="k8s", submit_time=1,
                           start_time=2, end_time=0, allocation=(
                               NodeAllocation("n1", ((0, 0), (0, 1)), 512, (2,)),
                               NodeAllocation("n2", ((1, 0),), 512, ()))), "8")
    text = explain_text(explanation(pod("g"), job, []))
    assert "holds n1 cores=s0:0-1 memory=512M gpus=2; n2 cores=s1:0 memory=512M" in text
