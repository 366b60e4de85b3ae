"""`kubectl slurm`: what Slurm decided, seen from Kubernetes, for users and operators.

    kubectl slurm pods [-n NS | -A] [-o json]   marked Pods: job, state, reason, expected start
    kubectl slurm nodes [-o json]               Slurm-labelled Nodes: Slurm's state, who holds it
    kubectl slurm explain POD [-n NS] [-o json] one Pod's journey: admission, job, Events

Installed with the Python package as `kubectl-slurm`, which kubectl runs as the `slurm` plugin
(krew's naming). It reads the API server (the current kubeconfig context) and, for `nodes`,
slurmrestd (SLURMREST_URL, SLURM_JWT_FILE and SLURM_USER, as the binder reads them); it writes
nothing. `pods` needs no Slurm call: the binder mirrors every job's state onto its Pods;
`explain` reads that Pod's job (one GET /job/{id}).

Slurm calls of `nodes` (docs/operator-guide.md weighs them on a busy site): one GET /node/{name}
per Slurm-labelled Node, and for each such node Slurm calls allocated to no Pod of ours, one
slurmdbd query for the jobs running there (filtered by node and state in slurmdbd: its cost
follows that node's jobs, not the site's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from slurmgate import contract, names
from slurmgate.config import SlurmSettings
from slurmgate.kube import KubeClient, KubeError, load_config
from slurmgate.kubeview import NodeView, PodView
from slurmgate.slurm import PENDING, JobInfo, SlurmClient, SlurmError, accounting
from slurmgate.slurm.dialects import num
from slurmgate.timestamps import format_time

MARKED = f"{contract.MARK_LABEL}={contract.MARK_VALUE}"
NONE = "-"
# a Slurm node in one of these states runs something; ask slurmdbd what, when no Pod of ours does
BUSY_STATES = ("ALLOCATED", "MIXED", "COMPLETING")


@dataclass(frozen=True)
class PodRow:
    namespace: str
    name: str
    job: str
    state: str
    reason: str
    expected_start: str
    partition: str
    account: str
    node: str


@dataclass(frozen=True)
class NodeRow:
    node: str
    slurm_node: str
    slurm_state: str
    kubernetes: str  # Ready, NotReady, and SchedulingDisabled when cordoned
    tainted: bool  # the taint that keeps other Pods off a Slurm Node
    held_by: str


def pod_row(p: dict[str, Any]) -> PodRow:
    v = PodView(p)
    a = v.annotations
    return PodRow(namespace=v.namespace, name=v.name,
                  job=a.get(contract.A_JOB_ID, NONE), state=a.get(contract.A_JOB_STATE, NONE),
                  reason=a.get(contract.A_JOB_REASON) or NONE,
                  expected_start=a.get(contract.A_EXPECTED_START, NONE),
                  partition=a.get(contract.A_PARTITION, NONE),
                  account=a.get(contract.A_ACCOUNT, NONE),
                  node=v.node_name or NONE)


def _kube_state(v: NodeView) -> str:
    word = "Ready" if v.ready == "True" else "NotReady"
    return f"{word},SchedulingDisabled" if v.unschedulable else word


def _tainted(v: NodeView) -> bool:
    return any(t.get("key") == contract.TAINT_KEY for t in v.taints)


def _pods_by_node(pods: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for p in pods:
        r = pod_row(p)
        if r.node != NONE and not PodView(p).finished:
            out.setdefault(r.node, []).append(f"pod {r.namespace}/{r.name} (job {r.job})")
    return out


def _holders(jobs: list[dict[str, Any]] | None) -> str:
    """Who runs on a busy Slurm node of no Pod of ours, from slurmdbd's records."""
    if jobs is None:
        return "a Slurm job (no slurmdbd to ask which)"
    return ", ".join(f"job {num(j.get('job_id'))} (user {j.get('user') or '?'}, "
                     f"partition {j.get('partition') or '?'})" for j in jobs
                     ) or "a Slurm job (slurmdbd has none yet)"


async def node_rows(kube: KubeClient, slurm: SlurmClient) -> list[NodeRow]:
    nodes, _ = await kube.list("/api/v1/nodes", labelSelector=contract.NODE_LABEL)
    pods, _ = await kube.list("/api/v1/pods", labelSelector=MARKED)
    held = _pods_by_node(pods)
    rows = []
    for v in sorted(map(NodeView, nodes), key=lambda v: v.name):
        name, slurm_node = v.name, v.slurm_node or NONE
        holder = ", ".join(held.get(name, [])) or NONE
        try:
            info = await slurm.node(slurm_node)
            state = "(not in Slurm)" if info is None else info.state
            if holder == NONE and info is not None and info.state in BUSY_STATES:
                holder = _holders(await accounting.running_on_node(slurm, slurm_node))
        except SlurmError as e:
            state = f"? ({e})"[:60]
        rows.append(NodeRow(name, slurm_node, state, _kube_state(v), _tainted(v), holder))
    return rows


def _when(unix: int) -> str:
    return format_time(unix) if unix > 0 else NONE


def job_view(job: JobInfo | None, job_id: str) -> dict[str, Any]:
    """What Slurm says of the Pod's job now."""
    if job is None:
        return {"job_id": job_id, "known_to_slurm": False}
    return {"job_id": job.job_id, "known_to_slurm": True, "state": job.state,
            "reason": job.reason, "partition": job.partition, "user": job.user or NONE,
            "nodes": list(job.nodes), "submitted": _when(job.submit_time),
            **({"expected_start": _when(job.expected_start or 0)} if job.state == PENDING
               else {"started": _when(job.start_time)}),
            "restarts": job.restarts, "preempted": job.preempted,
            **({"holds": "; ".join(f"{a.node} {a.describe()}" for a in job.allocation)}
               if job.allocation else {})}


def explanation(p: dict[str, Any], job: dict[str, Any] | None,
                events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    v = PodView(p)
    cond = v.condition(contract.COND_ALLOCATED)
    return {
        "pod": v.key, "phase": v.phase, "node": v.node_name or NONE, "gated": v.gated,
        "condition": dict(cond) if cond is not None else None,
        "annotations": {k: val for k, val in v.annotations.items()
                        if k.startswith(f"{contract.DOMAIN}/")},
        "job": job,
        "events": [{"time": e.get("lastTimestamp") or e.get("eventTime") or NONE,
                    "type": e.get("type"), "reason": e.get("reason"),
                    "count": e.get("count") or 1, "message": e.get("message")}
                   for e in events],
    }


def explain_text(x: dict[str, Any]) -> str:
    lines = [f"Pod {x['pod']}: {x['phase']}, on Node {x['node']}"
             + (f", gated ({contract.GATE})" if x["gated"] else "")]
    if c := x["condition"]:
        lines.append(f"  {contract.COND_ALLOCATED}={c.get('status')} ({c.get('reason')}): "
                     f"{c.get('message')}")
    lines.append("Annotations:")
    lines += [f"  {k}: {v}" for k, v in sorted(x["annotations"].items())] or ["  (none)"]
    j = x["job"]
    if j is None:
        lines.append("Slurm: no job yet")
    elif not j["known_to_slurm"]:
        lines.append(f"Slurm: job {j['job_id']} is no longer known to Slurm")
    else:
        lines.append(f"Slurm job {j['job_id']}: " + ", ".join(
            f"{k} {','.join(v) if isinstance(v, list) else v}" for k, v in j.items()
            if k not in ("job_id", "known_to_slurm")))
    lines.append("Events (oldest first):")
    lines += [f"  {e['time']}  {e['type']:<8} {e['reason']:<24} {e['message']}"
              + (f" (x{e['count']})" if e["count"] > 1 else "") for e in x["events"]] or [
        "  (none)"]
    return "\n".join(lines)


async def explain(kube: KubeClient, slurm: SlurmClient, ns: str, name: str) -> dict[str, Any]:
    p = await kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")
    events, _ = await kube.list(f"/api/v1/namespaces/{ns}/events",
                                fieldSelector=f"involvedObject.uid={PodView(p).uid}")
    events.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    job_id = PodView(p).annotations.get(contract.A_JOB_ID, "")
    job = None
    if job_id.isdigit():
        job = job_view(await slurm.job(int(job_id)), job_id)
    return explanation(p, job, events)


def table(rows: Sequence[Any], headers: Sequence[str]) -> str:
    """Columns as wide as their widest cell, as kubectl prints them."""
    cells = [list(headers)] + [[str(v) for v in asdict(r).values()] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


POD_HEADERS = ("NAMESPACE", "NAME", "JOB", "STATE", "REASON", "EXPECTED-START", "PARTITION",
               "ACCOUNT", "NODE")
NODE_HEADERS = ("NODE", "SLURM-NODE", "SLURM-STATE", "KUBERNETES", "TAINTED", "HELD-BY")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kubectl slurm", description=__doc__.split("\n\n")[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=("pods", "nodes", "explain"))
    ap.add_argument("pod", nargs="?", help="the Pod (explain)")
    ap.add_argument("-n", "--namespace", help="only this namespace (pods); the Pod's (explain, "
                    "default: default)")
    ap.add_argument("-A", "--all-namespaces", action="store_true",
                    help="every namespace (pods; the default without -n)")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table")
    ap.add_argument("--kubeconfig", default=None)
    return ap


async def run(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> str:
    ap = _parser()
    a = ap.parse_args(argv)
    if (a.what == "explain") != (a.pod is not None):
        ap.error("explain takes one Pod name; pods and nodes take none")
    # names go into URL paths: one that is no Kubernetes name is a mistake, said as one
    if a.namespace is not None and not names.DNS_LABEL.fullmatch(a.namespace):
        ap.error(f"-n: {a.namespace[:64]!r} is not a namespace name")
    if a.pod is not None and not names.DNS_SUBDOMAIN.fullmatch(a.pod):
        ap.error(f"{a.pod[:64]!r} is not a Pod name")
    s = SlurmSettings.from_env(os.environ if env is None else env)
    rows: Sequence[Any]
    headers: Sequence[str]
    async with KubeClient(load_config(a.kubeconfig)) as kube:
        if a.what == "pods":  # asks no Slurm: it runs where slurmrestd is out of reach
            path = (f"/api/v1/namespaces/{a.namespace}/pods" if a.namespace and
                    not a.all_namespaces else "/api/v1/pods")
            pods, _ = await kube.list(path, labelSelector=MARKED)
            rows = sorted((pod_row(p) for p in pods), key=lambda r: (r.namespace, r.name))
            headers = POD_HEADERS
        else:
            async with SlurmClient(s.url, s.token_file, s.user) as slurm:
                if a.what == "explain":
                    x = await explain(kube, slurm, a.namespace or "default", a.pod)
                    return json.dumps(x, indent=2) if a.output == "json" else explain_text(x)
                rows = await node_rows(kube, slurm)
                headers = NODE_HEADERS
    if a.output == "json":
        return json.dumps([asdict(r) for r in rows], indent=2)
    return table(rows, headers)


def main() -> None:
    try:
        print(asyncio.run(run()))
    except (OSError, KubeError, SlurmError, ValueError) as e:
        print(f"kubectl slurm: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
