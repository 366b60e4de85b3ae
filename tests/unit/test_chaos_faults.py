"""The chaos run's fault driver: the parse-worker fault kills the leading binder's worker,
whichever replica leads (real processes standing in for two binder replicas and their
workers); a fault with nothing to kill is a skip, not an injection, and is tried again."""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from bench.chaos import FAULTS, faults
from bench.chaos.reads import processes

# a "binder" that starts one child whose command line looks like a multiprocessing worker
PARENT = ("import subprocess, sys, time\n"
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)',"
          " 'multiprocessing-fork-stand-in'])\n"
          "time.sleep(60)\n")


def _worker_of(pid: int) -> int | None:
    return next((p.pid for p in processes() if p.ppid == pid and "multiprocessing" in p.cmdline),
                None)


def _alive(pid: int) -> bool:
    return any(p.pid == pid for p in processes())


@pytest.fixture
def replicas() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    procs = {name: subprocess.Popen([sys.executable, "-c", PARENT])
             for name in ("binder", "binder-2")}
    deadline = time.monotonic() + 10
    while any(_worker_of(p.pid) is None for p in procs.values()):
        assert time.monotonic() < deadline, "the stand-in workers did not start"
        time.sleep(0.05)
    yield procs
    for p in procs.values():
        worker = _worker_of(p.pid)
        p.kill()
        p.wait()
        if worker is not None:
            subprocess.run(["kill", "-9", str(worker)], check=False)


@pytest.mark.parametrize("leader", ["binder", "binder-2"])
def test_the_leaders_worker_is_killed(replicas: dict[str, subprocess.Popen[bytes]],
                                      leader: str, monkeypatch: pytest.MonkeyPatch) -> None:
    workers = {name: _worker_of(p.pid) for name, p in replicas.items()}
    driver = faults.FaultDriver.__new__(faults.FaultDriver)
    driver.bridge = SimpleNamespace(pids={n: p.pid for n, p in replicas.items()})  # type: ignore[assignment]
    monkeypatch.setattr(faults.bridge_mod, "leading_binder", lambda b: leader)
    said = driver._parse_worker()
    assert said == f"parse worker pid {workers[leader]} ({leader})"
    killed = workers[leader]
    other = next(w for n, w in workers.items() if n != leader)
    assert killed is not None and other is not None
    deadline = time.monotonic() + 5
    while _alive(killed):  # SIGKILLed; gone once its parent reaps it or it turns zombie
        state = open(f"/proc/{killed}/stat").read().rsplit(")", 1)[1].split()[0]
        if state == "Z":
            break
        assert time.monotonic() < deadline, "the leader's worker is still running"
        time.sleep(0.05)
    assert _alive(other)


class Obs:
    """What the fault driver tells the observer."""

    def __init__(self) -> None:
        self.told: list[str] = []
        self.pending_fault = None

    def note(self, text: str) -> None:
        self.told.append(text)

    def fault_started(self, name: str) -> None:
        self.told.append(f"started {name}")

    def fault_ended(self, name: str) -> None:
        self.told.append(f"ended {name}")

    def slurmd_killed(self, node: str) -> None:
        self.told.append(f"slurmd killed on {node}")


def _driver(pids: dict[str, int]) -> faults.FaultDriver:
    driver = faults.FaultDriver.__new__(faults.FaultDriver)
    # the driver is a Thread: its own attributes (_target, _name, ...) must not hide a method
    # of the driver's (a `_target` method was None in the first CI run: no fault injected)
    threading.Thread.__init__(driver, daemon=True)
    driver.bridge = SimpleNamespace(pids=pids)  # type: ignore[assignment]
    driver.obs = Obs()  # type: ignore[assignment]
    return driver


def test_no_worker_under_the_leader_is_a_skip_not_an_injection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    lone = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        driver = _driver({"binder": lone.pid})
        driver.rng = random.Random(1)
        monkeypatch.setattr(faults.bridge_mod, "leading_binder", lambda b: "binder")
        with pytest.raises(faults.Skipped, match="no parse worker running under binder"):
            driver._parse_worker()
        rec = driver.inject("parse-worker")
        assert rec.skipped and not rec.done and not rec.error
        # nothing happened, so the observer waits for no settling
        assert driver.obs.told == [  # type: ignore[attr-defined]
            f"FAULT parse-worker skipped, nothing injected: {rec.skipped}"]
        assert lone.poll() is None  # and the binder stand-in was left alone
    finally:
        lone.kill()
        lone.wait()


def test_with_no_binder_leading_the_binder_fault_kills_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # killing a standby is not the fault (the leader's loss): it waits for a leader
    driver = _driver({"binder": 1, "binder-2": 1})
    monkeypatch.setattr(faults.bridge_mod, "leading_binder", lambda b: None)
    for name in ("binder", "parse-worker"):
        with pytest.raises(faults.Skipped, match="no binder replica leads"):
            driver._what_to_kill(name, "")


def test_a_skipped_fault_is_tried_again_within_its_round_then_given_up() -> None:
    driver = _driver({})
    driver.rng, driver.gap, driver.rounds, driver.rounds_done = random.Random(3), (0, 0), 1, 0
    driver.only, driver.injected, driver.stop_flag = FAULTS, [], threading.Event()
    driver._pause = lambda seconds: True  # type: ignore[method-assign]
    # parse-worker never finds a worker; the others inject
    driver.inject = lambda name: faults.Injected(  # type: ignore[method-assign]
        name, 0.0, 0.0, skipped="no worker" if name == "parse-worker" else "")
    driver.run()
    tried = [i.name for i in driver.injected]
    assert sorted(set(tried)) == sorted(FAULTS)  # the round ended, every fault tried
    assert tried.count("parse-worker") == faults.SKIP_TRIES
    assert all(tried.count(n) == 1 for n in FAULTS if n != "parse-worker")


def test_a_slurmd_kill_is_told_to_the_observer(monkeypatch: pytest.MonkeyPatch) -> None:
    # the observer's evidence that Slurm ended a placeholder without its node
    driver = _driver({})
    driver.slurm_dir = None  # type: ignore[assignment]
    done: list[str] = []
    monkeypatch.setattr(faults.slurm_faults, "kill_daemon", lambda d, n: done.append(f"kill {n}"))
    monkeypatch.setattr(faults.slurm_faults, "start_daemon",
                        lambda d, n, timeout: done.append(f"start {n}"))
    driver._slurm = lambda *a: done.append(" ".join(a)) or ""  # type: ignore[method-assign]
    assert driver._slurmd("n2", 0.0) == "slurmd-n2"
    assert done[0] == "kill slurmd-n2"
    assert driver.obs.told == ["slurmd killed on n2"]  # type: ignore[attr-defined]
