"""What a binder poll costs on each Slurm release: idle and changed answers, side by side.

    .venv/bin/python -m bench.poll_cost [--versions 22.05,24.11,26.05] [--jobs 200] [--n 50]

For each release: a throwaway 4-node cluster (port base 17800), --jobs placeholder jobs (4 run,
the rest pend), then --n timed requests of each way to learn "what changed": GET
/jobs?update_time=T with nothing changed (idle), the full /jobs list (what a change costs),
/jobs/state (ids and states only), and /diag (22.05's clock). Prints median and p95 latency
and the answer size; the binder's choice per dialect is argued from these figures in the
docs/operator-guide.md's polling section.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import aiohttp

from cluster import slurm as cluster_slurm
from cluster import slurm_release
from slurmgate.slurm import JobSpec, SlurmClient

BASE_PORT = 17800


async def timed(session: aiohttp.ClientSession, url: str, headers: dict[str, str], n: int
                ) -> tuple[float, float, int, int]:
    """median ms, p95 ms, bytes of the last answer, its HTTP status."""
    times, size, status = [], 0, 0
    for _ in range(n):
        t0 = time.perf_counter()
        async with session.get(url, headers=headers) as r:
            body = await r.read()
            status = r.status
        times.append((time.perf_counter() - t0) * 1000)
        size = len(body)
    times.sort()
    return statistics.median(times), times[int(0.95 * (len(times) - 1))], size, status


async def measure(c: cluster_slurm.SlurmCluster, jobs: int, n: int) -> list[str]:
    async with SlurmClient(c.rest_url, c.token_file) as client:
        api = await client.detect_version()
        for i in range(jobs):
            await client.submit(JobSpec(name=f"k8s:bench/{i}", comment=f"slurmgate claim=b{i}",
                                        memory_mb=1000, cpus=1))
        # settle: wait until an update_time poll says nothing changed for a while
        deadline = time.monotonic() + 60
        _, since = await client.jobs()
        while time.monotonic() < deadline:
            await asyncio.sleep(1.1)
            changed, t = await client.jobs(since)
            if changed is None:
                break
            since = t
        base = f"{c.rest_url}/slurm/{api}"
        hdrs = c.rest_headers()
        rows = []
        async with aiohttp.ClientSession() as s:
            for what, url in (
                ("jobs?update_time (idle)", f"{base}/jobs?update_time={since}"),
                ("jobs (full list)", f"{base}/jobs"),
                ("jobs/state", f"{base}/jobs/state"),
                ("diag", f"{base}/diag"),
            ):
                if what == "jobs/state" and api == "v0.0.38":
                    rows.append(f"{c.version:6} {api:8} {what:26} {'(not served)':>30}")
                    continue
                med, p95, size, status = await timed(s, url, hdrs, n)
                rows.append(f"{c.version:6} {api:8} {what:26} {med:8.1f} {p95:8.1f} "
                            f"{size:>10} {status:>6}")
        return rows


def run_one(version: str, jobs: int, n: int) -> list[str]:
    with cluster_slurm.throwaway("slurmgate-pollcost-", BASE_PORT, version=version) as c:
        return asyncio.run(measure(c, jobs, n))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.poll_cost")
    ap.add_argument("--versions", default=",".join(slurm_release.RELEASES))
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--n", type=int, default=50)
    a = ap.parse_args()
    rows = []
    for v in a.versions.split(","):
        rows += run_one(v, a.jobs, a.n)
    print(f"\npoll cost with {a.jobs} jobs in Slurm, {a.n} requests each")
    print(f"{'slurm':6} {'api':8} {'request':26} {'p50 ms':>8} {'p95 ms':>8} {'bytes':>10} "
          f"{'status':>6}")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
