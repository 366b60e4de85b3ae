"""SlurmCluster: one local Slurm cluster as recorded in ``run_dir/cluster.json`` (its paths,
daemon PIDs, release and root), how to run its commands, and which processes are its own.

cluster/slurm.py starts a cluster and writes the record; cluster/slurm_stop.py and
cluster/slurm_faults.py read it back with load().
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cluster import proc, slurm_release

# Every daemon we start carries this variable in its environment. slurmstepd inherits slurmd's
# environment, so stop() can find the job step daemons of *this* cluster without matching names.
MARKER_ENV = "SLURMGATE_SLURM_RUN_DIR"
RECORD_FILE = "cluster.json"
NICE = "/usr/bin/nice"
# cluster.local starts every slurmd at this nice(1) level (bench.run --slurmd-nice sets it)
SLURMD_NICE_ENV = "SLURMGATE_SLURMD_NICE"


@dataclass
class SlurmCluster:
    run_dir: Path
    conf: Path
    rest_url: str
    token_file: Path
    nodes: list[str]
    node_cpus: int
    node_memory_mb: int
    pids: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    cluster_name: str = "sg"
    version: str = "22.05"
    # The chroot the daemons and CLI run in ("" = the host's own Slurm).
    root: str = ""
    # Nodes with `gpu` gres (slurm.conf Gres=, gres.conf), and their count and type
    gpu_nodes: list[str] = field(default_factory=list)
    gpus_per_node: int = 0
    gpu_type: str = ""
    # Addresses slurmrestd also listens on, besides 127.0.0.1 (a real Node's IP, so that
    # slurmgate's Pods on that Node's bridge reach it)
    rest_listen_ips: list[str] = field(default_factory=list)
    features: dict[str, str] = field(default_factory=dict)  # Features= by node
    # nice(1) of every slurmd and so of every job it starts: on one host the slurmd stand for
    # other machines, and a bench can keep them from taking the control plane's cores
    slurmd_nice: int = 0
    # slurmd of other users' partition (a busy-site bench): in slurm.conf and started like
    # the others, but no Kubernetes Node stands for them (cluster/slurm_conf.SiteLayout)
    site_nodes: list[str] = field(default_factory=list)
    site_partition: str = ""
    # slurmd holds every job to its cores and GPUs (cgroups: cluster/slurm_cgroups.py)
    enforce: bool = False

    def command(self, *args: str) -> tuple[list[str], dict[str, str]]:
        """argv and env that run one of this cluster's Slurm commands (squeue, sbatch, ...)."""
        return slurm_release.command(self.root, list(args), self.env)

    def daemon(self, *args: str) -> tuple[list[str], dict[str, str]]:
        """command() for a daemon: it also carries our marker, which its children inherit."""
        argv, env = slurm_release.command(self.root, list(args), {**self.env, **self.daemon_env()})
        return argv, {**env, **self.daemon_env()}

    def slurmd(self, node: str) -> tuple[list[str], dict[str, str]]:
        """daemon() for node's slurmd, in the foreground, at slurmd_nice."""
        argv, env = self.daemon("slurmd", "-D", "-f", str(self.conf), "-N", node)
        # nice execs slurmd in place: the PID recorded is slurmd's
        return ([NICE, "-n", str(self.slurmd_nice), *argv] if self.slurmd_nice else argv), env

    def cli(self, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        argv, env = self.command(*args)
        return proc.run(argv, env, timeout=timeout)

    def client_env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF (host Slurm only; use command() for every release)."""
        return {**os.environ, **self.env}

    def token(self) -> str:
        return self.token_file.read_text().strip()

    def rest_headers(self) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": self.token()}

    def daemon_env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf), MARKER_ENV: str(self.run_dir)}

    def save(self) -> None:
        (self.run_dir / RECORD_FILE).write_text(self.to_json())

    def to_json(self) -> str:
        d = asdict(self)
        for k in ("run_dir", "conf", "token_file"):
            d[k] = str(d[k])
        return json.dumps(d, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SlurmCluster:
        d = json.loads(text)
        for k in ("run_dir", "conf", "token_file"):
            d[k] = Path(d[k])
        return cls(**d)


def load(run_dir: Path) -> SlurmCluster:
    return SlurmCluster.from_json((Path(run_dir) / RECORD_FILE).read_text())


def ours(run_dir: Path, pid: int) -> bool:
    """A recorded PID is trusted only while the process carries our marker (PIDs get reused)."""
    return pid > 1 and proc.alive(pid) and proc.environ(pid).get(MARKER_ENV) == str(run_dir)
