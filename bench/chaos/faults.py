"""What a chaos run kills, and how each comes back: the way a site's supervisor would restart
it (slurmctld keeps its saved state, the control plane keeps its data, the binder and webhook
start again from nothing but the cluster)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.chaos import FAULTS
from bench.chaos.observe import Admin, Observer, processes
from cluster import bridge as bridge_mod
from cluster import kube, proc, slurm_faults
from cluster.bridge import Bridge
from cluster.local import Local

SETTLE_TIMEOUT = 180.0  # a fault the cluster has not settled from by then is a violation


@dataclass
class Injected:
    name: str
    at: float
    down_s: float
    detail: str = ""
    error: str = ""


class FaultDriver(threading.Thread):
    """One fault at a time: a quiet gap, a kill, the restart, then wait until the observer
    sees the cluster settled (or report that it did not)."""

    def __init__(self, local: Local, bridge: Bridge, obs: Observer, rng: random.Random,
                 gap: tuple[float, float] = (10.0, 30.0), only: tuple[str, ...] = FAULTS,
                 rounds: int | None = None) -> None:
        super().__init__(daemon=True, name="chaos-faults")
        self.local, self.bridge, self.obs, self.rng = local, bridge, obs, rng
        self.gap, self.only, self.rounds = gap, only, rounds
        self.rounds_done = 0
        self.injected: list[Injected] = []
        self.restarts: dict[str, int] = {}  # exits of our own the supervisor restarted
        self.resumed: list[str] = []  # nodes Slurm kept out after a fault, resumed as an admin
        self.stop_flag = threading.Event()
        self.admin = Admin(self.local)
        self.slurm_dir = Path(self.local.slurm.run_dir)
        self.kube_dir = Path(self.local.kube.run_dir)

    # --- the faults: each returns what it did, and has brought the component back
    def _slurm_daemon(self, name: str, down: float) -> str:
        slurm_faults.kill_daemon(self.slurm_dir, name)
        time.sleep(down)
        slurm_faults.start_daemon(self.slurm_dir, name)
        return name

    def _slurmd(self, down: float) -> str:
        """A node goes down for Slurm (its jobs fail over), then comes back
        (ReturnToService=2 returns it once its slurmd registers)."""
        node = self.rng.choice(self.local.slurm.nodes)
        slurm_faults.kill_daemon(self.slurm_dir, f"slurmd-{node}")
        self.obs.slurmd_killed(node)  # evidence for the double-booking verdicts
        self._slurm("scontrol", "update", f"nodename={node}", "state=down", "reason=chaos")
        time.sleep(down)
        try:
            slurm_faults.start_daemon(self.slurm_dir, f"slurmd-{node}", timeout=45)
        except proc.NotReady:
            # slurmd runs and registered, yet Slurm keeps the node out: it drained the node
            # itself (a controller restarted on an old state reused a job id the node still
            # ran: "Duplicate jobid"). A site's admin resumes it; the report says so.
            state = self._slurm("sinfo", "-h", "-n", node, "-o", "%T %E").strip()
            self.obs.note(f"RESUMED {node}, which Slurm had left as: {state}")
            self.resumed.append(f"{node}: {state}")
            self._slurm("scontrol", "update", f"nodename={node}", "state=resume")
            proc.wait_until(f"{node} resumed", lambda: self._slurm(
                "sinfo", "-h", "-n", node, "-o", "%t").strip().rstrip("*") in (
                "idle", "alloc", "mix"), 45)
        return f"slurmd-{node}"

    def _slurm(self, *args: str) -> str:
        argv, env = self.local.slurm.command(*args)
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20,
                              check=False).stdout

    def _control_plane(self, name: str, down: float) -> str:
        kube.kill_daemon(self.kube_dir, name)
        time.sleep(down)
        kube.start_daemon(self.kube_dir, name)
        deadline = time.monotonic() + 120
        while True:  # etcd back is not the API server serving again
            try:
                self.admin.raw("GET", "/readyz", timeout=5)  # plain text "ok"
                return name
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def _ours(self, name: str) -> str:
        """SIGKILL, as an OOM kill or a node loss does; then a new process, as a Deployment's
        controller would start one. Of several binder replicas the leader is killed: a standby
        takes over once the dead one's Lease expires."""
        if name == "binder":
            name = bridge_mod.leading_binder(self.bridge) or "binder"
        proc.kill_and_wait(self.bridge.pids[name], name)
        bridge_mod.start_processes(self.bridge, (name,))
        return name

    def _parse_worker(self) -> str:
        # the leader's: a standby polls nothing, so it has no worker (the first replica was
        # taken for the leader, and once the other led this fault found nothing to kill)
        leader = bridge_mod.leading_binder(self.bridge) or "binder"
        binder = self.bridge.pids[leader]
        workers = [p for p in processes() if p.ppid == binder and "multiprocessing" in p.cmdline
                   and "resource_tracker" not in p.cmdline]
        if not workers:
            return "no parse worker running (not spawned yet)"
        os.kill(workers[0].pid, signal.SIGKILL)
        return f"parse worker pid {workers[0].pid} ({leader})"

    def inject(self, name: str) -> Injected:
        down = round(self.rng.uniform(1.0, 8.0), 1)
        if name == "slurmd":  # long enough for slurmctld to see the node gone
            down = max(down, 5.0)
        actions: dict[str, Callable[[], str]] = {
            "slurmctld": lambda: self._slurm_daemon("slurmctld", down),
            "slurmrestd": lambda: self._slurm_daemon("slurmrestd", down),
            "slurmd": lambda: self._slurmd(down),
            "kube-apiserver": lambda: self._control_plane("kube-apiserver", down),
            "etcd": lambda: self._control_plane("etcd", down),
            "binder": lambda: self._ours("binder"),
            "webhook": lambda: self._ours("webhook"),
            "parse-worker": self._parse_worker,
        }
        # our processes and the parse worker are killed and started again at once
        killed_only = name in ("binder", "webhook", "parse-worker")
        rec = Injected(name, time.time(), 0.0 if killed_only else down)
        self.obs.fault_started(name)
        self.obs.note(f"FAULT {name} (down {rec.down_s}s)")
        try:
            rec.detail = actions[name]()
        except Exception as e:  # a component that did not come back is reported, not hidden
            rec.error = f"{type(e).__name__}: {e}"[:300]
            self.obs.note(f"FAULT {name} restore failed: {rec.error}")
        self.obs.fault_ended(name)
        self.obs.note(f"FAULT {name} restored")
        return rec

    def supervise(self) -> None:
        """Start again a binder or webhook that exited on its own, as a Deployment would (a
        binder that cannot renew its Lease while the API server is away exits by design)."""
        for name in ("webhook", *bridge_mod.BINDERS):
            pid = self.bridge.pids.get(name)
            if pid is not None and not proc.alive(pid):
                proc.reap(pid)
                self.obs.note(f"SUPERVISOR {name} pid {pid} had exited: started again")
                self.restarts[name] = self.restarts.get(name, 0) + 1
                try:
                    bridge_mod.start_processes(self.bridge, (name,))
                except Exception as e:
                    self.obs.note(f"SUPERVISOR {name} did not come back: {e}"[:300])

    def _pause(self, seconds: float) -> bool:
        """Wait, supervising meanwhile; False once asked to stop."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if self.stop_flag.wait(min(0.5, max(0.0, end - time.monotonic()))):
                return False
            self.supervise()
        return True

    def run(self) -> None:
        order: list[str] = []
        while self._pause(self.rng.uniform(*self.gap)):
            if not order and self.rounds is not None and self.rounds_done >= self.rounds:
                return  # the short variant: this many rounds, then the run ends
            if not order:  # every fault once per round, in a seeded order
                order = list(self.only)
                self.rng.shuffle(order)
            rec = self.inject(order.pop())
            self.injected.append(rec)
            self.rounds_done += not order
            if rec.error:
                continue
            deadline = time.monotonic() + SETTLE_TIMEOUT
            while self.obs.pending_fault is not None and not self.stop_flag.is_set():
                if time.monotonic() > deadline:
                    self.obs.violate_unsettled(rec.name, SETTLE_TIMEOUT)
                    break
                self._pause(0.5)

    def stop(self) -> None:
        self.stop_flag.set()
        if self.is_alive():  # also called on a run that failed before it started
            self.join(300)
