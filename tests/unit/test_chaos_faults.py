"""The chaos run's parse-worker fault kills the leading binder's worker, whichever replica leads
(real processes standing in for two binder replicas and their workers)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from bench.chaos import faults
from bench.chaos.observe import processes

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
