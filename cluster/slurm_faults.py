"""Fault injection for the local Slurm cluster: kill one daemon by its PID, start it again.

Used by the fault tests; a restarted daemon gets the flags start() gave it, minus the one-time
ones (slurmctld keeps its saved state)."""

from __future__ import annotations

import time
from pathlib import Path

from cluster import proc
from cluster.slurm import ctld_up, restd_argv, restd_up
from cluster.slurm_cluster import load, ours


def kill_daemon(run_dir: Path, name: str, timeout: float = 10.0) -> None:
    """SIGKILL one daemon of the cluster by its recorded PID and wait until it is gone."""
    run_dir = Path(run_dir).resolve()
    pid = load(run_dir).pids.get(name, 0)
    if ours(run_dir, pid):
        proc.kill_and_wait(pid, name, timeout)


def running(run_dir: Path, name: str) -> bool:
    """Whether the daemon recorded under `name` is alive (and ours)."""
    run_dir = Path(run_dir).resolve()
    return ours(run_dir, load(run_dir).pids.get(name, 0))


def start_daemon(run_dir: Path, name: str, timeout: float = 60.0,
                 clear_state: bool = False) -> int:
    """Start slurmctld or slurmrestd again; wait until it answers; record the new PID in
    cluster.json. Returns the PID. `clear_state`: slurmctld starts with -c, as a controller
    that lost its state directory would (every job forgotten)."""
    run_dir = Path(run_dir).resolve()
    c = load(run_dir)
    if name == "slurmctld":
        # no -c, as a site restarts it: the saved job state is recovered, not cleared
        argv, env = c.daemon("slurmctld", "-D", "-f", str(c.conf), "-i",
                             *(["-c"] if clear_state else []))
        ready = lambda: ctld_up(c)  # noqa: E731
    elif name == "slurmrestd":
        argv, env = restd_argv(c)
        ready = lambda: restd_up(c)  # noqa: E731
    elif name.startswith("slurmd-") and name[len("slurmd-"):] in c.nodes:
        node = name[len("slurmd-"):]
        argv, env = c.slurmd(node)
        # ReturnToService=2: a node marked DOWN comes back once its slurmd registers
        ready = lambda: c.cli("sinfo", "-h", "-n", node, "-o", "%t", timeout=10).stdout.strip(  # noqa: E731
        ).rstrip("*") in ("idle", "alloc", "mix")
    else:
        raise ValueError(f"cannot restart {name!r} (supported: slurmctld, slurmrestd, "
                         "slurmd-<node>)")
    p = proc.spawn(run_dir / "log", name, argv, env)
    c.pids[name] = p.pid
    c.save()
    logs = [run_dir / "log" / f"{name}.out", run_dir / "log" / "ctld.log"]
    proc.wait_until(f"{name} restarted", ready, timeout, logs,
                    pid_alive=lambda: p.poll() is None)
    return p.pid


def restart_daemon(run_dir: Path, name: str, down_for: float = 0.0) -> int:
    """kill_daemon, stay down for `down_for` seconds, start_daemon. Returns the new PID."""
    kill_daemon(run_dir, name)
    if down_for > 0:
        time.sleep(down_for)
    return start_daemon(run_dir, name)
