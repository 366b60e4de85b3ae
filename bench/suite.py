"""A whole bench run (see bench/run.py for usage): per Slurm release, one after the other,
choose the nodes, bring up a fresh cluster of that release, run the phases in order, write the
JSON and the table; then the summary across releases. Imported after the environment is set.

The release is a parameter (cluster.local.up(slurm_version=...)), not $SLURM_VERSION: nothing
reads it at import time, so one process runs every release in turn."""

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

from bench import cpusplit, util
from bench.harness import Env
from bench.phases import admission, choose_nodes, kube_floor, ours, slurm_floor
from bench.report import code_fingerprint, table, targets
from bench.stats import log, ratio
from bench.summary import summarize, summary_table
from cluster import bridge as bridge_mod
from cluster import local as local_mod
from cluster import slurm_release
from cluster.proc import ClusterError


class NoNodes(RuntimeError):
    """The node probe found no node count this machine holds."""


async def run_all(a: argparse.Namespace, lc: local_mod.Local, b: bridge_mod.Bridge,
                  results: dict[str, Any], prof_dir: Path | None) -> None:
    env = await Env.open(lc, b, pool=max(64, 2 * a.concurrency))
    try:
        results["memory"] = {"idle": {"webhook": round(util.rss_mib(env.pid("webhook")), 1),
                                      "binder": round(util.rss_mib(env.pid("binder")), 1)}}
        await admission(env, a, results, prof_dir)
        for size in a.sizes:
            log(f"burst {size}: kube-scheduler floor")
            ks = await kube_floor(env, size, a)
            log(f"burst {size}: kube-scheduler {ks.get('p50_ms')}/{ks.get('p99_ms')} ms, "
                f"{ks.get('makespan_s')} s")
            sl = await slurm_floor(env, size, results["nodes"], a)
            log(f"burst {size}: Slurm {sl.get('p50_ms')}/{sl.get('p99_ms')} ms, "
                f"{sl.get('makespan_s')} s")
            prof = (prof_dir / f"binder-burst-{size}.txt"
                    if prof_dir is not None and size == max(a.sizes) else None)
            o = await ours(env, size, results["nodes"], a, prof)
            log(f"burst {size}: slurmgate {o.get('p50_ms')}/{o.get('p99_ms')} ms, "
                f"{o.get('makespan_s')} s, {o.get('per_s')}/s")
            if "profile" in o:
                results["profiles"][f"binder_burst_{size}"] = o.pop("profile")
            # Slurm's floor as its own log tells it when it can (no poller's delay in it)
            fl: dict[str, Any] = sl["by_log"] if (sl.get("by_log") or {}).get("done") else sl
            ov = {"p50": ratio(o.get("p50_ms"), [ks.get("p50_ms"), fl.get("p50_ms")]),
                  "p99": ratio(o.get("p99_ms"), [ks.get("p99_ms"), fl.get("p99_ms")]),
                  "makespan": ratio(o.get("makespan_s"),
                                    [ks.get("makespan_s"), fl.get("makespan_s")])}
            results["bursts"].append({"size": size, "kube_scheduler": ks, "slurm": sl,
                                      "ours": o, "overhead": ov})
            if size == max(a.sizes):
                results["memory"]["max"] = {"pods": size, "webhook": o["webhook_rss_peak_mib"],
                                            "binder": o["binder_rss_peak_mib"]}
            if "cleanup_error" in o:
                results["error"] = f"stopped after burst {size}: {o['cleanup_error']}"
                break
    finally:
        results["slurm_drained_nodes_resumed"] = env.resumed
        results["cleanup_recancelled"] = env.recancelled
        await env.close()


def _measure(a: argparse.Namespace, version: str, results: dict[str, Any],
             prof_dir: Path | None) -> None:
    nodes = choose_nodes(a, results, version)
    if not nodes:
        raise NoNodes("no node count worked")
    results["nodes"] = nodes
    log(f"Slurm {version}: bursts run on {nodes} Slurm nodes")
    t0 = time.monotonic()
    lc = local_mod.up(a.run_dir, nodes=nodes, slurm_version=version)
    results["cluster_up_s"] = round(time.monotonic() - t0, 1)
    results["slurm_root"] = lc.slurm.root  # its name carries the Debian package version
    b = bridge_mod.up(lc)
    if a.split_cpus:
        slurm_cpus, kube_cpus = cpusplit.halves(os.sched_getaffinity(0))
        pinned = cpusplit.apply(slurm_cpus, kube_cpus)
        results["split_cpus"] = {"slurm": sorted(slurm_cpus), "kube": sorted(kube_cpus),
                                 "processes": pinned}
        log(f"CPUs split: Slurm on {sorted(slurm_cpus)} ({pinned['slurm']} processes), "
            f"Kubernetes and slurmgate on {sorted(kube_cpus)} ({pinned['kube']})")
    results["code"] = code_fingerprint()  # what the webhook and binder just loaded
    asyncio.run(run_all(a, lc, b, results, prof_dir))


def run_version(a: argparse.Namespace, version: str, stamp: str,
                keep: bool) -> tuple[int, dict[str, Any], Path]:
    """The whole bench on a fresh cluster of one release: (exit code, results, JSON file)."""
    prof_dir = a.out / f"profile-{stamp}-slurm-{version}" if a.profile else None
    if prof_dir:
        prof_dir.mkdir()
    results: dict[str, Any] = {
        "started": stamp, "version_started": time.strftime("%Y%m%d-%H%M%S"),
        "slurm_version": version, "argv": sys.argv[1:], "bursts": [], "profiles": {},
        "concurrency": a.concurrency,
        "burst_phase": a.phase, "slurmd_nice": a.slurmd_nice,
        # the webhook inherits the bench's environment (cluster.bridge)
        "submit_budget": os.environ.get("SUBMIT_BUDGET", "0"),
        "binder_lease_seconds": os.environ.get("SLURMGATE_LEASE_SECONDS"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "mem_gib": round(os.sysconf("SC_PHYS_PAGES") * util.PAGE / 2**30, 1),
                    "loadavg_start": util.loadavg()},
    }
    path = a.out / f"bench-{stamp}-slurm-{version}.json"
    code = 0
    try:
        _measure(a, version, results, prof_dir)
    except BaseException as e:
        results["error"] = f"{type(e).__name__}: {e}"
        code = 1
        log(f"FAILED on Slurm {version}: {results['error']} (partial results follow)")
        if isinstance(e, KeyboardInterrupt):
            code = 130
    finally:
        results["machine"]["loadavg_end"] = util.loadavg()
        results["targets"] = targets(results)
        path.write_text(json.dumps(results, indent=2, default=str))
        try:
            print(table(results))
        except Exception as e:  # the JSON is written; a table bug must not lose it
            print(f"(table failed: {e})")
        print(f"\nresults: {path}", flush=True)
        if not keep:
            bridge_mod.down(a.run_dir)
            local_mod.down(a.run_dir)
    return code, results, path


def main(a: argparse.Namespace) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    a.out.mkdir(parents=True, exist_ok=True)
    try:
        # every root first: a failing debootstrap shows before hours of measuring, and none
        # is built while another release is being measured (cached: fast when present)
        for v in a.versions:
            slurm_release.build_root(slurm_release.release(v))
    except ClusterError as e:
        print(f"{e}", file=sys.stderr)
        return 1
    runs: list[tuple[str, int, dict[str, Any], Path]] = []
    code = 0
    for i, v in enumerate(a.versions):
        log(f"=== Slurm {v} ({i + 1} of {len(a.versions)})")
        # a kept cluster would hold the run dir and ports the next release needs
        keep = a.keep and i == len(a.versions) - 1
        saved_env = dict(os.environ)  # the harness points SLURM_CONF at this cluster's
        try:
            c, results, path = run_version(a, v, stamp, keep)
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
        runs.append((v, c, results, path))
        code = max(code, c)
        if c == 130:  # interrupted: the releases not yet run stay unrun
            break
    summary = summarize(stamp, runs)
    path = a.out / f"bench-{stamp}-summary.json"
    path.write_text(json.dumps(summary, indent=2, default=str))
    print("\n" + summary_table(summary))
    print(f"\nsummary: {path}")
    return code
