"""Start and stop a real, local Slurm cluster in a scratch directory (dev/test tool).

Everything lives under ``run_dir``: an own munged (own socket and key), slurmctld, N slurmd
(``slurmd -N nX``, all on this host) and slurmrestd with JWT auth. Nothing system-wide is
touched, no systemd is used, and every daemon is stopped by its own PID.

    python -m cluster.slurm up   [--dir D] [--nodes N]
    python -m cluster.slurm down [--dir D]

Synchronous on purpose: this is a dev tool, not part of the event loop.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

REST_USER = "slurmrest"
# Every daemon we start carries this variable in its environment. slurmstepd inherits slurmd's
# environment, so stop() can find the job step daemons of *this* cluster without matching names.
MARKER_ENV = "SLURMGATE_SLURM_RUN_DIR"
OPENAPI_PLUGINS = "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36"
DEFAULT_DIR = Path("/tmp/slurmgate-slurm")
LOG_TAIL_LINES = 30


class ClusterError(RuntimeError):
    """A daemon died or never became ready; the message carries its last log lines."""


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

    def client_env(self) -> dict[str, str]:
        """os.environ plus SLURM_CONF: pass as ``env=`` to sbatch/squeue/scontrol."""
        return {**os.environ, **self.env}

    def token(self) -> str:
        return self.token_file.read_text().strip()

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


# ----------------------------------------------------------------------------- helpers


def _tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log at {path}: {e})"
    return "\n".join(lines[-n:]) or f"(log {path} is empty)"


def _tails(logs: Path | list[Path] | None) -> str:
    if logs is None:
        return ""
    if isinstance(logs, Path):
        logs = [logs]
    return "".join(f"\n--- last lines of {p}:\n{_tail(p)}" for p in logs if p.exists())


def _proc_state(pid: int) -> str | None:
    """The /proc state letter of pid, or None if it does not exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ppid ..." -- comm may contain spaces and parentheses.
    return data[data.rindex(")") + 2 :].split(" ", 1)[0]


def _alive(pid: int) -> bool:
    st = _proc_state(pid)
    return st is not None and st not in ("Z", "X")


def _reap(pid: int) -> None:
    """Reap pid if it is our child (no-op otherwise)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError:
        pass


def _wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    log: Path | list[Path] | None = None,
    pid_alive: Callable[[], bool] | None = None,
    interval: float = 0.2,
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if pid_alive is not None and not pid_alive():
            # One more check: the daemon may have forked into the background and exited.
            if check():
                return
            raise ClusterError(f"{what}: the daemon died{_tails(log)}")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not ready after {timeout:.0f}s{_tails(log)}")
        time.sleep(interval)


def _run(
    args: list[str], env: dict[str, str], timeout: float = 10.0
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _ensure_rest_user() -> None:
    try:
        pwd.getpwnam(REST_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "-r", "-M", "-s", "/usr/sbin/nologin", REST_USER],
            check=True,
            capture_output=True,
        )


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


def _http_status(url: str, headers: dict[str, str] | None = None, timeout: float = 2.0) -> int:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0


def _spawn(
    run_dir: Path, name: str, args: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start a daemon in the foreground, in its own session, output to log/<name>.out."""
    with (run_dir / "log" / f"{name}.out").open("ab") as out:
        return subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _check_ports_free(ports: list[int]) -> None:
    busy = []
    for port in ports:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                busy.append(port)
    if busy:
        raise ClusterError(
            f"ports {busy} are in use (another local Slurm cluster?); stop it or pick another "
            "base_port"
        )


def _write_private(path: Path, data: bytes, mode: int) -> None:
    if path.exists():
        path.chmod(0o600)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    path.chmod(mode)


def slurm_conf_text(
    run_dir: Path,
    nodes: list[str],
    cpus: int,
    memory_mb: int,
    base_port: int,
    munge_socket: Path,
    cluster_name: str,
    grace_time: int,
) -> str:
    d = run_dir
    node_lines = "\n".join(
        f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={base_port + 100 + i} "
        f"CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN"
        for i, n in enumerate(nodes, start=1)
    )
    return f"""\
# Generated by cluster/slurm.py -- a throwaway local cluster; do not edit.
ClusterName={cluster_name}
SlurmctldHost=localhost
SlurmctldPort={base_port + 17}
SlurmdPort={base_port + 18}
AuthType=auth/munge
AuthInfo=socket={munge_socket}
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key={d}/jwt.key
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/run/ctld.pid
SlurmdPidFile={d}/run/d-%n.pid
SlurmctldLogFile={d}/log/ctld.log
SlurmdLogFile={d}/log/d-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
MailProg=/bin/true
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
# Fast scheduling for tests.
SchedulerParameters=bf_interval=1
KillWait=5
# hundreds of slurmd on one host kill their steps slowly under a cancel storm; past this
# Slurm drains the node ("Kill task failed"), which the 1,000-job benchmarks hit at 60 s
UnkillableStepTimeout=180
MinJobAge=300
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
{node_lines}
PartitionName=k8s Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1 \
  GraceTime={grace_time}
PartitionName=hpc Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10
"""


# ----------------------------------------------------------------------------- start


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
) -> SlurmCluster:
    """Start munged, slurmctld, n_nodes slurmd and slurmrestd; return when all are ready.

    Ports: slurmctld base+17, slurmd nX base+100+X, slurmrestd base+20.
    On any failure the daemons started so far are stopped and ClusterError is raised.
    """
    run_dir = Path(run_dir).resolve()
    if (run_dir / "cluster.json").exists():
        stop(run_dir)  # a previous cluster in the same dir: never leave two running
    rest_port = base_port + 20
    _check_ports_free(
        [base_port + 17, base_port + 18, rest_port]
        + [base_port + 100 + i for i in range(1, n_nodes + 1)]
    )
    run_dir.mkdir(parents=True, exist_ok=True)
    run_dir.chmod(0o755)
    _check_traversable(run_dir)
    _ensure_rest_user()

    for sub in ("state", "run", "log", "munge", "spool"):
        p = run_dir / sub
        if sub in ("state", "spool") and p.exists():
            shutil.rmtree(p)  # fresh job/node state every time
        p.mkdir(exist_ok=True)
        p.chmod(0o755)
    nodes = [f"n{i}" for i in range(1, n_nodes + 1)]
    for n in nodes:
        (run_dir / "spool" / n).mkdir(exist_ok=True)

    cluster_name = f"sg{base_port}"
    conf = run_dir / "slurm.conf"
    mdir = run_dir / "munge"
    msock = mdir / "munge.sock"
    cluster = SlurmCluster(
        run_dir=run_dir,
        conf=conf,
        rest_url=f"http://127.0.0.1:{rest_port}",
        token_file=run_dir / "token",
        nodes=nodes,
        node_cpus=cpus,
        node_memory_mb=memory_mb,
        env={"SLURM_CONF": str(conf)},
        cluster_name=cluster_name,
    )
    denv = {**os.environ, "SLURM_CONF": str(conf), MARKER_ENV: str(run_dir)}
    denv.pop("SLURM_JWT", None)

    def save() -> None:
        (run_dir / "cluster.json").write_text(cluster.to_json())

    try:
        # --- munged ---
        mkey = mdir / "munge.key"
        if not mkey.exists():
            _write_private(mkey, os.urandom(1024), 0o400)
        mlog = run_dir / "log" / "munged.log"
        mpid = mdir / "munged.pid"
        mpid.unlink(missing_ok=True)
        mproc = _spawn(
            run_dir,
            "munged",
            [
                "munged",
                "--foreground",
                f"--socket={msock}",
                f"--key-file={mkey}",
                f"--pid-file={mpid}",
                f"--log-file={mlog}",
                f"--seed-file={mdir / 'munged.seed'}",
                "--force",
            ],
            denv,
        )
        cluster.pids["munged"] = mproc.pid
        save()

        def munge_ok() -> bool:
            cred = _run(["munge", "-n", "-S", str(msock)], denv)
            if cred.returncode != 0:
                return False
            un = subprocess.run(
                ["unmunge", "-S", str(msock)],
                input=cred.stdout,
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
            return un.returncode == 0

        _wait_until(
            "munged",
            munge_ok,
            15,
            [run_dir / "log" / "munged.out", mlog],
            pid_alive=lambda: mproc.poll() is None,
        )

        # --- keys and config ---
        _write_private(run_dir / "jwt.key", os.urandom(32), 0o600)
        conf.write_text(
            slurm_conf_text(
                run_dir, nodes, cpus, memory_mb, base_port, msock, cluster_name, grace_time
            )
        )
        conf.chmod(0o644)

        # --- slurmctld ---
        clog = run_dir / "log" / "ctld.log"
        cproc = _spawn(
            run_dir, "slurmctld", ["slurmctld", "-D", "-f", str(conf), "-c", "-i"], denv
        )
        cluster.pids["slurmctld"] = cproc.pid
        save()

        def ctld_up() -> bool:
            p = _run(["scontrol", "ping"], denv)
            return p.returncode == 0 and " is UP" in p.stdout

        _wait_until(
            "slurmctld",
            ctld_up,
            timeout,
            [run_dir / "log" / "slurmctld.out", clog],
            pid_alive=lambda: cproc.poll() is None,
        )

        # --- slurmd ---
        dprocs: dict[str, subprocess.Popen[bytes]] = {}
        for n in nodes:
            dprocs[n] = _spawn(
                run_dir, f"slurmd-{n}", ["slurmd", "-D", "-f", str(conf), "-N", n], denv
            )
            cluster.pids[f"slurmd-{n}"] = dprocs[n].pid
        save()

        def all_idle() -> bool:
            for n in nodes:
                if dprocs[n].poll() is not None:
                    logs = [run_dir / "log" / f"slurmd-{n}.out", run_dir / "log" / f"d-{n}.log"]
                    raise ClusterError(f"slurmd {n} died{_tails(logs)}")
            p = _run(["sinfo", "-h", "-N", "-o", "%N %t"], denv)
            if p.returncode != 0:
                return False
            states = dict(line.split() for line in p.stdout.splitlines() if line.strip())
            return all(states.get(n) == "idle" for n in nodes)

        _wait_until("slurmd nodes idle", all_idle, timeout, clog)

        # --- token ---
        r = _run(
            ["scontrol", "token", "username=root", f"lifespan={token_lifespan}"], denv
        )
        if r.returncode != 0 or "SLURM_JWT=" not in r.stdout:
            raise ClusterError(f"scontrol token failed: {r.stderr.strip()}\n{_tail(clog)}")
        token = r.stdout.strip().split("SLURM_JWT=", 1)[1].strip()
        _write_private(cluster.token_file, (token + "\n").encode(), 0o600)

        # --- slurmrestd (foreground daemon; we own its PID) ---
        rlog = run_dir / "log" / "slurmrestd.out"
        renv = {**denv, "SLURM_JWT": "daemon"}
        proc = _spawn(
            run_dir,
            "slurmrestd",
            [
                "slurmrestd",
                "-f",
                str(conf),
                "-a",
                "rest_auth/jwt",
                "-u",
                REST_USER,
                "-g",
                REST_USER,
                "-s",
                OPENAPI_PLUGINS,
                f"127.0.0.1:{rest_port}",
            ],
            renv,
        )
        cluster.pids["slurmrestd"] = proc.pid
        save()
        hdrs = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token}

        def rest_ok() -> bool:
            return (
                _http_status(f"{cluster.rest_url}/openapi/v3", hdrs) == 200
                and _http_status(f"{cluster.rest_url}/slurm/v0.0.38/ping", hdrs) == 200
            )

        _wait_until("slurmrestd", rest_ok, timeout, rlog, pid_alive=lambda: proc.poll() is None)
        save()
        return cluster
    except BaseException:
        save()
        stop(run_dir)
        raise


# ----------------------------------------------------------------------------- stop


def load(run_dir: Path) -> SlurmCluster:
    return SlurmCluster.from_json((Path(run_dir) / "cluster.json").read_text())


def _all_procs() -> dict[int, int]:
    """pid -> ppid for every process."""
    out: dict[int, int] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            data = (p / "stat").read_text()
        except OSError:
            continue
        rest = data[data.rindex(")") + 2 :].split()
        out[int(p.name)] = int(rest[1])
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def _descendants(roots: Iterable[int], procs: dict[int, int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid in procs.items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        for c in children.get(pid, []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def _job_processes(run_dir: Path, cluster_name: str, daemon_pids: set[int]) -> set[int]:
    """Processes of this cluster that are not its recorded daemons: slurmstepd (they carry our
    marker, inherited from slurmd, and are re-parented to init), job processes (Slurm puts
    SLURM_JOB_ID, SLURM_CONF and SLURM_CLUSTER_NAME into every job's environment) and all their
    descendants. Children of the daemons themselves (slurmscriptd) are left to the daemons
    while they live."""
    conf = str(run_dir / "slurm.conf")
    procs = _all_procs()
    me = os.getpid()
    roots: set[int] = set()
    for pid, ppid in procs.items():
        if pid == me or pid in daemon_pids or ppid in daemon_pids:
            continue
        env = _environ(pid)
        if not env:
            continue
        if env.get(MARKER_ENV) == str(run_dir) or (
            "SLURM_JOB_ID" in env
            and (env.get("SLURM_CONF") == conf or env.get("SLURM_CLUSTER_NAME") == cluster_name)
        ):
            roots.add(pid)
    found = roots | _descendants(roots, procs)
    found.discard(me)
    return found - daemon_pids


def _kill_now(pids: Iterable[int], timeout: float = 5.0) -> None:
    """SIGKILL and wait (placeholders ignore SIGTERM by design)."""
    pids = [p for p in pids if p > 1 and _alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        for p in pids:
            _reap(p)
        time.sleep(0.05)


def _signal_and_wait(pids: Iterable[int], timeout: float) -> None:
    pids = [p for p in pids if p > 1]
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        live = [p for p in pids if _alive(p)]
        if not live:
            return
        for p in live:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for p in live:
                _reap(p)
            if not any(_alive(p) for p in live):
                return
            time.sleep(0.1)


def stop(run_dir: Path) -> None:
    """Stop every daemon of the cluster in run_dir by PID and kill leftover job processes.

    Idempotent: a missing cluster.json or already-dead PIDs are fine.
    """
    run_dir = Path(run_dir).resolve()
    pids: dict[str, int] = {}
    cluster_name = ""
    try:
        c = load(run_dir)
        pids = dict(c.pids)
        cluster_name = c.cluster_name
    except (OSError, ValueError, TypeError, KeyError):
        pass
    # PID files may know about daemons cluster.json did not record yet (failed start).
    for name, pf in [("munged", run_dir / "munge" / "munged.pid"),
                     ("slurmctld", run_dir / "run" / "ctld.pid")]:
        pid = _read_pid(pf)
        if pid is not None:
            pids.setdefault(name, pid)
    for pf in (run_dir / "run").glob("d-*.pid"):
        pid = _read_pid(pf)
        if pid is not None:
            pids.setdefault(f"slurmd-{pf.stem[2:]}", pid)

    # Only trust a recorded PID if the process still carries our marker (PIDs get reused).
    def ours(pid: int) -> bool:
        return pid > 1 and _alive(pid) and _environ(pid).get(MARKER_ENV) == str(run_dir)

    daemon_pids = {p for p in pids.values() if ours(p)}
    # Jobs first (slurmstepd would otherwise outlive slurmd), then slurmrestd, then slurmctld
    # and all slurmd together, then leftovers, munged last.
    _kill_now(_job_processes(run_dir, cluster_name, daemon_pids))
    rest = pids.get("slurmrestd", 0)
    if ours(rest):
        _signal_and_wait([rest], 10.0)
    group = [v for k, v in pids.items() if k not in ("munged", "slurmrestd") and ours(v)]
    _signal_and_wait(group, 15.0)
    munged = pids.get("munged", 0)
    alive_daemons = {munged} if ours(munged) else set()
    _kill_now(_job_processes(run_dir, cluster_name, alive_daemons))
    if alive_daemons:
        _signal_and_wait([munged], 10.0)
    for k in list(pids):
        if _alive(pids[k]) and ours(pids[k]):
            print(f"warning: {k} (pid {pids[k]}) still alive", file=sys.stderr)


# ----------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cluster.slurm", description=__doc__.split("\n")[0])
    ap.add_argument("action", choices=["up", "down", "status"])
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--cpus", type=int, default=8)
    ap.add_argument("--memory-mb", type=int, default=16000)
    ap.add_argument("--base-port", type=int, default=16800)
    ap.add_argument("--grace-time", type=int, default=20)
    a = ap.parse_args(argv)
    if a.action == "down":
        stop(a.dir)
        print(f"stopped cluster in {a.dir}")
        return 0
    if a.action == "status":
        c = load(a.dir)
        for k, pid in sorted(c.pids.items()):
            print(f"{k:14} {pid:>8} {'up' if _alive(pid) else 'DOWN'}")
        return 0
    try:
        c = start(a.dir, a.nodes, a.cpus, a.memory_mb, a.base_port, grace_time=a.grace_time)
    except ClusterError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"rest_url={c.rest_url}")
    print(f"token_file={c.token_file}")
    print(f"SLURM_CONF={c.conf}")
    print(f"nodes={','.join(c.nodes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


# ----------------------------------------------------------------------------- fault injection


def _daemon_argv(c: SlurmCluster, name: str) -> tuple[list[str], dict[str, str]]:
    """The command line and environment `start()` uses for a daemon, minus one-time flags."""
    denv = {**os.environ, "SLURM_CONF": str(c.conf), MARKER_ENV: str(c.run_dir)}
    denv.pop("SLURM_JWT", None)
    if name == "slurmctld":
        # no -c: a restart must recover the saved job state, not clear it
        return ["slurmctld", "-D", "-f", str(c.conf), "-i"], denv
    if name == "slurmrestd":
        port = c.rest_url.rsplit(":", 1)[1]
        return ([
            "slurmrestd", "-f", str(c.conf), "-a", "rest_auth/jwt", "-u", REST_USER,
            "-g", REST_USER, "-s", OPENAPI_PLUGINS, f"127.0.0.1:{port}",
        ], {**denv, "SLURM_JWT": "daemon"})
    raise ValueError(f"cannot restart {name!r} (supported: slurmctld, slurmrestd)")


def kill_daemon(run_dir: Path, name: str, timeout: float = 10.0) -> None:
    """SIGKILL one daemon of the cluster by its recorded PID and wait until it is gone."""
    run_dir = Path(run_dir).resolve()
    c = load(run_dir)
    pid = c.pids.get(name, 0)
    if pid > 1 and _alive(pid) and _environ(pid).get(MARKER_ENV) == str(run_dir):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pid > 1 and _alive(pid):
        _reap(pid)
        if time.monotonic() > deadline:
            raise ClusterError(f"{name} (pid {pid}) survived SIGKILL for {timeout:.0f}s")
        time.sleep(0.05)
    _reap(pid)


def _daemon_ready(c: SlurmCluster, name: str, env: dict[str, str]) -> bool:
    if name == "slurmctld":
        p = _run(["scontrol", "ping"], env)
        return p.returncode == 0 and " is UP" in p.stdout
    hdrs = {"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": c.token()}
    return _http_status(f"{c.rest_url}/slurm/v0.0.38/ping", hdrs) == 200


def start_daemon(run_dir: Path, name: str, timeout: float = 60.0) -> int:
    """Start slurmctld or slurmrestd again with the flags `start()` used (slurmctld keeps its
    saved state); wait until it answers; record the new PID in cluster.json. Returns the PID."""
    run_dir = Path(run_dir).resolve()
    c = load(run_dir)
    argv, env = _daemon_argv(c, name)
    proc = _spawn(run_dir, name, argv, env)
    c.pids[name] = proc.pid
    (run_dir / "cluster.json").write_text(c.to_json())
    logs = [run_dir / "log" / f"{name}.out", run_dir / "log" / "ctld.log"]
    _wait_until(f"{name} restarted", lambda: _daemon_ready(c, name, env), timeout, logs,
                pid_alive=lambda: proc.poll() is None)
    return proc.pid


def restart_daemon(run_dir: Path, name: str, down_for: float = 0.0) -> int:
    """kill_daemon, stay down for `down_for` seconds, start_daemon. Returns the new PID."""
    kill_daemon(run_dir, name)
    if down_for > 0:
        time.sleep(down_for)
    return start_daemon(run_dir, name)
