"""The local cluster can start every slurmd (and so every job it starts) under nice(1): on one
host the slurmd stand for other machines, and a bench keeps them off the control plane's cores.
The same argv serves a slurmd restarted by a fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster import local, slurm_cluster
from cluster.slurm_cluster import NICE, SlurmCluster


def test_slurmd_runs_under_nice_only_when_asked(tmp_path: Path) -> None:
    c = SlurmCluster(tmp_path, tmp_path / "slurm.conf", "http://x", tmp_path / "t", ["n1"], 8, 1000)
    plain, _ = c.slurmd("n1")
    assert plain[0] != NICE and plain[-2:] == ["-N", "n1"]
    c.slurmd_nice = 19
    niced, env = c.slurmd("n1")
    assert niced == [NICE, "-n", "19", *plain]
    assert env["SLURM_CONF"] == str(tmp_path / "slurm.conf")


def test_a_nice_level_that_is_no_number_names_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(slurm_cluster.SLURMD_NICE_ENV, "high")
    with pytest.raises(ValueError, match="SLURMGATE_SLURMD_NICE='high'"):
        local._slurmd_nice()
    monkeypatch.setenv(slurm_cluster.SLURMD_NICE_ENV, "7")
    assert local._slurmd_nice() == 7
