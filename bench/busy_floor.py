"""The busy-site bench's own calls to Slurm and to slurmgate's /metrics (bench/busy.py): the
floor (the webhook's submit, the binder's state read and its cancel made directly to
slurmrestd), the binder's state reads beside the same reads made at the same time, and the
waits for our jobs to end. Imports cluster.* (through bench.harness): import it only once the
environment is set."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench import attribution
from bench.busy_cost import Samples, rest_by_endpoint
from bench.harness import Env
from bench.stats import binned_lat, lat
from slurmgate.slurm import RUNNING, JobSpec
from slurmgate.slurm.models import ENDED_STATES
from slurmgate.slurm.restmetrics import LAT_BUCKETS

FLOOR_PARTITION = "k8s"


async def scrape(env: Env) -> dict[str, Samples]:
    """/metrics of the webhook and the binder (empty for one that does not answer)."""
    out: dict[str, Samples] = {}
    for name, get in (("binder", env.binder_metrics), ("webhook", env.webhook_metrics)):
        try:
            out[name] = await get()
        except Exception:
            out[name] = []
    return out


async def wait_ours_idle(env: Env, job_ids: set[int], limit: float = 120.0) -> float:
    """Until each of `job_ids` has ended and every node of our partition is idle (never a
    list of every job: on a busy site that is the expensive read); cancels what is still
    there half-way. Returns seconds."""
    t0 = time.monotonic()
    left = set(job_ids)
    cancelled = False
    while True:
        for j in sorted(left):
            try:
                info = await env.slurm.job(j)
            except Exception:
                continue
            if info is None or info.state in ENDED_STATES:
                left.discard(j)
        try:
            nodes = [n for n in await env.slurm.nodes() if FLOOR_PARTITION in n.partitions]
        except Exception:
            nodes = []
        busy = [n.name for n in nodes if n.state != "IDLE" or "COMPLETING" in n.flags]
        if not left and nodes and not busy:
            return round(time.monotonic() - t0, 1)
        waited = time.monotonic() - t0
        if waited > limit / 2 and left and not cancelled:
            cancelled = True
            await env.cancel_jobs(sorted(left), 8)
        if waited > limit:
            raise TimeoutError(f"our jobs {sorted(left)[:5]} or nodes {busy[:5]} still busy "
                               f"after {limit:.0f}s")
        await asyncio.sleep(0.5)


async def job_ended(env: Env, job_id: int, limit: float = 60.0) -> None:
    """Until Slurm says the job ended (or forgot it); one GET job/{id} per 0.1 s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        info = await env.slurm.job(job_id)
        if info is None or info.state in ENDED_STATES:
            return
        await asyncio.sleep(0.1)
    raise TimeoutError(f"job {job_id} still there {limit:.0f} s after its Pod was deleted")


# the floor's own reads of its jobs' states, each job's while it runs, as far apart as the
# binder's polls while a job of ours is in flight (binder/jobpoll.py): the binder's periodic
# read made directly, in the same run, at the same resolution
FLOOR_READS_PER_JOB = 12
FLOOR_READ_GAP_S = 0.1
# after the Pods-in-flight window: the binder's reads and the same reads made directly, at once
READS_SIDE_BY_SIDE_S = 20.0


def floor_job(name: str) -> JobSpec:
    """A job made directly, sized as the bench's marked Pods' placeholders are (whole-node
    and exclusive, as every submit of slurmgate's client is)."""
    return JobSpec(name=name, comment="bench floor", memory_mb=1024, cpus=1,
                   partition=FLOOR_PARTITION)


class SlurmFloor:
    """The webhook's submit, the binder's state read and its cancel, made directly to
    slurmrestd: a block's jobs submitted back to back, then each waited for until RUNNING, its
    state read (with the ids before it, as the binder asks for every id it watches), then
    cancelled (KILL).

    Run in blocks (`block`) between the rounds of marked Pods, so that the direct calls and
    slurmgate's meet the same moments of a busy slurmctld: their p99s are then compared side
    by side, not a quiet minute against a loaded one."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.submit: list[float] = []
        self.cancel: list[float] = []
        self.reads: list[float] = []
        self.ids: list[int] = []
        self.ctld_log, _ = env.logs()
        self.at = attribution.size_of(self.ctld_log)

    async def block(self, n: int) -> None:
        """`n` jobs submitted back to back, as a latency round admits its Pods (each submit
        then meets the previous jobs' starts, as the webhook's do); then each in turn: until
        RUNNING, its state read, cancelled, and gone before the next one's cancel (as the
        round deletes its Pods); then until our nodes are idle."""
        d = await self.env.slurm.dialect()
        slurm, first = self.env.slurm, len(self.ids)
        for i in range(first, first + n):
            t0 = time.perf_counter()
            jid = await slurm.submit(floor_job(f"bench-floor-{i}"))
            self.submit.append(time.perf_counter() - t0)
            self.ids.append(jid)
        for jid in self.ids[first:]:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                j = await slurm.job(jid)
                if j is not None and j.state == RUNNING:
                    break
                await asyncio.sleep(0.05)
            for _ in range(FLOOR_READS_PER_JOB):
                t0 = time.perf_counter()
                # the binder's read per release: one filtered GET jobs/state (24.11+), or
                # each job's record where slurmrestd cannot filter (22.05: the job in flight)
                await (slurm.job_states(self.ids) if d.state_query else slurm.job(jid))
                self.reads.append(time.perf_counter() - t0)
                await asyncio.sleep(FLOOR_READ_GAP_S)
            t0 = time.perf_counter()
            await slurm.cancel(jid, "KILL")
            self.cancel.append(time.perf_counter() - t0)
            await job_ended(self.env, jid)
        await wait_ours_idle(self.env, set(self.ids[first:]))

    async def result(self) -> dict[str, Any]:
        d = await self.env.slurm.dialect()
        sub = attribution.slurm_submits(self.ctld_log, self.at)
        run = attribution.slurm_running(self.ctld_log, self.at)
        inside = attribution.slurm_submit_time(self.ctld_log, self.at)
        # also at the resolution of slurmgate's own figures (a histogram): like with like
        return {"submit": lat(self.submit), "cancel": lat(self.cancel), "read": lat(self.reads),
                "read_endpoint": "jobs/state" if d.state_query else "job/{id}",
                "submit_binned": binned_lat(self.submit, LAT_BUCKETS),
                "cancel_binned": binned_lat(self.cancel, LAT_BUCKETS),
                "read_binned": binned_lat(self.reads, LAT_BUCKETS),
                "ctld_submit": lat([inside[j] for j in self.ids if j in inside]),
                "submit_to_running": lat([run[j] - sub[j] for j in self.ids
                                          if j in sub and j in run])}


async def reads_side_by_side(env: Env, ids: list[int], seconds: float) -> dict[str, Any]:
    """The binder's periodic state read and the same read made directly, over the same
    `seconds`, on the same ids (our jobs in flight): what the moment costs any client of this
    Slurm shows in both, so the ratio is the binder's own. Direct: the filtered GET jobs/state
    of all the ids (24.11+), or GET job/{id} of each in turn (22.05), every FLOOR_READ_GAP_S;
    the binder's: its GETs of that endpoint between two scrapes of its histogram."""
    d = await env.slurm.dialect()
    ep = "jobs/state" if d.state_query else "job/{id}"
    m0 = await scrape(env)
    direct: list[float] = []
    t_start = time.monotonic()
    while ids and time.monotonic() - t_start < seconds:
        t0 = time.perf_counter()
        await (env.slurm.job_states(ids) if d.state_query
               else env.slurm.job(ids[len(direct) % len(ids)]))
        direct.append(time.perf_counter() - t0)
        await asyncio.sleep(FLOOR_READ_GAP_S)
    dt = time.monotonic() - t_start
    m1 = await scrape(env)
    rest = rest_by_endpoint(m0.get("binder", []), m1.get("binder", []), "binder", dt)
    ours = (rest.get(ep) or {}).get("methods", {}).get("GET")
    return {"endpoint": ep, "seconds": round(dt, 1), "ids": len(ids), "ours": ours,
            "direct": binned_lat(direct, LAT_BUCKETS), "direct_exact": lat(direct)}


