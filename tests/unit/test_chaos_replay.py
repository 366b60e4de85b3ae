"""A chaos run's seed replays it: the printed command carries every option that shapes the
seeded choices, and the churn meets the same random numbers at the same tick whatever the
cluster did meanwhile (a refused create, an evicted Pod, an hpc job queued)."""

from __future__ import annotations

import random
import shlex
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from bench.chaos import __main__ as entry
from bench.chaos import report
from bench.chaos.churn import Churn, ChurnStats

NOT_REPLAYED = {"-h", "--run-dir", "--out", "--keep"}  # where and whether, not what


def test_the_replay_command_parses_back_to_the_same_run() -> None:
    a = entry.parse_args(["--seed", "1205", "--versions", "26.05,24.11", "--rounds", "1",
                          "--gap", "5", "12.5", "--minutes", "10", "--binders", "1",
                          "--pods", "5", "--faults", "etcd,slurmd", "--nodes", "3",
                          "--min-pods-created", "9", "--min-pods-bound", "4"])
    argv = shlex.split(report.replay_command(a))
    assert argv[:3] == ["python", "-m", "bench.chaos"]
    b = entry.parse_args(argv[3:])
    skip = {"run_dir", "out", "keep"}
    assert {k: v for k, v in vars(b).items() if k not in skip} == {
        k: v for k, v in vars(a).items() if k not in skip}
    # one release of it, alone
    one = entry.parse_args(shlex.split(report.replay_command(a, ["24.11"]))[3:])
    assert one.versions == ["24.11"] and one.seed == 1205


def test_every_option_that_shapes_a_run_is_in_its_replay() -> None:
    # a new option left out of the replay would silently take its default there
    a = entry.parse_args(["--rounds", "1"])  # the one option whose default is left out
    replay = shlex.split(report.replay_command(a))
    for action in entry.parser()._actions:
        flags = set(action.option_strings)
        if flags and not flags & NOT_REPLAYED:
            assert flags & set(replay), f"{sorted(flags)} missing from {replay}"


def test_without_a_seed_one_is_drawn_and_kept() -> None:
    a = entry.parse_args([])
    assert isinstance(a.seed, int)
    assert f"--seed {a.seed} " in report.replay_command(a)


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
