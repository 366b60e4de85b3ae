"""SlurmClient against a real Slurm (slurmctld, 4 slurmd, slurmrestd) on this host, of the
release $SLURM_VERSION names (22.05, 24.11 or 26.05; `make test-matrix` runs each)."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from cluster import slurm as cluster_slurm
from cluster import slurm_release
from cluster.local import PORT_OFFSET
from slurmgate.slurm import PLACEHOLDER_SCRIPT, JobInfo, JobSpec, SlurmClient

pytestmark = pytest.mark.e2e

T = TypeVar("T")
# away from the default 16800 of `python -m cluster.slurm up` / cluster.local, and shifted like
# them: tests/matrix.sh runs two releases side by side (CI found both here at once)
BASE_PORT = 17400 + PORT_OFFSET
GRACE_TIME = 60  # long enough to observe that a preempted placeholder stays alive


@pytest.fixture(scope="module")
def cluster() -> Iterator[cluster_slurm.SlurmCluster]:
    run_dir = Path(tempfile.mkdtemp(prefix="slurmgate-e2e-slurm-", dir="/tmp"))
    try:
        c = cluster_slurm.start(run_dir, n_nodes=4, base_port=BASE_PORT, grace_time=GRACE_TIME)
        yield c
    finally:
        cluster_slurm.stop(run_dir)
        shutil.rmtree(run_dir, ignore_errors=True)


async def wait_for(what: str, fn: Callable[[], Awaitable[T | None]], limit: float,
                   interval: float = 0.2) -> T:
    """Poll fn until truthy, for at most `limit` seconds (a deadline, not a sleep)."""
    deadline = time.monotonic() + limit
    last: object = None
    while time.monotonic() < deadline:
        last = await fn()
        if last:
            return last  # type: ignore[return-value]
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {limit}s waiting for {what}; last: {last!r}")


@pytest.fixture
async def client(cluster: cluster_slurm.SlurmCluster) -> AsyncIterator[SlurmClient]:
    async with SlurmClient(cluster.rest_url, cluster.token_file) as c:
        yield c
        # Leave Slurm empty for the next test: KILL every job, wait for all nodes idle.
        jobs, _ = await c.jobs()
        for j in jobs or []:
            if j.active:
                await c.cancel(j.job_id)

        async def all_idle() -> bool:
            return all(n.state == "IDLE" and not n.flags for n in await c.nodes())

        await wait_for("all nodes idle", all_idle, 30)


def spec(i: int | str, **kw: object) -> JobSpec:
    return JobSpec(name=f"k8s:e2e/{i}", comment=f"slurmgate claim=c{i} pod=e2e/{i}",
                   memory_mb=1000, cpus=1, **kw)  # type: ignore[arg-type]


def cli(cluster: cluster_slurm.SlurmCluster, *args: str) -> str:
    """Slurm's own CLI of the cluster's release: an argument list, never a shell."""
    argv, env = cluster.command(*args)
    return subprocess.run(argv, env=env, capture_output=True, text=True, check=True,
                          timeout=30).stdout


def _under_slurmstepd(pid: int) -> bool:
    """True when a slurmstepd is among the ancestors: the job's own processes. The push hook
    that EpilogSlurmctld detaches (setsid, up to 5 s) carries the job's env too but hangs off
    init, and it is not the placeholder."""
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:]
        if comm == "slurmstepd":
            return True
        pid = int(rest.split()[1])
    return False


def job_pids(cluster: cluster_slurm.SlurmCluster, job_id: int) -> list[int]:
    """Processes of a job: the SLURM_JOB_ID/SLURM_CONF Slurm puts in their env, under a
    slurmstepd."""
    out = []
    want = {b"SLURM_JOB_ID=" + str(job_id).encode(), b"SLURM_CONF=" + str(cluster.conf).encode()}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            env = set((p / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if want <= env and _under_slurmstepd(int(p.name)):
            out.append(int(p.name))
    return out


async def job_in(c: SlurmClient, job_id: int, *states: str) -> JobInfo | None:
    j = await c.job(job_id)
    return j if j is not None and j.state in states else None


async def test_ping_and_version(client: SlurmClient,
                                cluster: cluster_slurm.SlurmCluster) -> None:
    assert await client.detect_version() == slurm_release.release(cluster.version).rest_api
    await client.ping()


async def test_submit_runs_with_comment(
    client: SlurmClient, cluster: cluster_slurm.SlurmCluster
) -> None:
    times = []
    t0 = time.perf_counter()
    job_id = await client.submit(spec("a"))
    times.append(time.perf_counter() - t0)
    j = await wait_for("job RUNNING", lambda: job_in(client, job_id, "RUNNING"), 20)
    assert len(j.nodes) == 1 and j.nodes[0] in cluster.nodes
    assert j.comment == "slurmgate claim=ca pod=e2e/a"
    assert j.name == "k8s:e2e/a" and j.partition == "k8s" and j.reason == "None"
    assert j.start_time >= j.submit_time > 0
    await wait_for("placeholder process", lambda: asyncio.to_thread(job_pids, cluster, job_id),
                   10)
    # The node is exclusively ours: all CPUs allocated.
    node = next(n for n in await client.nodes() if n.name == j.nodes[0])
    assert node.state == "ALLOCATED"
    for i in range(3):  # a few more for the latency figure
        t0 = time.perf_counter()
        await client.submit(spec(f"lat{i}"))
        times.append(time.perf_counter() - t0)
    print(f"\nsubmit latency over REST: median {statistics.median(times) * 1000:.1f} ms, "
          f"max {max(times) * 1000:.1f} ms (n={len(times)})")


async def test_hostile_strings_reach_slurm_verbatim_and_never_the_script(
    client: SlurmClient, cluster: cluster_slurm.SlurmCluster
) -> None:
    evil = "x; touch /tmp/slurmgate-pwned $(id) `id`\n#SBATCH --uid=0"
    job_id = await client.submit(JobSpec(name=f"k8s:{evil}", comment=f"slurmgate claim=e {evil}",
                                         memory_mb=1000, cpus=1))
    j = await wait_for("RUNNING", lambda: job_in(client, job_id, "RUNNING"), 20)
    assert j.comment == f"slurmgate claim=e {evil}" and j.name == f"k8s:{evil}"
    script = cluster.run_dir / "spool" / j.nodes[0] / f"job{job_id:05d}" / "slurm_script"

    async def written() -> bytes | None:
        # RUNNING comes at allocation (and once PrologSlurmctld is done); slurmd writes the
        # script when the launch reaches it, a moment later
        return await asyncio.to_thread(lambda: script.read_bytes() if script.exists() else None)

    data = await wait_for("the batch script on the node", written, 20)
    assert data == PLACEHOLDER_SCRIPT.encode()
    assert not await asyncio.to_thread(Path("/tmp/slurmgate-pwned").exists)


async def test_five_exclusive_jobs_on_four_nodes(
    client: SlurmClient, cluster: cluster_slurm.SlurmCluster
) -> None:
    ids = [await client.submit(spec(i)) for i in range(5)]

    async def settled() -> list[JobInfo] | None:
        jobs = [await client.job(i) for i in ids]
        # 22.05 shows a job its scheduler has not looked at yet as PENDING with reason None
        if sum(1 for j in jobs if j and j.state == "RUNNING") == 4 and not any(
                j and j.state == "PENDING" and j.reason == "None" for j in jobs):
            return [j for j in jobs if j is not None]
        return None

    jobs = await wait_for("4 RUNNING", settled, 30)
    running = [j for j in jobs if j.state == "RUNNING"]
    pending = [j for j in jobs if j.state == "PENDING"]
    assert sorted(n for j in running for n in j.nodes) == sorted(cluster.nodes)
    assert len(pending) == 1 and pending[0].reason in ("Resources", "Priority")
    assert pending[0].nodes == () and pending[0].active


async def test_jobs_since_not_modified(client: SlurmClient) -> None:
    jobs, t = await client.jobs()
    assert jobs is not None

    async def quiet() -> tuple[int] | None:
        nonlocal t
        again, t2 = await client.jobs(since=t)
        if again is None:
            assert t2 == t
            return (t,)
        t = t2
        return None

    await wait_for("304 Not Modified", quiet, 10, interval=0.5)
    job_id = await client.submit(spec("since"))
    changed, t3 = await client.jobs(since=t)
    assert changed is not None and job_id in {j.job_id for j in changed}
    assert t3 >= t


async def test_cancel_frees_node(client: SlurmClient, cluster: cluster_slurm.SlurmCluster) -> None:
    job_id = await client.submit(spec("cancel"))
    j = await wait_for("RUNNING", lambda: job_in(client, job_id, "RUNNING"), 20)
    node = j.nodes[0]
    pids = await wait_for("placeholder process",
                          lambda: asyncio.to_thread(job_pids, cluster, job_id), 10)
    t0 = time.perf_counter()
    await client.cancel(job_id)
    cancel_ms = (time.perf_counter() - t0) * 1000
    done = await wait_for("job ended", lambda: job_in(client, job_id, "CANCELLED"), 20)
    assert done.ended and not done.active

    async def node_idle() -> bool:
        return any(n.name == node and n.state == "IDLE" for n in await client.nodes())

    await wait_for(f"{node} idle", node_idle, 20)
    assert pids and not await asyncio.to_thread(job_pids, cluster, job_id)
    await client.cancel(job_id)  # already ended: not an error
    await client.cancel(999_999)  # never existed: not an error
    assert await client.job(999_999) is None
    print(f"\ncancel over REST: {cancel_ms:.1f} ms")


async def test_drain_resume(client: SlurmClient, cluster: cluster_slurm.SlurmCluster,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The client drains and resumes a node on every release, checked with Slurm's own CLI:
    over REST on 24.11+, by running scontrol on 22.05 (v0.0.38 has no node update), as the
    binder does (it gets the cluster's slurm.conf there, cluster/bridge.py)."""
    if not (await client.dialect()).node_update:
        monkeypatch.setenv("SLURM_CONF", str(cluster.conf))

    def n3() -> str:
        return cli(cluster, "sinfo", "-h", "-N", "-p", "k8s", "-n", "n3", "-o", "%t|%E").strip()

    await client.drain("n3", "slurmgate: cordoned by the client")
    try:
        out = n3()
        assert out.startswith("drain") and out.endswith("slurmgate: cordoned by the client"), out
    finally:
        await client.resume("n3")

    async def idle() -> bool:
        # right after a RESUME, 24.11+ show the node "idle*" until slurmd answers a ping
        return (await asyncio.to_thread(n3)).split("|")[0] == "idle"

    await wait_for("n3 idle after resume", idle, 30)
    # Drain state written by scontrol is read back correctly over REST.
    cli(cluster, "scontrol", "update", "nodename=n4", "state=drain",
        "reason=slurmgate: cordoned test")
    try:
        n4 = next(n for n in await client.nodes() if n.name == "n4")
        assert "DRAIN" in n4.flags and n4.reason == "slurmgate: cordoned test"
        assert n4.state == "IDLE" and n4.cpus == cluster.node_cpus
        assert n4.real_memory_mb == cluster.node_memory_mb
    finally:
        cli(cluster, "scontrol", "update", "nodename=n4", "state=resume")
    n4 = next(n for n in await client.nodes() if n.name == "n4")
    assert "DRAIN" not in n4.flags
    parts = {p.name: p for p in await client.partitions()}
    if (await client.dialect()).partition_flags:
        assert parts["k8s"].default and not parts["hpc"].default
    assert parts["k8s"].grace_time_seconds == GRACE_TIME
    assert not parts["hpc"].grace_time_seconds
    assert parts["k8s"].nodes == tuple(cluster.nodes) and parts["k8s"].max_time_minutes is None


async def test_preemption_placeholder_survives_until_killed(
    client: SlurmClient, cluster: cluster_slurm.SlurmCluster
) -> None:
    ids = [await client.submit(spec(f"pre{i}")) for i in range(4)]

    async def all_running() -> bool:
        return all([await job_in(client, i, "RUNNING") for i in ids])

    await wait_for("4 placeholders RUNNING", all_running, 30)
    out = cli(cluster, "sbatch", "--parsable", "--partition=hpc", "--exclusive", "--nodes=1",
              "--mem=1000", "--job-name=hpc-e2e", "--output=/dev/null", "--wrap=sleep 300")
    hpc_id = int(out.strip().split(";")[0])
    t0 = time.monotonic()

    async def victims() -> list[JobInfo] | None:
        jobs = [await client.job(i) for i in ids]
        hit = [j for j in jobs if j is not None and (j.preempted or j.state != "RUNNING")]
        return hit or None

    hit = await wait_for("a placeholder preempted", victims, 60, interval=0.5)
    t_preempt = time.monotonic() - t0
    v = hit[0]
    assert v.preempted, v
    assert v.state in ("RUNNING", "COMPLETING", "PREEMPTED"), v
    # Still alive: the placeholder ignores SIGTERM through GraceTime ...
    await asyncio.sleep(2)
    assert await asyncio.to_thread(job_pids, cluster, v.job_id), "placeholder died on SIGTERM"
    hpc = await client.job(hpc_id)
    assert hpc is not None and hpc.state == "PENDING", hpc
    # ... until we KILL it (the binder does this once the Pod is gone). Slurm may over-preempt
    # (22.05 backfill picks a second victim in the next cycle): kill every victim we see.
    killed: set[int] = set()

    async def hpc_running() -> JobInfo | None:
        for j in await asyncio.gather(*(client.job(i) for i in ids)):
            if j is not None and j.preempted and j.job_id not in killed:
                await client.cancel(j.job_id, "KILL")
                killed.add(j.job_id)
        return await job_in(client, hpc_id, "RUNNING")

    t1 = time.monotonic()
    hpc = await wait_for("hpc job RUNNING", hpc_running, 90 - (time.monotonic() - t0),
                         interval=0.5)
    t_run = time.monotonic() - t1
    assert v.job_id in killed
    assert not await asyncio.to_thread(job_pids, cluster, v.job_id)
    assert len(hpc.nodes) == 1
    final = await client.job(v.job_id)
    assert final is not None and final.preempted
    print(f"\npreemption: victim {v.job_id} seen {t_preempt:.1f}s after the hpc submit "
          f"(state {v.state}); hpc RUNNING {t_run:.1f}s after our KILL; victims {sorted(killed)};"
          f" victim final state {final.state}")
