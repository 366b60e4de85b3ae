"""The e2e teardown's leak check can fail: a job of ours that no Pod names and slurmgate does
not cancel (the binder finds such a job only in its hourly whole list) is named, where the old
teardown cancelled it silently (issue 30)."""

from __future__ import annotations

import pytest

from cluster.local import Local
from slurmgate import contract
from tests.e2e.conftest import Kubectl, leftovers, slurm_cli

pytestmark = [pytest.mark.e2e, pytest.mark.hostprocs, pytest.mark.kube_side]


def test_a_job_left_behind_is_named(admin: Kubectl, local: Local, ns: str) -> None:
    comment = contract.job_comment("leak0000", ns, "ghost")
    job = slurm_cli(local, "sbatch", "--parsable", "--output=/dev/null", "-p", "k8s",
                    "--mem=100M", f"--comment={comment}", "--hold",
                    "--wrap=sleep 600").strip().split(";")[0]
    try:
        left = leftovers(admin, local, ns, deadline=3.0)
        assert [x for x in left if x.startswith(f"job {job} ")], left
        assert comment in left[0]
    finally:
        slurm_cli(local, "scancel", job)
    assert leftovers(admin, local, ns, deadline=10.0) == []
