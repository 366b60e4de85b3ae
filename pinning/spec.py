"""What `create` changes in a container's OCI spec (config.json in its bundle): for a marked
Pod's container, `linux.resources.cpu.cpus` becomes its placeholder job's cores and its GPUs the
job's (devices.py); nothing else changes, and an unmarked Pod's spec is left as it is."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from slurmgate import contract

from . import devices
from .placeholder import Placeholder, Refused

# containerd's own annotations on every CRI container (sandbox and workload): the Pod as the
# kubelet asked for it, which no Pod can set
CRI_NAME = "io.kubernetes.cri.sandbox-name"
CRI_NAMESPACE = "io.kubernetes.cri.sandbox-namespace"


def marked_job(annotations: Mapping[str, str]) -> tuple[int, str] | None:
    """(job id, Slurm node) a marked Pod's container names, or None for any other container.
    A Pod that names a job must name it whole."""
    raw = annotations.get(contract.A_JOB_ID)
    if raw is None:
        return None
    node = annotations.get(contract.A_SLURM_NODE, "")
    if not raw.isdigit() or not node:
        raise Refused(f"the Pod names Slurm job {raw!r} on Slurm node {node!r}: slurmgate "
                      "writes both once Slurm runs the job; this Pod is not bound by it")
    return int(raw), node


def owns(job_name: str, namespace: str, pod: str, group: str | None) -> bool:
    """Whether the job Slurm started under `job_name` is this Pod's placeholder: its own
    (`k8s:<ns>/<pod>`, or `<generateName>*` when admission did not know the name yet) or its
    gang's (`k8s:<ns>/group:<group>`). The namespace and name are containerd's, not the Pod's
    annotations, so a Pod cannot claim another Pod's job."""
    want = f"{contract.JOB_NAME_PREFIX}{namespace}/"
    if not job_name.startswith(want):
        return False
    display = job_name[len(want):]
    if display == pod:
        return True
    if display.endswith("*") and pod.startswith(display[:-1]):
        return True
    return bool(group) and display == f"group:{group}"


def pin(config: dict[str, Any], node_names: frozenset[str],
        find: Callable[[str, int], Placeholder],
        node_gpus: tuple[str, ...] = ()) -> Placeholder | None:
    """Set the spec's cpuset to the placeholder's cores and its GPUs to the job's (in place;
    `node_gpus`: the Node's GPU device files in gres index order); None for a container that
    is not a marked Pod's. Raises Refused when a marked one must not start."""
    ann = config.get("annotations") or {}
    named = marked_job(ann)
    if named is None:
        return None
    job_id, node = named
    if node not in node_names:
        raise Refused(f"the Pod's job {job_id} runs on Slurm node {node}, which this Node does "
                      f"not stand for ({', '.join(sorted(node_names)) or 'none configured'})")
    ph = find(node, job_id)
    namespace, pod = ann.get(CRI_NAMESPACE, ""), ann.get(CRI_NAME, "")
    if not owns(ph.name, namespace, pod, ann.get(contract.A_GROUP)):
        raise Refused(f"Slurm job {job_id} ({ph.name!r}) is not the placeholder of Pod "
                      f"{namespace}/{pod}")
    linux = config.setdefault("linux", {})
    cpu = linux.setdefault("resources", {}).setdefault("cpu", {})
    cpu["cpus"] = ph.cpus
    if node_gpus or ph.gpus:
        devices.hold(config, ph.gpus, node_gpus)
    return ph


def rewrite(bundle: Path, node_names: frozenset[str],
            find: Callable[[str, int], Placeholder],
            node_gpus: tuple[str, ...] = ()) -> Placeholder | None:
    """pin() on the bundle's config.json, written back whole (a new file renamed over the old:
    runc never reads half of it)."""
    path = bundle / "config.json"
    config = json.loads(path.read_text())
    ph = pin(config, node_names, find, node_gpus)
    if ph is not None:
        tmp = path.with_name(".config.json.slurmgate")
        tmp.write_text(json.dumps(config))
        os.replace(tmp, path)
    return ph
