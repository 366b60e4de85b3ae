"""slurmgate benchmarks against the real local cluster (run on demand; not part of `make test`).

    make bench                                   # = .venv/bin/python -m bench.run
    .venv/bin/python -m bench.run --quick        # a tiny run of every phase (about a minute)
    .venv/bin/python -m bench.run --sizes 100,500,1000 --nodes 1000 --profile

Phases, all in one run so that ratios compare like with like on a noisy machine:
  1. node probe: how many real slurmd fit (start time, RSS/PSS, idle CPU) -- skipped with --nodes
  2. admission: p50/p95/p99 of unmarked vs marked Pod creates (client side, kube-apiserver's
     apiserver_admission_webhook_admission_duration_seconds, the webhook's own histogram), and
     creates/s through one webhook replica with concurrent creators
  3. per burst size: kube-scheduler floor (unmarked Pods, create -> bound), Slurm floor (REST
     submit of the same exclusive job -> RUNNING), then slurmgate (create -> bound, Slurm
     RUNNING -> bound from the binder's histogram and from our own watch + poll), binder CPU
     and RSS, and an idle window (reconciles and CPU with every Pod bound and nothing changing)
  4. a table on stdout and bench/results/bench-<time>.json

A burst larger than the node count is run with churn (each Pod deleted once bound, each floor
job cancelled once RUNNING), so it measures sustained throughput, not a one-shot burst; the
table says so.

The benchmark runs its own cluster: run dir --run-dir (default /tmp/slurmgate-bench) and port
offset $SLURMGATE_PORT_OFFSET (default 2000), never the default cluster's; its daemons are
stopped by PID at the end (--keep leaves them running).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

DEFAULT_RUN_DIR = Path("/tmp/slurmgate-bench")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny run of each phase")
    ap.add_argument("--sizes", default=None, help="burst sizes, e.g. 100,500,1000")
    ap.add_argument("--nodes", type=int, default=None,
                    help="Slurm nodes for the bursts (skips the node probe)")
    ap.add_argument("--probe", default=None,
                    help="node counts to probe, e.g. 50,100,200,400,1000")
    ap.add_argument("--max-nodes", type=int, default=1000,
                    help="never start more slurmd than this")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent creators")
    ap.add_argument("--idle-window", type=float, default=None,
                    help="seconds of the idle reconcile window (default 65: one full resync)")
    ap.add_argument("--admission-pods", type=int, default=None)
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the webhook (admission) and the binder (largest burst)")
    ap.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args(argv)
    if a.quick:
        a.sizes = a.sizes or "10,20"
        a.nodes = a.nodes or 20
        a.idle_window = a.idle_window or 5.0
        a.admission_pods = a.admission_pods or 20
    a.sizes = [int(x) for x in (a.sizes or "100,500,1000").split(",") if x]
    a.idle_window = a.idle_window or 65.0
    a.admission_pods = a.admission_pods or 100
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    # Our own cluster, never the default one: cluster.local reads these at import time.
    os.environ.setdefault("SLURMGATE_PORT_OFFSET", "2000")
    os.environ["SLURMGATE_RUN_DIR"] = str(a.run_dir)
    # at load average 200 (1,000 placeholder jobs starting on 2 cores) the apiserver stalls
    # for over 15 s; a binder that cannot renew its Lease exits by design, and here nothing
    # would restart it. A real Deployment restarts it; the bench keeps it with a longer Lease.
    os.environ.setdefault("SLURMGATE_LEASE_SECONDS", "120")
    if a.run_dir.resolve() == Path("/tmp/slurmgate") or os.environ["SLURMGATE_PORT_OFFSET"] == "0":
        print("refusing to run on the default cluster's run dir or ports", file=sys.stderr)
        return 2
    from bench import suite  # after the environment is set

    return suite.main(a)


if __name__ == "__main__":
    sys.exit(main())
