"""What a real Node (cluster/realnode.py) leaves on the host besides its own directory, and
how it goes: cgroups, shims and their sockets, mounts, libcni's cache, the kubelet's fixed paths.

Some paths are fixed by the daemons (not configurable in containerd 1.6 or the kubelet), so
several nodes share them; everything here removes only what is provably one node's: found by
its containerd socket, its cgroup root, its CNI network name or its directory.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import time
from pathlib import Path

CGROUP_FS = Path("/sys/fs/cgroup")
CONTAINER_LOG_LINKS = Path("/var/log/containers")  # the kubelet's, not configurable
SHIM_SOCKETS = Path("/run/containerd/s")  # containerd 1.6's, not configurable
CNI_CACHE = Path("/var/lib/cni/results")  # libcni's, not configurable through containerd 1.6
# the kubelet's device-plugin socket ignores --root-dir: every kubelet on the host serves it
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


def hierarchies() -> list[Path]:
    """Mount points of the cgroup v1 hierarchies (the kubelet wants its root in each)."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mnt, fstype, *_ = line.split()
        if fstype == "cgroup":
            out.append(Path(mnt))
    return out


def make_cgroups(root: str) -> None:
    for h in hierarchies():
        d = h / root.lstrip("/")
        d.mkdir(exist_ok=True)
        if (h / "cpuset.cpus").exists():
            # a new cpuset starts empty, and so would every child runc makes below it
            for f in ("cpuset.cpus", "cpuset.mems"):
                (d / f).write_text((h / f).read_text())


def cgroup_dirs(root: str) -> list[Path]:
    """Every cgroup directory of ours, deepest first, in every hierarchy (v2 included)."""
    out: list[Path] = []
    for h in [*hierarchies(), CGROUP_FS / "unified"]:
        top = h / root.lstrip("/")
        if top.is_dir():
            out += [Path(d) for d, _, _ in os.walk(top, topdown=False)]
    return out


def cgroup_pids(root: str) -> set[int]:
    pids: set[int] = set()
    for d in cgroup_dirs(root):
        try:
            pids |= {int(p) for p in (d / "cgroup.procs").read_text().split()}
        except OSError:
            pass
    return pids


def shims(containerd_socket: str) -> list[int]:
    """containerd-shim processes serving this containerd (their -address is its socket)."""
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            argv = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-address" in argv[:-1] and \
                argv[argv.index(b"-address") + 1] == containerd_socket.encode():
            out.append(int(p.name))
    return out


def shim_sockets(node_dir: str, containerd_socket: str) -> list[Path]:
    """The sockets this node's shims serve: containerd 1.6 puts them in the shared
    /run/containerd/s, named by sha256(<containerd socket>/<namespace>/<task id>); a killed
    shim leaves its socket behind."""
    tasks = Path(node_dir) / "containerd" / "state" / "io.containerd.runtime.v2.task"
    out = []
    for ns in tasks.iterdir() if tasks.is_dir() else []:
        for task in ns.iterdir():
            h = hashlib.sha256(f"{containerd_socket}/{ns.name}/{task.name}".encode())
            out.append(SHIM_SOCKETS / h.hexdigest())
    return out


def remove_cni_cache(network: str) -> None:
    """libcni's cached results of this node's Pods (a killed Pod never had its CNI DEL):
    <network>-<sandbox id>-eth0 for our network, cni-loopback-<sandbox id>-lo for theirs."""
    if not CNI_CACHE.is_dir():
        return
    prefix = f"{network}-"
    for f in list(CNI_CACHE.iterdir()):
        if f.name.startswith(prefix):
            sandbox = f.name[len(prefix):].rsplit("-", 1)[0]
            (CNI_CACHE / f"cni-loopback-{sandbox}-lo").unlink(missing_ok=True)
            f.unlink(missing_ok=True)


def remove_if_dead(sock: Path) -> None:
    """Unlink a unix socket nobody serves any more (another kubelet may serve it)."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(sock))
        except FileNotFoundError:
            return
        except OSError:
            sock.unlink(missing_ok=True)


def rmdirs(*dirs: Path) -> None:
    """rmdir each if empty (the kubelet and libcni made them; nothing else here uses them)."""
    for d in dirs:
        try:
            d.rmdir()
        except OSError:
            pass


def unmount_under(top: Path) -> None:
    """Lazily unmount everything under top (overlay rootfs, netns, the kubelet's tmpfs
    volumes, its root dir bind-mounted on itself), deepest first, until nothing is left."""
    prefix = str(top).rstrip("/") + "/"
    for _ in range(5):
        mnts = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            # octal escapes (\040 for a space) in the mount point
            mnt = line.split()[4].encode().decode("unicode_escape")
            if mnt.startswith(prefix) or mnt == str(top):
                mnts.append(mnt)
        if not mnts:
            return
        for m in sorted(set(mnts), key=lambda m: m.count("/"), reverse=True):
            subprocess.run(["umount", "-l", m], capture_output=True, check=False)


def remove_cgroups(root: str) -> None:
    for _ in range(20):
        left = []
        for d in cgroup_dirs(root):
            try:
                d.rmdir()
            except OSError:
                left.append(d)
        if not left:
            return
        time.sleep(0.1)  # a killed task leaves its cgroup a moment after it is gone


def remove_log_links(node_dir: str) -> None:
    if CONTAINER_LOG_LINKS.is_dir():
        for link in CONTAINER_LOG_LINKS.iterdir():
            if link.is_symlink() and os.readlink(link).startswith(node_dir + "/"):
                link.unlink(missing_ok=True)
