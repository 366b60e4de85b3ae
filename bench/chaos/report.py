"""The chaos run's figures per Slurm release, and for each violation the timeline before it."""

from __future__ import annotations

import argparse
import re
import shlex
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.chaos.churn import ChurnStats
from bench.chaos.faults import Injected
from bench.chaos.observe import Observer, Violation

TIMELINE_BEFORE = 25  # entries printed before each violation
KEPT_LINES_PRINTED = 60  # the binder's lines about a violation's jobs, printed at most


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, round(q * (len(v) - 1)))]


def replay_command(a: argparse.Namespace, versions: list[str] | None = None) -> str:
    """The command that makes the same seeded choices again (`a` as __main__ parsed it): every
    option that shapes them, explicit, so a changed default cannot change the replay (the run
    and out dirs and --keep do not). Each release draws from the seed afresh, so one release
    of a multi-release run replays alone."""
    argv = ["python", "-m", "bench.chaos", "--seed", str(a.seed),
            "--versions", ",".join(versions or a.versions), "--minutes", f"{a.minutes:g}",
            *(["--rounds", str(a.rounds)] if a.rounds is not None else []),
            "--gap", *(f"{g:g}" for g in a.gap), "--nodes", str(a.nodes),
            "--binders", str(a.binders), "--pods", str(a.pods), "--faults", a.faults,
            "--min-pods-created", str(a.min_pods_created),
            "--min-pods-bound", str(a.min_pods_bound)]
    return shlex.join(argv)


def summary(version: str, seed: int, minutes: float, churn: ChurnStats,
            injected: list[Injected], obs: Observer) -> dict[str, Any]:
    conv = [t for _, t in obs.convergence]
    per_fault: dict[str, list[float]] = {}
    for name, t in obs.convergence:
        per_fault.setdefault(name, []).append(t)
    skipped: dict[str, list[str]] = {}
    for i in injected:
        if i.skipped:
            skipped.setdefault(i.name, []).append(i.skipped)
    return {
        "slurm_version": version, "seed": seed, "minutes": minutes,
        "pods_created": churn.created, "gangs": churn.gangs, "time_limited": churn.time_limited,
        "pods_bound": len(obs.bound),
        "pods_deleted": churn.deleted, "creates_refused": churn.create_failed,
        "batch_jobs": churn.batch_submitted,
        # injected: killed and brought back; a try that found nothing to kill is in skipped
        "faults": dict(Counter(i.name for i in injected if i.done)),
        "faults_skipped": skipped,
        "faults_not_restored": [f"{i.name}: {i.error}" for i in injected if i.error],
        "violations": [vars(v) for v in obs.violations],
        "slurm_view_only": obs.slurm_view_only,
        "double_bookings": obs.double_bookings,
        "settle_p50_s": percentile(conv, 0.5), "settle_p99_s": percentile(conv, 0.99),
        "settle_per_fault": {k: {"n": len(v), "p50": percentile(v, 0.5),
                                 "max": max(v)} for k, v in sorted(per_fault.items())},
        "samples": obs.samples, "unobservable_samples": obs.unobservable,
        "errors": churn.errors,
    }


def _double_bookings(items: dict[str, dict[str, Any]]) -> list[str]:
    """Each with its verdict and the observations it rests on."""
    own = sum(1 for r in items.values() if r["slurms_own"])
    lines = [f"double bookings (a job's process beside a Pod, one of the two jobs no longer on "
             f"that node in Slurm): {len(items)}; proven Slurm's own {own}, counted as violations "
             f"{len(items) - own}"]
    for r in items.values():
        verdict = "Slurm's own" if r["slurms_own"] else "COUNTED"
        lines.append(f"  [{verdict}] {r['kind']}: {r['detail']} (seen {r['seen_s']:.0f} s)")
        lines += [f"      {e}" for e in r["evidence"]]
    return lines


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def table(s: dict[str, Any]) -> str:
    lines = [
        f"== chaos on Slurm {s['slurm_version']}: seed {s['seed']}, {s['minutes']} min",
        f"replay: {s['replay']}" if s.get("replay") else "",
        f"Pods created {s['pods_created']} (gangs {s['gangs']}, time-limited "
        f"{s['time_limited']}), bound {s['pods_bound']}, deleted {s['pods_deleted']}, creates "
        f"refused {s['creates_refused']}; batch jobs {s['batch_jobs']}",
        f"faults injected {sum(s['faults'].values())}: "
        + ", ".join(f"{k} {v}" for k, v in sorted(s['faults'].items())),
        *([("skipped (nothing to kill; not injected): " + "; ".join(
            f"{k} {len(v)} ({v[-1]})" for k, v in sorted(s["faults_skipped"].items())))]
          if s["faults_skipped"] else []),
        f"violations: {len(s['violations'])}",
        f"overlaps only in slurmctld's view (no process of the job on the node; not violations):"
        f" {len(s['slurm_view_only'])}",
        *_double_bookings(s["double_bookings"]),
        f"settle after a fault: p50 {_fmt(s['settle_p50_s'])} s, p99 {_fmt(s['settle_p99_s'])} s",
    ]
    for k, v in s["settle_per_fault"].items():
        lines.append(f"  {k:15s} n={v['n']:<3d} p50 {_fmt(v['p50'])} s  max {_fmt(v['max'])} s")
    lines.append(f"samples {s['samples']} (unobservable {s['unobservable_samples']})")
    if s.get("supervisor_restarts"):
        lines.append("exited on their own, restarted as a Deployment would: " + ", ".join(
            f"{k} {v}" for k, v in sorted(s["supervisor_restarts"].items())))
    if s.get("nodes_resumed"):
        lines.append("nodes Slurm kept out after a fault, resumed as an admin would: "
                     + "; ".join(s["nodes_resumed"]))
    if s["faults_not_restored"]:
        lines.append("not restored: " + "; ".join(s["faults_not_restored"]))
    lines += [f"FLOOR MISSED: {m}" for m in s.get("floors_missed", ())]
    return "\n".join(line for line in lines if line)


def timelines(obs: Observer, seed: int) -> str:
    """For each violation, what happened before it (faults and churn), with the seed."""
    out = []
    for v in obs.violations:
        out.append(_one(v, obs.timeline, seed))
    return "\n".join(out)


def _one(v: Violation, timeline: list[tuple[float, str]], seed: int) -> str:
    before = [(t, e) for t, e in timeline if t <= v.t][-TIMELINE_BEFORE:]
    t0 = before[0][0] if before else v.t
    lines = [f"-- VIOLATION {v.rule} (seed {seed}): {v.detail}"]
    lines += [f"   +{t - t0:7.1f}s {e}" for t, e in before]
    return "\n".join(lines)


def keep_logs(run_dir: Path, out: Path, seed: int, version: str,
              violations: list[dict[str, Any]], namespace: str) -> str:
    """A failed release's evidence, kept before its cluster goes (the next release reuses the
    run dir): slurmgate's and Slurm's logs copied under `out`, and the binder's lines about the
    jobs and groups the violations name, printed (CI keeps only what is printed)."""
    dest = out / f"chaos-logs-seed{seed}-{version}-{time.strftime('%Y%m%d-%H%M%S')}"
    for src in (run_dir / "bridge" / "log", run_dir / "slurm" / "log"):
        if src.is_dir():
            shutil.copytree(src, dest / src.parent.name, dirs_exist_ok=True)
    text = " ".join(str(v.get("detail", "")) for v in violations)
    marks = {f'"job": {n}' for n in re.findall(r"\bjob (\d+)", text)}
    marks |= {f'"group": "{namespace}/{g}"' for g in re.findall(r"group:(\S+?)[,)]", text)}
    lines = []
    for log in sorted((dest / "bridge").glob("binder*.log")):
        lines += [f"{log.name}: {line}" for line in log.read_text(errors="replace").splitlines()
                  if any(m in line for m in marks)]
    head = f"logs kept in {dest}"
    return "\n".join([head, *lines[-KEPT_LINES_PRINTED:]]) if marks else head
