"""Start and stop a real, local Slurm cluster in a scratch directory (dev/test tool).

Everything lives under ``run_dir``: an own munged (own socket and key), slurmctld, N slurmd
(``slurmd -N nX``, all on this host) and slurmrestd with JWT auth. Nothing system-wide is
touched, no systemd is used, and every daemon is stopped by its own PID. The Slurm release is
chosen by ``SLURM_VERSION`` (22.05, 24.11, 26.05; see cluster/slurm_release.py).

This module starts a cluster; the SlurmCluster record it returns is cluster/slurm_cluster.py's
and stop() is cluster/slurm_stop.py's (both re-exported here, so callers need only this one).

    python -m cluster.slurm up     [--dir D] [--nodes N] [--version V]
    python -m cluster.slurm down   [--dir D]
    python -m cluster.slurm status [--dir D]

Synchronous on purpose: this is a dev tool, not part of the event loop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from cluster import proc, slurm_accounting, slurm_cgroups, slurm_release, unix_users
from cluster.proc import ClusterError
from cluster.slurm_cluster import RECORD_FILE, SlurmCluster, load
from cluster.slurm_conf import GpuLayout, SiteLayout
from cluster.slurm_files import CLI_TOOLS, munge_socket, write_cli_wrappers, write_config
from cluster.slurm_stop import stop

__all__ = ["ClusterError", "SiteLayout", "SlurmCluster", "load", "start", "stop", "throwaway"]

REST_USER = "slurmrest"
DEFAULT_DIR = Path("/tmp/slurmgate-slurm")


def start(
    run_dir: Path,
    n_nodes: int = 4,
    cpus: int = 8,
    memory_mb: int = 16000,
    base_port: int = 16800,
    *,
    grace_time: int = 20,
    token_lifespan: int = 86400,
    timeout: float = 60.0,
    version: str | None = None,
    accounting: bool = True,
    gpu_nodes: int = 2,
    gpus_per_node: int = 4,
    gpu_type: str = "a100",
    rest_listen_ips: tuple[str, ...] = (),
    features: dict[str, str] | None = None,
    slurmd_nice: int = 0,
    site: SiteLayout | None = None,
    enforce: bool = False,
    node_prefix: str = "n",
) -> SlurmCluster:
    """Start munged, MariaDB and slurmdbd (unless accounting is off), slurmctld, n_nodes slurmd
    and slurmrestd; return when all are ready.

    The last `gpu_nodes` nodes (at most half of them) get `gpus_per_node` GPUs of `gpu_type`
    ("" = untyped) as gres; gpu_nodes=0 for none. `rest_listen_ips`: slurmrestd also listens
    there (Pods on a real Node's bridge reach it at the Node's IP); `features`: Features= by node.
    `slurmd_nice`: every slurmd, and so every job it starts, runs at this nice(1) level.
    `site`: other users' slurmd and partition beside ours, and job limits (a busy-site bench;
    SiteLayout, None: none). Their slurmd start and stop with the rest; no Node stands for them.
    `enforce`: slurmd holds each job to its cores and GPUs (cgroups; `cpus` at most the host's,
    cluster/slurm_cgroups.py). Its cgroups are named by node (`slurm_<node>`): enforcing
    clusters that run on one host at once need node names of their own (`node_prefix`).

    Ports: slurmctld base+17, slurmd nX base+100+X (the site's after them), slurmrestd
    base+20, slurmdbd base+21, MariaDB base+22.
    On any failure the daemons started so far are stopped and ClusterError is raised.
    """
    run_dir = Path(run_dir).resolve()
    rel = slurm_release.release(version)
    root = slurm_release.build_root(rel)  # before anything starts: the first build is slow
    if (run_dir / RECORD_FILE).exists():
        stop(run_dir)  # a previous cluster in the same dir: never leave two running
    site = site or SiteLayout()
    _check_ports_free(base_port, n_nodes + len(site.other_nodes), accounting)
    if enforce:
        cpus = slurm_cgroups.cpus_for_enforcement(cpus)
    c = _new_cluster(run_dir, rel.version, root, n_nodes, cpus, memory_mb, base_port,
                     node_prefix)
    c.enforce = enforce
    if enforce:
        slurm_cgroups.check_free([*c.nodes, *site.other_nodes])
    c.site_nodes, c.site_partition = list(site.other_nodes), site.other_partition
    gpus = GpuLayout.last(c.nodes, gpu_nodes, gpus_per_node, gpu_type)
    c.gpu_nodes, c.gpus_per_node, c.gpu_type = list(gpus.nodes), gpus.per_node, gpus.type
    c.rest_listen_ips = list(rest_listen_ips)
    c.features = dict(features or {})
    if not 0 <= slurmd_nice <= 19:
        raise ValueError(f"slurmd_nice must be 0..19 (nice(1)'s range), not {slurmd_nice}")
    c.slurmd_nice = slurmd_nice
    _prepare_dirs(c)
    unix_users.ensure(root, [REST_USER] + (slurm_accounting.unix_users() if accounting else []))
    # The record is saved after every daemon, so that stop() finds what runs even when this
    # process is killed halfway.
    try:
        c.save()
        slurm_release.enter(root, run_dir, cgroups=enforce)
        write_cli_wrappers(c)
        _start_munged(c)
        c.save()
        write_config(c, rel, base_port, grace_time, accounting, site)
        if accounting:
            slurm_accounting.start(c, base_port, munge_socket(c), timeout)
            c.save()
            slurm_accounting.register(c)
            slurm_accounting.seed(c)
        _start_slurmctld(c, timeout)
        c.save()
        _start_slurmds(c, timeout)
        c.save()
        _write_token(c, token_lifespan)
        _start_slurmrestd(c, timeout)
        c.save()
        return c
    except BaseException:
        c.save()
        stop(run_dir)
        raise


@contextlib.contextmanager
def throwaway(prefix: str, base_port: int, **kw: Any) -> Iterator[SlurmCluster]:
    """A 4-node cluster in a fresh /tmp dir (any start() keyword), stopped and removed after."""
    run_dir = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield start(run_dir, kw.pop("n_nodes", 4), base_port=base_port, **kw)
    finally:
        stop(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


# ----------------------------------------------------------------- the steps of start(), in order


def _check_ports_free(base_port: int, n_nodes: int, accounting: bool) -> None:
    proc.check_ports_free(
        [base_port + 17, base_port + 18, base_port + 20]
        + (list(slurm_accounting.ports(base_port)) if accounting else [])
        + [base_port + 100 + i for i in range(1, n_nodes + 1)]
    )


def _new_cluster(run_dir: Path, version: str, root: str, n_nodes: int, cpus: int,
                 memory_mb: int, base_port: int, node_prefix: str = "n") -> SlurmCluster:
    conf = run_dir / "slurm.conf"
    return SlurmCluster(
        run_dir=run_dir, conf=conf, rest_url=f"http://127.0.0.1:{base_port + 20}",
        token_file=run_dir / "token", nodes=[f"{node_prefix}{i}" for i in range(1, n_nodes + 1)],
        node_cpus=cpus, node_memory_mb=memory_mb, env={"SLURM_CONF": str(conf)},
        cluster_name=f"sg{base_port}", version=version, root=root,
    )


def _prepare_dirs(c: SlurmCluster) -> None:
    c.run_dir.mkdir(parents=True, exist_ok=True)
    c.run_dir.chmod(0o755)
    _check_traversable(c.run_dir)
    for sub in ("state", "run", "log", "munge", "spool", "bin"):
        p = c.run_dir / sub
        if sub in ("state", "spool") and p.exists():
            shutil.rmtree(p)  # fresh job/node state every time
        p.mkdir(exist_ok=True)
        p.chmod(0o755)
    for n in [*c.nodes, *c.site_nodes]:
        (c.run_dir / "spool" / n).mkdir(exist_ok=True)


def _check_traversable(path: Path) -> None:
    """slurmrestd runs unprivileged and must read slurm.conf: every ancestor needs o+x."""
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise ClusterError(
                f"{p} is not world-traversable (mode {stat.filemode(mode)}); slurmrestd runs as "
                f"{REST_USER!r} and must read {path}/slurm.conf. Use a run_dir such as "
                "/tmp/slurmgate-slurm or tempfile.mkdtemp(dir='/tmp')."
            )


def _start_munged(c: SlurmCluster) -> None:
    mdir = c.run_dir / "munge"
    msock, mkey, mpid = munge_socket(c), mdir / "munge.key", mdir / "munged.pid"
    if not mkey.exists():
        proc.write_private(mkey, os.urandom(1024), 0o400)
    mlog = c.run_dir / "log" / "munged.log"
    mpid.unlink(missing_ok=True)
    argv, env = c.daemon(
        "munged", "--foreground", f"--socket={msock}", f"--key-file={mkey}",
        f"--pid-file={mpid}", f"--log-file={mlog}", f"--seed-file={mdir / 'munged.seed'}",
        "--force",
    )
    p = proc.spawn(c.run_dir / "log", "munged", argv, env)
    c.pids["munged"] = p.pid

    def munge_ok() -> bool:
        cred = c.cli("munge", "-n", "-S", str(msock), timeout=10)
        if cred.returncode != 0:
            return False
        argv, env = c.command("unmunge", "-S", str(msock))
        return proc.run(argv, env, timeout=10, stdin=cred.stdout).returncode == 0

    proc.wait_until("munged", munge_ok, 15, [c.run_dir / "log" / "munged.out", mlog],
                    pid_alive=lambda: p.poll() is None)


def _start_slurmctld(c: SlurmCluster, timeout: float) -> None:
    clog = c.run_dir / "log" / "ctld.log"
    argv, env = c.daemon("slurmctld", "-D", "-f", str(c.conf), "-c", "-i")
    p = proc.spawn(c.run_dir / "log", "slurmctld", argv, env)
    c.pids["slurmctld"] = p.pid
    proc.wait_until("slurmctld", lambda: ctld_up(c), timeout,
                    [c.run_dir / "log" / "slurmctld.out", clog],
                    pid_alive=lambda: p.poll() is None)


def ctld_up(c: SlurmCluster) -> bool:
    p = c.cli("scontrol", "ping", timeout=10)
    return p.returncode == 0 and " is UP" in p.stdout


def _start_slurmds(c: SlurmCluster, timeout: float) -> None:
    procs: dict[str, subprocess.Popen[bytes]] = {}
    every = [*c.nodes, *c.site_nodes]
    for n in every:
        argv, env = c.slurmd(n)
        procs[n] = proc.spawn(c.run_dir / "log", f"slurmd-{n}", argv, env)
        c.pids[f"slurmd-{n}"] = procs[n].pid

    def all_idle() -> bool:
        for n, p in procs.items():
            if p.poll() is not None:
                logs = [c.run_dir / "log" / f"slurmd-{n}.out", c.run_dir / "log" / f"d-{n}.log"]
                raise ClusterError(f"slurmd {n} died{proc.tails(logs)}")
        out = c.cli("sinfo", "-h", "-N", "-o", "%N %t", timeout=10)
        if out.returncode != 0:
            return False
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return all(states.get(n) == "idle" for n in every)

    proc.wait_until("slurmd nodes idle", all_idle, timeout, c.run_dir / "log" / "ctld.log")


def _write_token(c: SlurmCluster, lifespan: int) -> None:
    r = c.cli("scontrol", "token", "username=root", f"lifespan={lifespan}")
    if r.returncode != 0 or "SLURM_JWT=" not in r.stdout:
        raise ClusterError(
            f"scontrol token failed: {r.stderr.strip()}\n{proc.tail(c.run_dir / 'log/ctld.log')}")
    token = r.stdout.strip().split("SLURM_JWT=", 1)[1].strip()
    proc.write_private(c.token_file, (token + "\n").encode(), 0o600)


def restd_argv(c: SlurmCluster) -> tuple[list[str], dict[str, str]]:
    port = c.rest_url.rsplit(":", 1)[1]
    r = slurm_release.release(c.version)
    c_env = {**c.env, **c.daemon_env(), "SLURM_JWT": "daemon"}
    # slurmdbd's endpoints where it runs: the binder finds lost jobs of ours there
    plugins = r.openapi_plugins + (f",{r.openapi_dbd_plugin}"
                                   if (c.run_dir / "slurmdbd.conf").exists() else "")
    argv, env = slurm_release.command(c.root, [
        "slurmrestd", "-f", str(c.conf), "-a", "rest_auth/jwt", "-u", REST_USER, "-g",
        REST_USER, "-s", plugins, f"127.0.0.1:{port}",
        *(f"{ip}:{port}" for ip in c.rest_listen_ips),
    ], c_env)
    return argv, {**env, **c_env}


def restd_up(c: SlurmCluster) -> bool:
    api = slurm_release.release(c.version).rest_api
    hdrs = c.rest_headers()
    return (proc.http_status(f"{c.rest_url}/openapi/v3", hdrs) == 200
            and proc.http_status(f"{c.rest_url}/slurm/{api}/ping", hdrs) == 200)


def _start_slurmrestd(c: SlurmCluster, timeout: float) -> None:
    argv, env = restd_argv(c)
    p = proc.spawn(c.run_dir / "log", "slurmrestd", argv, env)
    c.pids["slurmrestd"] = p.pid
    proc.wait_until("slurmrestd", lambda: restd_up(c), timeout,
                    c.run_dir / "log" / "slurmrestd.out", pid_alive=lambda: p.poll() is None)


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cluster.slurm",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("action", choices=["up", "down", "status"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--cpus", type=int, default=8)
    ap.add_argument("--memory-mb", type=int, default=16000)
    ap.add_argument("--base-port", type=int, default=16800)
    ap.add_argument("--grace-time", type=int, default=20)
    ap.add_argument("--version", default=None, help="22.05, 24.11 or 26.05 ($SLURM_VERSION)")
    ap.add_argument("--gpu-nodes", type=int, default=2,
                    help="the last N nodes (at most half) get GPUs (gres gpu)")
    ap.add_argument("--gpus-per-node", type=int, default=4)
    ap.add_argument("--gpu-type", default="a100", help='gres type; "" for untyped GPUs')
    ap.add_argument("--no-accounting", action="store_true",
                    help="no slurmdbd/MariaDB (AccountingStorageType=accounting_storage/none)")
    ap.add_argument("--enforce", action="store_true",
                    help="slurmd holds jobs to their cores and GPUs (cgroups; --cpus at most "
                         "the host's)")
    a = ap.parse_args(argv)
    if a.action == "down":
        stop(a.dir)
        print(f"stopped cluster in {a.dir}")
        return 0
    if a.action == "status":
        c = load(a.dir)
        for k, pid in sorted(c.pids.items()):
            print(f"{k:14} {pid:>8} {'up' if proc.alive(pid) else 'DOWN'}")
        return 0
    try:
        c = start(a.dir, a.nodes, a.cpus, a.memory_mb, a.base_port, grace_time=a.grace_time,
                  version=a.version, accounting=not a.no_accounting, gpu_nodes=a.gpu_nodes,
                  gpus_per_node=a.gpus_per_node, gpu_type=a.gpu_type, enforce=a.enforce)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"slurm={c.version}{' (root ' + c.root + ')' if c.root else ''}")
    print(f"rest_url={c.rest_url}")
    print(f"token_file={c.token_file}")
    print(f"SLURM_CONF={c.conf}")
    print(f"nodes={','.join(c.nodes)}")
    print(f"gpu_nodes={','.join(c.gpu_nodes)} (gpu:{c.gpu_type}:{c.gpus_per_node})")
    print(f"cli: {c.run_dir / 'bin'} ({', '.join(CLI_TOOLS)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
