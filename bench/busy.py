"""Busy-site benchmark (issue 29): what slurmgate costs a Slurm full of other people's jobs.

    .venv/bin/python -m bench.busy                      # N = 0, 10,000, 50,000 on every release
    .venv/bin/python -m bench.busy --versions 26.05 --background-jobs 0,2000 --window 20

Per Slurm release (--versions, default every release the local cluster runs), a fresh cluster:
--nodes slurmd in slurmgate's partitions (k8s and the others, one kwok Node each) and
--site-nodes more in a partition of their own ("site", no Node stands for them), with
MaxJobCount raised (100,000, or twice the largest N) and MinJobAge 30 s (both only here:
cluster/slurm_conf.SiteLayout). Then per background size N (--background-jobs, ascending,
the background grows from one to the next), side by side in one run:

  background  N standing jobs of users sg-team-a/sg-team-b (accounts team-a/team-b) in "site":
              70 % held, 20 % pending until a begin time a day away, 10 % held arrays of 10
              tasks; submitted in parallel through slurmrestd (bench/busy_load.py). For N > 0,
              churn at --churn R changes/s: short jobs that run on the site's nodes (submit,
              start, end), standing jobs cancelled and submitted again. N = 0 is the quiet site.
  stopped     a --window S cost window with slurmgate (webhook + binder) stopped: the CPU of
              slurmctld, slurmscriptd and slurmrestd from /proc
  lists       still stopped: the binder's two whole lists made directly through slurmgate's
              SlurmClient, 3 times each (the median): Slurm's job list (GET jobs, parsed for
              our jobs only; the binder reads it at start and every BINDER_FULL_LIST_INTERVAL)
              and its node list (GET nodes, the node drift check): wall time, bytes, and the
              CPU of slurmctld + slurmrestd net of the stopped window's rate; amortized over
              their intervals (300 s), that is the binder's one cost that grows with the site
  start       slurmgate started; the windows below wait until the binder has read its first
              whole job list (minutes at 50,000 jobs; its cost is the "lists" figure above)
  idle        slurmgate running, nothing of ours: a window with slurmctld's push hook on, one
              with it off (polls alone): its slurmrestd requests/s, bytes/s and p50/p99 by
              method and endpoint (its slurmgate_{binder,webhook}_slurmrestd_* metrics), its own
              CPU/RSS, and Slurm's CPU minus the stopped window's: what it costs the site (and,
              in a second verdict, that plus both whole lists amortized)
  bound       --nodes marked Pods, all bound (nothing of ours in flight), hook on: a window
              with them in k8s (GraceTime 20 s: each running job of ours is read whole every
              tenth of it, as preemption shows nowhere else) and one with them in hpc (none)
  latency     --pods K marked Pods, hook off then on, in rounds of one per node, each created
              alone: admission, create -> bound, Slurm RUNNING -> noticed -> bound (slurmctld's
              log, the binder's bind log); half of each round's jobs then ended by Slurm (a
              direct cancel): how long until the binder evicts the Pod
  floors      K unmarked Pods (admission, kube-scheduler's create -> bound); K jobs of the
              placeholder's shape submitted, run and cancelled directly through slurmrestd
              (Slurm's submit -> RUNNING; the submit and cancel slurmgate's own are held to:
              its POST job/submit and DELETE job/{id}, apart from its GET job/{id} reads)
  in flight   K marked Pods at once (one per node bound, the rest gated) and a cost window;
              then, still in flight, 20 s of the binder's state reads beside the same read made
              directly on the same ids (the ratio of their p99s is the binder's own: the
              moment's load shows in both)

A Markdown table per release on stdout (a column per N, then requests by endpoint, then the
verdicts against issue 29's targets), and everything in bench/results/busy-<time>.json.

The bench runs its own cluster: run dir --run-dir (default /tmp/slurmgate-busy) and port
offset $SLURMGATE_PORT_OFFSET (default 4000), never the default cluster's; every daemon is
stopped by PID at the end of each release. The binder reads Slurm's whole job list at its
product default (SLURMGATE_FULL_LIST_INTERVAL, which the local cluster otherwise shortens for
the tests).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench import util
from cluster import slurm_release

DEFAULT_RUN_DIR = Path("/tmp/slurmgate-busy")
PORT_OFFSET = 4000
DEFAULT_BACKGROUND = (0, 10_000, 50_000)


def _counts(ap: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        out = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        ap.error(f"--background-jobs: comma-separated whole numbers, not {text!r}")
    if not out or out[0] < 0:
        ap.error(f"--background-jobs: at least one number, none below 0 (got {text!r})")
    return out


def _versions(ap: argparse.ArgumentParser, text: str | None) -> list[str]:
    if text is None:
        return list(slurm_release.RELEASES)
    out = list(dict.fromkeys(v.strip() for v in text.split(",") if v.strip()))
    bad = [v for v in out if v not in slurm_release.RELEASES]
    if not out or bad:
        ap.error(f"--versions: {', '.join(bad) or 'none given'}; the local cluster runs "
                 f"{', '.join(slurm_release.RELEASES)}")
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.busy",
                                 description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--background-jobs", default=",".join(map(str, DEFAULT_BACKGROUND)),
                    help="foreign jobs standing, one segment each, ascending "
                         "(default %(default)s)")
    ap.add_argument("--churn", type=float, default=5.0,
                    help="foreign changes per second while N > 0 (default %(default)s)")
    ap.add_argument("--versions", default=None,
                    help=f"Slurm releases, one after the other (default all: "
                         f"{','.join(slurm_release.RELEASES)})")
    ap.add_argument("--pods", type=int, default=16, help="our marked Pods (default %(default)s)")
    ap.add_argument("--latency-pods", type=int, default=32,
                    help="marked Pods made one at a time with the hook on, as many direct jobs "
                         "between their rounds: the samples of the submit, cancel and RUNNING "
                         "-> bound p99s (default %(default)s)")
    ap.add_argument("--window", type=float, default=30.0,
                    help="seconds of each cost window (default %(default)s)")
    ap.add_argument("--nodes", type=int, default=4,
                    help="slurmd in slurmgate's partitions (default %(default)s)")
    ap.add_argument("--site-nodes", type=int, default=4,
                    help="slurmd in the site's own partition (default %(default)s)")
    ap.add_argument("--concurrency", type=int, default=32,
                    help="parallel submitters of the background (default %(default)s)")
    ap.add_argument("--run-dir", type=Path, default=DEFAULT_RUN_DIR)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    a = ap.parse_args(argv)
    a.background_jobs = _counts(ap, a.background_jobs)
    a.versions = _versions(ap, a.versions)
    if a.churn < 0:
        ap.error(f"--churn: changes per second, 0 or more, not {a.churn}")
    if a.window <= 0:
        ap.error(f"--window: seconds above 0, not {a.window}")
    for flag, v in (("--pods", a.pods), ("--latency-pods", a.latency_pods),
                    ("--nodes", a.nodes), ("--site-nodes", a.site_nodes),
                    ("--concurrency", a.concurrency)):
        if v < 1:
            ap.error(f"{flag}: at least 1, not {v}")
    return a


def product_full_list_interval() -> str | None:
    """The binder's own default for reading the whole job list, where it has one."""
    from slurmgate.binder.config import ReconcileSettings

    v = getattr(ReconcileSettings(), "full_list_interval", None)
    return None if v is None else str(v)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    # under a busy Slurm the host is loaded; a binder that misses its Lease exits by design
    os.environ.setdefault("SLURMGATE_LEASE_SECONDS", "60")
    full = product_full_list_interval()
    if full is not None:
        os.environ.setdefault("SLURMGATE_FULL_LIST_INTERVAL", full)
    if not util.use_own_cluster(a.run_dir, port_offset=PORT_OFFSET):
        return 2
    from bench import busy_run  # after the environment is set (cluster.local reads it)

    return busy_run.main(a)


if __name__ == "__main__":
    sys.exit(main())
