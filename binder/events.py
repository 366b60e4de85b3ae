"""core/v1 Events on Pods, so `kubectl describe pod` tells the story."""

from __future__ import annotations

import datetime as dt
import logging
import socket
from typing import Any

from slurmgate.kube import KubeClient, KubeError
from slurmgate.logs import kv

log = logging.getLogger("slurmgate.events")
COMPONENT = "slurmgate-binder"


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Recorder:
    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self.instance = socket.gethostname()
        self._last: dict[str, tuple[str, str]] = {}  # uid -> last (reason, message)

    async def emit(self, pod: dict[str, Any], reason: str, message: str,
                   warning: bool = False, once: bool = True) -> None:
        """`once`: skip when the same reason+message was the last one for this Pod."""
        meta = pod["metadata"]
        uid = meta.get("uid", "")
        if once and self._last.get(uid) == (reason, message):
            return
        self._last[uid] = (reason, message)
        if len(self._last) > 50_000:
            self._last.clear()
        now = _now()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": uid},
            "reason": reason, "message": message[:1024],
            "type": "Warning" if warning else "Normal",
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT, "reportingInstance": self.instance,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            await self.kube.create(f"/api/v1/namespaces/{meta['namespace']}/events", body)
        except KubeError as e:  # an Event is best effort; never fail a reconcile for it
            log.info("event not recorded", extra=kv(reason=reason, error=str(e)))

    def forget(self, uid: str) -> None:
        self._last.pop(uid, None)
