"""Big slurmrestd bodies are parsed in a worker process and filtered there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from slurmgate import jsonpool

PREFIX = "slurmgate claim="
BODY = {"meta": {}, "errors": [], "last_update": 5, "jobs": [
    {"job_id": 1, "comment": f"{PREFIX}a pod=ns/a"},
    {"job_id": 2, "comment": "someone else"},
    {"job_id": 3},
    "not a job",
    {"job_id": 4, "comment": f"{PREFIX}b pod=ns/b", "x": "é" * 10},
]}
RAW = json.dumps(BODY).encode()


def test_load_filters_and_keeps_the_rest() -> None:
    got = jsonpool.load(RAW, PREFIX)
    assert [j["job_id"] for j in got["jobs"]] == [1, 4]
    assert got["last_update"] == 5 and got["errors"] == []
    assert jsonpool.load(RAW) == BODY
    assert jsonpool.load(b"  ") is None
    with pytest.raises(ValueError):
        jsonpool.load(b"{not json")
    with pytest.raises(ValueError):
        jsonpool.load(b"\xff\xfe")


async def test_big_bodies_go_to_a_worker_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonpool, "OFFLOAD_BYTES", 10)
    jsonpool.shutdown()
    try:
        got = await jsonpool.load_async(RAW, PREFIX)
        assert got == jsonpool.load(RAW, PREFIX)
        pool = jsonpool._pool
        assert pool is not None
        worker = next(iter(pool._processes.values()))
        assert worker.pid != os.getpid()
        with pytest.raises(ValueError):
            await jsonpool.load_async(b"{not json but long enough", PREFIX)
        # a killed worker loses no answer: this call parses inline, the next gets a new worker
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        assert (await jsonpool.load_async(RAW, PREFIX)) == got
        assert (await jsonpool.load_async(RAW, PREFIX)) == got
        assert jsonpool._pool is not None and jsonpool._pool is not pool
    finally:
        jsonpool.shutdown()


async def test_small_bodies_stay_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    jsonpool.shutdown()
    monkeypatch.setattr(jsonpool, "OFFLOAD_BYTES", 1 << 30)
    assert (await jsonpool.load_async(RAW, PREFIX))["jobs"][0]["job_id"] == 1
    assert jsonpool._pool is None


_CHILD = """
import asyncio, os, sys
from slurmgate import jsonpool
asyncio.run(jsonpool.load_async(b'{"jobs": []}', None, offload_bytes=0))
kids = set()
for t in os.listdir("/proc/self/task"):
    kids |= set(open(f"/proc/self/task/{t}/children").read().split())
print(" ".join(sorted(kids)), flush=True)
sys.stdin.read()
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux /proc")
def test_the_worker_and_its_tracker_die_with_a_sigkilled_parent() -> None:
    p = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        kids = [int(k) for k in p.stdout.readline().split()]
        assert len(kids) >= 2, kids  # the parsing worker and multiprocessing's resource tracker
        assert all(_alive(k) for k in kids)
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 15
    while any(_alive(k) for k in kids) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a condition with a deadline: nothing to wait on across PIDs
    assert not [k for k in kids if _alive(k)], "orphans outlived their SIGKILLed parent"
