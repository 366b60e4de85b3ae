"""`make demo`'s story, run against the session cluster: what a person reads must be true."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator

import pytest

from cluster import demo
from cluster.bridge import Bridge
from cluster.local import Local, k8s_node_name
from slurmgate import contract
from tests.e2e.conftest import squeue, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.kube_side, pytest.mark.kube_api]


@pytest.fixture
def demo_cleanup(local: Local) -> Iterator[None]:
    yield
    demo.cleanup(local)
    wait_until("demo jobs gone", lambda: not squeue(local), 60)


def test_demo_story(local: Local, bridge: Bridge, demo_cleanup: None) -> None:
    out = io.StringIO()
    seen = demo.run(local, out)
    text = out.getvalue()
    assert seen["node"] == k8s_node_name(seen["slurm_node"])
    assert "slurmgate.io/job-id:" in text and seen["job"] in text
    assert "SchedulingGated" in text
    assert "slurmgate.io/job-reason:" in seen["waiting"]
    # when Slurm expects it to start (test_expected_start.py compares it with squeue --start)
    assert f"{contract.A_EXPECTED_START}:" in seen["waiting"], seen["waiting"]
    # the plugin: the waiting Pod with its expected start; every Node held by a Pod of ours
    waiting = next(ln for ln in seen["plugin_pods"].splitlines() if "waits-for-a-node" in ln)
    assert "PENDING" in waiting and re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", waiting), \
        seen["plugin_pods"]
    held = [ln for ln in seen["plugin_nodes"].splitlines()[1:] if " pod default/" in ln]
    assert len(held) == 4, seen["plugin_nodes"]
    assert re.search(rf"{re.escape(contract.COND_ALLOCATED)}\s+False", seen["waiting"]), \
        seen["waiting"]
    assert "condition met" in text
    assert "fits on no Slurm node" in seen["refusal"]
    assert "Bound" in text and "SlurmAllocated" in text
    assert "AccountNotAllowed" in seen["borrow"] or "may not use account" in seen["borrow"]
    assert re.search(r"sg-team-a\s+team-a\s", seen["sacct"]), seen["sacct"]
