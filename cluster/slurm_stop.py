"""Stopping a local Slurm cluster: its daemons by their recorded PIDs, the job processes they
left behind, then the root's mounts.

Nothing is killed by name: a PID is signalled only while the process carries the cluster's
marker (cluster/slurm_cluster.py), and job processes are found by their environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from cluster import proc, slurm_cgroups, slurm_release
from cluster.slurm_cluster import MARKER_ENV, load, ours


def stop(run_dir: Path) -> None:
    """Stop every daemon of the cluster in run_dir by PID and kill leftover job processes.

    Idempotent: a missing cluster.json or already-dead PIDs are fine.
    """
    run_dir = Path(run_dir).resolve()
    pids: dict[str, int] = {}
    cluster_name, root = "", ""
    cgroup_nodes: list[str] = []
    try:
        c = load(run_dir)
        pids, cluster_name, root = dict(c.pids), c.cluster_name, c.root
        cgroup_nodes = [*c.nodes, *c.site_nodes] if c.enforce else []
    except (OSError, ValueError, TypeError, KeyError):
        pass
    for name, pid in _pids_from_pid_files(run_dir).items():
        pids.setdefault(name, pid)

    daemon_pids = {p for p in pids.values() if ours(run_dir, p)}
    # Jobs first (slurmstepd would otherwise outlive slurmd), then slurmrestd, then slurmctld
    # and all slurmd together, then leftovers, munged last.
    proc.kill_now(_job_processes(run_dir, cluster_name, daemon_pids))
    rest = pids.get("slurmrestd", 0)
    if ours(run_dir, rest):
        proc.signal_and_wait([rest], 10.0)
    group = [v for k, v in pids.items()
             if k not in ("munged", "slurmrestd") and ours(run_dir, v)]
    proc.signal_and_wait(group, 15.0)
    munged = pids.get("munged", 0)
    alive_daemons = {munged} if ours(run_dir, munged) else set()
    proc.kill_now(_job_processes(run_dir, cluster_name, alive_daemons))
    if alive_daemons:
        proc.signal_and_wait([munged], 10.0)
    for k in list(pids):
        if ours(run_dir, pids[k]):
            print(f"warning: {k} (pid {pids[k]}) still alive", file=sys.stderr)
    slurm_cgroups.leftovers(cgroup_nodes)
    slurm_release.leave(root, run_dir)


def _pids_from_pid_files(run_dir: Path) -> dict[str, int]:
    """The daemons' own PID files: they may know daemons that cluster.json did not record yet
    (a start that failed or was killed)."""
    pids: dict[str, int] = {}
    for name, pf in [("munged", run_dir / "munge" / "munged.pid"),
                     ("slurmctld", run_dir / "run" / "ctld.pid"),
                     ("slurmdbd", run_dir / "run" / "slurmdbd.pid"),
                     ("mariadb", run_dir / "db" / "mariadb.pid")]:
        pid = proc.read_pid(pf)
        if pid is not None:
            pids[name] = pid
    for pf in (run_dir / "run").glob("d-*.pid"):
        pid = proc.read_pid(pf)
        if pid is not None:
            pids[f"slurmd-{pf.stem[2:]}"] = pid
    return pids


def _job_processes(run_dir: Path, cluster_name: str, daemon_pids: set[int]) -> set[int]:
    """Processes of this cluster that are not its recorded daemons: slurmstepd (they carry our
    marker, inherited from slurmd, and are re-parented to init), job processes (Slurm puts
    SLURM_JOB_ID, SLURM_CONF and SLURM_CLUSTER_NAME into every job's environment), whatever
    listens on a unix socket under run_dir (a slurmstepd whose environ was rewritten, as
    26.05's is), and all their descendants. Children of the daemons themselves (slurmscriptd)
    are left to the daemons while they live."""
    conf = str(run_dir / "slurm.conf")
    procs = proc.all_procs()
    me = os.getpid()
    roots: set[int] = set()
    for pid, ppid in procs.items():
        if pid == me or pid in daemon_pids or ppid in daemon_pids:
            continue
        env = proc.environ(pid)
        if not env:
            continue
        if env.get(MARKER_ENV) == str(run_dir) or (
            "SLURM_JOB_ID" in env
            and (env.get("SLURM_CONF") == conf or env.get("SLURM_CLUSTER_NAME") == cluster_name)
        ):
            roots.add(pid)
    roots |= {p for p in proc.unix_socket_holders(str(run_dir))
              if p in procs and p != me and p not in daemon_pids
              and procs[p] not in daemon_pids}
    found = roots | proc.descendants(roots, procs)
    found.discard(me)
    return found - daemon_pids
