"""What a bench run leaves behind besides the raw figures: the stdout table, the pass/miss
verdict against the targets, and the fingerprint of the code that was measured."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from bench.attribution import NOTICED_TO_BOUND
from bench.stats import fmt


def table(results: dict[str, Any]) -> str:
    lines: list[str] = []

    def row(*cells: Any, widths: tuple[int, ...] = (44, 11, 11, 11, 12)) -> None:
        lines.append("  ".join(fmt(c).ljust(w) if i == 0 else fmt(c).rjust(w)
                               for i, (c, w) in enumerate(zip(cells, widths, strict=False))))

    m = results["machine"]
    # several releases' tables follow one another on stdout: each names its own
    lines.append(f"slurmgate bench  Slurm {results.get('slurm_version', '?')}  "
                 f"{results['started']}  {m['cpus']} CPUs  {m['mem_gib']} GiB  "
                 f"nodes={results.get('nodes')}  concurrency={results['concurrency']}")
    phase = results.get("burst_phase")
    at = f".{round(phase * 1000):03d}" if phase is not None else "any"
    lines.append(f"bursts start at {at}"
                 f" of a second (slurmctld's tick is on whole seconds); slurmd at nice "
                 f"{results.get('slurmd_nice', 0)}; webhook SUBMIT_BUDGET "
                 f"{results.get('submit_budget', '0')} s"
                 + (f"; CPUs split: Slurm on {split['slurm']}, Kubernetes and slurmgate on "
                    f"{split['kube']}" if (split := results.get("split_cpus")) else ""))
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
        for label in ("unmarked", "marked", "marked_waiting"):
            if label not in adm:
                continue
            x = adm[label]
            c = x["client_create"]
            row(f"{label}: client create (seq)", c["p50_ms"], c["p95_ms"], c["p99_ms"], c["n"])
            h = x["apiserver_webhook"]
            row(f"{label}: apiserver webhook histogram", h["p50_ms"], h["p95_ms"],
                h["p99_ms"], h["n"])
            if label.startswith("marked"):
                h = x["webhook_marked"]
                row(f"{label}: webhook own histogram", h["p50_ms"], h["p95_ms"], h["p99_ms"],
                    h["n"])
                h = x["slurm_submit"]
                row(f"{label}: slurmrestd submit", h["p50_ms"], h["p95_ms"], h["p99_ms"],
                    h["n"])
                if x.get("handoffs"):
                    lines.append(f"{label}: {x['handoffs']:.0f} of {c['n']} admitted before "
                                 f"Slurm answered (SUBMIT_BUDGET "
                                 f"{results.get('submit_budget', '?')} s)")
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
        lg = sl.get("by_log") or {}
        if lg.get("done"):
            row("  the same, RUNNING as slurmctld logs it", lg.get("p50_ms"), lg.get("p99_ms"),
                lg.get("makespan_s"), lg.get("per_s"))
        row("slurmgate: create -> bound (ms)", o.get("p50_ms"), o.get("p99_ms"),
            o.get("makespan_s"), o.get("per_s"))
        if o.get("slurm_pushes") is not None:
            poll = o["binder_slurm_poll"]
            lines.append(f"  reconciles {o.get('reconciles_by_action')}")
            top = list((o.get("host_cpu_s") or {}).items())[:8]
            lines.append("  host CPU s during the burst: "
                         + ", ".join(f"{k} {v}" for k, v in top))
            lines.append(f"  slurmctld pushes {o['slurm_pushes']}, binder polls "
                         f"{o.get('binder_polls', 0):.0f}, poll p50/p99 "
                         f"{poll['p50_ms']}/{poll['p99_ms']} ms")
        rb = o["running_to_bound_binder_metric"]
        row("slurmgate: RUNNING -> bound, binder metric", rb["p50_ms"], rb["p99_ms"])
        row("slurmgate: create call (admission, ms)", o["create"]["p50_ms"],
            o["create"]["p99_ms"])
        if o.get("attribution"):
            lines.append("  where Slurm allocated -> bound goes, per Pod (ms)    p50          p99"
                         "             n")
            for name, v in o["attribution"].items():
                row(f"  {name}", v["p50_ms"], v["p99_ms"], "", v["n"])
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


def _verdict(value: Any, ok: bool, unit: str = "") -> str:
    return f"{value}{unit} {'OK' if ok else 'MISSED'}"


def admission_ratio(results: dict[str, Any],
                    label: str = "marked") -> tuple[float, float, float] | None:
    """(marked p99 ms, unmarked p99 ms, their ratio) of the sequential creates, if measured."""
    adm = results.get("admission")
    if not adm or label not in adm:
        return None
    m = adm[label]["client_create"]["p99_ms"]
    u = adm["unmarked"]["client_create"]["p99_ms"]
    return m, u, (round(m / u, 2) if u else float("nan"))


def makespan_limit(size: int) -> float:
    """Issue 15 allows a little more overhead once a burst queues behind itself."""
    return 1.15 if size <= 100 else 1.2


def targets(results: dict[str, Any]) -> dict[str, str]:
    """Issue 15's targets: ratios within this run, latencies after Slurm's decision."""
    out: dict[str, str] = {}
    adm = admission_ratio(results)
    if adm:
        m, u, r = adm
        out["marked admission p99 <= 2x unmarked p99 (client, seq)"] = \
            _verdict(f"{m} / {u} ms = {r}", r <= 2, "x")
    held = admission_ratio(results, "marked_waiting")
    if held:  # the same with every node taken: the admission path without its jobs starting
        m, u, r = held
        out["  the same while the jobs wait (admission path alone)"] = \
            _verdict(f"{m} / {u} ms = {r}", r <= 2, "x")
    for b in results.get("bursts", []):
        o, s = b["ours"], b["size"]
        limit = makespan_limit(s)
        ov = b["overhead"]["makespan"]
        out[f"[{s}] makespan overhead <= {limit}x"] = _verdict(ov, ov <= limit, "x")
        nb = (o.get("attribution") or {}).get(NOTICED_TO_BOUND)
        if nb and s <= 100:
            p50, p99 = nb["p50_ms"], nb["p99_ms"]
            want99 = 100 if s <= 20 else 150
            out[f"[{s}] RUNNING noticed -> bound p99 <= {want99} ms"] = \
                _verdict(p99, p99 <= want99, " ms")
            if s > 20:
                out[f"[{s}] RUNNING noticed -> bound p50 <= 50 ms"] = \
                    _verdict(p50, p50 <= 50, " ms")
    idles = [(b["ours"]["idle"]["bound_pods"], b["ours"]["idle"]["reconciles"],
              b["ours"]["idle"]["binder_cpu_s"]) for b in results.get("bursts", [])
             if "idle" in b["ours"]]
    if idles:
        lo, hi = min(idles), max(idles)
        out[f"idle: 0 reconciles ({lo[0]} .. {hi[0]} bound Pods)"] = _verdict(
            f"{lo[1]:.0f} .. {hi[1]:.0f} (CPU s {lo[2]} .. {hi[2]})", hi[1] == 0)
    return out


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
