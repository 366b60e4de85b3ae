"""Which Slurm the local cluster runs, and how its commands are started.

22.05 is the host's own Debian 12 package. 24.11 (trixie) and 26.05 (sid) need a newer glibc
than the host has, so they live in debootstrapped roots built once into a cache outside the
checkout (``cluster/build-slurm-root.sh``), and every daemon and CLI call of theirs runs as
``chroot ROOT env -i ...``. The root shares the host's network and PIDs, so ports, the REST
URL and stop-by-PID work exactly as on the host. The cluster's run_dir is bind-mounted into
the root at the same path, so every path in slurm.conf means the same file on both sides.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from cluster.proc import ClusterError

HERE = Path(__file__).resolve().parent
VERSION_ENV = "SLURM_VERSION"
ROOT_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Release:
    version: str
    # Debian suite of the root, or None for the host's packages.
    suite: str | None
    # slurmrestd -s: 24.11 dies at start with the default set when there is no slurmdbd.
    openapi_plugins: str
    # ...and its slurmdbd plugin, added where slurmdbd runs (binder/lostjobs.py asks it).
    openapi_dbd_plugin: str
    # The newest REST version the release serves: the one slurmgate picks.
    rest_api: str
    # 24.11+ slurmd exits without a cgroup filesystem unless cgroup.conf disables the plugin.
    cgroup_conf: str | None


RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release("22.05", None, "openapi/v0.0.38,openapi/v0.0.37,openapi/v0.0.36",
                "openapi/dbv0.0.38", "v0.0.38", None),
        Release("24.11", "trixie", "openapi/slurmctld", "openapi/slurmdbd", "v0.0.42",
                "CgroupPlugin=disabled\n"),
        Release("26.05", "sid", "openapi/slurmctld", "openapi/slurmdbd", "v0.0.45",
                "CgroupPlugin=disabled\n"),
    )
}
NEWEST = "26.05"


def release(version: str | None = None) -> Release:
    """The release named by `version`, else by $SLURM_VERSION, else the newest."""
    v = (version or os.environ.get(VERSION_ENV) or NEWEST).strip()
    try:
        return RELEASES[v]
    except KeyError:
        raise ClusterError(
            f"{VERSION_ENV}={v!r} is not one the local cluster runs; choose one of "
            f"{', '.join(RELEASES)}"
        ) from None


def build_root(r: Release) -> str:
    """The cached root for a newer release (built on first use), or "" for the host's Slurm."""
    if r.suite is None:
        return ""
    out = subprocess.run(
        ["bash", str(HERE / "build-slurm-root.sh"), r.version],
        stdout=subprocess.PIPE, text=True, check=False,
    )
    if out.returncode != 0 or not out.stdout.strip():
        raise ClusterError(f"building the Slurm {r.version} root failed (see the lines above)")
    return out.stdout.strip().splitlines()[-1]


def command(root: str, args: list[str], env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and environment that run a Slurm command of this cluster's release.

    In a root, the host environment is dropped (env -i): only PATH and what `env` names cross,
    so a host variable can never point the root's Slurm at the host's files."""
    if not root:
        # a JWT in the caller's environment would make the CLI skip munge
        host = {k: v for k, v in os.environ.items() if k != "SLURM_JWT"}
        return list(args), {**host, **env}
    pairs = [f"{k}={v}" for k, v in env.items()]
    return ["chroot", root, "env", "-i", f"PATH={ROOT_PATH}", *pairs, *args], {"PATH": ROOT_PATH}


def _mountpoints() -> set[str]:
    out = set()
    with open("/proc/self/mountinfo") as f:
        for line in f:
            # the fifth field is the mount point, with spaces escaped as \040
            out.add(line.split()[4].replace("\\040", " "))
    return out


def _mount(args: list[str]) -> None:
    p = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if p.returncode != 0:
        raise ClusterError(f"mount {' '.join(args)}: {p.stderr.strip()}")


def enter(root: str, run_dir: Path, cgroups: bool = False) -> None:
    """Make the root usable by this cluster: /proc, /sys, /dev, and run_dir at its own path;
    with `cgroups`, the host's cgroup mounts too (the root's fresh sysfs has none, and an
    enforcing slurmd needs them: cluster/slurm_cgroups.py).

    Idempotent; /proc, /sys and /dev are shared by every cluster on the root."""
    if not root:
        return
    _sync_file("/etc/hosts", root)  # Slurm resolves "localhost" and this host's name
    mounted = _mountpoints()
    for fs, src in (("proc", "proc"), ("sysfs", "sys"), ("bind", "/dev")):
        target = os.path.join(root, src.lstrip("/"))
        if target not in mounted:
            _mount(["--bind", src, target] if fs == "bind" else ["-t", fs, fs, target])
    cg = os.path.join(root, "sys/fs/cgroup")
    if cgroups and cg not in mounted:
        _mount(["--rbind", "/sys/fs/cgroup", cg])
    inner = os.path.join(root, str(run_dir).lstrip("/"))
    if inner in mounted:  # left by a cluster that was not stopped (e.g. a killed test run)
        subprocess.run(["umount", "-l", inner], check=False, capture_output=True)
    os.makedirs(inner, mode=0o755, exist_ok=True)
    _mount(["--bind", str(run_dir), inner])


def _sync_file(path: str, root: str) -> None:
    src = Path(path).read_bytes()
    dst = Path(root) / path.lstrip("/")
    if not dst.exists() or dst.read_bytes() != src:
        dst.write_bytes(src)


def leave(root: str, run_dir: Path) -> None:
    """Undo enter() for this cluster; /proc, /sys and /dev go once no process uses the root."""
    if not root:
        return
    mounted = _mountpoints()
    inner = os.path.join(root, str(run_dir).lstrip("/"))
    if inner in mounted:
        subprocess.run(["umount", "-l", inner], check=False, capture_output=True)
    if _root_in_use(root):
        return
    for sub in ("dev", "sys", "proc"):
        target = os.path.join(root, sub)
        if target in mounted:
            subprocess.run(["umount", "-l", target], check=False, capture_output=True)


def _root_in_use(root: str) -> bool:
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "root") == root:
                    return True
            except OSError:
                continue
    return False
