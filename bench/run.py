"""slurmgate benchmarks against the real local cluster (run on demand; not part of `make test`).

    make bench                                   # = .venv/bin/python -m bench.run --profile
    .venv/bin/python -m bench.run --quick        # a tiny run of every phase (about a minute)
    .venv/bin/python -m bench.run --versions 26.05 --sizes 100,500 --nodes 500
    .venv/bin/python -m bench.run --scale --nodes 1000 --profile   # adds the 1,000-Pod burst

The whole bench runs once per Slurm release (--versions, default every release the local
cluster runs; --quick: only $SLURM_VERSION, else the newest), one after the other, each on a
fresh cluster. Bursts are 100 and 500 Pods by default (what 2 cores can tell apart); --scale
adds 1,000, and --sizes replaces the list.

Phases of each release's run, all in one run so that ratios compare like with like on a noisy
machine:
  1. node probe: how many real slurmd fit (start time, RSS/PSS, idle CPU), counts up to the
     largest burst -- skipped with --nodes
  2. admission: p50/p95/p99 of unmarked vs marked Pod creates (client side, kube-apiserver's
     apiserver_admission_webhook_admission_duration_seconds, the webhook's own histogram), and
     creates/s through one webhook replica with concurrent creators
  3. per burst size: kube-scheduler floor (unmarked Pods, create -> bound), Slurm floor (REST
     submit of the same exclusive job -> RUNNING), then slurmgate (create -> bound, Slurm
     RUNNING -> bound from the binder's histogram and from our own watch + poll), binder CPU
     and RSS, and an idle window (reconciles and CPU with every Pod bound and nothing changing)
  4. a table on stdout naming the release, and bench/results/bench-<time>-slurm-<release>.json
Then a short summary across releases (overheads, RUNNING noticed -> bound, admission ratio,
target verdicts) on stdout and in bench/results/bench-<time>-summary.json.

A burst larger than the node count is run with churn (each Pod deleted once bound, each floor
job cancelled once RUNNING), so it measures sustained throughput, not a one-shot burst; the
table says so.

The benchmark runs its own cluster: run dir --run-dir (default /tmp/slurmgate-bench) and port
offset $SLURMGATE_PORT_OFFSET (default 2000), never the default cluster's; its daemons are
stopped by PID at the end (--keep leaves the last release's running).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

# cluster.slurm_release reads no environment at import (cluster.local does), so the versions
# can be checked here before the environment is set
from bench import util
from cluster import slurm_cluster, slurm_release

DEFAULT_RUN_DIR = Path("/tmp/slurmgate-bench")
DEFAULT_SIZES = (100, 500)
SCALE_SIZE = 1000
QUICK_SIZES = (10, 20)
# bursts start half a second after slurmctld's tick: the mean wait of a burst arriving at random
DEFAULT_PHASE = 0.5
# node counts the probe tries, smallest first; capped at the largest burst (more nodes than
# Pods measure nothing the bursts use)
PROBE_LADDER = (50, 100, 200, 400, 1000)


def _ints(ap: argparse.ArgumentParser, flag: str, text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ap.error(f"{flag}: comma-separated whole numbers, not {text!r}")
    if not out or min(out) <= 0:
        ap.error(f"{flag}: at least one number, all above 0 (got {text!r})")
    return out


def _versions(ap: argparse.ArgumentParser, text: str) -> list[str]:
    out: list[str] = []
    for v in (x.strip() for x in text.split(",")):
        if v and v not in out:
            out.append(v)
    bad = [v for v in out if v not in slurm_release.RELEASES]
    if not out or bad:
        ap.error(f"--versions: {', '.join(bad) or 'none given'}; the local cluster runs "
                 f"{', '.join(slurm_release.RELEASES)}")
    return out


def probe_counts(sizes: list[int]) -> list[int]:
    """The default probe: the ladder below the largest burst, then the largest burst itself,
    so the bursts can get one node per Pod when the machine holds that many."""
    top = max(sizes)
    return [n for n in PROBE_LADDER if n < top] + [top]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a tiny run of each phase, on one release unless --versions")
    ap.add_argument("--sizes", default=None,
                    help=f"burst sizes (default {','.join(map(str, DEFAULT_SIZES))})")
    ap.add_argument("--scale", action="store_true",
                    help=f"add the {SCALE_SIZE:,}-Pod burst to the default sizes")
    ap.add_argument("--versions", default=None,
                    help=f"Slurm releases, run one after the other (default all: "
                         f"{','.join(slurm_release.RELEASES)})")
    ap.add_argument("--nodes", type=int, default=None,
                    help="Slurm nodes for the bursts (skips the node probe)")
    ap.add_argument("--probe", default=None,
                    help="node counts to probe (default: 50,100,200,400 up to the largest "
                         "burst, then the largest burst)")
    ap.add_argument("--max-nodes", type=int, default=1000,
                    help="never start more slurmd than this")
    ap.add_argument("--concurrency", type=int, default=32, help="concurrent creators")
    ap.add_argument("--idle-window", type=float, default=None,
                    help="seconds of the idle reconcile window (default 65: one full resync)")
    ap.add_argument("--admission-pods", type=int, default=None)
    ap.add_argument("--profile", action="store_true",
                    help="py-spy the webhook (admission) and the binder (largest burst)")
    ap.add_argument("--phase", type=float, default=DEFAULT_PHASE,
                    help="start the Slurm floor's and slurmgate's bursts at this fraction of "
                         "a wall-clock second, where slurmctld's one-second tick falls alike "
                         f"for both (default {DEFAULT_PHASE}; --no-phase: whenever ready)")
    ap.add_argument("--no-phase", dest="phase", action="store_const", const=None)
    ap.add_argument("--slurmd-nice", type=int, default=0,
                    help="run every slurmd, and so every job, at this nice(1) level (0-19): "
                         "here the slurmd share the control plane's cores, at a site they "
                         "have machines of their own")
    ap.add_argument("--split-cpus", action="store_true",
                    help="Slurm's daemons and jobs on one half of the CPUs, Kubernetes and "
                         "slurmgate on the other (bench/cpusplit.py), as if the slurmd had "
                         "machines of their own")
    ap.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    ap.add_argument("--keep", action="store_true",
                    help="leave the (last release's) cluster running")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args(argv)
    if a.quick and a.scale:
        ap.error("--quick and --scale contradict each other (--sizes sets any sizes)")
    if a.phase is not None and not 0 <= a.phase < 1:
        ap.error(f"--phase: a fraction of a second in [0, 1), not {a.phase}")
    if not 0 <= a.slurmd_nice <= 19:
        ap.error(f"--slurmd-nice: 0..19 (nice(1)'s range), not {a.slurmd_nice}")
    if a.sizes is not None:
        a.sizes = _ints(ap, "--sizes", a.sizes)
    elif a.quick:
        a.sizes = list(QUICK_SIZES)
    else:
        a.sizes = [*DEFAULT_SIZES, *([SCALE_SIZE] if a.scale else [])]
    if a.versions is not None:
        a.versions = _versions(ap, a.versions)
    elif a.quick:
        # the release `make test-matrix` and the cluster tooling pick ($SLURM_VERSION, else
        # the newest), so the bench smoke test runs on the release under test
        a.versions = [_versions(ap, os.environ.get(slurm_release.VERSION_ENV)
                                or slurm_release.NEWEST)[0]]
    else:
        a.versions = list(slurm_release.RELEASES)
    a.probe = _ints(ap, "--probe", a.probe) if a.probe else probe_counts(a.sizes)
    if a.quick:
        a.nodes = a.nodes or 20
        a.idle_window = a.idle_window or 5.0
        a.admission_pods = a.admission_pods or 20
    a.idle_window = a.idle_window or 65.0
    a.admission_pods = a.admission_pods or 100
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    # at load average 200 (1,000 placeholder jobs starting on 2 cores) the apiserver stalls
    # for over 15 s; a binder that cannot renew its Lease exits by design, and here nothing
    # would restart it. A real Deployment restarts it; the bench keeps it with a longer Lease.
    os.environ.setdefault("SLURMGATE_LEASE_SECONDS", "120")
    os.environ[slurm_cluster.SLURMD_NICE_ENV] = str(a.slurmd_nice)
    if not util.use_own_cluster(a.run_dir, port_offset=2000):
        return 2
    from bench import suite  # after the environment is set

    return suite.main(a)


if __name__ == "__main__":
    sys.exit(main())
