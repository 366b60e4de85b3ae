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
from bench.chaos.observe import Admin, Observer
from bench.chaos.reads import processes
from cluster import bridge as bridge_mod
from cluster import kube, proc, slurm_cluster, slurm_faults
from cluster.bridge import Bridge
from cluster.local import Local

SETTLE_TIMEOUT = 180.0  # a fault the cluster has not settled from by then is a violation
# A fault that found nothing to kill is tried again at the end of its round, this many times in
# all: what it lacked is mostly a moment's state (a new leader's parse worker not spawned yet,
# no binder leading while a Lease changes hands), and one miss must not fail the run's floor.
SKIP_TRIES = 3


class Skipped(Exception):
    """Nothing there for the fault to kill: it did nothing at all."""


@dataclass
class Injected:
    name: str
    at: float
    down_s: float
    detail: str = ""
    error: str = ""
    skipped: str = ""  # why nothing was injected; such a try does not count as injected

    @property
    def done(self) -> bool:
        """Killed what it was meant to and brought it back."""
        return not self.error and not self.skipped


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

    def _slurmd(self, node: str, down: float) -> str:
        """A node goes down for Slurm (its jobs fail over), then comes back
        (ReturnToService=2 returns it once its slurmd registers)."""
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
        controller would start one. Of several binder replicas the leader is killed (see
        _what_to_kill): a standby takes over once the dead one's Lease expires."""
        proc.kill_and_wait(self.bridge.pids[name], name)
        bridge_mod.start_processes(self.bridge, (name,))
        return name

    def _leader(self) -> str:
        leader = bridge_mod.leading_binder(self.bridge)
        if leader is None:  # killing a standby would not be the fault (the leader's loss)
            raise Skipped("no binder replica leads")
        return leader

    def _leader_worker(self) -> tuple[str, int]:
        # the leader's: a standby polls nothing, so it has no worker (the first replica was
        # taken for the leader, and once the other led this fault found nothing to kill)
        leader = self._leader()
        binder = self.bridge.pids[leader]
        workers = [p for p in processes() if p.ppid == binder and "multiprocessing" in p.cmdline
                   and "resource_tracker" not in p.cmdline]
        if not workers:
            raise Skipped(f"no parse worker running under {leader} (not spawned yet)")
        return leader, workers[0].pid

    def _parse_worker(self) -> str:
        leader, pid = self._leader_worker()
        os.kill(pid, signal.SIGKILL)
        return f"parse worker pid {pid} ({leader})"

    def _what_to_kill(self, name: str, node: str) -> str:
        """What the fault is about to kill, checked alive first: Skipped when there is nothing
        to kill. The kill functions do nothing on a process already gone, and a fault that did
        nothing must not count as injected: it tested nothing."""
        if name in ("slurmctld", "slurmrestd", "slurmd"):
            daemon = f"slurmd-{node}" if name == "slurmd" else name
            run_dir = self.slurm_dir.resolve()  # as slurm_faults.kill_daemon reads it
            if not slurm_cluster.ours(run_dir, slurm_cluster.load(run_dir).pids.get(daemon, 0)):
                raise Skipped(f"{daemon} was not running")
            return daemon
        if name in ("kube-apiserver", "etcd"):
            if not proc.alive(kube.load(self.kube_dir).pids[name]):
                raise Skipped(f"{name} was not running")
            return name
        if name == "parse-worker":
            leader, pid = self._leader_worker()
            return f"parse worker pid {pid} ({leader})"
        target = self._leader() if name == "binder" else name
        if not proc.alive(self.bridge.pids[target]):  # exited; the supervisor starts it again
            raise Skipped(f"{target} was not running")
        return target

    def inject(self, name: str) -> Injected:
        down = round(self.rng.uniform(1.0, 8.0), 1)
        node = ""
        if name == "slurmd":  # long enough for slurmctld to see the node gone
            down = max(down, 5.0)
            node = self.rng.choice(self.local.slurm.nodes)
        # our processes and the parse worker are killed and started again at once
        killed_only = name in ("binder", "webhook", "parse-worker")
        rec = Injected(name, time.time(), 0.0 if killed_only else down)
        try:
            target = self._what_to_kill(name, node)
        except Skipped as e:  # the observer is not told: nothing happened to settle from
            rec.skipped = str(e)
            self.obs.note(f"FAULT {name} skipped, nothing injected: {rec.skipped}")
            return rec
        except Exception as e:
            rec.error = f"checking what to kill: {type(e).__name__}: {e}"[:300]
            self.obs.note(f"FAULT {name} not injected: {rec.error}")
            return rec
        actions: dict[str, Callable[[], str]] = {
            "slurmctld": lambda: self._slurm_daemon("slurmctld", down),
            "slurmrestd": lambda: self._slurm_daemon("slurmrestd", down),
            "slurmd": lambda: self._slurmd(node, down),
            "kube-apiserver": lambda: self._control_plane("kube-apiserver", down),
            "etcd": lambda: self._control_plane("etcd", down),
            "binder": lambda: self._ours(target),
            "webhook": lambda: self._ours("webhook"),
            "parse-worker": self._parse_worker,  # gone since _what_to_kill found it: an error
        }
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
        tries: dict[str, int] = {}
        while self._pause(self.rng.uniform(*self.gap)):
            if not order and self.rounds is not None and self.rounds_done >= self.rounds:
                return  # the short variant: this many rounds, then the run ends
            if not order:  # every fault once per round, in a seeded order
                order = list(self.only)
                self.rng.shuffle(order)
                tries = {}
            rec = self.inject(order.pop())
            self.injected.append(rec)
            if rec.skipped:
                tries[rec.name] = tries.get(rec.name, 0) + 1
                if tries[rec.name] < SKIP_TRIES:
                    order.insert(0, rec.name)  # last in this round (pop takes from the end)
            self.rounds_done += not order
            if not rec.done:
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
