"""Kubernetes cordon -> Slurm drain; uncordon -> resume (only nodes we drained)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from slurmgate import contract
from slurmgate.kubeview import NodeView
from slurmgate.logs import kv
from slurmgate.slurm import NodeInfo, SlurmClient

from . import metrics
from .informer import Informer
from .podview import node_ref
from .workqueue import WorkQueue

log = logging.getLogger("slurmgate.nodesync")
CACHE_SECONDS = 1.0
# The periodic drift check reads the whole node list this often (its cost follows the site's
# nodes); in between it reads only the nodes it may have to act on, one by one.
WHOLE_LIST_EVERY = 300.0


RESUME_RECHECK = 2.0  # s between looks at a held node whose Pods are gone, until it is back
SETTLE_TRIES = 3  # fresh looks at a Node before its Pods are evicted, at most...
SETTLE_RETRY = 0.5  # ...this far apart, doubling
# (action, for Pods stopping after a node failure rather than a cordon) -> the log line
LOG_LINES = {
    ("drain", False): "node cordoned; Slurm node drained",
    ("resume", False): "node uncordoned; Slurm node resumed",
    ("drain", True): "Pods of ours still stopping after a node failure; Slurm node drained",
    ("resume", True): "no Pod of ours stopping any more; Slurm node resumed",
}
FAILED_NODE_STATES = frozenset({"DOWN", "FAIL", "FAILING", "ERROR", "NOT_RESPONDING"})


def failed(sn: NodeInfo) -> bool:
    return sn.state.upper() in FAILED_NODE_STATES or bool(FAILED_NODE_STATES & sn.flags)


def tainted(node: dict[str, Any]) -> bool:
    return any(t.get("key") == contract.TAINT_KEY and t.get("effect") == contract.TAINT_EFFECT
               for t in NodeView(node).taints)


def drained(sn: NodeInfo) -> bool:
    return "DRAIN" in sn.flags or sn.state in ("DRAIN", "DRAINED", "DRAINING")


def ours_drained(sn: NodeInfo) -> bool:
    return drained(sn) and (sn.reason or "").startswith(contract.OUR_DRAIN_PREFIXES)


def held_by_us(sn: NodeInfo) -> bool:
    """We drained the node for Pods of ours still stopping there (see held())."""
    return (sn.reason or "").startswith(contract.DRAIN_STOPPING_PREFIX)


def may_hold(sn: NodeInfo) -> bool:
    """Whether Pods still stopping on the Node can matter to its Slurm node (held() is false
    otherwise, whatever stops there): callers skip the walk over our Pods everywhere else."""
    return failed(sn) or held_by_us(sn)


def held(sn: NodeInfo, stopping: list[str]) -> bool:
    """Pods of ours still stop on the Node (`stopping`) while no placeholder keeps its Slurm
    node: after a node failure (the job ended NODE_FAIL or was requeued) Slurm gives the node
    to the next job the moment its slurmd registers, and only a drain keeps it off until the
    Pods are gone. Any other end keeps the node in Slurm for KillWait or the GraceTime, which
    the eviction's grace is held to (slurmgate/preemption.py)."""
    return bool(stopping) and (failed(sn) or (drained(sn) and held_by_us(sn)))


def node_action(node: dict[str, Any], sn: NodeInfo, stopping: list[str] | None = None
                ) -> str | None:
    """What to do for a Node: "drain" its Slurm node once cordoned or held (see held()),
    "resume" it once neither if we drained it and it has not failed (a resume would undo a
    DOWN), else None. A drain someone else made (an admin, Slurm's own health checks) is never
    undone."""
    cordoned = NodeView(node).unschedulable
    hold = held(sn, stopping or [])
    if (cordoned or hold) and not drained(sn):
        return "drain"
    if not cordoned and not hold and ours_drained(sn) and not failed(sn):
        return "resume"
    return None


def drain_reason(k8s_name: str, sn: NodeInfo, stopping: list[str]) -> str:
    """Ours (contract.OUR_DRAIN_PREFIXES); a hold keeps the reason it replaces in view."""
    if not held(sn, stopping):
        return f"{contract.DRAIN_REASON_PREFIX} {k8s_name}"
    pods = ", ".join(stopping[:2]) + (f" and {len(stopping) - 2} more" if len(stopping) > 2
                                      else "")
    was = f"; was: {sn.reason}" if sn.reason else ""
    return f"{contract.DRAIN_STOPPING_PREFIX} on {k8s_name} ({pods}){was}"[:200]


class NodeSync:
    def __init__(self, slurm: SlurmClient, nodes: Informer, queue: WorkQueue[str],
                 stopping: Callable[[str], list[str]] = lambda _node: []) -> None:
        self.slurm = slurm
        self.nodes = nodes
        self.queue = queue
        # a Node's Pods of ours that still occupy it while no placeholder keeps its Slurm node
        self.stopping = stopping
        self._nodes: dict[str, NodeInfo] = {}
        self._warned: set[str] = set()  # Nodes reported without the taint
        self._at = 0.0
        self._whole_at = float("-inf")
        self._refreshing = asyncio.Lock()
        self._fresh: set[str] = set()  # Nodes whose next look reads their Slurm node alone
        # Nodes this binder drained for Pods of ours still stopping there (after a restart the
        # drift check finds the others: it reads every node we drained)
        self._holding: set[str] = set()

    async def _slurm_node(self, name: str) -> NodeInfo | None:
        if time.monotonic() - self._at > CACHE_SECONDS:
            await self.refresh()
        return self._nodes.get(name)

    async def failed_nodes(self, read_after: float) -> frozenset[str]:
        """Slurm nodes that are down or not responding, from a node list read after
        `read_after` (time.monotonic()). The caller passes the moment it looked at the job:
        slurmctld marks a node DOWN before it requeues the node's jobs, so only a list read
        after the requeue was seen is sure to show the node down (a list cached a moment
        earlier made a node failure look like a plain requeue on 22.05). Concurrent callers
        share one read."""
        async with self._refreshing:
            if self._at <= read_after:
                await self.refresh()
        return frozenset(n.name for n in self._nodes.values() if failed(n))

    async def refresh(self) -> None:
        self._nodes = {n.name: n for n in await self.slurm.nodes()}
        self._at = self._whole_at = time.monotonic()

    async def _read_candidates(self) -> None:
        """Between whole lists, read again only the Slurm nodes a drift check may act on: those
        of cordoned Nodes (to drain) and those we last saw drained by us (to resume)."""
        names = {n.name for n in self._nodes.values() if ours_drained(n)}
        for node in list(self.nodes.store.values()):
            view = node_ref(node)
            if view and view.slurm_node and view.unschedulable:
                names.add(view.slurm_node)
        for name in sorted(names):
            try:
                sn = await self.slurm.node(name)
            except ValueError as e:  # a label that names no possible Slurm node
                log.warning("cannot read Slurm node", extra=kv(slurm_node=name, error=str(e)))
                continue
            if sn is None:
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = sn

    async def drifted(self) -> list[str]:
        """Nodes whose Slurm side disagrees with their cordon. Every WHOLE_LIST_EVERY from ONE
        node list, in between from the few nodes that can disagree: the periodic check costs a
        REST call per cordoned or drained Node and a dict walk, not a queue item per Node."""
        if time.monotonic() - self._whole_at >= WHOLE_LIST_EVERY:
            await self.refresh()
        else:
            await self._read_candidates()
        out = []
        untainted = []
        for key, node in list(self.nodes.store.items()):
            view = node_ref(node)
            sn = self._nodes.get(view.slurm_node) if view and view.slurm_node else None
            if sn is not None and node_action(node, sn, self._stopping(key, sn)):
                out.append(key)
            if view and view.slurm_node and not tainted(node):
                untainted.append(key)
        self._report_untainted(untainted)
        return out

    def _stopping(self, k8s_name: str, sn: NodeInfo) -> list[str]:
        """The Node's Pods still stopping, asked only where they can matter (a walk over our
        Pods per Node would make each drift check cost Nodes x Pods)."""
        return self.stopping(k8s_name) if may_hold(sn) else []

    def pod_left(self, k8s_name: str) -> None:
        """A Pod of ours left this Node: where we hold its Slurm node for stopping Pods, look
        again soon, from that node alone (one node's read, never the list). Nowhere else: a
        read at every Pod's end would meet its job's cancel in slurmctld's locks."""
        if k8s_name in self._holding:
            self._fresh.add(k8s_name)
            self.queue.add(k8s_name)

    def _report_untainted(self, keys: list[str]) -> None:
        """The binder may not patch Nodes (least privilege): it says, once per Node, where the
        taint that keeps other Pods off Slurm's Nodes is missing."""
        metrics.UNTAINTED.set(len(keys))
        for key in set(keys) - self._warned:
            log.warning("Slurm node without the taint: Pods that are not ours may land beside "
                        "Slurm jobs", extra=kv(node=key, taint=f"{contract.TAINT_KEY}="
                                               f"{contract.TAINT['value']}:{contract.TAINT_EFFECT}"))
        self._warned = set(keys)

    async def _update(self, slurm_name: str, drain: bool, reason: str | None) -> None:
        if drain:
            await self.slurm.drain(slurm_name, reason or "")
        else:
            await self.slurm.resume(slurm_name)

    async def handle(self, key: str) -> None:
        metrics.NODE_SYNCS.inc()
        try:
            await self._reconcile(str(key))
            self.queue.forget(key)
        except Exception as e:
            delay = self.queue.retry(key)
            log.warning("node sync failed; will retry",
                        extra=kv(node=key, error=str(e), retry_in=round(delay, 2)))

    async def settle(self, k8s_name: str) -> None:
        """Reconcile one Node now from a fresh read of its Slurm node (GET /node/{name}: one
        node's cost): before its Pods are evicted, so that a hold is in place before they
        go (a failed node may be back any moment). A failed try (slurmctld busy with the
        failure, a timeout) is tried again at once, a few times; then the evictions go on and
        the Node is looked at again within a second, not at the next drift check."""
        for attempt in range(SETTLE_TRIES):
            try:
                await self._reconcile(k8s_name, fresh=True)
                return
            except Exception as e:
                log.warning("node sync before an eviction failed", extra=kv(
                    node=k8s_name, error=str(e), attempt=attempt + 1, of=SETTLE_TRIES))
            if attempt + 1 < SETTLE_TRIES:
                await asyncio.sleep(SETTLE_RETRY * 2 ** attempt)
        self._fresh.add(k8s_name)
        self.queue.add_after(k8s_name, SETTLE_RETRY)

    async def _reconcile(self, k8s_name: str, fresh: bool = False) -> None:
        node = self.nodes.store.get(k8s_name)
        if node is None:
            return
        slurm_name = NodeView(node).slurm_node
        if not slurm_name:
            return
        fresh = fresh or k8s_name in self._fresh
        self._fresh.discard(k8s_name)
        sn = await (self.slurm.node(slurm_name) if fresh else self._slurm_node(slurm_name))
        if sn is None:
            log.warning("no such Slurm node", extra=kv(node=k8s_name, slurm_node=slurm_name))
            return
        stopping = self._stopping(k8s_name, sn)
        action = node_action(node, sn, stopping)
        if action is None:
            if not stopping and failed(sn) and held_by_us(sn):
                # our Pods are gone but the node is not back yet: look again soon (one node's
                # read each time), so it is resumed as it returns, not at the next drift check
                self._fresh.add(k8s_name)
                self.queue.add_after(k8s_name, RESUME_RECHECK)
            return
        if action == "drain":
            await self._update(slurm_name, True, drain_reason(k8s_name, sn, stopping))
            if held(sn, stopping):
                self._holding.add(k8s_name)
        else:
            await self._update(slurm_name, False, None)
            self._holding.discard(k8s_name)
        self._at = 0.0
        metrics.NODE_ACTIONS.labels(action).inc()
        for_stopping = held(sn, stopping) or held_by_us(sn)
        log.info(LOG_LINES[action, for_stopping],
                 extra=kv(node=k8s_name, slurm_node=slurm_name, pods=stopping or None))
