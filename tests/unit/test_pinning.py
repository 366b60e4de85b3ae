"""slurmgate-runc (pinning/): which containers it pins, to what, and what it refuses. slurmd's
cgroups and /proc stand as directory trees; the wrapper's exec of runc is real (a script that
records what it was given)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from cluster import realnode_conf, slurm_cgroups
from slurmgate import contract
from slurmgate.pinning import placeholder
from slurmgate.pinning.__main__ import command
from slurmgate.pinning.placeholder import Placeholder, Refused
from slurmgate.pinning.spec import CRI_NAME, CRI_NAMESPACE, owns, pin


def job_tree(root: Path, node: str, job: int, cpus: str, env: dict[str, str],
             pid: int = 4242) -> None:
    """slurmd's cgroup of a job with one process in it, and that process's environment."""
    d = root / "cg" / "cpuset" / f"slurm_{node}" / "uid_0" / f"job_{job}"
    (d / "step_batch").mkdir(parents=True)
    (d / "cpuset.cpus").write_text(cpus + "\n")
    (d / "cgroup.procs").write_text("")
    (d / "step_batch" / "cgroup.procs").write_text(f"{pid}\n")
    p = root / "proc" / str(pid)
    p.mkdir(parents=True)
    (p / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))


def find_in(root: Path, within: float = 0.0) -> Callable[[str, int], Placeholder]:
    return partial(placeholder.find, within=within, root=root / "cg", proc=root / "proc")


def spec(job: str | None = "12", node: str = "n2", pod: str = "web-0", ns: str = "team-a",
         **extra: str) -> dict:
    ann = {CRI_NAME: pod, CRI_NAMESPACE: ns, **extra}
    if job is not None:
        ann[contract.A_JOB_ID] = job
        ann[contract.A_SLURM_NODE] = node
    return {"ociVersion": "1.0.2", "annotations": ann,
            "linux": {"resources": {"cpu": {"shares": 2}}}}


def test_a_marked_container_gets_its_jobs_cores(tmp_path: Path) -> None:
    job_tree(tmp_path, "n2", 12, "1", {"SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "k8s:team-a/web-0",
                                       "SLURM_JOB_GPUS": "0"})
    c = spec()
    ph = pin(c, frozenset({"n2"}), find_in(tmp_path), _gpus(tmp_path, 1))
    assert ph == Placeholder(12, "n2", "1", "k8s:team-a/web-0", "0")
    assert c["linux"]["resources"]["cpu"] == {"shares": 2, "cpus": "1"}


def test_unmarked_containers_are_left_alone(tmp_path: Path) -> None:
    c = spec(job=None)
    before = json.dumps(c)
    assert pin(c, frozenset({"n2"}), find_in(tmp_path)) is None
    assert json.dumps(c) == before


@pytest.mark.parametrize("job_name, pod, group, ok", [
    ("k8s:team-a/web-0", "web-0", None, True),
    ("k8s:team-a/web-*", "web-x7k2p", None, True),  # generateName: the name came later
    ("k8s:team-a/group:train", "worker-3", "train", True),
    ("k8s:team-a/web-0", "web-1", None, False),
    ("k8s:team-b/web-0", "web-0", None, False),  # another namespace's Pod of the same name
    ("k8s:team-a/group:train", "worker-3", None, False),
    ("k8s:team-a/group:train", "worker-3", "other", False),
    ("batch-job", "web-0", None, False),
])
def test_a_job_is_the_pods_own_by_the_name_slurm_started_it_under(
        job_name: str, pod: str, group: str | None, ok: bool) -> None:
    assert owns(job_name, "team-a", pod, group) is ok


def test_refusals(tmp_path: Path) -> None:
    job_tree(tmp_path, "n2", 12, "1", {"SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "k8s:team-a/web-0"})
    nodes = frozenset({"n2"})
    # another Pod naming this job (its own name comes from containerd, not its annotations)
    with pytest.raises(Refused, match="not the placeholder of Pod team-a/thief"):
        pin(spec(pod="thief"), nodes, find_in(tmp_path))
    with pytest.raises(Refused, match="Slurm node n3, which this Node does not stand for"):
        pin(spec(node="n3"), nodes, find_in(tmp_path))
    with pytest.raises(Refused, match="job 13 has no cgroup on Slurm node n2"):
        pin(spec(job="13"), nodes, find_in(tmp_path))
    with pytest.raises(Refused, match="names Slurm job 'x'"):
        pin(spec(job="x"), nodes, find_in(tmp_path))
    with pytest.raises(Refused, match="on Slurm node ''"):
        pin(spec(node=""), frozenset({""}), find_in(tmp_path))


def test_a_cgroup_without_the_jobs_process_is_waited_for_then_refused(tmp_path: Path) -> None:
    job_tree(tmp_path, "n2", 12, "1", {"PATH": "/bin"})  # no SLURM_JOB_ID: not launched yet
    with pytest.raises(Refused, match="no process in its cgroup"):
        pin(spec(), frozenset({"n2"}), find_in(tmp_path, within=0.2))


def test_runc_command_lines() -> None:
    argv = ["--root", "/run/containerd/runc/k8s.io", "--log", "/b/log.json", "--log-format",
            "json", "create", "--bundle", "/b", "--pid-file", "/b/init.pid", "abc123"]
    cmd, opts = command(argv)
    assert cmd == "create" and opts["--bundle"] == "/b" and opts["--log"] == "/b/log.json"
    assert command(["--root", "/r", "state", "abc"])[0] == "state"
    assert command(["--log=/l", "create", "--bundle=/x", "id"]) == (
        "create", {"--log": "/l", "--bundle": "/x"})


def _fake_runc(tmp_path: Path) -> Path:
    runc = tmp_path / "runc"
    runc.write_text("#!/bin/sh\n"
                    f"echo \"$*\" > {tmp_path}/runc.argv\n"
                    f"cp \"$(pwd)/config.json\" {tmp_path}/runc.config 2>/dev/null\n")
    runc.chmod(0o755)
    return runc


def _wrapper(tmp_path: Path, bundle: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SLURMGATE_RUNC": str(_fake_runc(tmp_path)),
           "SLURMGATE_SLURM_NODES": "n2"}
    return subprocess.run([sys.executable, "-m", "slurmgate.pinning", "--log",
                           str(bundle / "log.json"), *args], cwd=bundle, env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_wrapper_execs_runc_with_the_same_arguments(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(spec(job=None)))
    p = _wrapper(tmp_path, bundle, "create", "--bundle", str(bundle), "ctr1")
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "runc.argv").read_text().split() == [
        "--log", str(bundle / "log.json"), "create", "--bundle", str(bundle), "ctr1"]
    p = _wrapper(tmp_path, bundle, "delete", "ctr1")
    assert p.returncode == 0 and "delete ctr1" in (tmp_path / "runc.argv").read_text()


def test_the_wrapper_refuses_in_runcs_own_words_and_never_runs_runc(tmp_path: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(spec(node="n9")))
    p = _wrapper(tmp_path, bundle, "create", "--bundle", str(bundle), "ctr1")
    assert p.returncode == 1
    assert not (tmp_path / "runc.argv").exists()
    line = json.loads((bundle / "log.json").read_text().splitlines()[-1])
    assert line["level"] == "error" and "Slurm node n9" in line["msg"]
    assert json.loads((bundle / "config.json").read_text()) == spec(node="n9")


def test_the_nodes_launcher_sends_create_through_the_wrapper_only(tmp_path: Path) -> None:
    """The executable containerd runs as runc (cluster/realnode_conf.runc_launcher): `create`
    through slurmgate-runc (which refuses a marked container naming another Slurm node), every
    other call straight to runc; and containerd's config names it, with the Pod annotations."""
    runc = _fake_runc(tmp_path)
    launcher = tmp_path / "slurmgate-runc"
    launcher.write_text(realnode_conf.runc_launcher(sys.executable, str(runc), ["n2"]))
    launcher.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(spec(node="n9")))
    run = partial(subprocess.run, cwd=bundle, capture_output=True, text=True, timeout=60)
    p = run([str(launcher), "--log", str(bundle / "log.json"), "create", "--bundle", str(bundle),
             "c1"])
    assert p.returncode == 1 and "Slurm node n9" in p.stderr  # the wrapper's word, not runc's
    assert not (tmp_path / "runc.argv").exists()
    assert run([str(launcher), "state", "c1"]).returncode == 0
    assert (tmp_path / "runc.argv").read_text().split() == ["state", "c1"]
    toml = realnode_conf.containerd_toml(tmp_path, tmp_path / "s", "img", tmp_path, launcher)
    assert f'BinaryName = "{launcher}"' in toml and 'pod_annotations = ["slurmgate.io/*"]' in toml
    assert "BinaryName" not in realnode_conf.containerd_toml(tmp_path, tmp_path / "s", "img",
                                                             tmp_path)


def _gpus(tmp_path: Path, n: int) -> tuple[str, ...]:
    """n stand-in GPUs: character devices of their own, as the enforcing local cluster makes."""
    files = [tmp_path / "gpu-dev" / f"nvidia{i}" for i in range(n)]
    files[0].parent.mkdir()
    slurm_cgroups.make_stand_in_gpus(files)
    return tuple(str(f) for f in files)


def test_a_marked_container_gets_its_jobs_gpus_and_no_other(tmp_path: Path) -> None:
    gpus = _gpus(tmp_path, 4)
    job_tree(tmp_path, "n2", 12, "1", {"SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "k8s:team-a/web-0",
                                       "SLURM_JOB_GPUS": "1,3"})
    c = spec()
    major = slurm_cgroups.STAND_IN_GPU_MAJOR
    # what a device plugin that chose another GPU would have put there
    c["linux"]["devices"] = [{"path": "/dev/nvidia0", "type": "c", "major": major, "minor": 0}]
    pin(c, frozenset({"n2"}), find_in(tmp_path), gpus)
    assert [(d["path"], d["minor"]) for d in c["linux"]["devices"]] == [
        ("/dev/nvidia1", 1), ("/dev/nvidia3", 3)]
    rules = [(r["allow"], r["minor"]) for r in c["linux"]["resources"]["devices"]]
    assert rules == [(True, 1), (True, 3), (False, 0), (False, 2)]
    assert all(r["major"] == major for r in c["linux"]["resources"]["devices"])


def test_a_job_without_gpus_gets_none_of_the_nodes(tmp_path: Path) -> None:
    gpus = _gpus(tmp_path, 2)
    job_tree(tmp_path, "n2", 12, "0", {"SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "k8s:team-a/web-0"})
    c = spec()
    pin(c, frozenset({"n2"}), find_in(tmp_path), gpus)
    assert c["linux"].get("devices") == []
    assert [(r["allow"], r["minor"]) for r in c["linux"]["resources"]["devices"]] == [
        (False, 0), (False, 1)]


def test_gpus_that_cannot_be_given_refuse_the_container(tmp_path: Path) -> None:
    job_tree(tmp_path, "n2", 12, "0", {"SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "k8s:team-a/web-0",
                                       "SLURM_JOB_GPUS": "2"})
    with pytest.raises(Refused, match="GPU devices are not configured"):
        pin(spec(), frozenset({"n2"}), find_in(tmp_path))
    with pytest.raises(Refused, match="holds GPU 2, this Node has 2"):
        pin(spec(), frozenset({"n2"}), find_in(tmp_path), _gpus(tmp_path, 2))
    with pytest.raises(Refused, match="is not a character device"):
        pin(spec(), frozenset({"n2"}), find_in(tmp_path), ("/dev", "/dev", "/dev"))
