"""A whole busy-site run (see bench/busy.py for usage and what is measured): per Slurm release a
fresh cluster with the site's own partition, then per background size N one segment of
windows and phases, slurmgate stopped then running. Imported after the environment is set."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from bench import util
from bench.busy_cost import Watched, rest_by_endpoint, site_cost
from bench.busy_floor import READS_SIDE_BY_SIDE_S, SlurmFloor
from bench.busy_load import ForeignLoad
from bench.busy_phases import (
    delete_lease,
    direct_in_flight,
    kube_floor,
    latency,
    pods_in_flight,
    scrape,
    wait_first_whole_list,
    whole_lists,
    window,
)
from bench.busy_report import CALM, release_table
from bench.busy_targets import targets
from bench.harness import Env
from bench.observers import ProcSampler
from bench.report import code_fingerprint
from bench.stats import log
from cluster import bridge as bridge_mod
from cluster import local as local_mod
from cluster import proc, slurm_release
from cluster.proc import ClusterError
from cluster.slurm_conf import SiteLayout
from slurmgate.slurm import dialects

SITE_PARTITION = "site"
GRACE_PARTITION = "k8s"  # the local cluster's default: GraceTime 20 s
PLAIN_PARTITION = "hpc"  # no GraceTime
MIN_JOB_AGE = 30
# after slurmgate starts (its first full list, the informers' lists) / after churn starts
SETTLE_START_S = 10.0
SETTLE_S = 5.0
LEASE = "slurmgate-binder"


def site_layout(a: argparse.Namespace) -> SiteLayout:
    return SiteLayout(other_nodes=tuple(f"x{i}" for i in range(1, a.site_nodes + 1)),
                      other_partition=SITE_PARTITION,
                      max_job_count=max(100_000, 2 * max(a.background_jobs)),
                      min_job_age=MIN_JOB_AGE)


def list_intervals() -> dict[str, float]:
    """How often the bench's binder reads each whole list: Slurm's job list every
    BINDER_FULL_LIST_INTERVAL (cluster/bridge.py passes SLURMGATE_FULL_LIST_INTERVAL, which
    bench/busy.py sets to the product default), its node list every nodesync.WHOLE_LIST_EVERY."""
    from slurmgate.binder.config import ReconcileSettings
    from slurmgate.binder.nodesync import WHOLE_LIST_EVERY

    jobs = os.environ.get("SLURMGATE_FULL_LIST_INTERVAL") or ReconcileSettings().full_list_interval
    return {"jobs": float(jobs), "nodes": float(WHOLE_LIST_EVERY)}


def summary_of(lists: dict[str, Any]) -> str:
    """One log line of busy_phases.whole_lists."""
    out = []
    for k, v in lists.items():
        text = (f"{k}: {v.get('wall_ms')} ms, {v.get('bytes')} B, "
                f"{v.get('slurm_cpu_s_net')} CPU-s, {v.get('amortized_pct')} % amortized")
        out.append(text + (f" ({v['error']})" if "error" in v else ""))
    return "; ".join(out)


def save(doc: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(doc, indent=2, default=str))


def hook(lc: local_mod.Local, on: bool) -> None:
    """slurmctld's hook pushes to the binder (on) or to nobody (off: polls alone)."""
    bridge_mod.point_hook(lc, [f"127.0.0.1:{bridge_mod.binder_port('binder')}"] if on else [])


async def stop_slurmgate(env: Env, b: bridge_mod.Bridge) -> None:
    await asyncio.to_thread(bridge_mod.stop_processes, b)
    await delete_lease(env, bridge_mod.NAMESPACE, LEASE)


async def start_slurmgate(b: bridge_mod.Bridge) -> None:
    await asyncio.to_thread(bridge_mod.start_processes, b, ("webhook", "binder"))


async def running_phases(env: Env, lc: local_mod.Local, b: bridge_mod.Bridge,
                         a: argparse.Namespace, n: int, seg: dict[str, Any]) -> None:
    """slurmgate running on the background of N: idle windows (hook on, off), latency with
    the hook off and on, the two floors, then K Pods in flight."""
    ours = Watched.of(lc.slurm.pids, {"binder": b.pids["binder"], "webhook": b.pids["webhook"]})
    sampler = ProcSampler({"binder": b.pids["binder"], "webhook": b.pids["webhook"]})
    sampler.start()
    m0, t0 = await scrape(env), time.monotonic()
    try:
        log(f"N={n}: idle window, hook on")
        seg["idle"] = await window(env, ours, a.window, running=True)
        # bound Pods are not in flight: their idle cost, in a partition with a GraceTime
        # (whose preemption only a whole read of each job shows) and in one without
        for key, part in (("idle_bound", GRACE_PARTITION),
                          ("idle_bound_nograce", PLAIN_PARTITION)):
            log(f"N={n}: {a.nodes} Pods bound in {part}, idle window, hook on")
            seg[key] = await pods_in_flight(env, ours, f"busy-{n}-{key.replace('_', '-')}",
                                            a.nodes, a.nodes, a.window, part)
        hook(lc, False)
        await asyncio.sleep(2.0)
        log(f"N={n}: idle window, hook off")
        seg["idle_nohook"] = await window(env, ours, a.window, running=True)
        log(f"N={n}: latency, hook off")
        seg["latency_nohook"] = await latency(env, f"busy-{n}-nohook", a.pods, a.nodes)
        hook(lc, True)
        log(f"N={n}: latency, hook on")
        ma, ta = await scrape(env), time.monotonic()
        # the direct floor's jobs between its rounds: submits and cancels side by side
        floor = SlurmFloor(env)
        # more of them than the other phases' Pods: a p99 of 16 samples is their largest
        seg["latency_hook"] = await latency(env, f"busy-{n}-hook", a.latency_pods, a.nodes,
                                            floor)
        mb = await scrape(env)
        # Pods made one at a time, as the direct floor's jobs are: slurmgate's submits and
        # cancels compared like with like
        seg["calls_one_by_one"] = {c: rest_by_endpoint(ma.get(c, []), mb.get(c, []), c,
                                                       time.monotonic() - ta)
                                   for c in ("binder", "webhook")}
        log(f"N={n}: floor (kube-scheduler)")
        seg["unmarked"] = await kube_floor(env, f"busy-{n}-unmarked", a.pods)
        seg["floor"] = await floor.result()
        log(f"N={n}: {a.pods} Pods in flight, window")
        seg["pods"] = await pods_in_flight(env, ours, f"busy-{n}-inflight", a.pods, a.nodes,
                                           a.window, side_by_side=READS_SIDE_BY_SIDE_S)
        log(f"N={n}: {a.pods} jobs in flight made directly (the Pods window's floor), window")
        seg["direct"] = await direct_in_flight(env, ours, a.pods, a.nodes, a.window)
    finally:
        hook(lc, True)
        m1, dt = await scrape(env), time.monotonic() - t0
        await sampler.stop()
        seg["calls"] = {c: rest_by_endpoint(m0.get(c, []), m1.get(c, []), c, dt)
                        for c in ("binder", "webhook")}
        seg["rss_peak_mib"] = {k: round(v, 1) for k, v in sampler.peak.items()}
        seg["binder_alive"] = proc.alive(b.pids.get("binder", 0))


async def segment(env: Env, lc: local_mod.Local, b: bridge_mod.Bridge, load: ForeignLoad,
                  a: argparse.Namespace, seg: dict[str, Any]) -> None:
    """One background size N (seg["n"]), filled into seg as it goes (a failure keeps what
    was measured): grow the background, start churn, a window with slurmgate stopped, then
    slurmgate running (running_phases)."""
    n = seg["n"]
    await stop_slurmgate(env, b)
    log(f"N={n}: growing the background (slurmgate stopped)")
    seg["background"] = await load.grow(n)
    log(f"N={n}: background {seg['background']}")
    if n > 0:
        load.start_churn(a.churn)
    try:
        await asyncio.sleep(SETTLE_S)
        log(f"N={n}: window, slurmgate stopped")
        site = Watched.of(lc.slurm.pids, {})
        seg["stopped"] = await window(env, site, a.window, False)
        log(f"N={n}: the binder's whole lists, made directly (slurmgate stopped)")
        seg["whole_list"] = await whole_lists(lc.slurm.rest_url, lc.slurm.token_file, site,
                                              seg["stopped"], list_intervals())
        log(f"N={n}: whole lists {summary_of(seg['whole_list'])}")
        await start_slurmgate(b)
        await asyncio.sleep(SETTLE_START_S)
        seg["binder_start_whole_list_s"] = await wait_first_whole_list(env)
        log(f"N={n}: the binder read its first whole list "
            f"{seg['binder_start_whole_list_s']} s after it started")
        await running_phases(env, lc, b, a, n, seg)
    finally:
        seg["churn"] = await load.stop_churn()
        seg["load_errors"] = {"errors": load.counts.errors,
                              "samples": load.counts.error_samples}
    seg["cost"] = {k: site_cost(seg["stopped"]["cpu_pct"], seg[k]["cpu_pct"])
                   for k in (*CALM, "direct") if k in seg}
    if "pods" in seg and "direct" in seg:  # slurmgate's own, over what the jobs cost Slurm
        seg["cost"]["pods_over_direct"] = site_cost(seg["direct"]["cpu_pct"],
                                                    seg["pods"]["cpu_pct"])


async def measure(a: argparse.Namespace, lc: local_mod.Local, b: bridge_mod.Bridge,
                  results: dict[str, Any], doc: dict[str, Any], path: Path) -> None:
    env = await Env.open(lc, b)
    try:
        d = dialects.dialect(await env.slurm.detect_version())
        results["rest_api"] = d.version
        async with ForeignLoad(lc.slurm.rest_url, lc.slurm.token_file, d, SITE_PARTITION,
                               a.concurrency) as load:
            for n in a.background_jobs:
                seg: dict[str, Any] = {"n": n}
                results["by_n"].append(seg)
                try:
                    await segment(env, lc, b, load, a, seg)
                finally:
                    save(doc, path)
    finally:
        await env.close()


def run_release(a: argparse.Namespace, version: str, doc: dict[str, Any], path: Path) -> int:
    results: dict[str, Any] = {"slurm_version": version, "by_n": [],
                               "started": time.strftime("%Y%m%d-%H%M%S")}
    doc["releases"][version] = results
    code = 0
    try:
        t0 = time.monotonic()
        lc = local_mod.up(a.run_dir, nodes=a.nodes, slurm_version=version, site=site_layout(a))
        results["cluster_up_s"] = round(time.monotonic() - t0, 1)
        results["slurm_root"] = lc.slurm.root
        b = bridge_mod.up(lc)
        results["code"] = code_fingerprint()
        asyncio.run(measure(a, lc, b, results, doc, path))
    except BaseException as e:
        results["error"] = f"{type(e).__name__}: {e}"
        log(f"FAILED on Slurm {version}: {results['error']} (partial results follow)")
        code = 130 if isinstance(e, KeyboardInterrupt) else 1
    finally:
        results["targets"] = targets(results)
        save(doc, path)
        try:
            print(release_table(results, a.pods), flush=True)
        except Exception as e:  # the JSON is written; a table bug must not lose it
            print(f"(table failed: {type(e).__name__}: {e})")
        bridge_mod.down(a.run_dir)
        local_mod.down(a.run_dir)
    return code


def main(a: argparse.Namespace) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    a.out.mkdir(parents=True, exist_ok=True)
    path = a.out / f"busy-{stamp}.json"
    try:
        for v in a.versions:  # every root first: a failing build shows before any measuring
            slurm_release.build_root(slurm_release.release(v))
    except ClusterError as e:
        print(f"{e}", file=sys.stderr)
        return 1
    doc: dict[str, Any] = {
        "started": stamp, "argv": sys.argv[1:], "background_jobs": a.background_jobs,
        "churn_per_s": a.churn, "pods": a.pods, "latency_pods": a.latency_pods,
        "window_s": a.window, "nodes": a.nodes,
        "site_nodes": a.site_nodes, "min_job_age": MIN_JOB_AGE,
        "env": {k: os.environ.get(k) for k in ("SLURMGATE_FULL_LIST_INTERVAL",
                                               "SLURMGATE_LEASE_SECONDS", "SUBMIT_BUDGET")},
        "list_intervals_s": list_intervals(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start": util.loadavg()},
        "releases": {}}
    code = 0
    for v in a.versions:
        log(f"=== Slurm {v}")
        saved = dict(os.environ)  # the harness points SLURM_CONF at this cluster's
        try:
            code = max(code, run_release(a, v, doc, path))
        finally:
            os.environ.clear()
            os.environ.update(saved)
        if code == 130:
            break
    doc["machine"]["loadavg_end"] = util.loadavg()
    save(doc, path)
    print(f"\nresults: {path}")
    return code
