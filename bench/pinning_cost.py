"""What slurmgate-runc (pinning/) adds to a container's `create`, side by side in one run:
runc's command line through the Node's launcher and `python -m slurmgate.pinning` for an
unmarked container, against the same call to runc alone; and, in process, what a marked one
adds (its placeholder job's cgroup and process read from stand-in trees). runc is a stand-in
that exits at once, so the figures are the wrapper's own; every call but `create` skips Python
(the launcher).

    .venv/bin/python -m bench.pinning_cost [--n 30]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

from cluster.realnode_conf import runc_launcher
from slurmgate import contract
from slurmgate.pinning import placeholder
from slurmgate.pinning.spec import CRI_NAME, CRI_NAMESPACE, pin


def _timed(argv: list[str], n: int, env: dict[str, str]) -> tuple[float, float]:
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        xs.append((time.perf_counter() - t0) * 1000)
    xs.sort()
    return statistics.median(xs), xs[int(0.95 * (len(xs) - 1))]


def _pin_marked(d: Path, n: int) -> tuple[float, float]:
    """pin() on a marked container's spec, its job's cgroup and process in stand-in trees (as
    slurmd and /proc lay them out): what the marked path adds to the Python start above."""
    job = d / "cg" / "cpuset" / "slurm_n2" / "uid_0" / "job_12"
    (job / "step_batch").mkdir(parents=True)
    (job / "cpuset.cpus").write_text("1\n")
    (job / "step_batch" / "cgroup.procs").write_text("4242\n")
    (d / "proc" / "4242").mkdir(parents=True)
    (d / "proc" / "4242" / "environ").write_bytes(b"SLURM_JOB_ID=12\0SLURM_JOB_NAME=k8s:a/web")
    find = partial(placeholder.find, within=0.0, root=d / "cg", proc=d / "proc")
    xs = []
    for _ in range(n):
        spec = {"annotations": {CRI_NAME: "web", CRI_NAMESPACE: "a", contract.A_JOB_ID: "12",
                                contract.A_SLURM_NODE: "n2"}}
        t0 = time.perf_counter()
        pin(spec, frozenset({"n2"}), find)
        xs.append((time.perf_counter() - t0) * 1000)
    xs.sort()
    return statistics.median(xs), xs[int(0.95 * (len(xs) - 1))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pinning_cost")
    ap.add_argument("--n", type=int, default=30)
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        runc = d / "runc"
        runc.write_text("#!/bin/sh\nexit 0\n")
        runc.chmod(0o755)
        launcher = d / "slurmgate-runc"
        launcher.write_text(runc_launcher(sys.executable, str(runc), ["n2"]))
        launcher.chmod(0o755)
        bundle = d / "bundle"
        bundle.mkdir()
        plain = {"ociVersion": "1.0.2", "annotations": {CRI_NAME: "web", CRI_NAMESPACE: "a"}}
        (bundle / "config.json").write_text(json.dumps(plain))
        env = dict(os.environ)
        create = ["create", "--bundle", str(bundle), "c1"]
        rows = [("runc alone, create", _timed([str(runc), *create], a.n, env)),
                ("launcher, state (no Python)", _timed([str(launcher), "state", "c1"], a.n,
                                                       env)),
                ("launcher, create, unmarked container", _timed([str(launcher), *create], a.n,
                                                                 env))]
        rows.append(("pin() in process, marked container (its job's tree read)",
                     _pin_marked(d, a.n)))
    print(f"slurmgate-runc, {a.n} calls each: median / p95 ms")
    for name, (med, p95) in rows:
        print(f"  {name:<55} {med:7.1f} / {p95:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
