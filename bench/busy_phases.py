"""The measured phases of the busy-site bench (bench/busy.py), on one cluster and one
background: a cost window, a latency phase of marked Pods, the kube-scheduler floor, the Pods
in flight, the cleanup after each (the bench's own calls to Slurm: bench/busy_floor.py).
Imports cluster.* (through bench.harness): import it only once the environment is set."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from bench import attribution, util
from bench.busy_cost import (
    RPC_USER,
    Samples,
    Watched,
    background_rate,
    cpu_delta_by_role,
    list_cost,
    pct_of_core,
    rest_by_endpoint,
    rpc_delta,
    rpcs_by_user,
)
from bench.busy_floor import (
    SlurmFloor,
    floor_job,
    job_ended,
    reads_side_by_side,
    scrape,
    wait_ours_idle,
)
from bench.harness import Env
from bench.observers import PodWatch
from bench.stats import lat, log, spread
from slurmgate import jsonpool
from slurmgate.config import SlurmSettings
from slurmgate.contract import A_PARTITION, COMMENT_PREFIX
from slurmgate.kube import pod_path
from slurmgate.slurm import RUNNING, SlurmClient
from slurmgate.slurm.restmetrics import RestMetrics

COMPONENTS = ("binder", "webhook")
WHOLE_LIST_RUNS = 3
# a busy site's whole list may take longer than the binder's own request timeout: it is
# measured whole here, and the report says when the binder's timeout would have cut it
WHOLE_LIST_TIMEOUT_S = 600.0


async def wait_first_whole_list(env: Env, limit: float = 900.0) -> float:
    """Until the binder's safety net has looked once (it looks as it starts: slurmdbd's jobs of
    our partitions, or where slurmdbd is not served Slurm's whole job list, which at 50,000
    jobs takes minutes, measured apart, made directly, in seg["whole_list"]), so the windows
    after it measure the binder's steady cost, not its start; seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        try:
            samples = await env.binder_metrics()
        except Exception:  # not answering yet
            samples = []
        if any(name.startswith("slurmgate_binder_slurm_polls") and value >= 1
               and labels.get("outcome") in ("full", "partitions")
               for name, labels, value in samples):
            return round(time.monotonic() - t0, 1)
        await asyncio.sleep(1.0)
    raise TimeoutError(f"the binder read no whole job list within {limit:.0f} s")


async def window(env: Env, watched: Watched, seconds: float, running: bool) -> dict[str, Any]:
    """`seconds` of whatever runs now: CPU (% of a core) of Slurm's daemons and of ours, RSS,
    and (slurmgate running) its slurmrestd requests by endpoint."""
    m0 = await scrape(env) if running else {}
    r0 = await _sdiag(env)
    c0 = watched.cpu()
    host0 = util.cpu_by_command()
    t0 = time.monotonic()
    await asyncio.sleep(seconds)
    dt = time.monotonic() - t0
    c1 = watched.cpu()
    host = util.cpu_delta(host0, util.cpu_by_command())
    r1 = await _sdiag(env)
    m1 = await scrape(env) if running else {}
    cpu_s = cpu_delta_by_role(c0, c1)
    out: dict[str, Any] = {"seconds": round(dt, 1), "cpu_s": cpu_s,
                           "cpu_pct": pct_of_core(cpu_s, dt), "rss_mib": watched.rss(),
                           "host_cpu_s": dict(list(host.items())[:10]),
                           "ctld_rpc": rpc_delta(r0, r1, RPC_USER, dt)}
    if running:
        out["rest"] = {c: rest_by_endpoint(m0.get(c, []), m1.get(c, []), c, dt)
                       for c in COMPONENTS}
        out["binder_polls"] = {
            k: util.prom_sum(m1["binder"], "slurmgate_binder_slurm_polls_total", outcome=k)
            - util.prom_sum(m0["binder"], "slurmgate_binder_slurm_polls_total", outcome=k)
            for k in ("changed", "not_modified")}
    return out


async def _sdiag(env: Env) -> dict[str, tuple[int, float]]:
    """slurmctld's per-user RPC statistics now ({} if sdiag fails: the figure is left out)."""
    try:
        r = await asyncio.to_thread(env.local.slurm.cli, "sdiag", timeout=20.0)
    except Exception:
        return {}
    return rpcs_by_user(r.stdout) if r.returncode == 0 else {}


async def clear(env: Env, ns: str, job_ids: set[int]) -> None:
    await env.delete_pods(ns)
    await env.wait_no_pods(ns, limit=120)
    await wait_ours_idle(env, job_ids)


def evictions(binder_log: Path, ns: str, offset: int) -> dict[str, float]:
    """Pod name -> wall time of the binder's "pod evicted" line for it (namespace ns)."""
    out: dict[str, float] = {}
    for pod, doc in attribution.binder_lines(binder_log, "pod evicted", ns, offset):
        out.setdefault(pod, float(doc.get("ts", 0.0)))
    return out


async def end_noticed(env: Env, pods: dict[str, int], ns: str, limit: float = 30.0
                      ) -> list[float]:
    """Slurm ends each job (cancelled directly, one after the other); seconds until the binder
    evicts its Pod, as its log tells."""
    _, binder_log = env.logs()
    out = []
    for name, job in pods.items():
        at = attribution.size_of(binder_log)
        t0 = time.time()
        await env.slurm.cancel(job, "KILL")
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            seen = evictions(binder_log, ns, at)
            if name in seen:
                out.append(seen[name] - t0)
                break
            await asyncio.sleep(0.05)
    return out


async def latency(env: Env, ns_name: str, pods: int, nodes: int,
                  floor: SlurmFloor | None = None) -> dict[str, Any]:
    """`pods` marked Pods in rounds of `nodes` (each gets a node): each created alone
    (admission), bound (create -> bound; Slurm RUNNING -> noticed -> bound by the logs), then
    half of each round's jobs ended by Slurm (seconds until the binder evicts the Pod) and the
    rest deleted (the binder cancels their jobs). With a `floor`, as many direct jobs follow
    each round (its submits and cancels beside slurmgate's, round by round)."""
    ns = await env.namespace(ns_name)
    ctld_log, binder_log = env.logs()
    ctld_at, binder_at = attribution.size_of(ctld_log), attribution.size_of(binder_log)
    w = PodWatch(env.kube, ns)
    await w.start()
    made_all, ends, unbound = [], [], 0
    try:
        for r in range(0, pods, nodes):
            names = [f"p{i}" for i in range(r, min(pods, r + nodes))]
            made = await env.create_pods(ns, names, True, ns_name, concurrency=1)
            made_all += made
            ok = {c.name for c in made if c.ok}
            await w.wait_bound(ok, limit=120)
            bound = {c.name: c.job_id for c in made if c.name in w.bound_at and c.job_id}
            unbound += len(ok) - len(bound)
            half = dict(list(bound.items())[: (len(bound) + 1) // 2])
            ends += await end_noticed(env, half, ns)
            # the rest deleted one at a time, each job gone before the next: the binder's
            # cancels then meet slurmctld alone, as the floor's direct ones do (a round deleted
            # at once queues its cancels behind each other: another figure, not slurmgate's)
            for name, job_id in bound.items():
                if name not in half:
                    at = attribution.size_of(binder_log)
                    await env.kube.request("DELETE", pod_path(ns, name),
                                           params={"gracePeriodSeconds": "0"})
                    # the binder's word first, then Slurm's: the bench's own reads of the job
                    # beside the cancel would hold slurmctld's job lock against it (the direct
                    # floor's cancels meet no read of the bench either)
                    await binder_said(binder_log, CANCELLED, ns, name, at)
                    await job_ended(env, job_id)
            await clear(env, ns, {c.job_id for c in made if c.job_id})
            if floor is not None:
                await floor.block(len(names))
    finally:
        await w.stop()
    att = attribution.attribute(
        attribution.slurm_allocations(ctld_log, ctld_at),
        attribution.binder_binds(binder_log, ns, binder_at), w.running_wall,
        attribution.slurm_running(ctld_log, ctld_at), attribution.slurm_submits(ctld_log, ctld_at),
        {c.name: c.t_send + time.time() - time.monotonic() for c in made_all})
    out = {"admission": lat([c.t_done - c.t_send for c in made_all if c.ok]),
           "create_errors": sorted({c.error for c in made_all if not c.ok})[:3],
           "create_to_bound": spread(made_all, w.bound_at), "unbound": unbound,
           "end_noticed": lat(ends), "ends_not_noticed": (pods + 1) // 2 - len(ends)}
    inside = attribution.slurm_submit_time(ctld_log, ctld_at)
    out["ctld_submit"] = lat([inside[c.job_id] for c in made_all if c.job_id in inside])
    for key, step in (("running_to_bound", "Slurm RUNNING -> bound (total)"),
                      ("running_to_noticed", "Slurm RUNNING -> binder noticed"),
                      ("allocated_to_noticed", "Slurm allocated -> binder noticed"),
                      ("noticed_to_bound", attribution.NOTICED_TO_BOUND)):
        out[key] = att.get(step, {})
    return out


CANCELLED = "pod gone; job cancelled"  # the binder's line once its cancel was answered


async def binder_said(binder_log: Path, msg: str, ns: str, pod: str, offset: int,
                      limit: float = 30.0) -> bool:
    """Until the binder's log has line `msg` about Pod ns/pod after `offset` (a file read
    every 50 ms: nothing asked of Slurm or of the binder); False (said) after `limit` s."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if any(name == pod for name, _ in attribution.binder_lines(binder_log, msg, ns, offset)):
            return True
        await asyncio.sleep(0.05)
    log(f"no {msg!r} line for {ns}/{pod} in {limit:.0f} s")
    return False


async def kube_floor(env: Env, ns_name: str, pods: int) -> dict[str, Any]:
    """Unmarked Pods, each created alone: admission without the webhook's work, and
    kube-scheduler's create -> bound."""
    ns = await env.namespace(ns_name)
    w = PodWatch(env.kube, ns)
    await w.start()
    made = await env.create_pods(ns, [f"u{i}" for i in range(pods)], False, ns_name, 1)
    await w.wait_bound({c.name for c in made if c.ok}, limit=120)
    await w.stop()
    await clear(env, ns, set())
    return {"admission": lat([c.t_done - c.t_send for c in made if c.ok]),
            "create_to_bound": spread(made, w.bound_at)}


async def pods_in_flight(env: Env, watched: Watched, ns_name: str, pods: int, nodes: int,
                         seconds: float, partition: str | None = None,
                         side_by_side: float = 0.0) -> dict[str, Any]:
    """`pods` marked Pods at once (as many bound as there are nodes, the rest gated behind
    them), in `partition` (None: Slurm's default, k8s), then a cost window, then (for
    `side_by_side` seconds) the binder's state reads beside the same reads made directly;
    the binder cancels every job once they are deleted. With `pods` = `nodes` nothing of ours
    is in flight during the window: it is the idle cost of bound Pods."""
    ns = await env.namespace(ns_name)
    w = PodWatch(env.kube, ns)
    await w.start()
    ann = {A_PARTITION: partition} if partition else None
    made = await env.create_pods(ns, [f"f{i}" for i in range(pods)], True, ns_name, pods, ann)
    want = min(pods, nodes)
    for _ in range(600):  # 120 s
        if len(w.bound_at) >= want:
            break
        await asyncio.sleep(0.2)
    bound = len(w.bound_at)
    await asyncio.sleep(2.0)
    out = await window(env, watched, seconds, running=True)
    out["pods"] = {"created": sum(c.ok for c in made), "bound": bound}
    if side_by_side > 0:  # after the window: its direct reads must not count as our cost
        out["reads_side_by_side"] = await reads_side_by_side(
            env, [c.job_id for c in made if c.job_id], side_by_side)
    await w.stop()
    await clear(env, ns, {c.job_id for c in made if c.job_id})
    return out


async def direct_in_flight(env: Env, watched: Watched, pods: int, nodes: int,
                           seconds: float) -> dict[str, Any]:
    """The floor of pods_in_flight: as many whole-node jobs submitted directly to slurmrestd
    (not ours: the binder leaves them alone), as many running as there are nodes and the rest
    pending behind them, then the same cost window. What Slurm spends scheduling and running
    that many jobs is any client's (on a busy site its scheduler passes over our pending jobs
    too); the Pods window less this one is slurmgate's own."""
    ids = []
    for i in range(pods):
        ids.append(await env.slurm.submit(floor_job(f"bench-direct-{i}")))
    want, running = min(pods, nodes), 0
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = [await env.slurm.job(j) for j in ids]  # before the window: not counted
        running = sum(1 for j in states if j is not None and j.state == RUNNING)
        if running >= want:
            break
        await asyncio.sleep(0.2)
    await asyncio.sleep(2.0)  # as pods_in_flight waits after its binds
    out = await window(env, watched, seconds, running=True)
    out["jobs"] = {"submitted": len(ids), "running": running}
    await env.cancel_jobs(ids, 8)
    await wait_ours_idle(env, set(ids))
    return out


async def delete_lease(env: Env, namespace: str, name: str) -> None:
    """A stopped binder does not give its Lease back; the next one would wait it out."""
    try:
        await env.kube.request(
            "DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}")
    except Exception as e:  # 404: none yet
        log(f"lease delete: {e}")


def _grew(before: Samples, after: Samples, metric: str, endpoint: str) -> float:
    return (util.prom_sum(after, metric, endpoint=endpoint)
            - util.prom_sum(before, metric, endpoint=endpoint))


def binder_request_timeout() -> float:
    """The request timeout of the binder's SlurmClient (the binder sets none: the default)."""
    return float(inspect.signature(SlurmClient).parameters["timeout"].default)


async def whole_lists(rest_url: str, token_file: Path, watched: Watched,
                      stopped: dict[str, Any], intervals: dict[str, float],
                      runs: int = WHOLE_LIST_RUNS) -> dict[str, Any]:
    """The binder's two whole lists, made directly with slurmgate's own client: Slurm's whole
    job list (GET jobs, parsed for our jobs only, as the binder reads it at start and every
    `intervals["jobs"]` s) and its node list (GET nodes, the node drift check, every
    `intervals["nodes"]` s). Each `runs` times, one after the other, with the CPU of slurmctld
    and slurmrestd (/proc) just before and after, its wall time, the time to slurmrestd's
    whole answer and its bytes; then busy_cost.list_cost: the medians, net of what the
    stopped window's background spends in the same time, amortized over the interval. Run
    with slurmgate stopped: nothing else of ours asks Slurm meanwhile."""
    reg = CollectorRegistry()
    metrics = RestMetrics("bench", reg)
    prefix = "slurmgate_bench_slurmrestd"
    bg = background_rate(stopped.get("cpu_s") or {}, float(stopped.get("seconds") or 0.0))
    out: dict[str, Any] = {}
    # parsed as the binder parses it: a big answer in a worker process (the event loop, and
    # so the churn, goes on meanwhile)
    offload = SlurmSettings().json_offload_bytes
    async with SlurmClient(rest_url, token_file, "root", timeout=WHOLE_LIST_TIMEOUT_S,
                           json_offload_bytes=offload, metrics=metrics) as client:
        await client.detect_version()

        async def job_list() -> Any:
            return await client.our_jobs(COMMENT_PREFIX)

        calls: dict[str, Callable[[], Awaitable[Any]]] = {"jobs": job_list,
                                                           "nodes": client.nodes}
        for what, call in calls.items():
            samples: list[dict[str, Any]] = []
            try:
                for _ in range(runs):
                    m0 = util.parse_prom(generate_latest(reg).decode())
                    c0 = watched.cpu()
                    t0 = time.perf_counter()
                    await call()
                    wall = time.perf_counter() - t0
                    c1 = watched.cpu()
                    m1 = util.parse_prom(generate_latest(reg).decode())
                    answer = _grew(m0, m1, f"{prefix}_request_seconds_sum", what)
                    samples.append({"wall_s": round(wall, 4), "answer_s": round(answer, 4),
                                    "bytes": _grew(m0, m1, f"{prefix}_response_bytes_total",
                                                   what),
                                    "cpu_s": cpu_delta_by_role(c0, c1)})
                out[what] = list_cost(samples, intervals[what], bg)
            except Exception as e:  # a failed list is a result: keep the runs it made
                out[what] = {**list_cost(samples, intervals[what], bg),
                             "error": f"{type(e).__name__}: {e}"}
            out[what]["binder_timeout_s"] = binder_request_timeout()
    jsonpool.shutdown()  # its worker would otherwise idle through the rest of the segment
    return out
