"""The local cluster's enforcing mode (cluster/slurm_cgroups.py): what slurm.conf and cgroup.conf
say, the stand-in GPUs as devices a cgroup can tell apart, and the cleanup of what slurmd
leaves (on a directory tree standing in for /sys/fs/cgroup)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from cluster import slurm_cgroups
from cluster.proc import ClusterError
from cluster.slurm_conf import GpuLayout, slurm_conf_text

CONF_ARGS = (Path("/tmp/r"), ["n1", "n2"], 2, 4000, 16800, Path("/tmp/r/munge/munge.sock"),
             "sg16800", 20)


def test_cpu_lists_read_as_the_kernel_writes_them() -> None:
    assert slurm_cgroups.parse_cpu_list("0-2,5") == [0, 1, 2, 5]
    assert slurm_cgroups.parse_cpu_list("1\n") == [1]
    assert slurm_cgroups.parse_cpu_list("") == []


def test_an_enforcing_node_never_declares_cpus_the_host_lacks() -> None:
    have = len(slurm_cgroups.host_cpus())
    assert slurm_cgroups.cpus_for_enforcement(have) == have
    with pytest.raises(ValueError, match=f"this host has {have}"):
        slurm_cgroups.cpus_for_enforcement(have + 1)


def test_enforcing_conf_constrains_cores_and_devices() -> None:
    plain = slurm_conf_text(*CONF_ARGS)
    assert "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n" in plain
    assert "CoresPerSocket" not in plain
    text = slurm_conf_text(*CONF_ARGS, gpus=GpuLayout(("n2",), 4, "a100"), enforce=True)
    assert "ProctrackType=proctrack/cgroup\nTaskPlugin=task/cgroup\n" in text
    assert "CPUs=2 RealMemory=4000 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 Gres=gpu:a100:4" \
        in text
    # everything else stays as it was
    assert [ln for ln in text.splitlines() if "Proctrack" not in ln and "TaskPlugin" not in ln
            and "NodeName" not in ln] == \
        [ln for ln in plain.splitlines() if "Proctrack" not in ln and "TaskPlugin" not in ln
         and "NodeName" not in ln]
    for line in ("CgroupPlugin=cgroup/v1", "ConstrainCores=yes", "ConstrainDevices=yes"):
        assert line in slurm_cgroups.CGROUP_CONF.splitlines()


def test_stand_in_gpus_are_devices_of_their_own(tmp_path: Path) -> None:
    files = [tmp_path / f"nvidia{i}" for i in range(3)]
    files[0].symlink_to("/dev/null")  # what an unenforced cluster left in the same run dir
    slurm_cgroups.make_stand_in_gpus(files)
    slurm_cgroups.make_stand_in_gpus(files)  # again: the same devices, nothing changed
    seen = set()
    for i, f in enumerate(files):
        st = f.lstat()
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (slurm_cgroups.STAND_IN_GPU_MAJOR, i)
        seen.add(st.st_rdev)
    assert len(seen) == 3 and os.stat("/dev/null").st_rdev not in seen
    with pytest.raises(OSError) as e:  # no driver behind them: a job that may open one learns so
        os.open(files[1], os.O_RDONLY)
    assert e.value.errno == 6  # ENXIO, not EPERM (a device cgroup's refusal)


def test_leftovers_removes_empty_node_cgroups_only(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_cgroups, "CGROUP_ROOT", tmp_path)
    empty = tmp_path / "cpuset" / "slurm_n1" / "uid_0"
    empty.mkdir(parents=True)
    busy = tmp_path / "devices" / "slurm_n1" / "uid_0" / "job_7"
    busy.mkdir(parents=True)
    (busy / "tasks").write_text("123\n")  # a plain dir with a file stands for a cgroup in use
    other = tmp_path / "cpuset" / "slurm_n3"
    other.mkdir()
    assert slurm_cgroups.job_cgroup("devices", "n1", 7) == busy
    assert slurm_cgroups.job_cgroup("devices", "n1", 8) is None
    slurm_cgroups.leftovers(["n1", "n2"])
    assert not (tmp_path / "cpuset" / "slurm_n1").exists()
    assert busy.is_dir() and other.is_dir()


def test_a_node_name_whose_cgroups_hold_jobs_is_refused(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_cgroups, "CGROUP_ROOT", tmp_path)
    (tmp_path / "cpuset" / "slurm_n1" / "uid_0").mkdir(parents=True)
    slurm_cgroups.check_free(["n1", "n2"])  # an empty node cgroup is no one's
    (tmp_path / "cpuset" / "slurm_n2" / "uid_0" / "job_4").mkdir(parents=True)
    with pytest.raises(ClusterError, match="node n2's cgroups already hold job_4"):
        slurm_cgroups.check_free(["n1", "n2"])
