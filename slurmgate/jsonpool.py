"""JSON bodies of slurmrestd, parsed off the event loop when they are big.

A changed job list of a busy cluster is megabytes (every job, including ended ones Slurm keeps
for MinJobAge); `json.loads` of it holds the GIL for 100 ms or more, which stalls every other
coroutine (binds, watches, health probes). Profiling the binder under a 1,000-Pod burst put
48 % of its samples there. A thread would not help (the GIL), so a worker process parses and
sends back only the jobs the caller keeps.

The worker must die with its parent however the parent dies: a SIGKILLed binder otherwise left
its worker (which holds its own queue's write end, so it never sees EOF) and, through it,
multiprocessing's resource tracker behind, two orphans per kill. Linux's parent-death signal
ends the worker; the tracker exits by itself once no process holds its pipe.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import multiprocessing
import os
import signal
import sys
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


_PR_SET_PDEATHSIG = 1


def _die_with(parent: int) -> None:
    """Worker initializer: SIGKILL this worker when the parent dies (Linux only; elsewhere the
    old behaviour). The signal fires when the thread that started us ends: the pool is only ever
    grown from the event loop's thread (submit), whose end is the process's end."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


def _executor() -> ProcessPoolExecutor:
    global _pool
    if _pool is None:
        # spawn, not fork: forking a process with a running event loop and threads is unsafe
        _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                    initializer=_die_with, initargs=(os.getpid(),))
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
