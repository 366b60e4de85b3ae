"""What the chaos observer reads from outside slurmgate: Slurm's queue (squeue), slurmctld's
own log, and the processes the nodes really run (/proc)."""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path

from bench.attribution import ALLOC_LINE, local_epoch
from bench.chaos import invariants as inv
from slurmgate import hostlist


def _epoch(text: str) -> float:
    try:
        return datetime.fromisoformat(text).timestamp()  # squeue prints local time
    except ValueError:
        return 0.0  # N/A, Unknown


def parse_squeue(out: str) -> list[inv.Job]:
    jobs = []
    for line in out.splitlines():
        parts = line.split("|", 6)
        if len(parts) != 7 or not parts[0].strip().isdigit():
            continue
        jid, state, nodes, start, part, name, comment = parts
        try:
            expanded = tuple(hostlist.expand(nodes)) if nodes.strip() else ()
        except ValueError:
            expanded = ()
        jobs.append(inv.Job(int(jid), state, expanded, _epoch(start), part, name, comment))
    return jobs


def starts_in_log(text: str, until: float = float("inf")) -> dict[
        int, tuple[float, tuple[str, ...]]]:
    """Job id -> (when, nodes) of its last start slurmctld logged before `until`: the starts
    it made and may not have saved before a crash, which no squeue sample caught."""
    out: dict[int, tuple[float, tuple[str, ...]]] = {}
    for line in text.splitlines():
        m = ALLOC_LINE.match(line)
        if not m or not m["nodes"] or (when := local_epoch(m["ts"])) >= until:
            continue
        try:
            out[int(m["job"])] = (when, tuple(hostlist.expand(m["nodes"])))
        except ValueError:
            continue
    return out


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


BOOT = _boot_time()
TICK = os.sysconf("SC_CLK_TCK")


def job_processes(conf: str) -> list[inv.JobProc]:
    """The processes the cluster's jobs really run: children of a slurmstepd whose environment
    names this cluster's slurm.conf (another cluster may run on the host), with the job id and
    node Slurm gave them."""
    stat: dict[int, tuple[int, float]] = {}  # pid -> (ppid, start)
    stepds = set()
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            text = (p / "stat").read_text()
            if text[text.index("(") + 1:].startswith("slurmstepd"):
                stepds.add(int(p.name))
        except (OSError, ValueError):
            continue
        f = text[text.rindex(")") + 2:].split()
        stat[int(p.name)] = (int(f[1]), BOOT + int(f[19]) / TICK)
    want = f"SLURM_CONF={conf}"
    out = []
    for pid, (ppid, start) in stat.items():
        if ppid not in stepds:
            continue
        try:
            env = dict(e.split("=", 1) for e in (Path(f"/proc/{pid}/environ").read_bytes()
                       .decode(errors="replace").split("\0")) if "=" in e)
        except OSError:
            continue  # ended meanwhile
        job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
        if f"SLURM_CONF={env.get('SLURM_CONF')}" == want and job.isdigit() and node:
            out.append(inv.JobProc(pid, int(job), node, start, env.get("SLURM_JOB_NAME", "")))
    return out


def processes() -> list[inv.Proc]:
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        out.append(inv.Proc(int(p.name), ppid, cmd.strip()))
    return out
