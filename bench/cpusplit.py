"""`bench.run --split-cpus`: Slurm's daemons (and the jobs they start) on one half of the
host's CPUs, Kubernetes' control plane and slurmgate on the other.

On a site the slurmd run on their own machines and never take the API server's CPU; here 100
to 500 of them share two cores with it. The split is an experiment on this host, not a product
feature: it shows how much of slurmgate's overhead over Slurm's floor is that sharing. Each
side's floor is measured under the same split, so the ratios stay side by side in one run."""

from __future__ import annotations

import os
from collections.abc import Iterable

from bench import util
from cluster import proc

# /proc/pid/comm, cut at 15 characters by the kernel
SLURM_COMMANDS = ("slurmctld", "slurmscriptd", "slurmrestd", "slurmd", "slurmstepd",
                  "slurmdbd", "mariadbd")  # accounting is Slurm's too
KUBE_COMMANDS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller", "kwok")
OURS = ("python:binder", "python:binder-worker", "python:webhook", "python:bench")


def halves(cpus: Iterable[int]) -> tuple[frozenset[int], frozenset[int]]:
    """(Slurm's CPUs, Kubernetes' CPUs): the upper half to Slurm, at least one each."""
    ordered = sorted(cpus)
    if len(ordered) < 2:
        raise ValueError(f"--split-cpus needs two CPUs at least, this process may use "
                         f"{len(ordered)}")
    cut = len(ordered) // 2
    return frozenset(ordered[cut:]), frozenset(ordered[:cut])


def side(comm: str, role: str | None) -> str | None:
    """'slurm', 'kube' or None (left where it is) for a process."""
    if comm in SLURM_COMMANDS:
        return "slurm"
    if comm in KUBE_COMMANDS or role in OURS:
        return "kube"
    return None


def apply(slurm_cpus: frozenset[int], kube_cpus: frozenset[int],
          only: frozenset[int] | None = None) -> dict[str, int]:
    """Pin every thread of every process of each side (of `only` these PIDs, when given);
    returns how many processes per side. Processes started later inherit their parent's CPUs
    (a slurmd's steps and hooks)."""
    counts = {"slurm": 0, "kube": 0}
    stats = proc.proc_stats()
    roles = util.python_roles(stats)
    for pid, (comm, _) in stats.items():
        which = side(comm, roles.get(pid)) if only is None or pid in only else None
        if which is None:
            continue
        cpus = slurm_cpus if which == "slurm" else kube_cpus
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                os.sched_setaffinity(int(task), cpus)
        except (OSError, ValueError):
            continue  # gone meanwhile
        counts[which] += 1
    return counts
