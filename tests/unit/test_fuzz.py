"""Bad input against the webhook's aiohttp app (built as in test_server.py, with fakes):
wrong kinds and versions, non-list containers, unicode, bodies at and over the size limit,
nesting at and over the depth limit, chunked uploads. Every request is answered within a
deadline with well-formed JSON; an AdmissionReview answer is a valid one; nothing is a 500.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import jsonpatch
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmgate import contract
from slurmgate.webhook.server import MAX_BODY, MAX_DEPTH
from tests.unit.fakes import marked_pod, review
from tests.unit.test_server import PATHS, app, json_values, mutate

DEADLINE = 10.0  # seconds per request: "never hangs"


async def _post(c: TestClient, data: Any, **kw: Any) -> tuple[int, Any]:
    async def go() -> tuple[int, Any]:
        r = await c.post("/mutate", data=data, **kw)
        assert r.content_type == "application/json", r.content_type
        return r.status, json.loads(await r.read())
    return await asyncio.wait_for(go(), DEADLINE)


def check_answer(status: int, doc: Any, body: Any = None) -> None:
    """200 with a valid AdmissionReview response, or a 4xx with an error; never a 500."""
    assert status in (200, 400, 413), (status, doc)
    assert isinstance(doc, dict)
    if status != 200:
        assert isinstance(doc.get("error"), str) and doc["error"]
        return
    assert doc["apiVersion"] == "admission.k8s.io/v1" and doc["kind"] == "AdmissionReview"
    resp = doc["response"]
    assert isinstance(resp["allowed"], bool) and isinstance(resp["uid"], str)
    if isinstance(body, dict) and isinstance(body.get("request"), dict):
        assert resp["uid"] == body["request"].get("uid")
    if not resp["allowed"]:
        assert resp["status"]["message"].startswith("slurmgate: ")
        assert "patch" not in resp
    if "patch" in resp and body is not None:
        assert resp["patchType"] == "JSONPatch"
        ops = json.loads(base64.b64decode(resp["patch"]))
        obj = body["request"]["object"]
        new = jsonpatch.apply_patch(obj, ops)  # the patch applies to what was sent
        assert {"name": contract.GATE} in new["spec"]["schedulingGates"]
        assert new["spec"]["schedulerName"] == contract.SCHEDULER_NAME
    for w in resp.get("warnings", []):
        assert isinstance(w, str) and len(w) <= 256


def run(coro_fn: Any) -> None:
    async def go() -> None:
        async with TestClient(TestServer(app())) as c:
            await coro_fn(c)
    asyncio.run(go())


# --- structure: wrong kinds, versions, operations; containers not a list


KINDS = st.fixed_dictionaries({
    "group": st.sampled_from(["", "apps", "batch", "core"]),
    "version": st.sampled_from(["v1", "v1beta1", "v2", ""]),
    "kind": st.sampled_from(["Pod", "pod", "Deployment", "ConfigMap", "PodTemplate", ""]),
}) | json_values
API_VERSIONS = st.sampled_from(["admission.k8s.io/v1", "admission.k8s.io/v1beta1",
                                "admission.k8s.io/v2", "v1", ""]) | json_values


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(api=API_VERSIONS, kind=st.sampled_from(["AdmissionReview", "admissionreview", "Pod"]),
       rkind=KINDS, resource=st.sampled_from(["pods", "pods/status", "deployments", ""]),
       op=st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT", "create", ""]),
       sub=st.sampled_from([None, "", "status", "binding", "ephemeralcontainers"]))
def test_wrong_kinds_versions_operations(api: Any, kind: str, rkind: Any, resource: str,
                                         op: str, sub: str | None) -> None:
    body = review(marked_pod())
    body["apiVersion"], body["kind"] = api, kind
    req = body["request"]
    req["kind"], req["resource"]["resource"], req["operation"] = rkind, resource, op
    if sub is not None:
        req["subResource"] = sub

    async def go(c: TestClient) -> None:
        status, doc = await _post(c, json.dumps(body))
        check_answer(status, doc, body)
        is_our_case = (api == "admission.k8s.io/v1" and kind == "AdmissionReview"
                       and rkind == {"group": "", "version": "v1", "kind": "Pod"}
                       and resource == "pods" and op == "CREATE" and not sub)
        if status == 200 and not is_our_case:
            assert "patch" not in doc["response"] and doc["response"]["allowed"]  # untouched
    run(go)


@pytest.mark.parametrize("field", ["containers", "initContainers"])
@pytest.mark.parametrize("value", [5, True, 1.5, "abc", {"a": 1}, [1, "x", None]])
def test_containers_not_a_list_is_a_clean_denial(field: str, value: Any) -> None:
    # found by fuzzing (fixed in 0471c0e): an int/bool here raised TypeError -> HTTP 500
    body = review(marked_pod())
    body["request"]["object"]["spec"][field] = value

    async def go(c: TestClient) -> None:
        status, doc = await _post(c, json.dumps(body))
        check_answer(status, doc, body)
        assert status == 200 and doc["response"]["allowed"] is False
        assert f"spec.{field}" in doc["response"]["status"]["message"]
    run(go)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from([*PATHS, ["request", "object", "spec", "initContainers"],
                             ["request", "object", "metadata", "name"],
                             ["request", "object", "metadata", "generateName"],
                             ["request", "resource"], ["request", "subResource"], ["kind"]]),
       value=json_values)
def test_fuzzed_fields_never_500(path: list[str], value: object) -> None:
    body = mutate(review(marked_pod()), path, value)

    async def go(c: TestClient) -> None:
        status, doc = await _post(c, json.dumps(body))
        check_answer(status, doc, body)
    run(go)


# --- unicode in annotations and labels


UNICODE = st.text(alphabet=st.characters(codec="utf-8"), max_size=80)
# the Slurm options of the annotation contract (docs/user-guide.md)
OPTIONS = (contract.A_PARTITION, contract.A_QOS, contract.A_ACCOUNT, contract.A_TIME_LIMIT,
           contract.A_CONSTRAINT, contract.A_PRIORITY)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.sampled_from(OPTIONS) | UNICODE |
       UNICODE.map(lambda s: f"{contract.DOMAIN}/{s}"),
       value=UNICODE, label=UNICODE)
def test_unicode_annotations_and_labels(key: str, value: str, label: str) -> None:
    pod = marked_pod()
    pod["metadata"]["annotations"][key] = value
    pod["metadata"]["labels"][label or "x"] = value
    body = review(pod)

    async def go(c: TestClient) -> None:
        # ensure_ascii=False: raw UTF-8 on the wire, as the apiserver sends it
        status, doc = await _post(c, json.dumps(body, ensure_ascii=False).encode())
        check_answer(status, doc, body)
        resp = doc["response"]
        if key in OPTIONS and not (value.isascii() and value.isprintable()):
            assert resp["allowed"] is False
            assert f"metadata.annotations[{key}]" in resp["status"]["message"]
    run(go)


# --- sizes and nesting


def test_body_at_limit_answered_and_over_limit_refused() -> None:
    pod = marked_pod()
    pod["metadata"]["annotations"]["example.com/big"] = ""
    base = len(json.dumps(review(pod)))
    pod["metadata"]["annotations"]["example.com/big"] = "x" * (MAX_BODY - base - 100)
    body = review(pod)
    raw = json.dumps(body).encode()
    assert MAX_BODY - 200 < len(raw) <= MAX_BODY

    async def go(c: TestClient) -> None:
        status, doc = await _post(c, raw)
        check_answer(status, doc, body)
        assert status == 200 and doc["response"]["allowed"] is True
        status, doc = await _post(c, raw + b" " * 200)  # just over
        assert status == 413 and "larger" in doc["error"]

        async def chunks():  # no Content-Length: the limit still holds
            for _ in range(MAX_BODY // 65536 + 2):
                yield b" " * 65536
        status, doc = await _post(c, chunks())
        assert status == 413, (status, doc)
    run(go)


@pytest.mark.parametrize("depth", [MAX_DEPTH - 5, MAX_DEPTH + 1, 5000, 200_000])
def test_nesting_depth(depth: int) -> None:
    # nested inside an annotation-like field of a real review, and as a bare document
    nested = "[" * depth + "]" * depth
    raw = json.dumps(review(marked_pod())).replace('"annotations": {}',
                                                   f'"annotations": {{}}, "x": {nested}')

    async def go(c: TestClient) -> None:
        for data in (raw, nested):
            status, doc = await _post(c, data)
            check_answer(status, doc)
            if depth > MAX_DEPTH:
                assert status == 400 and "deeper" in doc["error"]
    run(go)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    pod = marked_pod()
    pod["metadata"]["annotations"]["example.com/brackets"] = "[{" * 5000 + '\\"' + "}]" * 10
    body = review(pod)

    async def go(c: TestClient) -> None:
        status, doc = await _post(c, json.dumps(body))
        check_answer(status, doc, body)
        assert status == 200 and doc["response"]["allowed"] is True
    run(go)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=st.binary(max_size=300) | st.text(max_size=300).map(str.encode),
       encoding=st.sampled_from(["utf-8", "utf-16", "utf-32", "latin-1"]))
def test_malformed_and_odd_encodings(raw: bytes, encoding: str) -> None:
    # valid JSON in other Unicode encodings (json.loads accepts them), and garbage
    doc = json.dumps(review(marked_pod()), ensure_ascii=False)
    candidates = [raw, doc.encode(encoding, errors="replace"), doc.encode()[: len(raw)]]

    async def go(c: TestClient) -> None:
        for data in candidates:
            status, out = await _post(c, data)
            check_answer(status, out)
    run(go)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", ""])
def test_content_types_do_not_matter(ctype: str) -> None:
    body = review(marked_pod())

    async def go(c: TestClient) -> None:
        status, doc = await _post(c, json.dumps(body), headers={"Content-Type": ctype})
        check_answer(status, doc, body)
        assert status == 200
    run(go)
