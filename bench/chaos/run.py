"""One chaos run per Slurm release: a fresh local cluster and bridge, churn + faults + the
observer for the set minutes, then the churn stops, every Pod is deleted and Slurm must be
left with none of our jobs. Imported after __main__ set the run dir and port offset."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.chaos import floor, report
from bench.chaos.churn import CHAOS_LABEL, Churn
from bench.chaos.faults import FaultDriver
from bench.chaos.observe import Admin, Observer
from cluster import bridge as bridge_mod
from cluster import local as local_mod

NAMESPACE = "chaos"
DRAIN_TIMEOUT = 120.0  # after the last delete, Slurm must be free of our jobs by then


def log(msg: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _drained(obs: Observer) -> bool:
    s = obs.snapshot()
    return not s.pods and not [j for j in s.jobs if j.claim]


def one_release(a: argparse.Namespace, version: str) -> dict[str, Any]:
    lc = local_mod.up(a.run_dir, nodes=a.nodes, slurm_version=version)
    faults: FaultDriver | None = None
    try:
        b = bridge_mod.up(lc, binders=a.binders)
        Admin(lc).call("POST", "/api/v1/namespaces",
                       {"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": NAMESPACE}})
        lock = threading.Lock()
        deleted: set[str] = set()
        # every random choice of the run is drawn from this (the churn's and the fault
        # driver's streams seeded from it), afresh for each release
        rng = random.Random(a.seed)
        obs = Observer(lc, [NAMESPACE], CHAOS_LABEL, sys.executable, deleted, lock,
                       ready=lambda: bridge_mod.components_ready(b))
        churn = Churn(lc, NAMESPACE, f"chaos-{a.seed}", random.Random(rng.random()), obs,
                      deleted, lock, target=a.pods)
        faults = FaultDriver(lc, b, obs, random.Random(rng.random()), gap=a.gap,
                             only=tuple(a.faults.split(",")), rounds=a.rounds)
        log(f"Slurm {version}: churn and faults for {a.minutes} min"
            f"{f' or {a.rounds} round(s) of faults' if a.rounds else ''} (seed {a.seed})")
        obs.start()
        churn.start()
        faults.start()
        end = time.monotonic() + a.minutes * 60
        while time.monotonic() < end and faults.is_alive():
            time.sleep(1)
        faults.stop()
        churn.stop()
        log("churn stopped; deleting every Pod and waiting for Slurm to be free of our jobs")
        churn.delete_all()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while True:
            try:
                if _drained(obs):
                    break
            except Exception:
                pass
            if time.monotonic() > deadline:
                obs._violate("not drained", f"Pods or placeholder jobs left {DRAIN_TIMEOUT:.0f}s "
                             "after every Pod was deleted", "drain")
                break
            time.sleep(1)
        obs.stop()
        obs.final_checks()
        s = report.summary(version, a.seed, a.minutes, churn.stats, faults.injected, obs)
        s["replay"] = report.replay_command(a, [version])
        s["faults_detail"] = [vars(i) for i in faults.injected]
        s["supervisor_restarts"] = faults.restarts
        s["nodes_resumed"] = faults.resumed
        s["floor"] = floor.Floor(a.min_pods_created, a.min_pods_bound,
                                 tuple(a.faults.split(",")))
        s["floors_missed"] = floor.missed(s, s["floor"])
        print(report.table(s), flush=True)
        if obs.violations:
            print(report.timelines(obs, a.seed), flush=True)
            print(report.keep_logs(a.run_dir, a.out, a.seed, version, s["violations"],
                                   NAMESPACE), flush=True)
        return s
    finally:
        if faults is not None:  # however the run ends, its supervisor must not start again
            faults.stop()       # what the teardown stops (an interrupted run left a webhook)
        if not a.keep:
            bridge_mod.down(a.run_dir)
            local_mod.down(a.run_dir)


def _json(x: object) -> object:
    """The floor (a dataclass) as its fields; anything else JSON lacks as text."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.asdict(x)
    return str(x)


def main(a: argparse.Namespace) -> int:
    # first, so that a run that dies or hangs can still be replayed
    print(f"chaos seed {a.seed}; replay: {report.replay_command(a)}", flush=True)
    results = []
    for v in a.versions:
        try:
            results.append(one_release(a, v))
        except Exception as e:
            log(f"Slurm {v}: the run itself failed: {type(e).__name__}: {e}")
            results.append({"slurm_version": v, "seed": a.seed,
                             "replay": report.replay_command(a, [v]),
                             "error": f"{type(e).__name__}: {e}", "violations": []})
    out = Path(a.out) / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}-seed{a.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=_json))
    print(f"\nresults: {out}", flush=True)
    bad = {r["slurm_version"]: why for r in results if (why := floor.failures(r))}
    for version, why in bad.items():
        print(f"chaos FAILED on Slurm {version}: {'; '.join(why)}", flush=True)
    print(f"chaos {'FAILED' if bad else 'passed'} (seed {a.seed}); replay: "
          f"{report.replay_command(a, list(bad) or None)}", flush=True)
    return 1 if bad else 0
