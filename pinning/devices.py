"""A marked container's GPUs: exactly its placeholder job's (SLURM_JOB_GPUS, Slurm's gres
indices on this Node), as device nodes in the container and as its device cgroup's rules; every
other GPU of the Node denied, whatever else put it in the spec (a device plugin that chose
other indices than Slurm)."""

from __future__ import annotations

import os
import stat
from typing import Any

from .placeholder import Refused

GPU_MODE = 0o666


def indices(job_gpus: str) -> list[int]:
    """SLURM_JOB_GPUS ("0,2"; "" without GPUs) as gres indices."""
    try:
        return sorted({int(x) for x in job_gpus.split(",") if x.strip()})
    except ValueError:
        raise Refused(f"the job's GPUs read {job_gpus!r}, not gres indices") from None


def _device(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError as e:
        raise Refused(f"GPU device {path} of this Node: {e.strerror}") from None
    if not stat.S_ISCHR(st.st_mode):
        raise Refused(f"GPU device {path} of this Node is not a character device")
    return os.major(st.st_rdev), os.minor(st.st_rdev)


def hold(config: dict[str, Any], job_gpus: str, node_gpus: tuple[str, ...]) -> list[int]:
    """Give the container the job's GPUs and no other of the Node's (in place); the indices
    given. `node_gpus`: the Node's GPU device files in gres index order (gres.conf's File=)."""
    mine = indices(job_gpus)
    if mine and not node_gpus:
        raise Refused(f"the job holds GPUs {job_gpus} but this Node's GPU devices are not "
                      "configured (SLURMGATE_GPU_DEVICES)")
    if mine and mine[-1] >= len(node_gpus):
        raise Refused(f"the job holds GPU {mine[-1]}, this Node has {len(node_gpus)}")
    linux = config.setdefault("linux", {})
    devices = linux.setdefault("devices", [])
    rules = linux.setdefault("resources", {}).setdefault("devices", [])
    numbers = {i: _device(p) for i, p in enumerate(node_gpus)}
    theirs = {numbers[i] for i in numbers if i not in mine}
    # nodes of other GPUs go, whoever added them; ours are added once
    devices[:] = [d for d in devices
                  if (d.get("major"), d.get("minor")) not in set(numbers.values())]
    for i in mine:
        major, minor = numbers[i]
        devices.append({"path": f"/dev/{os.path.basename(node_gpus[i])}", "type": "c",
                        "major": major, "minor": minor, "fileMode": GPU_MODE, "uid": 0,
                        "gid": 0})
        rules.append({"allow": True, "type": "c", "major": major, "minor": minor,
                      "access": "rw"})
    # the last rule that matches wins (runc applies them in order): the others' denials last
    for major, minor in sorted(theirs):
        rules.append({"allow": False, "type": "c", "major": major, "minor": minor,
                      "access": "rwm"})
    return mine
