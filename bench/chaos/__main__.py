"""python -m bench.chaos [--minutes 20] [--seed N] [--versions 26.05,24.11,22.05]

Runs on its own cluster (run dir and ports apart from the default one), so it never touches
a cluster `make demo` left running. Exit code 1 when any invariant was violated or the run fell
short of a floor (bench/chaos/floor.py). The seed and the command that replays the run are
printed first, and again with each release's figures and in the JSON."""

from __future__ import annotations

import argparse
import os
import random
import sys
from pathlib import Path

from bench import util
from bench.chaos import FAULTS
from bench.chaos.floor import MIN_PODS_BOUND, MIN_PODS_CREATED


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.chaos")
    ap.add_argument("--minutes", type=float, default=20.0)
    ap.add_argument("--seed", type=int, default=None, help="default: a random one, printed")
    ap.add_argument("--versions", default=os.environ.get("SLURM_VERSION", "26.05"),
                    help="comma-separated Slurm releases, one run each")
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=None,
                    help="end after this many rounds (every fault once a round), if sooner")
    ap.add_argument("--gap", type=float, nargs=2, default=(10.0, 30.0), metavar=("MIN", "MAX"),
                    help="quiet seconds before each fault, drawn between MIN and MAX")
    ap.add_argument("--binders", type=int, choices=(1, 2), default=2,
                    help="binder replicas (with two, the binder fault kills the leader)")
    ap.add_argument("--pods", type=int, default=6, help="marked Pods kept alive by the churn")
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help=f"which to inject (default all: {','.join(FAULTS)}); each must be "
                    "injected at least once, else the run fails")
    ap.add_argument("--min-pods-created", type=int, default=MIN_PODS_CREATED,
                    help="fewer created fails the run (default sized for one short round)")
    ap.add_argument("--min-pods-bound", type=int, default=MIN_PODS_BOUND,
                    help="fewer Pods ever bound to a Node fails the run")
    ap.add_argument("--run-dir", type=Path, default=Path("/tmp/slurmgate-chaos"))
    ap.add_argument("--out", type=Path, default=Path.home() / ".cache" / "slurmgate" / "chaos")
    ap.add_argument("--keep", action="store_true", help="leave the cluster running")
    return ap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = parser()
    a = ap.parse_args(argv)
    a.versions = [v for v in a.versions.split(",") if v]
    unknown = set(a.faults.split(",")) - set(FAULTS)
    if unknown:
        ap.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1 << 31)
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if not util.use_own_cluster(a.run_dir, port_offset=3000):
        return 2
    # The binder parses a job list bigger than this in its worker process (slurmgate.jsonpool).
    # This cluster's lists are a few kB, under the 256 kB default, so the worker seldom existed
    # and the parse-worker fault mostly found nothing to kill; with this it always has one.
    os.environ.setdefault("SLURMGATE_JSON_OFFLOAD_BYTES", "2048")
    from bench.chaos import run  # only now: cluster.local reads the environment at import

    return run.main(a)


if __name__ == "__main__":
    sys.exit(main())
