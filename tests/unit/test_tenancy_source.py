"""The tenancy policy source's state machine, against a fake API (list + watch)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from slurmgate import tenancy
from slurmgate.config import ConfigError, ObjectRef, tenancy_configmap
from slurmgate.kube import KubeError, WatchExpired
from slurmgate.tenancy_source import PolicyMetrics, PolicySource
from tests.unit.test_tenancy import req

REF = ObjectRef("slurmgate-system", "slurmgate-tenancy")
GOOD = "tenants: [{namespaces: [team-a], user: team-a, account: team-a}]\n"
OTHER = "tenants: [{namespaces: [team-b], user: team-b}]\n"
BAD = "tenants: [{namespaces: [team-a]}]\n"


def cm(text: str | None, rv: str = "1", key: str = tenancy.POLICY_KEY) -> dict[str, Any]:
    return {"metadata": {"name": REF.name, "namespace": REF.namespace, "resourceVersion": rv},
            "data": {} if text is None else {key: text}}


class FakeKube:
    """list answers from `items` (or raises `list_error`); each watch yields what is put on
    `events`: (type, object), an exception to raise, or None to end the watch."""

    def __init__(self, items: list[dict[str, Any]] | None = None) -> None:
        self.items = items or []
        self.list_error: Exception | None = None
        self.lists: list[tuple[str, dict[str, Any]]] = []
        self.watches: list[str] = []
        self.events: asyncio.Queue[Any] = asyncio.Queue()

    async def list(self, path: str, **params: Any) -> tuple[list[dict[str, Any]], str]:
        self.lists.append((path, params))
        if self.list_error is not None:
            err, self.list_error = self.list_error, None
            raise err
        return list(self.items), f"rv{len(self.lists)}"

    async def watch(self, path: str, resource_version: str,
                    **params: Any) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.watches.append(resource_version)
        while True:
            ev = await self.events.get()
            if ev is None:
                return
            if isinstance(ev, Exception):
                raise ev
            yield ev


async def changed(src: PolicySource, after: int) -> tenancy.PolicyState:
    # a bound, not a sleep: a source that never changes fails the test instead of hanging it
    return await asyncio.wait_for(src.wait_generation(after), 5)


async def started(kube: FakeKube, **kw: Any) -> tuple[PolicySource, asyncio.Task[None]]:
    src = PolicySource(kube, REF, backoff=(0.0, 0.0), **kw)
    assert src.state.status == tenancy.LOADING
    task = asyncio.create_task(src.run())
    await changed(src, 0)
    return src, task


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with suppress(asyncio.CancelledError):
        await task


async def test_disabled_without_a_configmap() -> None:
    kube = FakeKube()
    src = PolicySource(kube, None)
    assert src.state == tenancy.STATE_DISABLED
    await src.run()  # returns at once, reads nothing
    assert kube.lists == []


async def test_ready_then_updates_from_the_watch() -> None:
    kube = FakeKube([cm(GOOD)])
    seen: list[str] = []
    src, task = await started(kube, on_state=lambda s: seen.append(s.status))
    try:
        assert src.state.status == tenancy.READY and src.state.policy is not None
        assert src.state.policy.resolve("team-a") is not None
        path, params = kube.lists[0]
        assert path == "/api/v1/namespaces/slurmgate-system/configmaps"
        assert params == {"fieldSelector": "metadata.name=slurmgate-tenancy"}
        g = src.generation
        kube.events.put_nowait(("MODIFIED", cm(OTHER, "2")))
        state = await changed(src, g)
        assert state.policy is not None and state.policy.resolve("team-a") is None
        assert state.policy.resolve("team-b") is not None
        assert kube.watches == ["rv1"]
        assert seen == ["loading", "ready", "ready"]
    finally:
        await stop(task)


async def test_invalid_keeps_the_last_good_policy() -> None:
    kube = FakeKube([cm(GOOD)])
    src, task = await started(kube)
    try:
        good = src.state.policy
        g = src.generation
        kube.events.put_nowait(("MODIFIED", cm(BAD, "2")))
        state = await changed(src, g)
        assert state.status == tenancy.INVALID and state.policy is good
        assert "tenants[0].user" in state.error
        # still enforced: team-a runs as its user
        assert tenancy.check(state, "team-a", req()).user == "team-a"
        g = src.generation
        kube.events.put_nowait(("MODIFIED", cm(GOOD, "3")))
        assert (await changed(src, g)).status == tenancy.READY
    finally:
        await stop(task)


async def test_invalid_from_the_start_denies_naming_the_error() -> None:
    src, task = await started(FakeKube([cm(BAD)]))
    try:
        assert src.state.status == tenancy.INVALID and src.state.policy is None
        with pytest.raises(tenancy.TenancyDenied) as e:
            tenancy.check(src.state, "team-a", req())
        assert e.value.reason == "TenancyPolicyInvalid" and "tenants[0].user" in e.value.message
    finally:
        await stop(task)


@pytest.mark.parametrize(("items", "why"), [
    ([], "not found"),
    ([cm("x", key="other.yaml")], "has no key tenancy.yaml"),
])
async def test_missing_fails_closed(items: list[dict[str, Any]], why: str) -> None:
    src, task = await started(FakeKube(items))
    try:
        assert src.state.status == tenancy.MISSING and why in src.state.error
        with pytest.raises(tenancy.TenancyDenied) as e:
            tenancy.check(src.state, "team-a", req())
        assert e.value.reason == "TenancyPolicyMissing"
    finally:
        await stop(task)


async def test_deleted_configmap_is_missing_even_after_a_good_policy() -> None:
    kube = FakeKube([cm(GOOD)])
    src, task = await started(kube)
    try:
        g = src.generation
        kube.events.put_nowait(("DELETED", cm(GOOD, "2")))
        state = await changed(src, g)
        assert state.status == tenancy.MISSING and state.policy is None
        g = src.generation
        kube.events.put_nowait(("ADDED", cm(GOOD, "3")))  # the same text again: parsed again
        assert (await changed(src, g)).status == tenancy.READY
    finally:
        await stop(task)


async def test_expired_watch_relists_and_ended_watch_resumes() -> None:
    kube = FakeKube([cm(GOOD)])
    src, task = await started(kube)
    try:
        kube.events.put_nowait(("BOOKMARK", {"metadata": {"resourceVersion": "7"}}))
        kube.events.put_nowait(None)  # the server ends the watch: resume from the bookmark
        kube.items = [cm(OTHER, "8")]
        kube.events.put_nowait(WatchExpired())  # the resumed one is too old: list again
        g = src.generation
        state = await changed(src, g)
        assert state.policy is not None and state.policy.resolve("team-b") is not None
        assert kube.watches[:2] == ["rv1", "7"]
        assert len(kube.lists) == 2
    finally:
        await stop(task)


async def test_api_errors_keep_the_state_and_are_counted() -> None:
    kube = FakeKube([cm(GOOD)])
    errors: list[Exception] = []
    src, task = await started(kube, on_error=errors.append)
    try:
        kube.list_error = KubeError(403, "Forbidden", "configmaps is forbidden")
        kube.items = [cm(OTHER, "9")]
        kube.events.put_nowait(KubeError(500, "WatchError", "boom"))
        g = src.generation
        state = await changed(src, g)  # after the failed relist, the next one answers
        assert state.policy is not None and state.policy.resolve("team-b") is not None
        assert [e.status for e in errors if isinstance(e, KubeError)] == [500, 403]
    finally:
        await stop(task)


async def test_loading_until_the_first_list_answers() -> None:
    kube = FakeKube([cm(GOOD)])
    kube.list_error = KubeError(503, "ServiceUnavailable", "etcd")
    errors: list[Exception] = []
    src, task = await started(kube, on_error=errors.append)  # ready after the retry
    try:
        assert len(errors) == 1 and src.state.status == tenancy.READY
    finally:
        await stop(task)


def test_configmap_setting() -> None:
    assert tenancy_configmap({}) is None
    assert tenancy_configmap({"TENANCY_CONFIGMAP": ""}) is None
    ref = tenancy_configmap({"TENANCY_CONFIGMAP": "slurmgate-system/slurmgate-tenancy"})
    assert ref == REF and str(ref) == "slurmgate-system/slurmgate-tenancy"
    for bad in ("just-a-name", "/x", "ns/", "Ns/x", "a/b/c"):
        with pytest.raises(ConfigError, match="TENANCY_CONFIGMAP"):
            tenancy_configmap({"TENANCY_CONFIGMAP": bad})


def test_both_processes_read_the_same_setting() -> None:
    from slurmgate.binder import config as binder_config
    from slurmgate.webhook import config as webhook_config

    env = {"TENANCY_CONFIGMAP": "slurmgate-system/slurmgate-tenancy"}
    assert webhook_config.load([], env).tenancy_configmap == REF
    assert binder_config.load([], env).tenancy_configmap == REF
    assert webhook_config.load([], {}).tenancy_configmap is None
    assert binder_config.load([], {}).tenancy_configmap is None


async def test_subscribers_hear_every_later_change() -> None:
    kube = FakeKube([cm(GOOD)])
    src = PolicySource(kube, REF, backoff=(0.0, 0.0))
    heard: list[str] = []
    src.subscribe(lambda s: heard.append(s.status))
    task = asyncio.create_task(src.run())
    try:
        await changed(src, 0)
        g = src.generation
        kube.events.put_nowait(("MODIFIED", cm(BAD, "2")))
        await changed(src, g)
        assert heard == ["ready", "invalid"]
    finally:
        await stop(task)


def test_policy_metrics_follow_the_state_under_the_processes_prefix() -> None:
    reg = CollectorRegistry()
    m = PolicyMetrics("webhook", reg)

    def val(name: str, **labels: str) -> float | None:
        return reg.get_sample_value(f"slurmgate_webhook_tenancy_{name}", labels)

    m.on_state(tenancy.STATE_LOADING)
    assert val("policy_state", state="loading") == 1 and val("policy_state", state="ready") == 0
    assert val("reloads_total", result="loading") is None  # loading is no reload outcome
    m.on_state(tenancy.PolicyState(tenancy.MISSING))
    m.on_state(tenancy.PolicyState(tenancy.MISSING))
    assert val("policy_state", state="missing") == 1 and val("policy_state", state="loading") == 0
    assert val("reloads_total", result="missing") == 2
    m.on_error(RuntimeError("x"))
    assert val("source_errors_total") == 1
    PolicyMetrics("binder", reg)  # the other process's names never clash with these
