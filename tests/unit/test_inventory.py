"""The webhook's inventory reads Slurm's side (nodes, partitions) at its own, slower pace: every
read of it costs the site's slurmrestd, and it changes only with slurm.conf."""

from __future__ import annotations

from typing import Any

import pytest

from slurmgate import inventory
from slurmgate.inventory import Inventory
from slurmgate.slurm import PartitionInfo


class Slurm:
    def __init__(self) -> None:
        self.reads = 0
        self.grace = 20

    async def nodes(self) -> list[Any]:
        self.reads += 1
        return []

    async def partitions(self) -> list[PartitionInfo]:
        return [PartitionInfo("k8s", (), True, None, "UP", self.grace)]


class Kube:
    def __init__(self) -> None:
        self.reads = 0
        self.fail = False

    async def list(self, path: str, **params: str) -> tuple[list[dict[str, Any]], str]:
        self.reads += 1
        if self.fail:
            raise ConnectionError("apiserver away")
        return [], "1"


async def test_slurm_is_read_at_its_own_pace_and_kubernetes_each_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(inventory.time, "monotonic", lambda: now[0])
    slurm, kube = Slurm(), Kube()
    inv = Inventory(slurm, kube, interval=30, slurm_interval=60)  # type: ignore[arg-type]
    await inv.refresh()
    assert (slurm.reads, kube.reads) == (1, 2)  # Nodes and slurmd Pods
    slurm.grace = 40  # slurm.conf changed
    now[0] += 30
    m = await inv.refresh()
    assert (slurm.reads, kube.reads) == (1, 4)  # Kubernetes re-read, Slurm's side kept
    assert m.partitions["k8s"].grace_time_seconds == 20
    now[0] += 30
    m = await inv.refresh()
    assert slurm.reads == 2 and m.partitions["k8s"].grace_time_seconds == 40


async def test_a_failed_refresh_reads_slurm_again_next_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(inventory.time, "monotonic", lambda: now[0])
    slurm, kube = Slurm(), Kube()
    inv = Inventory(slurm, kube, interval=30, slurm_interval=60)  # type: ignore[arg-type]
    kube.fail = True
    with pytest.raises(ConnectionError):
        await inv.refresh()
    assert inv.current is None and slurm.reads == 1
    kube.fail = False
    slurm.grace = 40
    m = await inv.refresh()  # at once: Slurm's side of the failed refresh was never kept
    assert slurm.reads == 2 and m.partitions["k8s"].grace_time_seconds == 40
