"""The measured phases of a bench run: node probe, admission, per burst the kube-scheduler and
Slurm floors then slurmgate itself with its idle window, and the cleanup between them.
Imports cluster.*, so only import it once the environment is set (see bench/run.py)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any

from bench import attribution, util
from bench import probe as probe_mod
from bench.harness import Env
from bench.observers import JobPoller, PodWatch, ProcSampler
from bench.profiling import Profiler
from bench.stats import hist_lat, lat, log, spread
from slurmgate.kube import pod_path
from slurmgate.slurm import RUNNING, JobSpec

WEBHOOK_NAME = "pods.slurmgate.io"
APISERVER_HIST = "apiserver_admission_webhook_admission_duration_seconds"
WEBHOOK_HIST = "slurmgate_webhook_request_duration_seconds"
HANDOFFS = "slurmgate_webhook_submit_handoffs_total"


async def admission(env: Env, a: argparse.Namespace, results: dict[str, Any],
                    prof_dir: Path | None) -> None:
    ns = await env.namespace("bench-adm")
    n = a.admission_pods
    out: dict[str, Any] = {}
    # "marked_waiting": every node is taken by one plain job first, so the admitted Pods' jobs
    # wait; what remains of the marked tail then is the admission path itself, not the load of
    # their jobs starting (slurmd, hooks, binds) while the next Pods are admitted
    for label, marked in (("unmarked", False), ("marked", True), ("marked_waiting", True)):
        filler = None
        if label == "marked_waiting":
            await cleanup(env, ns)  # the nodes of the marked Pods before
            filler = await _take_every_node(env, results["nodes"])
        api0, wh0 = await env.apiserver_metrics(), await env.webhook_metrics()
        made = await env.create_pods(ns, [f"seq-{label.replace('_', '-')}-{i}"
                                          for i in range(n)], marked, "adm", concurrency=1)
        await asyncio.sleep(0.5)
        api1, wh1 = await env.apiserver_metrics(), await env.webhook_metrics()
        api_h = util.hist_delta(util.histogram(api1, APISERVER_HIST, name=WEBHOOK_NAME),
                                util.histogram(api0, APISERVER_HIST, name=WEBHOOK_NAME))
        wh_h = util.hist_delta(util.histogram(wh1, WEBHOOK_HIST, marked="true"),
                               util.histogram(wh0, WEBHOOK_HIST, marked="true"))
        wh_u = util.hist_delta(util.histogram(wh1, WEBHOOK_HIST, marked="false"),
                               util.histogram(wh0, WEBHOOK_HIST, marked="false"))
        sub_h = util.hist_delta(
            util.histogram(wh1, "slurmgate_slurm_submit_duration_seconds"),
            util.histogram(wh0, "slurmgate_slurm_submit_duration_seconds"))
        out[label] = {
            "client_create": lat([c.t_done - c.t_send for c in made if c.ok]),
            "errors": sum(not c.ok for c in made),
            "error_samples": sorted({c.error for c in made if not c.ok})[:3],
            "apiserver_webhook_calls": util.hist_count(api_h),
            "apiserver_webhook": hist_lat(api_h),
            "webhook_marked": hist_lat(wh_h),
            "webhook_unmarked_calls": util.hist_count(wh_u),
            "slurm_submit": hist_lat(sub_h),
            # Pods admitted before Slurm answered their submit (the webhook's SUBMIT_BUDGET)
            "handoffs": util.prom_sum(wh1, HANDOFFS) - util.prom_sum(wh0, HANDOFFS),
        }
        if filler is not None:
            await env.cancel_jobs([filler])
        log(f"admission {label}: client p50 {out[label]['client_create']['p50_ms']} ms, "
            f"p99 {out[label]['client_create']['p99_ms']} ms, "
            f"apiserver saw {util.hist_count(api_h):.0f} webhook calls")
    await cleanup(env, ns)  # the waiting jobs start once the filler is gone: not during this
    # throughput: concurrent creates through the single webhook replica
    tput: dict[str, Any] = {}
    m = max(4 * a.concurrency, n)
    for label, marked in (("unmarked", False), ("marked", True)):
        prof = None
        if prof_dir is not None and marked:
            prof = Profiler(env.pid("webhook"), prof_dir / "webhook-admission.txt")
        cpu0 = util.cpu_seconds(env.pid("webhook"))
        t0 = time.monotonic()
        made = await env.create_pods(ns, [f"par-{label}-{i}" for i in range(m)], marked,
                                     "adm", concurrency=a.concurrency)
        dt = time.monotonic() - t0
        cpu = util.cpu_seconds(env.pid("webhook")) - cpu0
        ok = sum(c.ok for c in made)
        tput[label] = {"pods": m, "ok": ok, "seconds": round(dt, 2),
                       "creates_per_s": round(ok / dt, 1),
                       "client_create": lat([c.t_done - c.t_send for c in made if c.ok]),
                       "webhook_cpu_s": round(cpu, 2),
                       "errors": sorted({c.error for c in made if not c.ok})[:3]}
        if prof is not None:
            results["profiles"]["webhook_admission"] = prof.stop()
        log(f"admission {label} x{a.concurrency}: {tput[label]['creates_per_s']} creates/s")
    out["throughput"] = tput
    out["concurrency"] = a.concurrency
    results["admission"] = out
    await cleanup(env, ns)


async def _take_every_node(env: Env, nodes: int) -> int:
    job_id = await env.slurm.submit(JobSpec(name="bench-filler", comment="bench filler",
                                            memory_mb=1000, cpus=1, nodes=nodes,
                                            partition="k8s"))
    deadline = time.monotonic() + 120
    while (j := await env.slurm.job(job_id)) is None or j.state != RUNNING:
        if time.monotonic() > deadline:
            raise RuntimeError(f"filler job {job_id} not RUNNING after 120 s")
        await asyncio.sleep(0.2)
    return job_id


async def cleanup(env: Env, ns: str, size: int = 0) -> None:
    """Delete every Pod, then wait until Slurm is idle; deadlines grow with the burst (a
    1,000-job cancel storm on one host takes minutes)."""
    t0 = time.monotonic()
    await env.delete_pods(ns)
    await env.wait_no_pods(ns, limit=max(300.0, 0.6 * size))
    # the binder cancels the jobs of deleted Pods (orphans after 60 s): the bench steps in
    # only well after that, and records it
    await env.wait_slurm_idle(limit=max(600.0, 1.2 * size), recancel_after=150, phase=ns)
    log(f"cleanup of {ns}: {time.monotonic() - t0:.1f}s")


async def kube_floor(env: Env, size: int, a: argparse.Namespace) -> dict[str, Any]:
    ns = await env.namespace(f"bench-ks-{size}")
    w = PodWatch(env.kube, ns)
    await w.start()
    names = [f"ks-{i}" for i in range(size)]
    made = await env.create_pods(ns, names, False, f"ks-{size}", a.concurrency)
    ok = await w.wait_bound({c.name for c in made if c.ok}, limit=300)
    await w.stop()
    r = spread(made, w.bound_at)
    r["all_bound"] = ok
    r["create"] = lat([c.t_done - c.t_send for c in made if c.ok])
    await cleanup(env, ns, size)
    return r


async def slurm_floor(env: Env, size: int, nodes: int, a: argparse.Namespace) -> dict[str, Any]:
    ctld_log, _ = env.logs()
    ctld_at = attribution.size_of(ctld_log)
    poller = JobPoller(env.slurm)
    poller.start()
    churn = size > nodes
    stop_churn = asyncio.Event()

    async def churner() -> None:  # free the node of every job once it is seen RUNNING
        cancelled: set[int] = set()
        while not stop_churn.is_set():
            todo = [j for j in poller.running_at if j not in cancelled]
            cancelled.update(todo)
            if todo:
                await env.cancel_jobs(todo, 16)
            await asyncio.sleep(0.05)

    ch = asyncio.create_task(churner()) if churn else None
    await util.at_phase(a.phase)
    made = await env.submit_jobs(size, str(size), a.concurrency)
    ids = {c.job_id for c in made if c.ok and c.job_id}
    ok = await poller.wait_running(ids, limit=600)
    stop_churn.set()
    if ch:
        await ch
    await poller.stop()
    by_name = {c.name: poller.running_at[c.job_id] for c in made
               if c.job_id in poller.running_at}
    r = spread(made, by_name)
    r["all_running"] = ok
    r["submit"] = lat([c.t_done - c.t_send for c in made if c.ok])
    r["churn"] = churn
    # Slurm's own word on when each job ran (its log), free of any poller's delay: the floor
    # the overhead is measured against
    to_mono = time.time() - time.monotonic()
    running = attribution.slurm_running(ctld_log, ctld_at)
    r["by_log"] = spread(made, {c.name: running[c.job_id] - to_mono for c in made
                                if c.job_id in running})
    await env.cancel_jobs(sorted(ids))
    await env.wait_slurm_idle(limit=max(600.0, 1.2 * size), phase=f"slurm-floor-{size}")
    return r


async def ours(env: Env, size: int, nodes: int, a: argparse.Namespace,
               profile: Path | None) -> dict[str, Any]:
    ns = await env.namespace(f"bench-sg-{size}")
    churn = size > nodes
    bpid, wpid = env.pid("binder"), env.pid("webhook")
    deletes: list[asyncio.Task[Any]] = []

    def on_bound(name: str) -> None:
        if churn:  # free the node: the binder cancels the job once the Pod is gone
            deletes.append(asyncio.create_task(env.kube.request(
                "DELETE", pod_path(ns, name), params={"gracePeriodSeconds": "0"})))

    w = PodWatch(env.kube, ns, on_bound=on_bound)
    await w.start()
    # no poller of our own here: it would load slurmctld while the binder is measured (the
    # attribution reads Slurm's times from its log instead)
    sampler = ProcSampler({"binder": bpid, "webhook": wpid})
    sampler.start()
    bm0, wm0 = await env.binder_metrics(), await env.webhook_metrics()
    bcpu0, wcpu0 = util.cpu_seconds(bpid), util.cpu_seconds(wpid)
    prof = Profiler(bpid, profile) if profile else None
    ctld_log, binder_log = env.logs()
    ctld_at, binder_at = attribution.size_of(ctld_log), attribution.size_of(binder_log)
    names = [f"sg-{i}" for i in range(size)]
    cpu0 = util.cpu_by_command()
    await util.at_phase(a.phase)
    made = await env.create_pods(ns, names, True, f"sg-{size}", a.concurrency)
    created_names = {c.name for c in made if c.ok}

    def progress(n: int) -> None:
        if n % max(1, size // 5) == 0:
            log(f"  {n}/{size} bound")

    ok = await w.wait_bound(created_names, limit=max(120, 3 * size), progress=progress)
    bcpu, wcpu = util.cpu_seconds(bpid) - bcpu0, util.cpu_seconds(wpid) - wcpu0
    cpu = util.cpu_delta(cpu0, util.cpu_by_command())
    prof_summary = prof.stop() if prof else None
    bm1 = await env.binder_metrics()
    await sampler.stop()
    for t in deletes:
        with contextlib.suppress(Exception):
            await t
    r = spread(made, w.bound_at)
    r["all_bound"] = ok
    r["churn"] = churn
    r["create"] = lat([c.t_done - c.t_send for c in made if c.ok])
    r["create_errors"] = sum(not c.ok for c in made)
    r["create_error_samples"] = sorted({c.error for c in made if not c.ok})[:3]
    if not churn:  # churned Pods are deleted once bound: they never run
        r["all_running"] = await w.wait_running(created_names, limit=60)
    r["attribution"] = attribution.attribute(
        attribution.slurm_allocations(ctld_log, ctld_at),
        attribution.binder_binds(binder_log, ns, binder_at), w.running_wall,
        attribution.slurm_running(ctld_log, ctld_at), attribution.slurm_submits(ctld_log, ctld_at),
        {c.name: c.t_send + time.time() - time.monotonic() for c in made})
    hb = util.hist_delta(util.histogram(bm1, "slurmgate_binder_running_to_bound_seconds"),
                         util.histogram(bm0, "slurmgate_binder_running_to_bound_seconds"))
    hc = util.hist_delta(util.histogram(bm1, "slurmgate_binder_created_to_bound_seconds"),
                         util.histogram(bm0, "slurmgate_binder_created_to_bound_seconds"))
    hp = util.hist_delta(util.histogram(bm1, "slurmgate_binder_slurm_poll_seconds"),
                         util.histogram(bm0, "slurmgate_binder_slurm_poll_seconds"))
    r["running_to_bound_binder_metric"] = hist_lat(hb)
    r["created_to_bound_binder_metric"] = hist_lat(hc)
    r["binder_slurm_poll"] = hist_lat(hp)
    r["slurm_pushes"] = {
        f"{lab.get('event')}/{lab.get('outcome')}": v - util.prom_sum(
            bm0, "slurmgate_binder_slurm_pushes_total", **lab)
        for metric, lab, v in bm1 if metric == "slurmgate_binder_slurm_pushes_total"}
    r["host_cpu_s"] = cpu  # who used the two cores while the burst ran
    r["reconciles_by_action"] = {
        lab.get("action", ""): v - util.prom_sum(bm0, "slurmgate_binder_reconciles_total", **lab)
        for metric, lab, v in bm1 if metric == "slurmgate_binder_reconciles_total"}
    r["binder_polls"] = (util.prom_sum(bm1, "slurmgate_binder_slurm_polls_total")
                         - util.prom_sum(bm0, "slurmgate_binder_slurm_polls_total"))
    r["reconciles"] = (util.prom_sum(bm1, "slurmgate_binder_reconciles_total")
                       - util.prom_sum(bm0, "slurmgate_binder_reconciles_total"))
    r["binder_cpu_s"] = round(bcpu, 2)
    r["binder_cpu_s_per_1000"] = round(bcpu * 1000 / max(1, size), 2)
    r["webhook_cpu_s"] = round(wcpu, 2)
    r["webhook_cpu_s_per_1000"] = round(wcpu * 1000 / max(1, size), 2)
    r["binder_rss_mib"] = round(util.rss_mib(bpid), 1)
    r["webhook_rss_mib"] = round(util.rss_mib(wpid), 1)
    r["binder_rss_peak_mib"] = round(max(sampler.peak["binder"], r["binder_rss_mib"]), 1)
    r["webhook_rss_peak_mib"] = round(max(sampler.peak["webhook"], r["webhook_rss_mib"]), 1)
    r["pods_bound_now"] = len(w.bound_at) if not churn else 0
    if prof_summary is not None:
        r["profile"] = prof_summary
    # webhook side of the burst
    wm1 = await env.webhook_metrics()
    r["webhook_marked"] = hist_lat(util.hist_delta(
        util.histogram(wm1, WEBHOOK_HIST, marked="true"),
        util.histogram(wm0, WEBHOOK_HIST, marked="true")))
    if not churn:
        r["idle"] = await idle_window(env, w, len(w.bound_at), a.idle_window)
    await w.stop()
    try:
        await cleanup(env, ns, size)
    except Exception as e:  # keep the measurements; the next burst would not be clean
        r["cleanup_error"] = f"{type(e).__name__}: {e}"
        log(f"cleanup of {ns} failed: {r['cleanup_error']}")
    return r


async def idle_window(env: Env, w: PodWatch, bound: int, window: float) -> dict[str, Any]:
    """Every Pod bound, nothing changing: what does the binder do?"""
    settle = await w.quiet(5.0, limit=180.0)  # trailing kwok status updates and our patches
    bpid = env.pid("binder")
    m0 = await env.binder_metrics()
    c0 = util.cpu_seconds(bpid)
    e0 = w.events
    await asyncio.sleep(window)
    c1 = util.cpu_seconds(bpid)
    m1 = await env.binder_metrics()

    def d(name: str, **match: str) -> float:
        return util.prom_sum(m1, name, **match) - util.prom_sum(m0, name, **match)

    def by(name: str, *labels: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for metric, lab, v in m1:
            if metric == name:
                k = "/".join(lab.get(x, "") for x in labels)
                out[k] = out.get(k, 0.0) + v
        for metric, lab, v in m0:
            if metric == name:
                k = "/".join(lab.get(x, "") for x in labels)
                out[k] = out.get(k, 0.0) - v
        return {k: v for k, v in sorted(out.items()) if v}

    r = {"bound_pods": bound, "window_s": window, "settle_s": round(settle, 1),
         "reconciles": d("slurmgate_binder_reconciles_total"),
         "reconciles_by_action": by("slurmgate_binder_reconciles_total", "action"),
         "watch_events": by("slurmgate_binder_watch_events_total", "resource", "type"),
         "pod_events_seen_by_bench": w.events - e0,
         "node_syncs": d("slurmgate_binder_node_syncs_total"),
         "polls_not_modified": d("slurmgate_binder_slurm_polls_total", outcome="not_modified"),
         "polls_changed": d("slurmgate_binder_slurm_polls_total", outcome="changed"),
         "job_changes": d("slurmgate_binder_job_changes_total"),
         "binder_cpu_s": round(c1 - c0, 3),
         "binder_cpu_pct": round(100 * (c1 - c0) / window, 2),
         "binder_rss_mib": round(util.rss_mib(bpid), 1),
         "webhook_rss_mib": round(util.rss_mib(env.pid("webhook")), 1)}
    log(f"  idle with {bound} bound (settled {settle:.1f}s): {r['reconciles']:.0f} reconciles "
        f"{r['reconciles_by_action']}, watch {r['watch_events']}, "
        f"{r['node_syncs']:.0f} node syncs, {r['binder_cpu_s']} CPU s in {window:.0f}s")
    return r


def choose_nodes(a: argparse.Namespace, results: dict[str, Any], slurm_version: str) -> int:
    """--nodes, else the most slurmd of a.probe (bench/run.py's counts) this machine holds
    on `slurm_version`, at most the largest burst."""
    if a.nodes:
        return min(a.nodes, a.max_nodes)
    rows = []
    best = 0
    for n in a.probe:
        if n > a.max_nodes:
            break
        log(f"probe: starting the Slurm {slurm_version} cluster with {n} slurmd")
        row = probe_mod.probe(a.run_dir, n, slurm_version=slurm_version)
        rows.append(row)
        log(f"probe {n}: {json.dumps({k: v for k, v in row.items() if k != 'detail'})}")
        if not row.get("ok"):
            break
        best = n
        if util.mem_available_mib() < 4096:
            break
    results["node_probe"] = rows
    need = max(a.sizes)
    return min(best, need) if best else 0
