"""Big slurmrestd bodies are parsed in a worker process and filtered there."""

from __future__ import annotations

import json
import os
import signal

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
