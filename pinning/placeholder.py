"""The placeholder job as slurmd runs it on this Node: its cgroup (`slurm_<node>/uid_U/job_J`,
cluster/slurm_cgroups.py documents the layout), the cores in it, and the name Slurm started it
under (read from one of its processes' environment: slurmd sets SLURM_JOB_NAME for the batch
script, and no Pod can change it)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
# how long `create` waits for slurmd to launch the job's step: Slurm reports RUNNING (and the
# binder binds) at allocation, a moment before slurmd has made the job's cgroup
APPEAR_WITHIN_S = 10.0
POLL_S = 0.05


class Refused(Exception):
    """The container must not start: the message says why, for `kubectl describe pod`."""


@dataclass(frozen=True)
class Placeholder:
    job_id: int
    node: str
    cpus: str  # the kernel's list format, as cpuset.cpus holds it ("0", "2-3")
    name: str  # SLURM_JOB_NAME
    gpus: str  # SLURM_JOB_GPUS ("" without GPUs)


def job_dir(controller: str, node: str, job_id: int, root: Path = CGROUP_ROOT) -> Path | None:
    for d in (root / controller / f"slurm_{node}").glob(f"uid_*/job_{job_id}"):
        return d
    return None


def _task_env(job: Path, proc: Path) -> dict[str, str] | None:
    """The environment of the first process in the job's cgroup tree that slurmd launched as
    the job (one carrying SLURM_JOB_ID), or None while there is none yet."""
    for tasks in sorted(job.rglob("cgroup.procs")):
        try:
            pids = tasks.read_text().split()
        except OSError:
            continue
        for pid in pids:
            try:
                raw = (proc / pid / "environ").read_bytes()
            except OSError:
                continue
            env = dict(item.decode(errors="replace").split("=", 1)
                       for item in raw.split(b"\0") if b"=" in item)
            if "SLURM_JOB_ID" in env:
                return env
    return None


def find(node: str, job_id: int, *, within: float = APPEAR_WITHIN_S,
         root: Path = CGROUP_ROOT, proc: Path = PROC) -> Placeholder:
    """The job as slurmd runs it on `node`, waiting up to `within` seconds for its cgroup and
    its batch process to appear."""
    deadline = time.monotonic() + within
    while True:
        d = job_dir("cpuset", node, job_id, root)
        env = _task_env(d, proc) if d is not None else None
        if d is not None and env is not None:
            if env.get("SLURM_JOB_ID") != str(job_id):
                raise Refused(f"job {job_id}'s cgroup on {node} holds job "
                              f"{env.get('SLURM_JOB_ID')}'s process")
            cpus = (d / "cpuset.cpus").read_text().strip()
            if not cpus:
                raise Refused(f"job {job_id} has no cores in its cgroup on {node}")
            return Placeholder(job_id, node, cpus, env.get("SLURM_JOB_NAME", ""),
                               env.get("SLURM_JOB_GPUS", ""))
        if time.monotonic() >= deadline:
            where = "no cgroup" if d is None else "no process in its cgroup"
            raise Refused(f"Slurm job {job_id} has {where} on Slurm node {node} after "
                          f"{within:.0f} s: it ended, or Slurm did not start it on this Node")
        time.sleep(POLL_S)
