"""binder/index.py: which job ids are ours, as the Pods' annotations say."""

from __future__ import annotations

from typing import Any

from slurmgate import contract
from slurmgate.binder.index import Index


class Store:
    store: dict[str, Any] = {}


def pod(job: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "annotations": {
        contract.A_CLAIM: "c" * 32, contract.A_JOB_ID: job}}, "spec": {}}


def test_a_resubmitted_pods_old_job_id_is_no_longer_ours() -> None:
    idx = Index(Store())  # type: ignore[arg-type]
    idx.pod_changed("ns/p", None, pod("53"))
    assert idx.comment_by_job[53].endswith(" pod=ns/p")
    idx.pod_changed("ns/p", pod("53"), pod("60"))  # a new placeholder job
    assert 53 not in idx.comment_by_job  # a lost-state controller may give 53 to anyone
    assert 60 in idx.comment_by_job
    idx.pod_changed("ns/p", pod("60"), None)
    assert idx.comment_by_job == {}
