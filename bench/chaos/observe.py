"""Snapshots of the cluster every ~0.5 s, the invariants applied to each, and the time the
cluster takes to settle after each fault. Runs in its own thread beside the churn and the
fault driver."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos import invariants as inv
from bench.chaos.reads import job_processes, parse_squeue, processes, starts_in_log
from cluster.local import Local, k8s_node_name

SQUEUE_FORMAT = "%i|%T|%N|%S|%P|%j|%k"

# How long each condition may last before it is a violation, counted from when it was first
# seen or from the end of the last fault, whichever is later: the binder's own graces (orphan
# 10 s and duplicate sweeps every 10 s in the local bridge, a lost job resubmitted after 60 s, a
# restarted binder waiting out a 15 s Lease) plus a margin for 2 loaded cores.
LIMITS = {"leaked job": 45.0, "duplicate jobs": 30.0, "waiting without a job": 90.0,
          "unbound while its job runs": 30.0, "on a Node its job left": 30.0,
          "orphan process": 5.0}
DOUBLE_BOOKING = "DOUBLE BOOKING"
LOUD = ("FAULT", "SUPERVISOR", "SLURM VIEW ONLY", DOUBLE_BOOKING, "RESUMED")
# Outstanding items first seen up to this long after a fault's restore (or after our components
# answered ready again, if later) are the fault's to clear; later ones are the churn's own.
SETTLED_AFTER = 3.0


class Admin:
    """The API server as the cluster admin (client certificate), without kubectl: one process
    per call would cost more CPU than the binder does."""

    def __init__(self, local: Local) -> None:
        self.server = local.kube.server
        pki = Path(local.kube.ca_file).parent
        self.ctx = ssl.create_default_context(cafile=local.kube.ca_file)
        self.ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def raw(self, method: str, path: str, body: dict[str, Any] | None = None,
            timeout: float = 20.0) -> bytes:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.server}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
            out: bytes = r.read()
            return out

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             timeout: float = 20.0) -> dict[str, Any]:
        out: dict[str, Any] = json.loads(self.raw(method, path, body, timeout) or b"{}")
        return out

    def pods(self, ns: str, selector: str) -> list[dict[str, Any]]:
        q = urllib.parse.urlencode({"labelSelector": selector})
        return list(self.call("GET", f"/api/v1/namespaces/{ns}/pods?{q}")["items"])

    def events(self, ns: str) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/api/v1/namespaces/{ns}/events")["items"])


def _progress(text: str) -> None:
    print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@dataclass
class Durations:
    """How long each item of one condition has lasted, from first sight or the last fault."""
    since: dict[str, float] = field(default_factory=dict)

    def update(self, items: dict[str, str], now: float, floor: float) -> dict[str, float]:
        self.since = {k: self.since.get(k, now) for k in items}
        return {k: now - max(t, floor) for k, t in self.since.items()}

    def any_seen_by(self, t: float) -> bool:
        """Whether an item still outstanding was first seen at or before t."""
        return any(first <= t for first in self.since.values())


@dataclass
class Violation:
    t: float
    rule: str
    detail: str


class Observer(threading.Thread):
    def __init__(self, local: Local, namespaces: list[str], selector: str, python: str,
                 deleted_by_us: set[str], lock: threading.Lock, interval: float = 0.5,
                 ready: Callable[[], bool] = lambda: True) -> None:
        super().__init__(daemon=True, name="chaos-observer")
        self.local, self.namespaces, self.selector = local, namespaces, selector
        self.python, self.deleted, self.lock = python, deleted_by_us, lock
        self.interval = interval
        self.ready = ready  # our components answer /readyz (the binder: it leads)
        self.admin = Admin(local)
        self.k8s_node = {n: k8s_node_name(n) for n in local.slurm.nodes}
        self.stop_flag = threading.Event()
        self.violations: list[Violation] = []
        # overlaps squeue showed with no process of that job on the node (not violations)
        self.slurm_view_only: list[str] = []
        # processes of jobs Slurm no longer has beside a Pod (inv.leftovers), key -> record:
        # kind, detail, first_seen, seen_s, slurms_own (proven at any sample) and the evidence
        # (of the sample that proved it, else of the first). Unproven ones fail the run.
        self.double_bookings: dict[str, dict[str, Any]] = {}
        self.ctld_since = 0.0  # when the running slurmctld was started again
        self.ctld_down_at = 0.0  # when it was last SIGKILLed
        # job id -> (when, nodes): where squeue last showed each job on its nodes
        self.placements: dict[int, tuple[float, tuple[str, ...]]] = {}
        self.placed_before_crash: frozenset[tuple[int, str]] = frozenset()
        self.slurmd_kills: list[tuple[str, float]] = []  # (Slurm node, when)
        self.bound: set[str] = set()  # Pods seen bound to a Node at least once
        self._reported: set[tuple[str, str]] = set()
        self.durations = {rule: Durations() for rule in LIMITS}
        self.samples = self.unobservable = 0
        self.seen: dict[str, str] = {}  # Pod key -> uid, last listing
        self.vanished: dict[str, str] = {}
        self.last_fault_end = 0.0
        self.pending_fault: tuple[str, float] | None = None  # (name, restored at)
        self.ready_at: float | None = None  # when our components answered ready after it
        self.clear_at: float | None = None  # first sample since with nothing of it outstanding
        self.convergence: list[tuple[str, float]] = []
        self.timeline: list[tuple[float, str]] = []

    def note(self, text: str) -> None:
        with self.lock:
            self.timeline.append((time.time(), text))
        if text.startswith(LOUD):  # the run's progress, as it happens; churn stays quiet
            _progress(text)

    def fault_started(self, name: str) -> None:
        with self.lock:
            if name == "slurmctld":
                self.ctld_down_at = time.time()
            self.pending_fault = None
            self.ready_at = self.clear_at = None
            self.last_fault_end = float("inf")  # nothing times out while a component is down

    def fault_ended(self, name: str) -> None:
        now = time.time()
        with self.lock:
            self.last_fault_end = now
            self.pending_fault = (name, now)
            if name == "slurmctld":
                self.ctld_since = now
                self.placed_before_crash = self._placed_at(self.ctld_down_at)
            self.ready_at = self.clear_at = None

    def _placed_at(self, t: float) -> frozenset[tuple[int, str]]:
        """(job id, node) for where Slurm had each job at `t`: the later of the last squeue
        sample and slurmctld's log (its starts in the last instants before a crash)."""
        last = dict(self.placements)
        try:
            logged = starts_in_log((self.local.slurm.run_dir / "log" / "ctld.log").read_text(
                errors="replace"), until=t)
        except OSError:
            logged = {}
        for jid, (when, nodes) in logged.items():
            if when >= last.get(jid, (0.0, ()))[0]:
                last[jid] = (when, nodes)
        return frozenset((jid, n) for jid, (_, nodes) in last.items() for n in nodes)

    def slurmd_killed(self, node: str) -> None:
        with self.lock:
            self.slurmd_kills.append((node, time.time()))

    def violate_unsettled(self, fault: str, waited: float) -> None:
        with self.lock:
            self.pending_fault = None
        self._violate("did not settle", f"not settled {waited:.0f}s after {fault} came back",
                      f"{fault}@{time.time():.0f}")

    def snapshot(self) -> inv.Snapshot:
        t_pods = time.time()
        items = [p for ns in self.namespaces for p in self.admin.pods(ns, self.selector)]
        argv, env = self.local.slurm.command("squeue", "-h", "-a", "-o", SQUEUE_FORMAT)
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=20,
                             check=True).stdout
        t_slurm = time.time()
        jobs = tuple(parse_squeue(out))
        with self.lock:
            kills = tuple(self.slurmd_kills)
            for j in jobs:
                if j.state in inv.ON_NODE_STATES and j.nodes:
                    self.placements[j.job_id] = (t_slurm, j.nodes)
            since, down_at, placed = self.ctld_since, self.ctld_down_at, self.placed_before_crash
        return inv.Snapshot(t_pods, t_slurm, tuple(inv.pod_view(p) for p in items), jobs,
                            tuple(job_processes(str(self.local.slurm.conf))), since, kills,
                            down_at, placed)

    def _violate(self, rule: str, detail: str, key: str, t: float | None = None) -> None:
        """`t`: when it happened, if before now (the timeline printed ends there)."""
        if (rule, key) in self._reported:
            return
        self._reported.add((rule, key))
        t = time.time() if t is None else t
        with self.lock:
            self.violations.append(Violation(t, rule, detail))
            self.timeline.append((t, f"VIOLATION {rule}: {detail}"))
        _progress(f"VIOLATION {rule}: {detail}")

    def check(self, s: inv.Snapshot) -> None:
        """Apply every rule to one snapshot."""
        now = s.t_slurm
        with self.lock:
            floor = self.last_fault_end
            deleted = set(self.deleted)
        for d in inv.sharing(s, self.k8s_node):
            self._violate("node shared", d, d)
        for d in inv.slurm_view_sharing(s, self.k8s_node):
            if d not in self.slurm_view_only:
                self.slurm_view_only.append(d)
                self.note(f"SLURM VIEW ONLY {d}")
        for lo in [*inv.leftovers(s, self.k8s_node), *inv.relocated(s, self.k8s_node)]:
            self._double_booking(lo, now)
        self.bound.update(p.key for p in s.pods if p.node)
        listed = {p.key: p.uid for p in s.pods}
        for key, uid in self.seen.items():
            if key not in listed and key not in deleted:
                self.vanished[key] = uid
        self.seen = listed
        conditions = {
            "leaked job": inv.leaked_jobs(s),
            "duplicate jobs": inv.duplicate_jobs(s),
            "waiting without a job": inv.waiting_without_job(s),
            "unbound while its job runs": inv.unbound_while_running(s),
            "on a Node its job left": inv.misplaced(s, self.k8s_node),
            "orphan process": inv.orphans(processes(), self.python),
        }
        for rule, items in conditions.items():
            ages = self.durations[rule].update(items, now, floor)
            for key, age in ages.items():
                if age > LIMITS[rule]:
                    self._violate(rule, f"{items[key]} (for {age:.0f}s)", key)

    def _double_booking(self, lo: inv.Leftover, now: float) -> None:
        """Keep what each sample shows of one leftover: proven Slurm's own at any sample, it is
        (the evidence of that sample kept); at its first sight the proof may not be complete
        yet (the Pod's job read just as it ended), so the verdict waits for the run's end."""
        rec = self.double_bookings.get(lo.key)
        if rec is None:
            rec = self.double_bookings[lo.key] = {
                "kind": lo.kind, "detail": lo.detail, "first_seen": now, "seen_s": 0.0,
                "slurms_own": lo.slurms_own, "evidence": list(lo.evidence)}
            verdict = "Slurm's own" if lo.slurms_own else "not proven Slurm's own (yet)"
            self.note(f"{DOUBLE_BOOKING} ({lo.kind}, {verdict}): {lo.detail}")
        elif lo.slurms_own and not rec["slurms_own"]:
            rec.update(slurms_own=True, evidence=list(lo.evidence))
            self.note(f"{DOUBLE_BOOKING} proven Slurm's own now: {lo.detail}")
        rec["seen_s"] = now - rec["first_seen"]

    def settled(self, restored: float, now: float) -> float | None:
        """How long after a fault restored at `restored` the cluster settled, once that is
        known (else None): our components answer ready, and nothing the fault left behind is
        outstanding (an item first seen by SETTLED_AFTER past the later of the restore and
        that readiness; a Pod left unbound across a fault keeps the cluster unsettled until it
        is bound). The time is that of the first sample clear of it, not of the wait to be
        sure that nothing more of it shows up."""
        if self.ready_at is None:
            try:
                if not self.ready():
                    return None
            except Exception:
                return None
            self.ready_at = now
        cutoff = max(restored, self.ready_at) + SETTLED_AFTER
        if any(d.any_seen_by(cutoff) for d in self.durations.values()):
            self.clear_at = None
            return None
        if self.clear_at is None:
            self.clear_at = now
        return self.clear_at - restored if now > cutoff else None

    def run(self) -> None:
        while not self.stop_flag.wait(self.interval):
            try:
                s = self.snapshot()
            except Exception:  # the API server or slurmctld is down: nothing to judge
                self.unobservable += 1
                continue
            self.samples += 1
            self.check(s)
            with self.lock:
                pending = self.pending_fault
            if pending is None or (took := self.settled(pending[1], s.t_slurm)) is None:
                continue
            with self.lock:
                if self.pending_fault == pending:  # not replaced by a newer fault meanwhile
                    self.convergence.append((pending[0], took))
                    _progress(f"settled {took:.1f}s after {pending[0]} came back")
                    self.pending_fault = None

    def stop(self) -> None:
        self.stop_flag.set()
        self.join(30)

    def final_checks(self) -> None:
        """Pods that vanished are lost unless an Event of ours says why (read at the end: an
        Event written during an API server restart is retried by the binder); double bookings
        never proven Slurm's own (judged first: reading the Events may fail)."""
        self.judge_double_bookings()
        events = [e for ns in self.namespaces for e in self.admin.events(ns)]
        for d in inv.lost_pods(self.vanished, events):
            self._violate("lost Pod", d, d)

    def judge_double_bookings(self) -> None:
        """A double booking never proven Slurm's own is a violation, dated when first seen."""
        for key, rec in self.double_bookings.items():
            if not rec["slurms_own"]:
                self._violate("double booking", f"{rec['detail']} (not proven Slurm's own: "
                              + "; ".join(rec["evidence"]) + ")", key, t=rec["first_seen"])
