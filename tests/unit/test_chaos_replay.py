"""A chaos run's seed replays it: the churn meets the same random numbers at the same tick
whatever the cluster did meanwhile (a refused create, an evicted Pod, an hpc job queued)."""

from __future__ import annotations

import random
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from bench.chaos.churn import Churn, ChurnStats


class Cluster:
    """The API server and squeue as the churn sees them; `refuse` turns creates away."""

    def __init__(self, refuse_every: int = 0, hpc_queued: bool = False) -> None:
        self.refuse_every, self.hpc_queued = refuse_every, hpc_queued
        self.calls: list[str] = []
        self.pods: set[str] = set()

    def call(self, method: str, path: str, body: Any = None, timeout: float = 0) -> dict[str, Any]:
        name = body["metadata"]["name"] if body else path.rsplit("/", 1)[1]
        if method == "POST":
            if self.refuse_every and len(self.calls) % self.refuse_every == 0:
                self.calls.append(f"refused {name}")
                raise RuntimeError("HTTP 503: the webhook is down")
            self.pods.add(name)
        else:
            self.pods.discard(name)
        self.calls.append(f"{method} {name}")
        return {}

    def list_pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        return [{"metadata": {"name": n}} for n in sorted(self.pods)]

    def slurm(self, *args: str) -> str:
        return "scavenger\nscavenger\n" + ("hpc\n" if self.hpc_queued else "")


def churn(seed: int, cluster: Cluster) -> Churn:
    c = Churn.__new__(Churn)  # the churn's decisions alone: no cluster behind it
    c.ns, c.run_id, c.rng = "chaos", "chaos-1", random.Random(seed)
    c.obs = SimpleNamespace(note=lambda text: None)  # type: ignore[assignment]
    c.deleted, c.lock, c.target = set(), threading.Lock(), 6
    c.admin = SimpleNamespace(call=cluster.call, pods=cluster.list_pods)  # type: ignore[assignment]
    c._slurm = cluster.slurm  # type: ignore[method-assign]
    c.stats, c.live, c.n = ChurnStats(), [], 0
    return c


def test_the_same_seed_makes_the_same_choices() -> None:
    runs = []
    for _ in range(2):
        cluster = Cluster()
        c = churn(42, cluster)
        for _ in range(60):
            c.step()
        runs.append(cluster.calls)
    assert runs[0] == runs[1] and len(runs[0]) > 30
    other = Cluster()
    c = churn(43, other)
    for _ in range(60):
        c.step()
    assert other.calls != runs[0]


@pytest.mark.parametrize("cluster", [Cluster(refuse_every=3), Cluster(hpc_queued=True)],
                         ids=["creates refused", "an hpc job queued"])
def test_what_the_cluster_did_does_not_shift_later_draws(cluster: Cluster) -> None:
    # the same seed against a quiet cluster and against one that refuses creates (or already
    # has an hpc job): the random stream stays in step, tick by tick
    quiet, busy = churn(42, Cluster()), churn(42, cluster)
    for tick in range(60):
        quiet.step()
        busy.step()
        assert quiet.rng.getstate() == busy.rng.getstate(), f"parted at tick {tick}"
    assert quiet.stats.created != busy.stats.created or cluster.hpc_queued
