"""bench --split-cpus: which side a process goes to, the halves, and a real process pinned."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bench import cpusplit


def test_halves_give_slurm_the_upper_half() -> None:
    assert cpusplit.halves({0, 1}) == (frozenset({1}), frozenset({0}))
    assert cpusplit.halves({3, 0, 2, 1, 4}) == (frozenset({2, 3, 4}), frozenset({0, 1}))
    with pytest.raises(ValueError, match="two CPUs"):
        cpusplit.halves({0})


@pytest.mark.parametrize("comm,role,want", [
    ("slurmd", None, "slurm"), ("slurmscriptd", None, "slurm"), ("slurmstepd", None, "slurm"),
    ("mariadbd", None, "slurm"),
    ("kube-apiserver", None, "kube"), ("kube-controller", None, "kube"), ("etcd", None, "kube"),
    ("python3", "python:binder", "kube"), ("python3", "python:binder-worker", "kube"),
    ("python3", "python", None), ("sshd", None, None), ("sleep", None, None),
])
def test_side(comm: str, role: str | None, want: str | None) -> None:
    assert cpusplit.side(comm, role) == want


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_a_webhook_process_is_pinned_to_the_kubernetes_half() -> None:
    slurm, kube = cpusplit.halves(os.sched_getaffinity(0))
    # a process whose command line names the webhook module, as the bridge starts it
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()",
                              "slurmgate.webhook"], stdin=subprocess.PIPE)
    try:
        counts = cpusplit.apply(slurm, kube, only=frozenset({child.pid}))
        assert counts == {"slurm": 0, "kube": 1}
        assert os.sched_getaffinity(child.pid) == kube
        # a process of neither side is left where it was
        assert cpusplit.apply(slurm, kube, only=frozenset({os.getppid()})) == {
            "slurm": 0, "kube": 0}
    finally:
        child.communicate(b"")
