"""How many real slurmd does this machine hold? Start the whole local cluster with N nodes,
time it, add up the daemons' memory, sample their idle CPU, stop it."""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from bench import util
from cluster import local as local_mod


def daemon_pids(lc: local_mod.Local) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {"slurmd": [], "slurmctld": [], "slurmrestd": [],
                                    "kube": []}
    for name, pid in lc.slurm.pids.items():
        if name.startswith("slurmd-"):
            groups["slurmd"].append(pid)
        elif name in groups:
            groups[name].append(pid)
    groups["kube"] = list(lc.kube.pids.values())
    return groups


def idle_cpu(pids: list[int], window: float) -> float:
    """CPU cores used by pids over `window` seconds."""
    def total() -> float:
        s = 0.0
        for p in pids:
            try:
                s += util.cpu_seconds(p)
            except OSError:
                pass
        return s
    a = total()
    time.sleep(window)
    return (total() - a) / window


def probe(run_dir: Path, n: int, idle_window: float = 5.0,
          slurm_version: str | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    avail0 = util.mem_available_mib()
    row: dict[str, Any] = {"nodes": n}
    try:
        lc = local_mod.up(run_dir, nodes=n, slurm_version=slurm_version)
    except BaseException as e:
        row.update(ok=False, seconds=round(time.monotonic() - t0, 1),
                   error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}",
                   detail=traceback.format_exc()[-1500:])
        local_mod.down(run_dir)
        return row
    try:
        row["ok"] = True
        row["seconds"] = round(time.monotonic() - t0, 1)
        groups = daemon_pids(lc)
        for g, pids in groups.items():
            rss, pss = util.total_rss(pids)
            row[f"{g}_rss_mib"] = round(rss, 1)
            row[f"{g}_pss_mib"] = round(pss, 1)
        row["slurmd_rss_each_mib"] = round(row["slurmd_rss_mib"] / max(1, n), 2)
        row["slurmd_pss_each_mib"] = round(row["slurmd_pss_mib"] / max(1, n), 2)
        row["idle_cpu_cores_slurm"] = round(idle_cpu(
            groups["slurmd"] + groups["slurmctld"] + groups["slurmrestd"], idle_window), 3)
        row["mem_used_mib"] = round(avail0 - util.mem_available_mib(), 0)
        row["loadavg"] = util.loadavg()
        return row
    finally:
        t1 = time.monotonic()
        local_mod.down(run_dir)
        row["down_seconds"] = round(time.monotonic() - t1, 1)
