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


def _ts(t: dt.datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str) -> dt.datetime:
    return dt.datetime.strptime(s.replace("Z", ""), "%Y-%m-%dT%H:%M:%S.%f").replace(tzinfo=dt.UTC)


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

    async def acquire(self) -> None:
        while True:
            try:
                if await self._try():
                    self.is_leader = True
                    log.info("became leader", extra=kv(identity=self.identity))
                    return
            except Exception as e:
                log.warning("lease attempt failed", extra=kv(error=str(e)))
            await asyncio.sleep(self.renew_seconds / 2)

    async def keep(self) -> None:
        """Renew until we cannot within the lease; then return (caller exits)."""
        last_ok = asyncio.get_running_loop().time()
        while True:
            await asyncio.sleep(self.renew_seconds)
            try:
                if await self._try():
                    last_ok = asyncio.get_running_loop().time()
                    continue
                log.error("lease lost to another holder")
                self.is_leader = False
                return
            except Exception as e:
                log.warning("lease renew failed", extra=kv(error=str(e)))
            if asyncio.get_running_loop().time() - last_ok > self.lease_seconds * 0.8:
                log.error("lease not renewed in time; stepping down")
                self.is_leader = False
                return


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
