"""The tenancy policy, kept current from its ConfigMap (both the webhook and the binder run one).

List the one ConfigMap (fieldSelector metadata.name, so RBAC can name it in resourceNames),
then watch from the list's resourceVersion; a watch the server ends is resumed from the last
version seen, an expired one (410) or an error means list again, errors after a backoff.

States (slurmgate.tenancy.PolicyState.status):
  loading  until the first list answers (the webhook reports not ready meanwhile);
  ready    the policy parsed;
  missing  the ConfigMap or its key is not there: fail closed, every marked Pod is refused;
  invalid  the text does not parse: the last good policy stays in force (and the error is
           logged and counted); with none before it, every marked Pod is refused.
A source without a ConfigMap to read (TENANCY_CONFIGMAP unset) is `disabled` for good.
An API error never changes the state: the last thing known stays in force.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from slurmgate import tenancy
from slurmgate.config import ObjectRef
from slurmgate.kube import WatchExpired
from slurmgate.kubeview import ObjectView
from slurmgate.logs import kv
from slurmgate.tenancy import PolicyState

log = logging.getLogger("slurmgate.tenancy")


class PolicyMetrics:
    """A process's metrics of its policy source, named after the process (`component`: webhook
    or binder), so both processes keep the same three series under their own prefix."""

    def __init__(self, component: str, registry: CollectorRegistry) -> None:
        p = f"slurmgate_{component}_tenancy"
        self.state = Gauge(f"{p}_policy_state", "1 for the tenancy policy's current state "
                           "(disabled, loading, ready, missing, invalid)", ["state"],
                           registry=registry)
        self.reloads = Counter(f"{p}_reloads_total", "Tenancy policy changes seen, by outcome "
                               "(ready, missing, invalid)", ["result"], registry=registry)
        self.errors = Counter(f"{p}_source_errors_total",
                              "Failed lists/watches of the tenancy policy's ConfigMap",
                              registry=registry)

    def on_state(self, s: PolicyState) -> None:
        """The gauge is 1 for the current state; the counter counts each new reload outcome."""
        for st in tenancy.STATES:
            self.state.labels(st).set(1 if st == s.status else 0)
        if s.status not in (tenancy.LOADING, tenancy.DISABLED):
            self.reloads.labels(s.status).inc()

    def on_error(self, e: Exception) -> None:
        self.errors.inc()


class Kube(Protocol):
    """The part of slurmgate.kube.KubeClient the source uses (unit tests pass a fake)."""

    async def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]: ...

    def watch(self, path: str, resource_version: str, **params: Any) -> Any: ...


class PolicySource:
    def __init__(self, kube: Kube, ref: ObjectRef | None, *,
                 on_state: Callable[[PolicyState], None] = lambda s: None,
                 on_error: Callable[[Exception], None] = lambda e: None,
                 backoff: tuple[float, float] = (1.0, 30.0)) -> None:
        self._kube = kube
        self.ref = ref
        self._listeners: list[Callable[[PolicyState], None]] = [on_state]
        self._on_error = on_error
        self._backoff = backoff
        self._state = tenancy.STATE_DISABLED if ref is None else tenancy.STATE_LOADING
        self._text: str | None = None  # the document last parsed (unchanged -> no reparse)
        self._changed = asyncio.Condition()
        self.generation = 0  # bumped on every state change (tests wait on it)
        on_state(self._state)

    @property
    def state(self) -> PolicyState:
        return self._state

    def subscribe(self, listener: Callable[[PolicyState], None]) -> None:
        """`listener(state)` on every later change (e.g. the binder looks again at what the
        policy refused)."""
        self._listeners.append(listener)

    def current(self) -> PolicyState:
        """For callers that take a `Callable[[], PolicyState]`."""
        return self._state

    async def wait_generation(self, after: int) -> PolicyState:
        """Return once the state changed more than `after` times."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.generation > after)
        return self._state

    async def _set(self, state: PolicyState) -> None:
        if state == self._state:
            return
        self._state = state
        self._log(state)
        for listener in self._listeners:
            listener(state)
        async with self._changed:
            self.generation += 1
            self._changed.notify_all()

    def _log(self, state: PolicyState) -> None:
        if state.status == tenancy.READY:
            log.info("tenancy policy loaded", extra=kv(
                configmap=str(self.ref), tenants=len(state.policy.tenants if state.policy
                                                     else ())))
        else:
            log.warning("tenancy policy not usable", extra=kv(
                configmap=str(self.ref), state=state.status, error=state.error,
                keeping_last_good=state.policy is not None))

    async def apply(self, obj: dict[str, Any] | None) -> None:
        """The ConfigMap as last seen (None: it does not exist) -> the state."""
        assert self.ref is not None
        data = (obj or {}).get("data") or {}
        text = data.get(tenancy.POLICY_KEY) if isinstance(data, dict) else None
        if obj is None or not isinstance(text, str):
            self._text = None
            why = (f"ConfigMap {self.ref} not found" if obj is None
                   else f"ConfigMap {self.ref} has no key {tenancy.POLICY_KEY}")
            await self._set(PolicyState(tenancy.MISSING, None, why))
            return
        if text == self._text:
            return
        self._text = text
        try:
            policy = tenancy.parse(text)
        except tenancy.PolicyError as e:
            last = self._state.policy  # ready, or invalid already keeping one
            await self._set(PolicyState(tenancy.INVALID, last, str(e)))
            return
        await self._set(PolicyState(tenancy.READY, policy))

    @property
    def _path(self) -> str:
        assert self.ref is not None
        return f"/api/v1/namespaces/{self.ref.namespace}/configmaps"

    async def _list(self) -> str:
        assert self.ref is not None
        items, rv = await self._kube.list(self._path,
                                          fieldSelector=f"metadata.name={self.ref.name}")
        await self.apply(next((i for i in items
                               if ObjectView(i).name == self.ref.name),
                              None))
        return rv

    async def _watch(self, rv: str) -> str:
        """Until the server ends the watch; returns the last resourceVersion seen."""
        assert self.ref is not None
        async for typ, obj in self._kube.watch(self._path, rv,
                                               fieldSelector=f"metadata.name={self.ref.name}"):
            rv = ObjectView(obj).resource_version or rv
            if typ == "BOOKMARK":
                continue
            await self.apply(None if typ == "DELETED" else obj)
        return rv

    async def run(self) -> None:
        """Forever (cancel to stop); returns at once when tenancy is disabled."""
        if self.ref is None:
            return
        delay = self._backoff[0]
        while True:
            try:
                rv = await self._list()
                delay = self._backoff[0]
                while True:
                    rv = await self._watch(rv)
            except WatchExpired:
                continue  # too old: list again at once
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API is unreachable or refuses: keep what we know
                self._on_error(e)
                log.warning("tenancy policy list/watch failed; retrying",
                            extra=kv(configmap=str(self.ref), error=str(e),
                                     retry_in=round(delay, 1)))
                await asyncio.sleep(delay)
                delay = min(self._backoff[1], max(delay * 2, 0.1))
