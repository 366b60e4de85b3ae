"""What GraceTime, KillWait and the placeholder's TERM trap really do, on each Slurm release.

    .venv/bin/python -m bench.preempt_timing [--versions 22.05,24.11,26.05] [--grace 10]

For each release: a 4-node cluster (port base 17900, k8s partition GraceTime=--grace,
KillWait=5), four placeholder jobs (our real submit body) filling every node, then an exclusive
hpc job that preempts one of them. Nobody cancels the victim: the timeline shows what Slurm does
alone. Sampled every 0.1 s: when preempt_time is set, each state the victim goes through, when
its processes (the TERM-ignoring script and its sleep) are gone, and when the hpc job runs.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Awaitable, Callable

from cluster import proc, slurm_release
from cluster import slurm as cluster_slurm
from slurmgate.slurm import RUNNING, JobSpec, SlurmClient

BASE_PORT = 17900


def job_pids(c: cluster_slurm.SlurmCluster, job_id: int) -> list[int]:
    out = []
    for pid in proc.all_procs():
        env = proc.environ(pid)
        if env.get("SLURM_JOB_ID") == str(job_id) and env.get("SLURM_CONF") == str(c.conf):
            out.append(pid)
    return out


async def until(what: str, fn: Callable[[], Awaitable[bool]], limit: float) -> None:
    deadline = time.monotonic() + limit
    while True:
        if await fn():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not after {limit}s")
        await asyncio.sleep(0.1)


async def timeline(c: cluster_slurm.SlurmCluster, limit: float) -> list[str]:
    async with SlurmClient(c.rest_url, c.token_file) as client:
        ids = [await client.submit(JobSpec(name=f"k8s:p{i}", comment=f"slurmgate claim=p{i}",
                                           memory_mb=1000, cpus=1)) for i in range(4)]

        async def all_running() -> bool:
            jobs = [await client.job(i) for i in ids]
            if not all(j is not None and j.state == RUNNING for j in jobs):
                return False
            # and their processes up, before the clock starts
            return all([await asyncio.to_thread(job_pids, c, i) for i in ids])

        await until("placeholders running", all_running, 60)
        argv, env = c.command("sbatch", "--parsable", "-p", "hpc", "--exclusive", "-N1",
                              "--mem=1000", "--output=/dev/null", "--wrap=sleep 300")
        out = await asyncio.to_thread(proc.run, argv, env)
        hpc = int(out.stdout.strip().split(";")[0])
        t0 = time.monotonic()
        events: list[str] = []
        seen: dict[str, str] = {}
        victim: int | None = None

        def note(key: str, what: str) -> None:
            if key not in seen:
                seen[key] = what
                events.append(f"t+{time.monotonic() - t0:5.1f}s  {what}")

        while time.monotonic() - t0 < limit:
            jobs = {i: await client.job(i) for i in [*ids, hpc]}
            for i in ids:
                j = jobs[i]
                if j and (j.preempted or j.state != RUNNING) and victim is None:
                    victim = i
            if victim is not None:
                v = jobs[victim]
                if v is not None:
                    if v.preempt_time:
                        note("preempt_time", f"victim {victim}: preempt_time set")
                    flags = "+".join(sorted(v.state_flags))
                    note(f"state {flags}", f"victim {victim}: state {flags}")
                if not await asyncio.to_thread(job_pids, c, victim):
                    note("gone", f"victim {victim}: processes gone")
            h = jobs[hpc]
            if h and h.state == RUNNING:
                note("hpc", f"hpc {hpc}: RUNNING on {','.join(h.nodes)}")
                break
            await asyncio.sleep(0.1)
        for i in [*ids, hpc]:
            await client.cancel(i)
        return events


def run_one(version: str, grace: int, limit: float) -> list[str]:
    with cluster_slurm.throwaway("slurmgate-preempt-", BASE_PORT, version=version,
                                grace_time=grace) as c:
        return asyncio.run(timeline(c, limit))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.preempt_timing")
    ap.add_argument("--versions", default=",".join(slurm_release.RELEASES))
    ap.add_argument("--grace", type=int, default=10)
    a = ap.parse_args()
    for v in a.versions.split(","):
        events = run_one(v, a.grace, a.grace + 60)
        print(f"\nSlurm {v} (GraceTime={a.grace}, KillWait=5), from the hpc submit:")
        for e in events:
            print(f"  {e}")


if __name__ == "__main__":
    main()
