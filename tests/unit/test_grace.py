"""A Pod must stop within what its partition's preemption GraceTime leaves it once the binder has
noticed the preemption and evicted the Pod: admission lowers a longer
terminationGracePeriodSeconds (LONG_TERMINATION_GRACE=clamp, the default) or refuses the Pod
(deny)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
from typing import Any

import jsonpatch
import pytest

from slurmgate import contract, preemption
from slurmgate.binder import jobpoll
from slurmgate.config import ConfigError
from slurmgate.nodemap import NodeMap
from slurmgate.webhook import __main__ as webhook_main
from slurmgate.webhook import config as webhook_config
from slurmgate.webhook.admission import Admitter
from slurmgate.webhook.config import Settings
from slurmgate.webhook.grace import LongGrace
from tests.unit.fakes import FakeSubmit, marked_pod, node_map, review

GRACE_PATH = "/spec/terminationGracePeriodSeconds"


def graced_nodes(grace_time: int | None, partition: str = "k8s") -> NodeMap:
    nm = node_map()
    nm.partitions[partition] = dataclasses.replace(nm.partitions[partition],
                                                   grace_time_seconds=grace_time)
    return nm


def admitter(grace_time: int | None = 20, mode: LongGrace = LongGrace.CLAMP,
             submit: Any = None, **kw: Any) -> tuple[Admitter, Any]:
    s = submit or FakeSubmit()
    nm = graced_nodes(grace_time)
    return Admitter(s, lambda: nm, Settings(long_grace=mode, **kw)), s


def pod_asking(seconds: int, **ann: str) -> dict[str, Any]:
    pod = marked_pod(**ann)
    pod["spec"]["terminationGracePeriodSeconds"] = seconds
    return pod


def ops_of(out: dict[str, Any]) -> list[dict[str, Any]]:
    return json.loads(base64.b64decode(out["response"]["patch"]))


def applied(pod: dict[str, Any], out: dict[str, Any]) -> dict[str, Any]:
    return jsonpatch.apply_patch(pod, ops_of(out))


# --- the arithmetic both processes share


@pytest.mark.parametrize(("grace_time", "every", "budget"), [
    (20, 2.0, 16),  # the local cluster's k8s partition
    (30, 3.0, 25),
    (25, 2.5, 20),  # 20.5, rounded down: whole seconds, never more than is left
    (600, 60.0, 538),
    (5, 1.0, 2),  # a read at least a second apart, not every 0.5 s
    (3, 1.0, 0),
])
def test_stop_budget_is_grace_time_less_one_notice_less_the_margin(
        grace_time: int, every: float, budget: int) -> None:
    assert preemption.preempt_every(grace_time) == every
    assert preemption.stop_budget(grace_time) == budget


def test_the_binder_reads_at_the_pace_the_budget_assumes() -> None:
    # one function, so a change to the binder's pace changes the webhook's limit with it
    assert jobpoll.preempt_every is preemption.preempt_every


# --- clamp (the default)


@pytest.mark.parametrize("asked", [600, 30, 17])  # 30: what the apiserver sets when unset
async def test_a_longer_grace_is_lowered_and_the_pod_admitted(asked: int) -> None:
    a, s = admitter()
    pod = pod_asking(asked)
    out = await a.review(review(pod))
    r = out["response"]
    assert r["allowed"] is True
    new = applied(pod, out)
    assert new["spec"]["terminationGracePeriodSeconds"] == 16
    assert new["metadata"]["annotations"][contract.A_REQUESTED_GRACE] == str(asked)
    (warning,) = [w for w in r["warnings"] if "terminationGracePeriodSeconds" in w]
    assert warning.startswith(f"terminationGracePeriodSeconds {asked} lowered to 16: "
                              "partition 'k8s' has preemption GraceTime 20s, less 2s to notice a "
                              "preemption and 2s to evict the Pod"), warning
    assert len(s.specs) == 1  # admitted as usual: its job is submitted


async def test_settings_default_to_clamp() -> None:
    assert Settings().long_grace is LongGrace.CLAMP
    assert webhook_config.load([], {}).admission.long_grace is LongGrace.CLAMP


@pytest.mark.parametrize("path", ["submitted", "dry_run", "group", "fail_open", "handed_off"])
async def test_every_way_of_admitting_lowers_the_grace(path: str) -> None:
    """Each branch of admission builds its own patch: none may leave the grace as asked."""
    kw: dict[str, Any] = {}
    ann: dict[str, str] = {}
    if path == "group":
        ann = {contract.A_GROUP: "pair", contract.A_GROUP_SIZE: "2"}
    elif path == "fail_open":
        kw = {"submit": FakeSubmit(fail="connection refused"), "fail_open": True}
    elif path == "handed_off":
        never = asyncio.Event()

        async def slow(spec: Any) -> int:
            await never.wait()
            return 1

        kw = {"submit": slow, "submit_budget": 0.01}
    a, _ = admitter(**kw)
    pod = pod_asking(60, **ann)
    out = await asyncio.wait_for(a.review(review(pod, dry_run=path == "dry_run")), 5)
    assert out["response"]["allowed"] is True
    new = applied(pod, out)
    assert new["spec"]["terminationGracePeriodSeconds"] == 16
    assert new["metadata"]["annotations"][contract.A_REQUESTED_GRACE] == "60"
    for t in a.in_flight:
        t.cancel()


# --- deny


async def test_deny_refuses_a_longer_grace_with_the_numbers_and_submits_nothing() -> None:
    a, s = admitter(mode=LongGrace.DENY)
    out = await a.review(review(pod_asking(600)))
    r = out["response"]
    assert r["allowed"] is False
    assert r["status"]["reason"] == "GracePeriodTooLong"
    msg = r["status"]["message"]
    assert msg.startswith("slurmgate: terminationGracePeriodSeconds 600 is longer than the 16s "
                          "a Pod may take to stop: partition 'k8s' has preemption GraceTime "
                          "20s"), msg
    assert "Set spec.terminationGracePeriodSeconds to at most 16" in msg
    assert s.specs == []  # refused before any job was submitted


async def test_deny_admits_a_grace_within_the_budget() -> None:
    a, _ = admitter(mode=LongGrace.DENY)
    out = await a.review(review(pod_asking(16)))
    assert out["response"]["allowed"] is True
    assert "warnings" not in out["response"]


# --- untouched


@pytest.mark.parametrize("mode", list(LongGrace))
@pytest.mark.parametrize("asked", [16, 5, 0])
async def test_a_grace_within_the_budget_is_untouched(mode: LongGrace, asked: int) -> None:
    a, _ = admitter(mode=mode)
    pod = pod_asking(asked)
    out = await a.review(review(pod))
    assert out["response"]["allowed"] is True
    assert not [op for op in ops_of(out) if op["path"] == GRACE_PATH]
    assert contract.A_REQUESTED_GRACE not in applied(pod, out)["metadata"]["annotations"]
    assert "warnings" not in out["response"]


@pytest.mark.parametrize("mode", list(LongGrace))
@pytest.mark.parametrize("grace_time", [None, 0])  # 0: how Slurm reports "no GraceTime"
async def test_a_partition_without_grace_time_leaves_the_pod_alone(
        mode: LongGrace, grace_time: int | None) -> None:
    a, _ = admitter(grace_time, mode)
    pod = pod_asking(600)
    out = await a.review(review(pod))
    assert out["response"]["allowed"] is True
    assert not [op for op in ops_of(out) if op["path"] == GRACE_PATH]
    assert "warnings" not in out["response"]


async def test_the_pods_own_partition_counts_not_the_default() -> None:
    a, _ = admitter()  # k8s (the default) has GraceTime 20, hpc none
    pod = pod_asking(600, **{contract.A_PARTITION: "hpc"})
    out = await a.review(review(pod))
    assert not [op for op in ops_of(out) if op["path"] == GRACE_PATH]


async def test_a_copied_requested_grace_annotation_is_dropped_not_refused() -> None:
    """A Pod made from another's YAML carries the annotation: neither an unknown annotation to
    refuse nor something this Pod asked for."""
    a, _ = admitter()
    pod = pod_asking(16, **{contract.A_REQUESTED_GRACE: "600"})
    out = await a.review(review(pod))
    assert out["response"]["allowed"] is True
    assert contract.A_REQUESTED_GRACE not in applied(pod, out)["metadata"]["annotations"]


# --- a GraceTime too short for any Pod


async def test_tiny_grace_time_clamps_to_the_kubelets_least_and_says_it_is_not_enough() -> None:
    a, _ = admitter(grace_time=3)  # 3 s less 1 s less 2 s: nothing left
    pod = pod_asking(30)
    out = await a.review(review(pod))
    assert out["response"]["allowed"] is True
    new = applied(pod, out)
    assert new["spec"]["terminationGracePeriodSeconds"] == preemption.KUBELET_MIN_GRACE == 2
    assert new["metadata"]["annotations"][contract.A_REQUESTED_GRACE] == "30"
    (warning,) = out["response"]["warnings"]
    assert warning.startswith("terminationGracePeriodSeconds 30 lowered to 2; partition 'k8s' "
                              "has preemption GraceTime 3s, less 1s to notice a preemption and "
                              "2s to evict the Pod leaves 0s"), warning
    assert "may still run beside the next job" in warning


async def test_tiny_grace_time_keeps_a_shorter_grace_but_warns() -> None:
    a, _ = admitter(grace_time=3)
    pod = pod_asking(1)
    out = await a.review(review(pod))
    assert out["response"]["allowed"] is True
    assert not [op for op in ops_of(out) if op["path"] == GRACE_PATH]
    (warning,) = out["response"]["warnings"]
    assert warning.startswith("terminationGracePeriodSeconds 1 kept; partition 'k8s'"), warning


@pytest.mark.parametrize("asked", [30, 1])
async def test_tiny_grace_time_is_refused_under_deny(asked: int) -> None:
    a, s = admitter(grace_time=3, mode=LongGrace.DENY)
    r = (await a.review(review(pod_asking(asked))))["response"]
    assert r["allowed"] is False
    assert r["status"]["reason"] == "GraceTimeTooShort"
    assert "GraceTime 3s" in r["status"]["message"]
    assert "leaves 0s, less than the 2s the kubelet gives any Pod" in r["status"]["message"]
    assert s.specs == []


# --- the setting


@pytest.mark.parametrize(("raw", "want"), [
    ("clamp", LongGrace.CLAMP), ("deny", LongGrace.DENY), (" Deny ", LongGrace.DENY),
    ("", LongGrace.CLAMP),  # left blank in the ConfigMap
])
def test_setting_values(raw: str, want: LongGrace) -> None:
    cfg = webhook_config.load([], {"LONG_TERMINATION_GRACE": raw})
    assert cfg.admission.long_grace is want


@pytest.mark.parametrize("raw", ["truncate", "0", "denied"])
def test_a_bad_setting_stops_the_webhook_at_start(raw: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=f"^LONG_TERMINATION_GRACE='{raw}' must be clamp "):
        webhook_config.load([], {"LONG_TERMINATION_GRACE": raw})
    monkeypatch.setenv("LONG_TERMINATION_GRACE", raw)

    async def started(cfg: object) -> None:
        raise AssertionError("the webhook started with a bad setting")

    monkeypatch.setattr(webhook_main, "run", started)
    with pytest.raises(SystemExit) as e:
        webhook_main.main([])
    assert str(e.value.code).startswith(f"slurmgate-webhook: LONG_TERMINATION_GRACE='{raw}' "
                                        "must be clamp")
