"""The benchmark phases (see bench/run.py for usage). Imported after the environment is set."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import probe as probe_mod
from bench import util
from bench.harness import Created, Env, JobPoller, PodWatch, ProcSampler
from cluster import bridge as bridge_mod
from cluster import local as local_mod
from slurmgate.kube import pod_path

WEBHOOK_NAME = "pods.slurmgate.io"
APISERVER_HIST = "apiserver_admission_webhook_admission_duration_seconds"
WEBHOOK_HIST = "slurmgate_webhook_request_duration_seconds"


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def ms(x: float) -> float:
    return round(x * 1000, 1) if not math.isnan(x) else math.nan


def lat(values: list[float]) -> dict[str, float]:
    s = util.summary(values)
    return {"n": s["n"], "p50_ms": ms(s["p50"]), "p95_ms": ms(s["p95"]),
            "p99_ms": ms(s["p99"]), "max_ms": ms(s["max"])}


def hist_lat(h: dict[float, float]) -> dict[str, float]:
    return {"n": util.hist_count(h), "p50_ms": ms(util.hist_quantile(h, 0.50)),
            "p95_ms": ms(util.hist_quantile(h, 0.95)),
            "p99_ms": ms(util.hist_quantile(h, 0.99))}


# ----------------------------------------------------------------------------- profiling


class Profiler:
    """py-spy record on a pid until stopped (SIGINT makes py-spy write its output)."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        exe = Path(sys.executable).parent / "py-spy"
        if not exe.exists():
            log("py-spy not installed (.venv/bin/pip install py-spy); not profiling")
            return
        self.proc = subprocess.Popen(
            [str(exe), "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
             "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return summarize_profile(self.out)


def _fn(frame: str) -> str:
    """'func (path/file.py:123)' -> 'func (path/file.py)': one entry per function."""
    head, _, rest = frame.rpartition(":")
    return f"{head})" if rest.rstrip(")").isdigit() else frame


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """From py-spy's collapsed stacks: the functions with most self and total samples."""
    self_s: dict[str, int] = {}
    total_s: dict[str, int] = {}
    n = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        n += c
        frames = stack.split(";")
        # skip the thread name frame py-spy may put first
        frames = [_fn(f) for f in frames if "(" in f]
        if not frames:
            continue
        self_s[frames[-1]] = self_s.get(frames[-1], 0) + c
        for f in set(frames):
            total_s[f] = total_s.get(f, 0) + c

    def rank(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / max(1, n), 1))
                for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": n, "file": str(path), "self_pct": rank(self_s),
            "total_pct": rank(total_s)}


# ----------------------------------------------------------------------------- phases


async def admission(env: Env, a: argparse.Namespace, results: dict[str, Any],
                    prof_dir: Path | None) -> None:
    ns = await env.namespace("bench-adm")
    n = a.admission_pods
    out: dict[str, Any] = {}
    for label, marked in (("unmarked", False), ("marked", True)):
        api0, wh0 = await env.apiserver_metrics(), await env.webhook_metrics()
        made = await env.create_pods(ns, [f"seq-{label}-{i}" for i in range(n)], marked,
                                     "adm", concurrency=1)
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
            "apiserver_webhook_calls": util.hist_count(api_h),
            "apiserver_webhook": hist_lat(api_h),
            "webhook_marked": hist_lat(wh_h),
            "webhook_unmarked_calls": util.hist_count(wh_u),
            "slurm_submit": hist_lat(sub_h),
        }
        log(f"admission {label}: client p50 {out[label]['client_create']['p50_ms']} ms, "
            f"p99 {out[label]['client_create']['p99_ms']} ms, "
            f"apiserver saw {util.hist_count(api_h):.0f} webhook calls")
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


def spread(made: list[Created], done_at: dict[str, float]) -> dict[str, Any]:
    """create-sent -> done for every item; makespan and throughput."""
    per = [done_at[c.name] - c.t_send for c in made if c.ok and c.name in done_at]
    if not per:
        return {"done": 0}
    first = min(c.t_send for c in made)
    last = max(done_at[c.name] for c in made if c.name in done_at)
    r = lat(per)
    r.update(done=len(per), makespan_s=round(last - first, 2),
             per_s=round(len(per) / max(1e-9, last - first), 1))
    return r


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
    poller = JobPoller(env.slurm)
    poller.start()
    sampler = ProcSampler({"binder": bpid, "webhook": wpid})
    sampler.start()
    bm0, wm0 = await env.binder_metrics(), await env.webhook_metrics()
    bcpu0, wcpu0 = util.cpu_seconds(bpid), util.cpu_seconds(wpid)
    prof = Profiler(bpid, profile) if profile else None
    names = [f"sg-{i}" for i in range(size)]
    made = await env.create_pods(ns, names, True, f"sg-{size}", a.concurrency)
    created_names = {c.name for c in made if c.ok}

    def progress(n: int) -> None:
        if n % max(1, size // 5) == 0:
            log(f"  {n}/{size} bound")

    ok = await w.wait_bound(created_names, limit=max(120, 3 * size), progress=progress)
    bcpu, wcpu = util.cpu_seconds(bpid) - bcpu0, util.cpu_seconds(wpid) - wcpu0
    prof_summary = prof.stop() if prof else None
    bm1 = await env.binder_metrics()
    await poller.stop()
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
    job_of = {c.name: c.job_id for c in made if c.job_id}
    r["running_to_bound_watch"] = lat([
        w.bound_at[n] - poller.running_at[j] for n, j in job_of.items()
        if n in w.bound_at and j in poller.running_at])
    r["running_seen_by_bench"] = len(set(job_of.values()) & poller.running_at.keys())
    hb = util.hist_delta(util.histogram(bm1, "slurmgate_binder_running_to_bound_seconds"),
                         util.histogram(bm0, "slurmgate_binder_running_to_bound_seconds"))
    hc = util.hist_delta(util.histogram(bm1, "slurmgate_binder_created_to_bound_seconds"),
                         util.histogram(bm0, "slurmgate_binder_created_to_bound_seconds"))
    hp = util.hist_delta(util.histogram(bm1, "slurmgate_binder_slurm_poll_seconds"),
                         util.histogram(bm0, "slurmgate_binder_slurm_poll_seconds"))
    r["running_to_bound_binder_metric"] = hist_lat(hb)
    r["created_to_bound_binder_metric"] = hist_lat(hc)
    r["binder_slurm_poll"] = hist_lat(hp)
    r["bench_slurm_poll"] = lat(poller.poll_seconds)
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


# ----------------------------------------------------------------------------- nodes


def choose_nodes(a: argparse.Namespace, results: dict[str, Any]) -> int:
    if a.nodes:
        return min(a.nodes, a.max_nodes)
    counts = [int(x) for x in (a.probe or "50,100,200,400,1000").split(",") if x]
    rows = []
    best = 0
    for n in counts:
        if n > a.max_nodes:
            break
        log(f"probe: starting the cluster with {n} slurmd")
        row = probe_mod.probe(a.run_dir, n)
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


# ----------------------------------------------------------------------------- report


def fmt(x: Any) -> str:
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        return f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"
    return str(x)


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []

    def row(*cells: Any, widths: tuple[int, ...] = (44, 11, 11, 11, 12)) -> None:
        lines.append("  ".join(fmt(c).ljust(w) if i == 0 else fmt(c).rjust(w)
                               for i, (c, w) in enumerate(zip(cells, widths, strict=False))))

    m = results["machine"]
    lines.append(f"slurmgate bench  {results['started']}  {m['cpus']} CPUs  {m['mem_gib']} GiB  "
                 f"nodes={results['nodes']}  concurrency={results['concurrency']}")
    if results.get("node_probe"):
        lines.append("")
        lines.append("node probe (real slurmd, cluster.local.up)")
        row("nodes", "up s", "slurmd RSS", "slurmd PSS", "idle CPU",
            widths=(44, 11, 11, 11, 12))
        for p in results["node_probe"]:
            if p.get("ok"):
                row(p["nodes"], p["seconds"], f"{p['slurmd_rss_mib']:.0f}M",
                    f"{p['slurmd_pss_mib']:.0f}M", f"{p['idle_cpu_cores_slurm']:.2f}")
            else:
                row(p["nodes"], p.get("seconds"), "FAILED", p.get("error", "")[:60])
    adm = results.get("admission")
    if adm:
        lines.append("")
        lines.append("admission (ms)                                      p50          p95"
                     "          p99         n")
        for label in ("unmarked", "marked"):
            x = adm[label]
            c = x["client_create"]
            row(f"{label}: client create (seq)", c["p50_ms"], c["p95_ms"], c["p99_ms"], c["n"])
            h = x["apiserver_webhook"]
            row(f"{label}: apiserver webhook histogram", h["p50_ms"], h["p95_ms"],
                h["p99_ms"], h["n"])
            if label == "marked":
                h = x["webhook_marked"]
                row("marked: webhook own histogram", h["p50_ms"], h["p95_ms"], h["p99_ms"],
                    h["n"])
                h = x["slurm_submit"]
                row("marked: slurmrestd submit", h["p50_ms"], h["p95_ms"], h["p99_ms"],
                    h["n"])
        for label in ("unmarked", "marked"):
            t = adm["throughput"][label]
            c = t["client_create"]
            row(f"{label}: x{adm['concurrency']} concurrent (creates/s)", c["p50_ms"],
                c["p95_ms"], c["p99_ms"], f"{t['creates_per_s']}/s")
    for b in results.get("bursts", []):
        s, o, ks, sl = b["size"], b["ours"], b["kube_scheduler"], b["slurm"]
        lines.append("")
        mode = (f"CHURN: {s} Pods > {results['nodes']} nodes, each Pod deleted once bound "
                "(throughput with churn)" if o.get("churn") else "burst fits the nodes")
        lines.append(f"burst {s}  ({mode})")
        lines.append("                                                    p50          p99"
                     "    makespan s     per s")
        row("kube-scheduler floor: create -> bound (ms)", ks.get("p50_ms"), ks.get("p99_ms"),
            ks.get("makespan_s"), ks.get("per_s"))
        row("Slurm floor: REST submit -> RUNNING (ms)", sl.get("p50_ms"), sl.get("p99_ms"),
            sl.get("makespan_s"), sl.get("per_s"))
        row("slurmgate: create -> bound (ms)", o.get("p50_ms"), o.get("p99_ms"),
            o.get("makespan_s"), o.get("per_s"))
        rb = o["running_to_bound_binder_metric"]
        row("slurmgate: RUNNING -> bound, binder metric", rb["p50_ms"], rb["p99_ms"])
        rw = o["running_to_bound_watch"]
        row("slurmgate: RUNNING -> bound, bench watch", rw["p50_ms"], rw["p99_ms"])
        row("slurmgate: create call (admission, ms)", o["create"]["p50_ms"],
            o["create"]["p99_ms"])
        ov = b["overhead"]
        row("overhead = ours / max(floors)", f"{ov['p50']}x", f"{ov['p99']}x",
            f"{ov['makespan']}x")
        row("binder CPU s (per 1000 Pods)", f"{o['binder_cpu_s']}",
            f"({o['binder_cpu_s_per_1000']})")
        row("binder RSS MiB now / peak", o["binder_rss_mib"], o["binder_rss_peak_mib"])
        row("webhook RSS MiB now / peak", o["webhook_rss_mib"], o["webhook_rss_peak_mib"])
        if "idle" in o:
            i = o["idle"]
            row(f"idle {i['window_s']:.0f}s, {i['bound_pods']} bound: reconciles / CPU s",
                i["reconciles"], i["binder_cpu_s"], f"{i['binder_cpu_pct']}%")
    mem = results.get("memory")
    if mem:
        lines.append("")
        row("RSS MiB (webhook / binder) idle", mem["idle"]["webhook"], mem["idle"]["binder"])
        if "max" in mem:
            row(f"RSS MiB at {mem['max']['pods']} Pods (peak)", mem["max"]["webhook"],
                mem["max"]["binder"])
    if results.get("slurm_drained_nodes_resumed"):
        rs = results["slurm_drained_nodes_resumed"]
        lines.append("")
        lines.append(f"Slurm drained {len(rs)} node(s) on its own during the run (resumed by the "
                     f"bench): {sorted({r['reason'] for r in rs})}")
    for rc in results.get("cleanup_recancelled") or []:
        lines.append(f"cleanup {rc['phase']}: the bench cancelled {rc['jobs']} still-live "
                     f"job(s) again after {rc['after_s']}s (e.g. {rc['sample']})")
    t = results.get("targets")
    if t:
        lines.append("")
        lines.append("targets")
        for k, v in t.items():
            lines.append(f"  {k:58} {v}")
    return "\n".join(lines)


def targets(results: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    adm = results.get("admission")
    if adm:
        p = adm["marked"]["client_create"]["p99_ms"]
        out["admission p99 < 50 ms incl. submit (client, seq)"] = \
            f"{p} ms {'OK' if p < 50 else 'MISSED'}"
        p = adm["unmarked"]["client_create"]["p99_ms"]
        out["unmarked create p99 < 5 ms (client, seq)"] = f"{p} ms {'OK' if p < 5 else 'MISSED'}"
    for b in results.get("bursts", []):
        o = b["ours"]
        s = b["size"]
        p = o["running_to_bound_binder_metric"]["p99_ms"]
        out[f"[{s}] Slurm RUNNING -> bound p99 < 250 ms (binder metric)"] = \
            f"{p} ms {'OK' if p < 250 else 'MISSED'}"
        ps = o.get("per_s", 0)
        out[f"[{s}] >= 50 Pods/s to bound"] = f"{ps}/s {'OK' if ps >= 50 else 'MISSED'}"
        ov = b["overhead"]["makespan"]
        out[f"[{s}] overhead (makespan) <= 1.5x"] = f"{ov}x {'OK' if ov <= 1.5 else 'MISSED'}"
    idles = [(b["ours"]["idle"]["bound_pods"], b["ours"]["idle"]["reconciles"],
              b["ours"]["idle"]["binder_cpu_s"]) for b in results.get("bursts", [])
             if "idle" in b["ours"]]
    if len(idles) >= 2:
        lo, hi = min(idles), max(idles)
        out[f"idle reconcile work flat ({lo[0]} vs {hi[0]} bound Pods)"] = \
            f"reconciles {lo[1]:.0f} vs {hi[1]:.0f}, CPU s {lo[2]} vs {hi[2]}"
    return out


def ratio(x: float | None, floors: list[float | None]) -> float:
    fl = [f for f in floors if f and not math.isnan(f)]
    if not x or not fl or math.isnan(x):
        return math.nan
    return round(x / max(fl), 2)


# ----------------------------------------------------------------------------- main


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
            ov = {"p50": ratio(o.get("p50_ms"), [ks.get("p50_ms"), sl.get("p50_ms")]),
                  "p99": ratio(o.get("p99_ms"), [ks.get("p99_ms"), sl.get("p99_ms")]),
                  "makespan": ratio(o.get("makespan_s"),
                                    [ks.get("makespan_s"), sl.get("makespan_s")])}
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


def code_fingerprint() -> dict[str, str]:
    """sha1 (12 hex) of the Python sources the processes run, to tell runs apart."""
    repo = Path(__file__).resolve().parent.parent
    out = {}
    for pkg in ("slurmgate", "binder", "webhook"):
        h = hashlib.sha1()
        for f in sorted((repo / pkg).glob("*.py")):
            h.update(f.name.encode() + f.read_bytes())
        out[pkg] = h.hexdigest()[:12]
    return out


def main(a: argparse.Namespace) -> int:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    a.out.mkdir(parents=True, exist_ok=True)
    prof_dir = a.out / f"profile-{stamp}" if a.profile else None
    if prof_dir:
        prof_dir.mkdir()
    results: dict[str, Any] = {
        "started": stamp, "argv": sys.argv[1:], "bursts": [], "profiles": {},
        "concurrency": a.concurrency,
        "binder_lease_seconds": os.environ.get("SLURMGATE_LEASE_SECONDS"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "mem_gib": round(os.sysconf("SC_PHYS_PAGES") * util.PAGE / 2**30, 1),
                    "loadavg_start": util.loadavg()},
    }
    nodes = choose_nodes(a, results)
    if not nodes:
        print("no node count worked", file=sys.stderr)
        return 1
    results["nodes"] = nodes
    log(f"bursts run on {nodes} Slurm nodes")
    t0 = time.monotonic()
    lc = local_mod.up(a.run_dir, nodes=nodes)
    results["cluster_up_s"] = round(time.monotonic() - t0, 1)
    code = 0
    try:
        b = bridge_mod.up(lc)
        results["code"] = code_fingerprint()  # what the webhook and binder just loaded
        asyncio.run(run_all(a, lc, b, results, prof_dir))
    except BaseException as e:
        results["error"] = f"{type(e).__name__}: {e}"
        code = 1
        log(f"FAILED: {results['error']} (partial results follow)")
        if isinstance(e, KeyboardInterrupt):
            code = 130
    finally:
        results["machine"]["loadavg_end"] = util.loadavg()
        results["targets"] = targets(results)
        path = a.out / f"bench-{stamp}.json"
        path.write_text(json.dumps(results, indent=2, default=str))
        try:
            print(table(results))
        except Exception as e:  # the JSON is written; a table bug must not lose it
            print(f"(table failed: {e})")
        print(f"\nresults: {path}")
        if not a.keep:
            bridge_mod.down(a.run_dir)
            local_mod.down(a.run_dir)
    return code
