"""binder/background.py: the SlurmAllocated condition is written off the bind's path. It waits
while a bind is in flight (up to PATIENCE), one Pod's writes keep their order, a repeat of the
pending write is not made twice, and a failed write asks for the Pod again."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from slurmgate.binder import background
from slurmgate.binder.background import BackgroundWrites
from slurmgate.kube import KubeError


class Kube:
    """Records pods/status patches; `fail` makes them raise."""

    def __init__(self, fail: KubeError | None = None) -> None:
        self.patches: list[tuple[str, str]] = []
        self.fail = fail

    async def strategic_patch(self, path: str, body: dict[str, Any]) -> None:
        if self.fail is not None:
            raise self.fail
        self.patches.append((path, body["status"]["conditions"][0]["reason"]))


def pod(uid: str = "u1") -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": uid}, "status": {}}


def cond(reason: str, status: str = "True") -> Any:
    return {"type": "SlurmAllocated", "status": status, "reason": reason, "message": reason}


async def settle(bw: BackgroundWrites) -> None:
    while bw._condition_writes:
        await asyncio.wait([t for *_, t in bw._condition_writes.values()])


def test_a_condition_waits_for_the_bind_in_flight() -> None:
    async def run() -> list[tuple[str, str]]:
        kube = Kube()
        bw = BackgroundWrites(kube)  # type: ignore[arg-type]
        with bw.binding():
            bw.set_condition(pod(), cond("Allocated"))
            for _ in range(20):  # many loop turns: the write must still be held
                await asyncio.sleep(0)
            assert kube.patches == []
        await settle(bw)
        return kube.patches

    assert asyncio.run(run()) == [("/api/v1/namespaces/ns/pods/p/status", "Allocated")]


def test_patience_bounds_the_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(background, "PATIENCE", 0.05)

    async def run() -> list[tuple[str, str]]:
        kube = Kube()
        bw = BackgroundWrites(kube)  # type: ignore[arg-type]
        with bw.binding():  # a bind that never ends within the test
            bw.set_condition(pod(), cond("Allocated"))
            await settle(bw)
            return kube.patches

    assert [r for _, r in asyncio.run(run())] == ["Allocated"]


def test_one_pods_writes_keep_their_order_and_a_repeat_is_dropped() -> None:
    async def run() -> list[str]:
        kube = Kube()
        bw = BackgroundWrites(kube)  # type: ignore[arg-type]
        with bw.binding():
            bw.set_condition(pod(), cond("Pending", "False"))
            bw.set_condition(pod(), cond("Allocated"))
            bw.set_condition(pod(), cond("Allocated"))  # the same as the one pending
        await settle(bw)
        return [r for _, r in kube.patches]

    assert asyncio.run(run()) == ["Pending", "Allocated"]


def test_a_failed_write_asks_for_the_pod_again_a_gone_pod_does_not() -> None:
    async def run(err: KubeError) -> list[str]:
        asked: list[str] = []
        bw = BackgroundWrites(Kube(fail=err))  # type: ignore[arg-type]
        bw.on_condition_failed = asked.append
        bw.set_condition(pod(), cond("Allocated"))
        await settle(bw)
        return asked

    assert asyncio.run(run(KubeError(500, "InternalError", "boom"))) == ["ns/p"]
    assert asyncio.run(run(KubeError(404, "NotFound", "gone"))) == []
