"""A submit Slurm does not answer within the webhook's budget: the Pod is admitted gated as
Submitting, the submit lands afterwards, and the binder waits for its job (or submits itself
once the webhook can no longer be sending it)."""

from __future__ import annotations

import asyncio
import base64
import inspect
import json

import jsonpatch
import pytest

from slurmgate import contract, reasons
from slurmgate.binder import decide as state
from slurmgate.config import ConfigError
from slurmgate.slurm import JobSpec, SlurmClient, SlurmError, SlurmUnavailable
from slurmgate.webhook import admission, config, metrics
from slurmgate.webhook.admission import Admitter
from slurmgate.webhook.config import Settings
from tests.unit.fakes import marked_pod, node_map, review


class HeldSubmit:
    """Slurm's answer comes when the test releases it (or at once when not held)."""

    def __init__(self, held: bool = True, fail: str | None = None,
                 unreachable: bool = False) -> None:
        self.release = asyncio.Event()
        if not held:
            self.release.set()
        self.fail = fail
        self.unreachable = unreachable
        self.specs: list[JobSpec] = []

    async def __call__(self, spec: JobSpec) -> int:
        self.specs.append(spec)
        await self.release.wait()
        if self.fail:
            raise (SlurmUnavailable if self.unreachable else SlurmError)(self.fail)
        return 500 + len(self.specs)


def admitter(submit: HeldSubmit, budget: float) -> Admitter:
    nm = node_map()
    return Admitter(submit, lambda: nm, Settings(submit_budget=budget))


def gated_annotations(pod: dict, out: dict) -> dict[str, str]:
    ops = json.loads(base64.b64decode(out["response"]["patch"]))
    new: dict = jsonpatch.apply_patch(pod, ops)
    assert new["spec"]["schedulingGates"] == [{"name": contract.GATE}]
    return dict(new["metadata"]["annotations"])


def handoffs() -> float:
    return metrics.REGISTRY.get_sample_value("slurmgate_webhook_submit_handoffs_total") or 0.0


async def test_slow_submit_is_handed_off_and_still_lands() -> None:
    s = HeldSubmit()
    a = admitter(s, budget=0.05)
    before = handoffs()
    pod = marked_pod()
    out = await asyncio.wait_for(a.review(review(pod)), 5)
    assert out["response"]["allowed"] is True
    ann = gated_annotations(pod, out)
    assert ann[contract.A_JOB_STATE] == contract.JOB_STATE_SUBMITTING
    assert contract.A_JOB_ID not in ann
    assert int(ann[contract.A_SUBMITTED_AT]) > 0
    assert handoffs() == before + 1
    # the job the binder will find carries the claim the Pod was given
    (spec,) = s.specs
    assert contract.claim_from_comment(spec.comment) == ann[contract.A_CLAIM]
    (task,) = a.in_flight
    s.release.set()
    assert await asyncio.wait_for(a.drain(), 5) == 1
    assert task.result() == 501 and not a.in_flight


async def test_answer_within_budget_names_the_job() -> None:
    s = HeldSubmit(held=False)
    before = handoffs()
    pod = marked_pod()
    out = await admitter(s, budget=5.0).review(review(pod))
    ann = gated_annotations(pod, out)
    assert (ann[contract.A_JOB_ID], ann[contract.A_JOB_STATE]) == ("501", "PENDING")
    assert handoffs() == before


async def test_budget_zero_waits_for_slurm() -> None:
    s = HeldSubmit()
    a = admitter(s, budget=0.0)
    review_task = asyncio.ensure_future(a.review(review(marked_pod())))
    # well past the default budget, the review still waits for Slurm
    done, _ = await asyncio.wait({review_task}, timeout=0.3)
    assert not done
    s.release.set()
    out = await asyncio.wait_for(review_task, 5)
    assert gated_annotations(marked_pod(), out)[contract.A_JOB_ID] == "501"


async def test_refused_after_handoff_is_counted_and_leaves_nothing_running() -> None:
    s = HeldSubmit(fail="Invalid account")
    a = admitter(s, budget=0.02)
    errors = metrics.REGISTRY.get_sample_value("slurmgate_slurm_submit_errors_total") or 0.0
    out = await a.review(review(marked_pod()))
    assert out["response"]["allowed"] is True  # the binder submits after the grace and says why
    s.release.set()
    await asyncio.wait_for(a.drain(), 5)
    assert metrics.REGISTRY.get_sample_value("slurmgate_slurm_submit_errors_total") == errors + 1
    assert not a.in_flight


async def test_after_slurm_was_unreachable_admission_waits_and_denies() -> None:
    s = HeldSubmit(fail="cannot reach slurmrestd", unreachable=True)
    a = admitter(s, budget=0.02)
    first = await a.review(review(marked_pod()))
    assert first["response"]["allowed"] is True  # handed off: Slurm was not known to be away
    s.release.set()
    await asyncio.wait_for(a.drain(), 5)
    before = handoffs()
    second = await asyncio.wait_for(a.review(review(marked_pod())), 5)
    assert second["response"]["allowed"] is False
    assert second["response"]["status"]["reason"] == "SlurmUnavailable"
    assert handoffs() == before
    s.fail = None  # Slurm answers again: the next slow submit is handed off again
    third = await asyncio.wait_for(a.review(review(pod := marked_pod())), 5)
    assert contract.A_JOB_ID in gated_annotations(pod, third)
    s.release.clear()
    fourth = await asyncio.wait_for(a.review(review(marked_pod())), 5)
    assert fourth["response"]["allowed"] is True and handoffs() == before + 1
    s.release.set()
    await asyncio.wait_for(a.drain(), 5)


def test_default_is_to_wait_for_slurm() -> None:
    assert Settings().submit_budget == 0.0


@pytest.mark.parametrize("raw,want", [(None, Settings.submit_budget), ("0", 0.0),
                                      ("0.25", 0.25), ("8", 8.0)])
def test_submit_budget_from_env(raw: str | None, want: float) -> None:
    env = {} if raw is None else {"SUBMIT_BUDGET": raw}
    assert config.load([], env).admission.submit_budget == want


@pytest.mark.parametrize("raw", ["-1", "9", "nan", "inf", "soon"])
def test_bad_submit_budget_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match="SUBMIT_BUDGET"):
        config.load([], {"SUBMIT_BUDGET": raw})


# --- the binder's side ---
NOW = 1_000_000.0
W = state.World(slurm_synced=True, now=NOW, node_for={"n1": state.NodeRef("kwok-n1", False)})


def submitting_pod(age: float) -> dict:
    return {"metadata": {"name": "p", "namespace": "default", "uid": "u", "annotations": {
        contract.A_CLAIM: "c1", contract.A_JOB_STATE: contract.JOB_STATE_SUBMITTING,
        contract.A_SUBMITTED_AT: str(int(NOW - age))}},
        "spec": {"schedulerName": contract.SCHEDULER_NAME,
                 "schedulingGates": [{"name": contract.GATE}]},
        "status": {"phase": "Pending"}}


def job(st: str, nodes: tuple[str, ...] = ()) -> state.JobInfo:
    return state.JobInfo(job_id=9, name="k8s:p", state=st, reason="None", nodes=nodes,
                         comment="slurmgate claim=c1 pod=default/p", partition="k8s",
                         submit_time=int(NOW), start_time=0, end_time=0)


def decide(p: dict, j: state.JobInfo | None, w: state.World = W) -> state.Decision:
    return state.decide(state.Unit.single(p), lambda _c: j, w)


def test_binder_waits_for_the_handed_off_submit() -> None:
    d = decide(submitting_pod(age=3), None)
    assert d.action == state.WAIT
    assert d.requeue_after == pytest.approx(W.handoff_grace - 3)
    assert d.conditions == ()  # nothing to show yet: the job is a moment away


def test_binder_submits_once_the_webhook_cannot_be_sending_it() -> None:
    d = decide(submitting_pod(age=W.handoff_grace + 1), None)
    assert (d.action, d.reason) == (state.SUBMIT, reasons.EV_JOB_SUBMITTED)


def test_a_clock_ahead_does_not_park_the_pod() -> None:
    d = decide(submitting_pod(age=-10_000), None)
    assert d.action == state.WAIT and d.requeue_after == W.handoff_grace


def test_the_job_found_by_claim_is_adopted() -> None:
    pending = decide(submitting_pod(age=1), job("PENDING"))
    assert pending.action == state.STATUS
    assert pending.status[contract.A_JOB_ID] == "9"
    running = decide(submitting_pod(age=1), job("RUNNING", ("n1",)))
    assert running.action == state.BIND and running.node == "kwok-n1"
    assert running.status[contract.A_JOB_ID] == "9"


def test_grace_covers_the_webhooks_longest_submit() -> None:
    # dialect probe + submit + cancel of a changed job, each up to the client's timeout
    timeout = inspect.signature(SlurmClient).parameters["timeout"].default
    assert contract.SUBMIT_HANDOFF_GRACE > 3 * timeout
    assert W.handoff_grace == contract.SUBMIT_HANDOFF_GRACE


# ------------------------------------------------ a submit that outlives its admission


def denied_admitter(s: HeldSubmit, seen: list[tuple[str, str, int]],
                    **kw: object) -> Admitter:
    nm = node_map()
    return Admitter(s, lambda: nm, Settings(answer_within=0.05, **kw),  # type: ignore[arg-type]
                    on_submitted=lambda ns, claim, job: seen.append((ns, claim, job)))


async def test_a_denied_pods_job_made_later_is_reported_for_cancelling() -> None:
    """Fail-closed, Slurm silent past answer_within (chaos: slurmctld restarting): the Pod is
    denied, but the submit goes on; when slurmctld makes the job after all, its answer names
    it, and it is handed to the orphan watch, which cancels it (the Pod never existed)."""
    s, seen = HeldSubmit(), list[tuple[str, str, int]]()
    a = denied_admitter(s, seen)
    out = await asyncio.wait_for(a.review(review(marked_pod())), 5)
    assert out["response"]["allowed"] is False
    assert out["response"]["status"]["reason"] == "SlurmUnavailable"
    assert "did not answer within 0.05s" in out["response"]["status"]["message"]
    (task,) = a.in_flight
    assert seen == []
    s.release.set()
    await asyncio.wait_for(a.drain(), 5)
    (spec,) = s.specs
    assert task.result() == 501
    assert seen == [("default", contract.claim_from_comment(spec.comment), 501)]


async def test_a_late_refusal_reports_nothing() -> None:
    s, seen = HeldSubmit(fail="Invalid account"), list[tuple[str, str, int]]()
    a = denied_admitter(s, seen)
    out = await asyncio.wait_for(a.review(review(marked_pod())), 5)
    assert out["response"]["allowed"] is False
    s.release.set()
    await asyncio.wait_for(a.drain(), 5)
    assert seen == [] and not a.in_flight


async def test_fail_open_drops_the_unanswered_submit() -> None:
    """Fail-open: the Pod is gated SubmitPending and the binder submits; the webhook's request
    is dropped (the binder reads the whole list for a job it may still make)."""
    s, seen = HeldSubmit(), list[tuple[str, str, int]]()
    a = denied_admitter(s, seen, fail_open=True)
    pod = marked_pod()
    out = await asyncio.wait_for(a.review(review(pod)), 5)
    ann = gated_annotations(pod, out)
    assert ann[contract.A_JOB_STATE] == contract.JOB_STATE_SUBMIT_PENDING
    assert not a.in_flight or all(t.cancelled() or t.cancelling() for t in a.in_flight)
    await asyncio.wait_for(a.drain(), 5)
    assert seen == [] and not a.in_flight


async def test_a_handed_off_submit_ends_before_the_binder_may_submit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A handed-off submit Slurm never answers is dropped at HANDOFF_LIMIT, before the binder
    may submit the Pod's job itself (two jobs for one Pod otherwise)."""
    assert admission.HANDOFF_LIMIT < contract.SUBMIT_HANDOFF_GRACE
    monkeypatch.setattr(admission, "HANDOFF_LIMIT", 0.1)
    s = HeldSubmit()
    a = admitter(s, budget=0.02)
    out = await asyncio.wait_for(a.review(review(marked_pod())), 5)
    assert out["response"]["allowed"] is True
    (task,) = a.in_flight
    await asyncio.wait_for(asyncio.wait({task}), 5)  # never released: only the limit ends it
    assert task.cancelled() and s.specs
