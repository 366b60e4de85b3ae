"""The leading binder labels its own Pod (the push Service selects it) and unlabels it at start
and when it steps down; a failed patch never stops the binder."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from slurmgate import contract
from slurmgate.binder.leader import label_own_pod
from slurmgate.kube import KubeError


class FakeKube:
    def __init__(self, fail: bool = False) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> Any:
        if self.fail:
            raise KubeError(503, "ServiceUnavailable", "apiserver away")
        self.patches.append((path, patch))
        return {}


@pytest.mark.parametrize("leading,value", [(True, "true"), (False, None)])
def test_the_pod_is_labelled_while_leading_and_unlabelled_otherwise(
        leading: bool, value: str | None) -> None:
    kube = FakeKube()
    asyncio.run(label_own_pod(kube, "slurmgate-system", "slurmgate-abc", leading))  # type: ignore[arg-type]
    # merge patch: null removes the label
    assert kube.patches == [("/api/v1/namespaces/slurmgate-system/pods/slurmgate-abc",
                             {"metadata": {"labels": {contract.LEADER_LABEL: value}}})]


@pytest.mark.parametrize("namespace,pod", [(None, "p"), ("ns", None), (None, None)])
def test_outside_a_pod_nothing_is_labelled(namespace: str | None, pod: str | None) -> None:
    kube = FakeKube()
    asyncio.run(label_own_pod(kube, namespace, pod, True))  # type: ignore[arg-type]
    assert kube.patches == []


def test_a_failed_patch_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    asyncio.run(label_own_pod(FakeKube(fail=True), "ns", "p", True))  # type: ignore[arg-type]
    assert "could not label the binder's Pod" in caplog.text
