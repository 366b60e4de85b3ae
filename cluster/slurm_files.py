"""The files a local Slurm cluster's daemons and users read, written into its run dir before
the daemons start: slurm.conf, gres.conf, cgroup.conf, the JWT key, slurmctld's hook and the
CLI wrappers (cluster/slurm.py starts the daemons)."""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from cluster import proc, slurm_accounting, slurm_cgroups, slurm_release
from cluster.slurm_cluster import SlurmCluster
from cluster.slurm_conf import GpuLayout, SiteLayout, gpu_files, gres_conf_text, slurm_conf_text

HOOK = Path(__file__).resolve().parent.parent / "slurmgate" / "hooks" / "slurmgate-notify"
# The Slurm commands a user of the local cluster types; each gets a wrapper in run_dir/bin.
CLI_TOOLS = ("squeue", "sinfo", "scontrol", "sbatch", "scancel", "srun", "sacct", "sacctmgr",
             "sprio", "sshare")


def munge_socket(c: SlurmCluster) -> Path:
    return c.run_dir / "munge" / "munge.sock"


def gpu_dir(c: SlurmCluster) -> Path:
    """Where the cluster's stand-in GPU device files are (no hardware here)."""
    return c.run_dir / "gpu-dev"


def gpu_devices(c: SlurmCluster) -> list[Path]:
    """The cluster's stand-in GPU device files in gres index order (gres.conf's File=; every
    GPU node names the same ones, all slurmd sharing one host)."""
    gpus = GpuLayout(tuple(c.gpu_nodes), c.gpus_per_node, c.gpu_type)
    return gpu_files(gpu_dir(c), gpus)


def write_cli_wrappers(c: SlurmCluster) -> None:
    """run_dir/bin/squeue etc. run this cluster's own Slurm CLI (the root's, on 24.11+), so a
    shell that sources env.sh types `squeue` and talks to the right slurmctld."""
    for tool in CLI_TOOLS:
        argv, _ = c.command(tool)
        if c.root:
            prefix = shlex.join(argv)
            body = f'#!/bin/sh\nexec {prefix} "$@"\n'
        else:
            body = f'#!/bin/sh\nSLURM_CONF={c.conf} exec /usr/bin/{tool} "$@"\n'
        w = c.run_dir / "bin" / tool
        w.write_text(body)
        w.chmod(0o755)


def write_config(c: SlurmCluster, rel: slurm_release.Release, base_port: int,
                 grace_time: int, accounting: bool, site: SiteLayout | None = None) -> None:
    """jwt.key, slurm.conf, gres.conf and cgroup.conf (the enforcing one, else the release's),
    read by slurmctld and slurmd."""
    proc.write_private(c.run_dir / "jwt.key", os.urandom(32), 0o600)
    acct = slurm_accounting.conf_lines(base_port, munge_socket(c)) if accounting else ""
    gpus = GpuLayout(tuple(c.gpu_nodes), c.gpus_per_node, c.gpu_type)
    c.conf.write_text(slurm_conf_text(c.run_dir, c.nodes, c.node_cpus, c.node_memory_mb,
                                      base_port, munge_socket(c), c.cluster_name, grace_time,
                                      acct, gpus, c.features, site, c.enforce))
    c.conf.chmod(0o644)
    devices = gpu_devices(c)
    dev_dir = gpu_dir(c)
    dev_dir.mkdir(exist_ok=True)
    if c.enforce:
        slurm_cgroups.make_stand_in_gpus(devices)
    else:
        for f in devices:
            f.unlink(missing_ok=True)
            f.symlink_to("/dev/null")
    (c.run_dir / "gres.conf").write_text(gres_conf_text(gpus, dev_dir))
    (c.run_dir / "gres.conf").chmod(0o644)
    hook_dir = c.run_dir / "hook"
    (hook_dir / "slurmgate").mkdir(parents=True, exist_ok=True)
    shutil.copy2(HOOK, hook_dir / "slurmgate-notify")  # inside the run dir: a root sees it
    if c.enforce:
        (c.run_dir / "cgroup.conf").write_text(slurm_cgroups.CGROUP_CONF)
    elif rel.cgroup_conf:
        (c.run_dir / "cgroup.conf").write_text(rel.cgroup_conf)
    else:  # one left by a newer release in the same run dir: 22.05 refuses its plugin name
        (c.run_dir / "cgroup.conf").unlink(missing_ok=True)
