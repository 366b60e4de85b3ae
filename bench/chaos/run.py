"""One chaos run per Slurm release: a fresh local cluster and bridge, churn + faults + the
observer for the set minutes, then the churn stops, every Pod is deleted and Slurm must be
left with none of our jobs. Imported after __main__ set the run dir and port offset."""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.chaos import report
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
        s["faults_detail"] = [vars(i) for i in faults.injected]
        s["supervisor_restarts"] = faults.restarts
        s["nodes_resumed"] = faults.resumed
        print(report.table(s), flush=True)
        if obs.violations:
            print(report.timelines(obs, a.seed), flush=True)
        return s
    finally:
        if faults is not None:  # however the run ends, its supervisor must not start again
            faults.stop()       # what the teardown stops (an interrupted run left a webhook)
        if not a.keep:
            bridge_mod.down(a.run_dir)
            local_mod.down(a.run_dir)


def main(a: argparse.Namespace) -> int:
    results = []
    for v in a.versions:
        try:
            results.append(one_release(a, v))
        except Exception as e:
            log(f"Slurm {v}: the run itself failed: {type(e).__name__}: {e}")
            results.append({"slurm_version": v, "error": f"{type(e).__name__}: {e}",
                            "violations": []})
    out = Path(a.out) / f"chaos-{time.strftime('%Y%m%d-%H%M%S')}-seed{a.seed}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nresults: {out}", flush=True)
    # a component that did not come back fails the run too: its settling was never judged
    bad = [r for r in results if r.get("error") or r["violations"]
           or r.get("faults_not_restored")]
    return 1 if bad else 0
