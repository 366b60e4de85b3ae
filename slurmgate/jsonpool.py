"""JSON bodies of slurmrestd, parsed off the event loop when they are big.

A changed job list of a busy cluster is megabytes (every job, including ended ones Slurm keeps
for MinJobAge); `json.loads` of it holds the GIL for 100 ms or more, which stalls every other
coroutine (binds, watches, health probes). Profiling the binder under a 1,000-Pod burst put
48 % of its samples there. A thread would not help (the GIL), so a worker process parses and
sends back only the jobs the caller keeps.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from slurmgate.config import JSON_OFFLOAD_BYTES

# The threshold when the caller passes none; SLURMGATE_JSON_OFFLOAD_BYTES reaches the clients
# of the two processes through SlurmSettings, not through this module.
OFFLOAD_BYTES = JSON_OFFLOAD_BYTES

_pool: ProcessPoolExecutor | None = None


def keep_jobs(jobs: list[Any], comment_prefix: str) -> list[Any]:
    """The job objects whose comment starts with comment_prefix."""
    return [j for j in jobs if isinstance(j, dict) and isinstance(c := j.get("comment"), str)
            and c.startswith(comment_prefix)]


def load(raw: bytes, keep_comment_prefix: str | None = None) -> Any:
    """Parse; with a prefix, keep only the jobs whose comment starts with it."""
    parsed = json.loads(raw) if raw.strip() else None
    if keep_comment_prefix is not None and isinstance(parsed, dict):
        jobs = parsed.get("jobs")
        if isinstance(jobs, list):
            parsed["jobs"] = keep_jobs(jobs, keep_comment_prefix)
    return parsed


def _executor() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        # spawn, not fork: forking a process with a running event loop and threads is unsafe
        _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    return _pool


async def load_async(raw: bytes, keep_comment_prefix: str | None = None,
                     offload_bytes: int | None = None) -> Any:
    if len(raw) < (OFFLOAD_BYTES if offload_bytes is None else offload_bytes):
        return load(raw, keep_comment_prefix)
    global _pool
    try:
        return await asyncio.get_running_loop().run_in_executor(
            _executor(), load, raw, keep_comment_prefix)
    except BrokenProcessPool:  # the worker was killed: parse here this once, then a new one
        _pool = None
        return load(raw, keep_comment_prefix)


def shutdown() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None
