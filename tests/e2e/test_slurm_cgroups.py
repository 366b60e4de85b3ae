"""slurmd holds each batch job to the cores and GPUs Slurm gave it (issue 33, slice 3: the
Slurm half of "no core and no GPU used by two workloads at once"), on the release
$SLURM_VERSION names, with real slurmd cgroups (cluster/slurm_cgroups.py).

Two 1-core, 1-GPU jobs share one node of 2 cores and 4 stand-in GPUs. Each job reports what
the kernel lets it use (its own Cpus_allowed_list; which GPU device files it may open) and the
test holds that to what Slurm says it gave (`scontrol -d show job`: CPU_IDs, GRES IDX) and to
slurmd's job cgroups (the e2e sampler's reading). Without enforcement both jobs see every core
and every GPU, and each assertion below fails."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TypeVar

import pytest

from cluster import slurm as cluster_slurm
from cluster import slurm_cgroups, slurm_files
from cluster.local import PORT_OFFSET

pytestmark = pytest.mark.e2e

T = TypeVar("T")
BASE_PORT = 18000 + PORT_OFFSET
# node names of its own (slurmd's cgroups are named by node): tests/matrix.sh runs releases at once
GPUS = 4
# the job's own report: the cores it may run on, then per stand-in GPU whether opening it was
# refused by the device cgroup (EPERM) or allowed through to a missing driver (ENXIO)
REPORT = """#!/bin/bash
grep Cpus_allowed_list /proc/self/status
for f in {dev}/nvidia*; do
  if cat "$f" 2>&1 | grep -q "not permitted"; then echo "gpu $(basename $f) denied"
  else echo "gpu $(basename $f) allowed"; fi
done
echo done
exec sleep 600
"""


@pytest.fixture(scope="module")
def cluster() -> Iterator[cluster_slurm.SlurmCluster]:
    if len(slurm_cgroups.host_cpus()) < 2:
        pytest.skip("two workloads with cores of their own need a host of 2 CPUs or more")
    run_dir = Path(tempfile.mkdtemp(prefix="slurmgate-e2e-cgroups-", dir="/tmp"))
    try:
        yield cluster_slurm.start(run_dir, n_nodes=2, cpus=2, memory_mb=4000,
                                  base_port=BASE_PORT, accounting=False, gpu_nodes=1,
                                  gpus_per_node=GPUS, gpu_type="a100", enforce=True,
                                  node_prefix=f"cg{BASE_PORT}n")
    finally:
        cluster_slurm.stop(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


def wait(what: str, fn: Callable[[], T | None], limit: float = 60.0) -> T:
    """Until fn answers something true, for at most `limit` seconds."""
    deadline = time.monotonic() + limit
    last: T | None = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {limit:.0f}s waiting for {what}; last: {last!r}")


def submit(c: cluster_slurm.SlurmCluster, name: str, node: str) -> tuple[int, Path]:
    script = c.run_dir / f"{name}.sh"
    script.write_text(REPORT.format(dev=slurm_files.gpu_dir(c)))
    out = c.run_dir / f"{name}.out"
    p = c.cli("sbatch", "--parsable", f"--job-name={name}", "--ntasks=1", "--cpus-per-task=1",
              "--gres=gpu:a100:1", "--mem=100", f"--nodelist={node}", f"--output={out}",
              str(script))
    assert p.returncode == 0, p.stderr
    return int(p.stdout.strip().split(";")[0]), out


def told(c: cluster_slurm.SlurmCluster, job_id: int) -> tuple[str, set[int], set[int]]:
    """(state, CPU ids, GPU indices) Slurm gave the job, from `scontrol -d show job`."""
    out = c.cli("scontrol", "-d", "-o", "show", "job", str(job_id)).stdout
    state = re.search(r"JobState=(\S+)", out)
    cpus = re.search(r" CPU_IDs=(\S+)", out)
    idx = re.search(r"GRES=\S*gpu[^(]*\(IDX:([^)]*)\)", out)
    return (state.group(1) if state else "",
            set(slurm_cgroups.parse_cpu_list(cpus.group(1))) if cpus else set(),
            set(slurm_cgroups.parse_cpu_list(idx.group(1))) if idx else set())


def running_share(c: cluster_slurm.SlurmCluster, job_id: int) -> tuple[set[int], set[int]] | None:
    """(CPU ids, GPU indices) once the job runs."""
    state, cpus, gpus = told(c, job_id)
    return (cpus, gpus) if state == "RUNNING" else None


def reported(out: Path) -> tuple[set[int], set[int]] | None:
    """(cores, GPU indices) the job could use, from its own report once complete."""
    try:
        text = out.read_text()
    except FileNotFoundError:
        return None
    if "done" not in text.split():
        return None
    cores = re.search(r"Cpus_allowed_list:\s*(\S+)", text)
    gpus = {int(i) for i in re.findall(r"gpu nvidia(\d+) allowed", text)}
    assert cores, text
    return set(slurm_cgroups.parse_cpu_list(cores.group(1))), gpus


def cgroup_gone(node: str, job_id: int) -> bool:
    return slurm_cgroups.job_cgroup("cpuset", node, job_id) is None


def test_each_job_held_to_its_own_cores_and_gpus(cluster: cluster_slurm.SlurmCluster) -> None:
    node = cluster.gpu_nodes[0]
    jobs = [submit(cluster, f"share{i}", node) for i in range(2)]
    try:
        given = {jid: wait(f"job {jid} running with its share",
                           partial(running_share, cluster, jid)) for jid, _ in jobs}
        (a_cpus, a_gpus), (b_cpus, b_gpus) = given.values()
        # Slurm split the node: one core and one GPU each, none shared
        assert len(a_cpus) == len(b_cpus) == 1 and not a_cpus & b_cpus, given
        assert len(a_gpus) == len(b_gpus) == 1 and not a_gpus & b_gpus, given
        for jid, out in jobs:
            cores, gpus = wait(f"job {jid}'s report", partial(reported, out))
            # what the kernel lets the job use is exactly what Slurm gave it
            assert (cores, gpus) == given[jid], (jid, cores, gpus, given)
            cg = slurm_cgroups.job_cgroup("cpuset", node, jid)
            assert cg is not None, f"no cpuset cgroup of job {jid} under slurm_{node}"
            assert set(slurm_cgroups.parse_cpu_list(
                (cg / "cpuset.cpus").read_text())) == given[jid][0]
    finally:
        for jid, _ in jobs:
            cluster.cli("scancel", str(jid))
    for jid, _ in jobs:
        # slurmd removes an ended job's cgroups: the sampler never reads a stale one
        wait(f"job {jid}'s cgroup gone", partial(cgroup_gone, node, jid))
