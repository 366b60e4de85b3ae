"""AdmissionReview in, AdmissionReview out: validate, submit the placeholder job, gate."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from slurmgate import contract, faults, groups, podrequest, reasons, tenancy
from slurmgate.logs import kv
from slurmgate.nodemap import NodeMap
from slurmgate.slurm import JobSpec, SlurmError, SlurmRefused, SlurmUnavailable
from slurmgate.slurm.placeholder import job_spec, refusal, submitted_status

from . import decide, metrics
from .config import Settings
from .patch import gate_pod

log = logging.getLogger("slurmgate.webhook")

API_VERSION = "admission.k8s.io/v1"


STALE = decide.STALE
# A handed-off submit is dropped this long after it began, before the binder may submit itself
HANDOFF_LIMIT = contract.SUBMIT_HANDOFF_GRACE - 5.0


async def _no_lookup(path: str) -> dict[str, Any] | None:
    return None


class BadReview(ValueError):
    """The body is not an AdmissionReview we can answer."""


Submit = Callable[[JobSpec], Awaitable[int]]


def _response(uid: str, allowed: bool, *, patch: list[dict[str, Any]] | None = None,
              message: str = "", reason: str = "", code: int = 403,
              warnings: tuple[str, ...] = ()) -> dict[str, Any]:
    resp: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch:
        resp["patchType"] = "JSONPatch"
        resp["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if not allowed:
        resp["status"] = {"code": code, "reason": reason, "message": f"slurmgate: {message}"}
    if warnings:
        resp["warnings"] = [w[:256] for w in warnings[:10]]
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": resp}


def parse_review(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadReview("body must be a JSON object")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise BadReview(f"expected apiVersion {API_VERSION} kind AdmissionReview")
    req = body.get("request")
    if not isinstance(req, dict):
        raise BadReview("request must be an object")
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid or len(uid) > 128:
        raise BadReview("request.uid must be a non-empty string")
    return req


class Admitter:
    def __init__(self, submit: Submit, nodemap: Callable[[], NodeMap | None],
                 settings: Settings, lookup: groups.Get | None = None,
                 policy: Callable[[], tenancy.PolicyState] | None = None,
                 on_submitted: Callable[[str, str, int], None] | None = None) -> None:
        self._submit = submit
        # (namespace, claim, job id) of each job submitted for an admitted Pod
        self._on_submitted = on_submitted or (lambda _ns, _claim, _job: None)
        self._nodemap = nodemap
        self.settings = settings
        self._lookup = lookup or _no_lookup
        # the tenancy policy as its source knows it now; None: tenancy off
        self._policy = policy or (lambda: tenancy.STATE_DISABLED)
        # apiserver retries reuse the request uid: answer them from here, so one job per Pod
        self._seen: OrderedDict[str, asyncio.Future[dict[str, Any]]] = OrderedDict()
        # every submit still running, kept referenced until done: one that outlived its
        # budget (or its review, cancelled) must still land
        self.in_flight: set[asyncio.Task[int]] = set()
        self._slurm_away = False  # the last submit to finish found Slurm unreachable

    async def review(self, body: Any) -> dict[str, Any]:
        """Raises BadReview for bodies that are not AdmissionReviews."""
        req = parse_review(body)
        uid = req["uid"]
        pending = self._seen.get(uid)
        if pending is not None:
            metrics.DUPLICATES.inc()
            return await asyncio.shield(pending)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._seen[uid] = fut
        while len(self._seen) > self.settings.dedup_entries:
            self._seen.popitem(last=False)
        try:
            result = await self._review(uid, req)
        except BaseException as e:
            self._seen.pop(uid, None)
            fut.set_exception(e)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody waits
            raise
        fut.set_result(result)
        return result

    async def _review(self, uid: str, req: dict[str, Any]) -> dict[str, Any]:
        kind = req.get("kind") or {}
        resource = req.get("resource") or {}
        is_pod = (isinstance(kind, dict) and kind.get("kind") == "Pod" and kind.get("group") == ""
                  and isinstance(resource, dict) and resource.get("resource") == "pods"
                  and not req.get("subResource"))
        if not is_pod or req.get("operation") != "CREATE":
            return _response(uid, True)
        pod = req.get("object")
        if not isinstance(pod, dict):
            return self._deny(uid, reasons.DENY_INVALID_OBJECT,
                              "request.object must be a Pod object")
        meta = pod.get("metadata") or {}
        if not isinstance(meta, dict):
            return self._deny(uid, reasons.DENY_INVALID_OBJECT, "metadata must be an object")
        labels = meta.get("labels")
        if not contract.is_marked(labels if isinstance(labels, dict) else None):
            metrics.DECISIONS.labels("untouched").inc()
            return _response(uid, True)
        return await self._admit_marked(uid, req, pod, meta)

    def _deny(self, uid: str, reason: str, message: str,
              warnings: tuple[str, ...] = ()) -> dict[str, Any]:
        metrics.DENIALS.labels(reason).inc()
        metrics.DECISIONS.labels("denied").inc()
        return _response(uid, False, message=message, reason=reason, warnings=warnings)

    async def _admit_marked(self, uid: str, req: dict[str, Any], pod: dict[str, Any],
                            meta: dict[str, Any]) -> dict[str, Any]:
        who = decide.identify(req, pod, meta)
        if isinstance(who, decide.Denial):
            return self._deny(uid, who.reason, who.message)
        try:
            resolved = await groups.resolve(pod, who.namespace, self._lookup)
        except podrequest.PodRequestError as e:
            return self._deny(uid, e.reason, str(e))
        except Exception as e:  # the API is unreachable: say so rather than guess
            return self._deny(uid, reasons.DENY_OWNER_LOOKUP_FAILED,
                              f"could not read the Pod's owning workload: {e}")
        d = decide.admit(pod, who, resolved, self.settings, self._policy(), self._nodemap(),
                         uuid.uuid4().hex, dry_run=bool(req.get("dryRun")))
        if isinstance(d, decide.Denial):
            return self._deny(uid, d.reason, d.message, d.warnings)
        if d.kind != decide.SUBMIT:
            metrics.DECISIONS.labels(d.kind).inc()
            return _response(uid, True, patch=gate_pod(pod, d.annotations, d.drop, grace=d.grace),
                             warnings=d.warnings)
        return await self._submit_then_gate(uid, pod, who, d)

    async def _submit_then_gate(self, uid: str, pod: dict[str, Any], who: decide.Identity,
                                d: decide.Admit) -> dict[str, Any]:
        """Submit the placeholder job within the settings' time, then gate the Pod with its id;
        or hand the submit off, or gate it for the binder, or deny (see the callees)."""
        assert d.claim is not None
        claim, annotations, warnings = d.claim, dict(d.annotations), list(d.warnings)
        job = job_spec(d.request, claim, who.namespace, who.display)
        pod_ref = f"{who.namespace}/{who.display}"
        submit = asyncio.ensure_future(self._timed_submit(job, pod_ref))
        self.in_flight.add(submit)
        submit.add_done_callback(self.in_flight.discard)
        budget, within = self.settings.submit_budget, self.settings.answer_within
        # after Slurm was unreachable, wait for its answer again: a denial says more than a
        # Pod gated on a submit that is likely to fail
        if budget > 0 and not self._slurm_away:
            await asyncio.wait((submit,), timeout=budget)
            if not submit.done():
                # the binder submits after SUBMIT_HANDOFF_GRACE: this one must be over by then
                asyncio.get_running_loop().call_later(HANDOFF_LIMIT - budget, submit.cancel)
                return self._hand_off(uid, submit, pod, annotations, who.namespace, pod_ref,
                                      warnings, d.grace)
        await asyncio.wait((submit,), timeout=within)
        if not submit.done():
            return self._unanswered(uid, submit, job, pod, annotations, who.namespace, pod_ref,
                                    warnings, d.grace)
        try:
            job_id = submit.result()
        except SlurmError as e:
            return self._submit_failed(uid, e, job, pod, annotations, warnings, d.grace)
        faults.point("webhook_after_submit")
        annotations.update(submitted_status(job_id, time.time()))
        metrics.DECISIONS.labels("gated").inc()
        self._on_submitted(who.namespace, claim, job_id)
        r = d.request
        log.info("placeholder job submitted",
                 extra=kv(pod=pod_ref, job=job_id, claim=claim,
                          memory_mib=r.memory_mib, cpus=r.cpus, partition=r.partition,
                          user=r.user, account=r.account, qos=r.qos, nice=r.nice))
        return _response(uid, True, patch=gate_pod(pod, annotations, STALE,
                                                   {contract.CLAIM_LABEL: claim}, d.grace),
                         warnings=tuple(warnings))

    def _submit_failed(self, uid: str, e: SlurmError, job: JobSpec, pod: dict[str, Any],
                       annotations: dict[str, str], warnings: list[str],
                       grace: int | None) -> dict[str, Any]:
        """Denied, or with fail-open gated for the binder to submit when Slurm answers. A
        refusal is denied either way, in Slurm's own words: Slurm did answer, and made no job."""
        if isinstance(e, SlurmRefused):
            return self._deny(uid, reasons.EV_SUBMIT_REFUSED, refusal(e, job))
        if not self.settings.fail_open:
            if isinstance(e, SlurmUnavailable):
                return self._deny(uid, reasons.DENY_SLURM_UNAVAILABLE, f"Slurm is unreachable: {e}")
            return self._deny(uid, reasons.EV_SUBMIT_FAILED,
                              f"submitting the placeholder job failed: {e}")
        annotations[contract.A_JOB_STATE] = contract.JOB_STATE_SUBMIT_PENDING
        annotations[contract.A_JOB_REASON] = str(e)[:200]
        metrics.DECISIONS.labels("gated_submit_pending").inc()
        warnings.append("Slurm is unreachable: the Pod is gated and its job will be "
                        "submitted when Slurm answers again")
        return _response(uid, True, patch=gate_pod(pod, annotations, STALE, grace=grace),
                         warnings=tuple(warnings))

    def _unanswered(self, uid: str, submit: asyncio.Task[int], job: JobSpec,
                    pod: dict[str, Any], annotations: dict[str, str], namespace: str,
                    pod_ref: str, warnings: list[str], grace: int | None) -> dict[str, Any]:
        """No answer within answer_within. Fail-open: the request is dropped and the binder
        submits when Slurm answers (it also looks up a job the dropped request may still make,
        by its name: binder/lostjobs.py). Fail-closed: the Pod is denied, and the submit goes on,
        so that a job Slurm makes for it all the same is cancelled (webhook/orphans.py) when its
        answer comes."""
        self._slurm_away = True
        e = SlurmUnavailable(f"submit job {job.name!r}: slurmrestd did not answer within "
                             f"{self.settings.answer_within:g}s")
        log.warning("slurm submit failed", extra=kv(pod=pod_ref, error=str(e)))
        if self.settings.fail_open:
            submit.cancel()
            metrics.SUBMIT_ERRORS.inc()  # a submit that goes on counts its own end
        else:
            claim = annotations[contract.A_CLAIM]
            submit.add_done_callback(lambda t: self._landed(
                t, namespace, claim, pod_ref, "slurm made the job of a Pod denied for want of "
                "its answer; it is cancelled once the Pod is confirmed absent", logging.WARNING))
        return self._submit_failed(uid, e, job, pod, annotations, warnings, grace)

    def _landed(self, task: asyncio.Task[int], namespace: str, claim: str, pod_ref: str,
                what: str, level: int = logging.INFO) -> None:
        """A submit that outlived its admission ended: a job it made goes to `_on_submitted`
        (the orphan watch), a failure was logged by _timed_submit."""
        if task.cancelled() or task.exception() is not None:
            return
        log.log(level, what, extra=kv(pod=pod_ref, job=task.result(), claim=claim))
        self._on_submitted(namespace, claim, task.result())

    async def _timed_submit(self, job: JobSpec, pod_ref: str) -> int:
        t0 = time.perf_counter()
        try:
            job_id = await self._submit(job)
        except SlurmError as e:
            self._slurm_away = isinstance(e, SlurmUnavailable)
            metrics.SUBMIT_ERRORS.inc()
            log.warning("slurm submit failed", extra=kv(pod=pod_ref, error=str(e)))
            raise
        finally:
            metrics.SUBMIT_LATENCY.observe(time.perf_counter() - t0)
        self._slurm_away = False
        return job_id

    def _hand_off(self, uid: str, submit: asyncio.Task[int], pod: dict[str, Any],
                  annotations: dict[str, str], namespace: str, pod_ref: str,
                  warnings: list[str], grace: int | None) -> dict[str, Any]:
        """Admit now, gated as Submitting; the submit goes on here. Its job carries the claim,
        so the binder finds it in Slurm's list whoever learns the id first; if it never comes
        (Slurm refused it, this process died), the binder submits after
        SUBMIT_HANDOFF_GRACE."""
        claim = annotations[contract.A_CLAIM]
        submit.add_done_callback(lambda t: self._landed(
            t, namespace, claim, pod_ref, "placeholder job submitted after admission"))
        metrics.HANDOFFS.inc()
        metrics.DECISIONS.labels("gated_submitting").inc()
        annotations[contract.A_JOB_STATE] = contract.JOB_STATE_SUBMITTING
        annotations[contract.A_SUBMITTED_AT] = str(int(time.time()))
        return _response(uid, True, patch=gate_pod(pod, annotations, STALE,
                                                   {contract.CLAIM_LABEL: claim}, grace),
                         warnings=tuple(warnings))

    async def drain(self) -> int:
        """Wait for the submits still running (a stopping webhook lets them land rather than
        leave them to the binder's grace; the caller bounds the wait). Returns how many ran."""
        running = set(self.in_flight)
        if running:
            await asyncio.wait(running)
        return len(running)
