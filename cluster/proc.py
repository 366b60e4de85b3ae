"""Process toolkit for the local cluster's daemons: spawn, wait, find and stop by PID.

Synchronous on purpose (dev tooling, never on an event loop). Nothing here kills by name: a
daemon is addressed by the PID it was started with, and checked against its environment
before a signal, because PIDs get reused.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path

LOG_TAIL_LINES = 30


class ClusterError(RuntimeError):
    """A daemon died or never became ready; the message carries its last log lines."""


class NotReady(ClusterError):
    """wait_until's deadline passed (the daemon, if watched, is still alive)."""


def tail(path: Path, n: int = LOG_TAIL_LINES) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as e:
        return f"(no log at {path}: {e})"
    return "\n".join(lines[-n:]) or f"(log {path} is empty)"


def tails(logs: Path | list[Path] | None) -> str:
    if logs is None:
        return ""
    if isinstance(logs, Path):
        logs = [logs]
    return "".join(f"\n--- last lines of {p}:\n{tail(p)}" for p in logs if p.exists())


def proc_state(pid: int) -> str | None:
    """The /proc state letter of pid, or None if it does not exist."""
    try:
        data = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) S ppid ..." -- comm may contain spaces and parentheses.
    return data[data.rindex(")") + 2 :].split(" ", 1)[0]


def alive(pid: int) -> bool:
    st = proc_state(pid)
    return st is not None and st not in ("Z", "X")


def reap(pid: int) -> None:
    """Reap pid if it is our child (no-op otherwise)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except OSError:
        pass


def wait_until(
    what: str,
    check: Callable[[], bool],
    timeout: float,
    log: Path | list[Path] | None = None,
    pid_alive: Callable[[], bool] | None = None,
    interval: float = 0.2,
    recheck_when_dead: bool = True,
) -> None:
    """Poll `check` until true. ClusterError if pid_alive() turns false, NotReady at timeout.

    recheck_when_dead: one more check after the death, for a daemon that forks into the
    background and exits; off for foreground daemons, where a check passing after the death
    is answered by someone else (a stale daemon on the same port).
    """
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if pid_alive is not None and not pid_alive():
            if recheck_when_dead and check():
                return
            raise ClusterError(f"{what}: the daemon died{tails(log)}")
        if time.monotonic() > deadline:
            raise NotReady(f"{what}: not ready after {timeout:.0f}s{tails(log)}")
        time.sleep(interval)


def run(
    args: list[str], env: dict[str, str], timeout: float = 10.0, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, env=env, input=stdin, capture_output=True, text=True, timeout=timeout,
        check=False,
    )


def read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def http_status(url: str, headers: dict[str, str] | None = None, timeout: float = 2.0,
                context: ssl.SSLContext | None = None) -> int:
    """The answer's status code; 0 if there was none (refused, reset, TLS failure, timeout)."""
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (urllib.error.URLError, OSError, TimeoutError):
        return 0


def spawn(
    log_dir: Path, name: str, args: list[str], env: dict[str, str] | None = None,
    suffix: str = ".out",
) -> subprocess.Popen[bytes]:
    """Start a daemon in the foreground, in its own session (so it is its own process group),
    output to log_dir/<name><suffix>; env None inherits ours."""
    with (log_dir / f"{name}{suffix}").open("ab") as out:
        return subprocess.Popen(
            args,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def check_ports_free(ports: list[int]) -> None:
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
            f"ports {busy} are in use (another local cluster?); stop it or pick another "
            "port offset (SLURMGATE_PORT_OFFSET)"
        )


def write_private(path: Path, data: bytes, mode: int) -> None:
    if path.exists():
        path.chmod(0o600)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    path.chmod(mode)


def proc_stats() -> dict[int, tuple[str, list[str]]]:
    """pid -> (command, the fields of /proc/pid/stat after it, from `state` on) for every
    process (the command may hold spaces and parentheses: it is cut at the last ')')."""
    out: dict[int, tuple[str, list[str]]] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            data = (p / "stat").read_text()
        except OSError:
            continue
        out[int(p.name)] = (data[data.index("(") + 1 : data.rindex(")")],
                            data[data.rindex(")") + 2 :].split())
    return out


def all_procs() -> dict[int, int]:
    """pid -> ppid for every process."""
    return {pid: int(rest[1]) for pid, (_, rest) in proc_stats().items()}


def environ(pid: int) -> dict[str, str]:
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


def unix_socket_holders(prefix: str, net_unix: Path = Path("/proc/net/unix"),
                        proc_root: Path = Path("/proc")) -> set[int]:
    """PIDs holding a unix socket bound at a path under `prefix`. Finds slurmstepd by what
    they listen on (`<spool>/<node>_<job>.<step>`) where their environment cannot: 26.05's
    stepd rewrites its environ, and reparented to init it has no daemon above it."""
    prefix = prefix.rstrip("/") + "/"
    inodes: set[str] = set()
    try:
        lines = net_unix.read_text().splitlines()[1:]
    except OSError:
        return set()
    for line in lines:
        f = line.split()
        # Num RefCount Protocol Flags Type St Inode [Path]
        if len(f) >= 8 and f[7].startswith(prefix):
            inodes.add(f"socket:[{f[6]}]")
    if not inodes:
        return set()
    out: set[int] = set()
    for d in proc_root.iterdir():
        if not d.name.isdigit():
            continue
        try:
            fds = list((d / "fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    out.add(int(d.name))
                    break
            except OSError:
                continue
    return out


def descendants(roots: Iterable[int], procs: dict[int, int]) -> set[int]:
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


def kill_now(pids: Iterable[int], timeout: float = 5.0) -> None:
    """SIGKILL and wait (placeholders ignore SIGTERM by design)."""
    pids = [p for p in pids if p > 1 and alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        for p in pids:
            reap(p)
        time.sleep(0.05)


def signal_and_wait(pids: Iterable[int], timeout: float, *, group: bool = False,
                    kill_wait: float = 5.0) -> None:
    """SIGTERM, then SIGKILL whatever is still there after `timeout`; wait up to `kill_wait`
    for that to take.

    group: signal each PID's process group (a spawn()ed daemon leads its own), so helpers it
    started go with it. A PID reused by another user's process then refuses the signal,
    which is skipped.
    """
    pids = [p for p in pids if p > 1]
    send = os.killpg if group else os.kill
    skip: tuple[type[OSError], ...] = (
        (ProcessLookupError, PermissionError) if group else (ProcessLookupError,))
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, kill_wait)):
        live = [p for p in pids if alive(p)]
        if not live:
            return
        for p in live:
            try:
                send(p, sig)
            except skip:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            for p in live:
                reap(p)
            if not any(alive(p) for p in live):
                return
            time.sleep(0.1)


def kill_and_wait(pid: int, what: str, timeout: float = 10.0) -> None:
    """SIGKILL one process and wait until it is gone (fault injection)."""
    if pid > 1 and alive(pid):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while pid > 1 and alive(pid):
        reap(pid)
        if time.monotonic() > deadline:
            raise ClusterError(f"{what} (pid {pid}) survived SIGKILL for {timeout:.0f}s")
        time.sleep(0.05)
    reap(pid)
