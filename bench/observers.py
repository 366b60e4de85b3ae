"""Background tasks that watch a phase while it runs and note when things happened: Pods bound
(PodWatch), jobs RUNNING (JobPoller), peak RSS (ProcSampler)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bench import util
from slurmgate import contract
from slurmgate.kube import KubeClient, pod_path
from slurmgate.slurm import RUNNING, JobInfo, SlurmClient


async def cancel_task(task: asyncio.Task[None] | None) -> None:
    """Stop a background sampler/watcher task and wait until it has ended."""
    if task:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def wait_keys(want: set[Any], have: Mapping[Any, Any], limit: float) -> bool:
    """Until every key of `want` is in `have` (filled by a watcher task), or `limit` s."""
    deadline = time.monotonic() + limit
    while len(want & have.keys()) < len(want):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


@dataclass
class PodWatch:
    """Watch one namespace; remember when each Pod was first seen bound and ungated."""
    kube: KubeClient
    ns: str
    bound_at: dict[str, float] = field(default_factory=dict)
    node_of: dict[str, str] = field(default_factory=dict)
    ungated_at: dict[str, float] = field(default_factory=dict)
    running_wall: dict[str, float] = field(default_factory=dict)  # phase Running (wall clock)
    on_bound: Callable[[str], None] | None = None
    last_event: float = 0.0
    events: int = 0
    _task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        _, rv = await self.kube.list(pod_path(self.ns), limit=1)
        self._task = asyncio.create_task(self._run(rv))

    async def _run(self, rv: str) -> None:
        while True:
            try:
                async for kind, obj in self.kube.watch(pod_path(self.ns), rv):
                    now = time.monotonic()
                    self.last_event = now
                    self.events += 1
                    meta = obj.get("metadata") or {}
                    rv = meta.get("resourceVersion") or rv
                    if kind not in ("ADDED", "MODIFIED"):
                        continue
                    name = meta.get("name", "")
                    spec = obj.get("spec") or {}
                    gates = spec.get("schedulingGates") or []
                    if not any(g.get("name") == contract.GATE for g in gates):
                        self.ungated_at.setdefault(name, now)
                    if ((obj.get("status") or {}).get("phase") == "Running"
                            and name not in self.running_wall):
                        self.running_wall[name] = time.time()
                    node = spec.get("nodeName")
                    if node and name not in self.bound_at:
                        self.bound_at[name] = now
                        self.node_of[name] = node
                        if self.on_bound:
                            self.on_bound(name)
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(0.2)

    async def wait_bound(self, names: set[str], limit: float,
                         progress: Callable[[int], None] | None = None) -> bool:
        deadline = time.monotonic() + limit
        last = -1
        while True:
            n = len(names & self.bound_at.keys())
            if progress and n != last:
                progress(n)
                last = n
            if n >= len(names):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.1)

    async def wait_running(self, names: set[str], limit: float) -> bool:
        return await wait_keys(names, self.running_wall, limit)

    async def quiet(self, seconds: float, limit: float) -> float:
        """Until no event for `seconds` (trailing kwok status updates done); returns the wait."""
        t0 = time.monotonic()
        while time.monotonic() - max(self.last_event, t0 - seconds) < seconds:
            if time.monotonic() - t0 > limit:
                break
            await asyncio.sleep(0.2)
        return time.monotonic() - t0

    async def stop(self) -> None:
        await cancel_task(self._task)


@dataclass
class JobPoller:
    """Our own view of Slurm, polled like the binder does (update_time, 0.1 s): when each job
    was first seen RUNNING."""
    slurm: SlurmClient
    interval: float = 0.1
    running_at: dict[int, float] = field(default_factory=dict)
    polls: int = 0
    poll_seconds: list[float] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        since: int | None = None
        while True:
            t0 = time.monotonic()
            try:
                jobs, t = await self.slurm.jobs(since)
                self.polls += 1
                self.poll_seconds.append(time.monotonic() - t0)
                now = time.monotonic()
                for j in jobs or []:
                    self._see(j, now)
                since = max(0, t - 1) if t else None
            except asyncio.CancelledError:
                raise
            except Exception:
                since = None
            # the binder's rule: a slow poll waits as long as it took (spares slurmctld)
            await asyncio.sleep(max(self.interval, min(1.0, time.monotonic() - t0)))

    def _see(self, j: JobInfo, now: float) -> None:
        if j.state == RUNNING and j.job_id not in self.running_at:
            self.running_at[j.job_id] = now

    async def wait_running(self, ids: set[int], limit: float) -> bool:
        return await wait_keys(ids, self.running_at, limit)

    async def stop(self) -> None:
        await cancel_task(self._task)


class ProcSampler:
    """Peak RSS of some processes while a phase runs."""

    def __init__(self, pids: dict[str, int], interval: float = 0.5) -> None:
        self.pids = pids
        self.interval = interval
        self.peak: dict[str, float] = dict.fromkeys(pids, 0.0)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            for k, p in self.pids.items():
                try:
                    self.peak[k] = max(self.peak[k], util.rss_mib(p))
                except OSError:
                    pass
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        await cancel_task(self._task)
