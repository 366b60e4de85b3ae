"""Coverage-guided fuzzing of the webhook's body handling and admission decision (atheris).

    python tests/fuzz/fuzz_admission.py -atheris_runs=20000      # bounded run
    python tests/fuzz/fuzz_admission.py -max_total_time=60

Each input is either a raw body (depth check, JSON parse, review) or a structured
AdmissionReview whose annotations, requests and names come from the fuzzer. Anything but a
well-formed answer or BadReview is a crash. Needs `pip install atheris` (Python 3.11 wheels).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import atheris

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

with atheris.instrument_imports():
    from slurmgate import contract
    from slurmgate.webhook.admission import Admitter, BadReview, Settings
    from slurmgate.webhook.server import _depth_ok
    from tests.unit.fakes import FakeSubmit, marked_pod, node_map, review

LOOP = asyncio.new_event_loop()
NODES = node_map()
KEYS = [*contract.USER_ANNOTATIONS, contract.A_CLAIM, contract.A_JOB_ID, "example.com/x"]


def answer(body: object) -> None:
    admitter = Admitter(FakeSubmit(), lambda: NODES, Settings())
    try:
        out = LOOP.run_until_complete(admitter.review(body))
    except BadReview:
        return
    resp = out["response"]
    assert isinstance(resp["allowed"], bool)
    if not resp["allowed"]:
        assert resp["status"]["message"].startswith("slurmgate: ")
    json.dumps(out)  # serialisable


def test_one_input(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    if fdp.ConsumeBool():
        raw = fdp.ConsumeBytes(fdp.remaining_bytes())
        if not _depth_ok(raw):
            return
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return
        answer(body)
        return
    pod = marked_pod(fdp.ConsumeUnicodeNoSurrogates(12) or "1Gi")
    for _ in range(fdp.ConsumeIntInRange(0, 4)):
        pod["metadata"]["annotations"][fdp.PickValueInList(KEYS)] = \
            fdp.ConsumeUnicodeNoSurrogates(40)
    if fdp.ConsumeBool():
        pod["metadata"]["name"] = fdp.ConsumeUnicodeNoSurrogates(80)
    if fdp.ConsumeBool():
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = \
            fdp.ConsumeUnicodeNoSurrogates(20)
    answer(review(pod, dry_run=fdp.ConsumeBool()))


def main() -> None:
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
