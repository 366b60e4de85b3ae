"""Leader election on a coordination.k8s.io Lease: only the holder reconciles."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import socket
import uuid

from slurmgate import contract
from slurmgate.kube import KubeClient, KubeError
from slurmgate.logs import kv

log = logging.getLogger("slurmgate.leader")

# A leader steps down when its Lease has not been renewed for this share of the lease (the
# rest is the margin before a standby may take it); client-go's defaults are 10 s of 15.
RENEW_DEADLINE = 0.8
# After a failed renewal the next try comes after this share of the renew period.
RETRY_FRACTION = 0.4


def _ts(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str) -> dt.datetime:
    return dt.datetime.strptime(s.replace("Z", ""), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=dt.UTC)


class NotLeading(Exception):
    """A write refused because this binder no longer holds the Lease."""


class LeaderElector:
    def __init__(self, kube: KubeClient, namespace: str, name: str = "slurmgate-binder",
                 lease_seconds: int = 15, renew_seconds: float = 5.0,
                 identity: str | None = None) -> None:
        self.kube = kube
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.namespace = namespace
        # the Pod name in a Deployment; elsewhere unique per process, as two may share a host
        self.identity = identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self.is_leader = False
        # event-loop time until which our last renewal keeps the Lease ours (the monotonic
        # clock runs on while the process is frozen, so a resumed leader sees it passed)
        self.valid_until = float("-inf")

    async def _try(self) -> bool:
        now = dt.datetime.now(dt.UTC)
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.lease_seconds,
                "renewTime": _ts(now)}
        try:
            lease = await self.kube.get(f"{self.path}/{self.name}")
        except KubeError as e:
            if e.status != 404:
                raise
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": _ts(now), "leaseTransitions": 0}}
            try:
                await self.kube.create(self.path, body)
                return True
            except KubeError as e2:
                if e2.status == 409:
                    return False
                raise
        cur = lease.get("spec") or {}
        holder = cur.get("holderIdentity")
        renew = cur.get("renewTime")
        expired = True
        if renew:
            age = (now - _parse(renew)).total_seconds()
            expired = age > cur.get("leaseDurationSeconds", self.lease_seconds)
        if holder not in (self.identity, None, "") and not expired:
            return False
        new_spec = {**cur, **spec}
        if holder != self.identity:
            new_spec["acquireTime"] = _ts(now)
            new_spec["leaseTransitions"] = cur.get("leaseTransitions", 0) + 1
        lease["spec"] = new_spec
        try:  # PUT with the read resourceVersion: optimistic concurrency decides races
            await self.kube.request("PUT", f"{self.path}/{self.name}", body=lease)
            return True
        except KubeError as e:
            if e.status == 409:
                return False
            raise

    def holds(self) -> bool:
        """Whether the Lease is ours now: leading, and within the renew window of the last
        renewal. keep() steps down at the same moment, but a frozen and resumed process may
        run other tasks before keep() wakes: they must find the Lease gone."""
        return self.is_leader and asyncio.get_running_loop().time() < self.valid_until

    def fence(self) -> None:
        """The write guard of the binder's clients: no write once the Lease may be another's."""
        if not self.holds():
            raise NotLeading("this binder no longer holds the Lease; the write is refused")

    async def acquire(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sent = loop.time()
                if await self._try():
                    self.valid_until = sent + self.lease_seconds * RENEW_DEADLINE
                    self.is_leader = True
                    log.info("became leader", extra=kv(identity=self.identity))
                    return
            except Exception as e:
                log.warning("lease attempt failed", extra=kv(error=str(e)))
            await asyncio.sleep(self.renew_seconds / 2)

    async def keep(self) -> None:
        """Renew until we cannot within RENEW_DEADLINE of the lease; then return (the caller
        exits). After a failed renewal the next try comes sooner (like client-go's retry
        period), so one slow answer from the API server is not two-fifths of the window. A
        renewal still unanswered at the deadline is abandoned: past it the standby may hold
        the Lease, and a leader waiting on its request would act beside it."""
        loop = asyncio.get_running_loop()
        window = self.lease_seconds * RENEW_DEADLINE
        retry = min(self.renew_seconds, max(0.2, self.renew_seconds * RETRY_FRACTION))
        last_ok = loop.time()
        delay = self.renew_seconds
        while True:
            # never sleep past the deadline: stepping down then is the point of it
            await asyncio.sleep(max(0.0, min(delay, last_ok + window - loop.time())))
            sent = loop.time()  # the renewTime written is about now: the window counts from it
            left = last_ok + window - sent
            try:
                if left <= 0:
                    raise TimeoutError
                renewed = await asyncio.wait_for(self._try(), left)
            except Exception as e:
                if loop.time() - last_ok >= window:
                    log.error("lease not renewed in time; stepping down",
                              extra=kv(error=str(e) or type(e).__name__))
                    self.is_leader = False
                    return
                log.warning("lease renew failed", extra=kv(error=str(e) or type(e).__name__))
                delay = retry
                continue
            if not renewed:
                log.error("lease lost to another holder")
                self.is_leader = False
                return
            last_ok = sent
            self.valid_until = sent + window
            delay = self.renew_seconds


async def label_own_pod(kube: KubeClient, namespace: str | None, pod: str | None,
                        leading: bool) -> None:
    """Put contract.LEADER_LABEL on this replica's Pod while it leads, take it off otherwise
    (at start too: a container restarted in a Pod that led keeps the Pod's labels). It only
    steers the push Service, which polling backs up, so a failure is logged, never fatal.
    Outside a Pod (no POD_NAME/POD_NAMESPACE) there is nothing to label."""
    if not (namespace and pod):
        return
    try:
        await kube.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{pod}", {
            "metadata": {"labels": {contract.LEADER_LABEL: "true" if leading else None}}})
    except Exception as e:
        log.warning("could not label the binder's Pod", extra=kv(
            pod=f"{namespace}/{pod}", leading=leading, error=str(e)))
