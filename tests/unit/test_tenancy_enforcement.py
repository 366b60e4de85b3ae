"""The tenancy policy where it is enforced: the webhook's admission and readiness, and the
binder's submits (policy changed after admission)."""

from __future__ import annotations

import asyncio
from typing import Any

from slurmgate import contract, reasons, tenancy
from slurmgate.binder.actions import TENANCY_RETRY, Actions
from slurmgate.binder.config import ReconcileSettings
from slurmgate.binder.controller import Controller
from slurmgate.binder.index import Request
from slurmgate.slurm import JobInfo, JobSpec
from slurmgate.tenancy import PolicyState
from slurmgate.webhook.admission import Admitter
from slurmgate.webhook.config import Settings
from slurmgate.webhook.server import readiness
from tests.unit.fakes import FakeSubmit, marked_pod, node_map, review

POLICY = tenancy.parse("""
tenants:
  - namespaces: [team-a]
    user: team-a
    account: team-a
    accounts: [team-a, shared]
    qos: [normal]
    partitions: [k8s]
""")
READY = PolicyState(tenancy.READY, POLICY)



async def submit_one(act: Any, pod: dict) -> float | None:
    """A single Pod's submit, as the controller asks it."""
    return await act.submit(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", [pod],
                            False, lambda: [])

def admitter(state: PolicyState = READY) -> tuple[Admitter, FakeSubmit]:
    s = FakeSubmit()
    nm = node_map()
    return Admitter(s, lambda: nm, Settings(), policy=lambda: state), s  # type: ignore[arg-type]


def in_ns(body: dict[str, Any], ns: str) -> dict[str, Any]:
    body["request"]["namespace"] = ns
    body["request"]["object"]["metadata"]["namespace"] = ns
    return body


# ----------------------------------------------------------------------------- webhook


async def test_allowed_pod_runs_as_the_tenant_with_its_default_account() -> None:
    a, s = admitter()
    out = await a.review(in_ns(review(marked_pod()), "team-a"))
    assert out["response"]["allowed"] is True
    (spec,) = s.specs
    assert (spec.user, spec.account, spec.partition) == ("team-a", "team-a", "k8s")


async def test_named_account_and_qos_within_the_policy() -> None:
    a, s = admitter()
    pod = marked_pod(**{contract.A_ACCOUNT: "shared", contract.A_QOS: "normal"})
    assert (await a.review(in_ns(review(pod), "team-a")))["response"]["allowed"]
    (spec,) = s.specs
    assert (spec.user, spec.account, spec.qos) == ("team-a", "shared", "normal")


async def test_denials_name_the_reason_and_submit_nothing() -> None:
    a, s = admitter()
    cases = [("team-b", {}, "NamespaceNotInTenancy"),
             ("team-a", {contract.A_ACCOUNT: "team-b"}, "AccountNotAllowed"),
             ("team-a", {contract.A_QOS: "high"}, "QOSNotAllowed"),
             ("team-a", {contract.A_PARTITION: "hpc"}, "PartitionNotAllowed")]
    for ns, ann, reason in cases:
        out = await a.review(in_ns(review(marked_pod(**ann)), ns))
        r = out["response"]
        assert r["allowed"] is False and r["status"]["reason"] == reason, (ns, ann)
        assert f'namespace "{ns}"' in r["status"]["message"]
    assert s.specs == []
    msg = (await a.review(in_ns(review(marked_pod(**{contract.A_ACCOUNT: "team-b"})),
                                "team-a")))["response"]["status"]["message"]
    assert msg == ('slurmgate: namespace "team-a" may not use account "team-b" '
                   f"({contract.A_ACCOUNT}); allowed: shared, team-a")


async def test_a_forbidden_gang_is_denied_at_admission() -> None:
    a, s = admitter()
    pod = marked_pod(**{contract.A_GROUP: "pair", contract.A_GROUP_SIZE: "2",
                        contract.A_ACCOUNT: "team-b"})
    out = await a.review(in_ns(review(pod), "team-a"))
    assert out["response"]["status"]["reason"] == "AccountNotAllowed"
    ok = marked_pod(**{contract.A_GROUP: "pair", contract.A_GROUP_SIZE: "2"})
    assert (await a.review(in_ns(review(ok), "team-a")))["response"]["allowed"]
    assert s.specs == []  # the binder submits the gang's job later


async def test_fail_closed_states_deny_every_marked_pod() -> None:
    for state, reason in [(PolicyState(tenancy.MISSING, None, "ConfigMap a/b not found"),
                           "TenancyPolicyMissing"),
                          (PolicyState(tenancy.INVALID, None, "tenants[0].user: bad"),
                           "TenancyPolicyInvalid"),
                          (tenancy.STATE_LOADING, "TenancyPolicyLoading")]:
        a, s = admitter(state)
        out = await a.review(in_ns(review(marked_pod()), "team-a"))
        assert out["response"]["status"]["reason"] == reason
        assert s.specs == []
    # an unmarked Pod is none of the policy's business
    a, _ = admitter(tenancy.STATE_LOADING)
    plain = marked_pod()
    plain["metadata"]["labels"] = {}
    assert (await a.review(review(plain)))["response"]["allowed"] is True


async def test_disabled_is_todays_behaviour() -> None:
    a, s = admitter(tenancy.STATE_DISABLED)
    pod = marked_pod(**{contract.A_ACCOUNT: "anything"})
    assert (await a.review(in_ns(review(pod), "team-z")))["response"]["allowed"]
    (spec,) = s.specs
    assert spec.user is None and spec.account == "anything"


def test_webhook_not_ready_while_the_policy_loads() -> None:
    ok, why = readiness(True, False, tenancy.STATE_LOADING)
    assert not ok and "tenancy" in why
    assert readiness(True, False, READY) == (True, "")
    assert readiness(True, False, tenancy.STATE_DISABLED) == (True, "")
    # missing: ready, its denials say why (a webhook out of the Service would only time out)
    assert readiness(True, False, PolicyState(tenancy.MISSING, None, "x"))[0]
    assert not readiness(False, False, READY)[0]
    assert readiness(False, True, READY)[0]


# ----------------------------------------------------------------------------- binder


class FakeSlurm:
    def __init__(self) -> None:
        self.specs: list[JobSpec] = []

    async def submit(self, spec: JobSpec) -> int:
        self.specs.append(spec)
        return 500 + len(self.specs)


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []

    async def merge_patch(self, path: str, patch: dict[str, Any]) -> None:
        self.patches.append((path, patch))


class FakeEvents:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str, str, bool]] = []

    async def emit(self, pod: dict[str, Any], reason: str, message: str,
                   warning: bool = False, once: bool = True) -> None:
        self.sent.append((pod["metadata"]["name"], reason, message, warning))


class FakeJobs:
    def __init__(self) -> None:
        self.synced = asyncio.Event()
        self.synced.set()
        self.listed = self.synced  # the whole list was read too

        self.asked_again: list[int] = []

    def kick(self) -> None:
        pass

    def submitted(self, job_id: int) -> None:
        self.asked_again.append(job_id)


def actions(state: PolicyState) -> tuple[Actions, FakeSlurm, FakeEvents, FakeKube]:
    slurm, events, kube = FakeSlurm(), FakeEvents(), FakeKube()
    act = Actions(kube, slurm, events, FakeJobs(), None, ReconcileSettings(),  # type: ignore[arg-type]
                  lambda: state)
    return act, slurm, events, kube


def pending_pod(ns: str, name: str = "p", **ann: str) -> dict[str, Any]:
    pod = marked_pod(**{contract.A_CLAIM: "c1", **ann})
    pod["metadata"].update(namespace=ns, name=name, uid=f"uid-{name}")
    return pod


async def test_binder_submits_as_the_tenants_user() -> None:
    act, slurm, events, kube = actions(READY)
    assert await submit_one(act, pending_pod("team-a")) is None
    (spec,) = slurm.specs
    assert (spec.user, spec.account, spec.partition) == ("team-a", "team-a", "k8s")
    assert kube.patches and events.sent[-1][1] == reasons.EV_JOB_SUBMITTED


async def test_an_id_slurm_gives_a_new_submit_is_no_longer_one_we_cancelled() -> None:
    """After a controller lost its state, the next submit may get an id the binder cancelled
    within the hour: from then on it is the new job's (never skipped as ours-cancelled), and
    the polls ask about it whatever a read said of that id before."""
    act = actions(READY)[0]
    act.cancelled[501] = 0.0  # the id FakeSlurm gives the next submit
    assert await submit_one(act, pending_pod("team-a")) is None
    assert 501 not in act.cancelled and act.jobs.asked_again == [501]


async def test_binder_never_takes_the_user_from_the_pod() -> None:
    act, slurm, _, _ = actions(READY)
    # an annotation that tried to pick a user is not an option at all: the Pod is refused
    pod = pending_pod("team-a", **{f"{contract.DOMAIN}/user": "root"})
    assert await submit_one(act, pod) is None
    assert slurm.specs == []
    ok = pending_pod("team-a")
    ok["metadata"]["labels"]["user"] = "root"
    await submit_one(act, ok)
    assert slurm.specs[0].user == "team-a"


async def test_binder_policy_changed_since_admission_records_and_requeues() -> None:
    act, slurm, events, kube = actions(READY)
    pod = pending_pod("team-a", **{contract.A_QOS: "high"})
    assert await submit_one(act, pod) == TENANCY_RETRY
    assert slurm.specs == [] and kube.patches == []
    ((name, reason, message, warning),) = events.sent
    assert (name, reason, warning) == ("p", "QOSNotAllowed", True)
    assert '"high"' in message and "normal" in message
    missing, slurm, events, _ = actions(PolicyState(tenancy.MISSING, None, "gone"))
    assert await submit_one(missing, pending_pod("team-a")) == TENANCY_RETRY
    assert slurm.specs == [] and events.sent[0][1] == "TenancyPolicyMissing"


def gang(ns: str, **ann: str) -> list[dict[str, Any]]:
    return [pending_pod(ns, f"m{i}", **{contract.A_GROUP: "g", contract.A_GROUP_SIZE: "2",
                                        **ann}) for i in range(2)]


async def test_binder_gang_job_as_the_tenants_user() -> None:
    act, slurm, _, _ = actions(READY)
    unclaimed: list[JobInfo] = []
    assert await act.submit("team-a/g", gang("team-a"), True, lambda: unclaimed) is None
    (spec,) = slurm.specs
    assert (spec.user, spec.account, spec.nodes) == ("team-a", "team-a", 2)


async def test_binder_gang_refused_now_is_told_and_requeued() -> None:
    act, slurm, events, _ = actions(READY)
    members = gang("team-b")
    assert await act.submit("team-b/g", members, True, lambda: []) == TENANCY_RETRY
    assert slurm.specs == []
    assert sorted((n, r) for n, r, _, _ in events.sent) == [
        ("m0", "NamespaceNotInTenancy"), ("m1", "NamespaceNotInTenancy")]


async def test_binder_leader_not_ready_while_the_policy_loads() -> None:
    from types import SimpleNamespace

    from aiohttp.test_utils import TestClient, TestServer

    from slurmgate.binder.__main__ import health_app
    from slurmgate.config import ObjectRef
    from slurmgate.tenancy_source import PolicySource

    synced = asyncio.Event()
    synced.set()
    binder = SimpleNamespace(pods=SimpleNamespace(synced=synced),
                             jobs=SimpleNamespace(synced=synced))
    elector = SimpleNamespace(is_leader=True)
    source = PolicySource(None, ObjectRef("ns", "cm"))  # type: ignore[arg-type]
    app = health_app(binder, elector, None, source)  # type: ignore[arg-type]
    async with TestClient(TestServer(app)) as c:
        r = await c.get("/readyz")
        assert r.status == 503 and "tenancy" in await r.text()
        elector.is_leader = False  # a standby is ready regardless
        assert (await c.get("/readyz")).status == 200
        elector.is_leader = True
        await source.apply({"data": {tenancy.POLICY_KEY: "tenants: []"}})
        assert source.state.status == tenancy.READY
        assert (await c.get("/readyz")).status == 200


async def test_binder_looks_again_at_once_when_the_policy_changes() -> None:
    c = Controller(kube=object(), slurm=object())  # type: ignore[arg-type]
    refused = Request("team-b", "p")
    c._refused.add(refused)
    assert len(c.queue) == 0
    c.policy_changed(tenancy.STATE_DISABLED)
    assert len(c.queue) == 1 and await c.queue.get() == refused
    c.policy_changed(tenancy.STATE_DISABLED)  # told once: what was refused is not kept
    assert len(c.queue) == 0


class CancellingSlurm(FakeSlurm):
    async def cancel(self, job_id: int, signal: str) -> None:
        pass


async def test_a_gang_never_adopts_a_job_the_binder_cancelled() -> None:
    """A released group's job, cancelled, still looks alive until the next poll (or for good,
    when slurmctld lost the cancel in a crash): members that complete the group again get a
    new job, never that one. A job nobody cancelled (a crash between submit and annotate) is
    still adopted."""
    act = actions(READY)[0]
    act.slurm = CancellingSlurm()
    old = JobInfo(job_id=122, name="k8s:team-a/group:g", state="RUNNING", reason="None",
                  nodes=("n1", "n2"), comment=contract.group_comment("c9", "team-a", "g"),
                  partition="k8s", submit_time=1, start_time=1, end_time=0)
    await act.cancel(old, "release")
    assert await act.submit("team-a/g", gang("team-a"), True, lambda: [old]) is None
    (spec,) = act.slurm.specs
    assert spec.comment != old.comment  # a new job, with a claim of its own
    fresh, _, _, kube = actions(READY)
    assert await fresh.submit("team-a/g", gang("team-a"), True, lambda: [old]) is None
    assert fresh.slurm.specs == [] and all(  # type: ignore[attr-defined]
        patch["metadata"]["annotations"][contract.A_JOB_ID] == "122" for _, patch in kube.patches)


async def test_a_refused_resubmit_marks_the_pod_given_back() -> None:
    """Its job given back (here: allocated on a cordoned Node) and cancelled, the Pod's new
    submit is refused by the policy: the Pod says GivenBack, so the cancelled job's end never
    evicts it (binder/decide.py), and it is looked at again when the policy may allow it."""
    from slurmgate.binder import decide

    c = Controller(kube=object(), slurm=object())  # type: ignore[arg-type]
    act, _, events, kube = actions(READY)
    act.slurm = CancellingSlurm()
    c.actions, c.events = act, events  # type: ignore[assignment]
    pod = pending_pod("team-a", **{contract.A_QOS: "high", contract.A_JOB_ID: "7"})
    old = JobInfo(job_id=7, name="k8s:team-a/p", state="RUNNING", reason="None", nodes=("n2",),
                  comment="slurmgate claim=c1 pod=team-a/p", partition="k8s", submit_time=1,
                  start_time=1, end_time=0)
    d = decide.Decision(decide.RELEASE, resubmit=(pod,), cancel=old, job=old, cancel_why="resubmit",
                        reason=reasons.EV_NODE_CORDONED, message="cordoned")
    req = Request("team-a", "p")
    await c.apply(req, decide.Unit.single(pod), d)
    assert act.cancelled.keys() == {7} and act.slurm.specs == []  # type: ignore[attr-defined]
    ((_, patch),) = kube.patches
    assert patch["metadata"]["annotations"] == {
        contract.A_JOB_STATE: contract.JOB_STATE_GIVEN_BACK}
    assert req in c._refused
