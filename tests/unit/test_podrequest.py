"""Pod -> placeholder request: sizes, defaults and every bad-input class, field named."""

from __future__ import annotations

import pytest

from slurmgate import contract, podrequest, quantity
from slurmgate.podrequest import PodRequestError


def mkpod(requests: dict | None = None, limits: dict | None = None, ann: dict | None = None,
          init: list | None = None, containers: int = 1) -> dict:
    res: dict = {}
    if requests is not None:
        res["requests"] = requests
    if limits is not None:
        res["limits"] = limits
    p: dict = {"metadata": {"name": "p", "annotations": ann or {}},
               "spec": {"containers": [{"name": f"c{i}", "resources": res}
                                       for i in range(containers)]}}
    if init:
        p["spec"]["initContainers"] = init
    return p


@pytest.mark.parametrize("text,minutes", [
    ("30", 30), ("1:30", 2), ("01:00:00", 60), ("2-0", 2880), ("1-2:30", 1590),
    ("0-0:0:1", 1), ("1-00:00:00", 1440),
])
def test_time_limits(text: str, minutes: int) -> None:
    assert podrequest.parse_time_limit(text) == minutes


@pytest.mark.parametrize("q,mib", [("1Gi", 1024), ("1G", 954), ("512Mi", 512), ("1", 1),
                                   ("1.5Gi", 1536), ("1e9", 954)])
def test_memory_sizes(q: str, mib: int) -> None:
    assert podrequest.from_pod(mkpod({"memory": q})).memory_mib == mib


def test_sums_containers_and_takes_max_with_init() -> None:
    p = mkpod({"memory": "1Gi", "cpu": "1500m"}, containers=2,
              init=[{"name": "i", "resources": {"requests": {"memory": "4Gi", "cpu": "1"}}}])
    r = podrequest.from_pod(p)
    assert (r.memory_mib, r.cpus) == (4096, 3)


def test_limits_stand_in_for_missing_requests_and_gpus() -> None:
    r = podrequest.from_pod(mkpod(limits={"memory": "2Gi", "nvidia.com/gpu": "2"}))
    assert (r.memory_mib, r.cpus, r.gpus) == (2048, 1, 2)


def test_annotations_parsed() -> None:
    r = podrequest.from_pod(mkpod({"memory": "1Gi"}, ann={
        contract.A_PARTITION: "k8s", contract.A_QOS: "high", contract.A_ACCOUNT: "ml",
        contract.A_TIME_LIMIT: "1-0", contract.A_CONSTRAINT: "a100&[rack1|rack2]",
        contract.A_PRIORITY: "-5"}))
    assert (r.partition, r.qos, r.account, r.time_limit_minutes, r.constraint, r.nice) == (
        "k8s", "high", "ml", 1440, "a100&[rack1|rack2]", -5)


def test_default_memory_and_partition() -> None:
    r = podrequest.from_pod(mkpod({}), default_memory="256Mi", default_partition="k8s")
    assert (r.memory_mib, r.partition) == (256, "k8s")


@pytest.mark.parametrize("p,field,reason", [
    (mkpod({}), "requests.memory", "MissingMemoryRequest"),
    (mkpod({"memory": "lots"}), "requests[memory]", "InvalidResources"),
    (mkpod({"memory": "-1Gi"}), "requests[memory]", "InvalidResources"),
    (mkpod({"memory": "2Ei"}), "requests.memory", "InvalidResources"),
    (mkpod({"memory": "1Gi", "cpu": "1e9"}), "requests.cpu", "InvalidResources"),
    (mkpod({"memory": "1Gi", "nvidia.com/gpu": "0.5"}), "nvidia.com/gpu", "InvalidResources"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_TIME_LIMIT: "forever"}), contract.A_TIME_LIMIT,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_TIME_LIMIT: "0"}), contract.A_TIME_LIMIT,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_TIME_LIMIT: "999-0"}), contract.A_TIME_LIMIT,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_PARTITION: "k8s; rm -rf /"}),
     contract.A_PARTITION, "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_PARTITION: "k8s\n#SBATCH --uid=0"}),
     contract.A_PARTITION, "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_ACCOUNT: "$(id)"}), contract.A_ACCOUNT,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_QOS: "hög"}), contract.A_QOS,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_QOS: "x" * 65}), contract.A_QOS,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_CONSTRAINT: "a100 `id`"}), contract.A_CONSTRAINT,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_PRIORITY: "99999"}), contract.A_PRIORITY,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={contract.A_PRIORITY: "high"}), contract.A_PRIORITY,
     "InvalidAnnotation"),
    (mkpod({"memory": "1Gi"}, ann={f"{contract.DOMAIN}/partiton": "k8s"}), "partiton",
     "InvalidAnnotation"),
])
def test_bad_input_names_the_field(p: dict, field: str, reason: str) -> None:
    with pytest.raises(PodRequestError) as e:
        podrequest.from_pod(p)
    assert field in str(e.value)
    assert e.value.reason == reason


@pytest.mark.parametrize("bad", ["", "1.2.3", "Gi", "1Qi", "1e", True, None, [1], "9" * 70,
                                 float("nan")])
def test_quantity_rejects(bad: object) -> None:
    with pytest.raises(quantity.QuantityError):
        quantity.parse(bad)


@pytest.mark.parametrize("containers", [True, 5, "x", {"a": 1}])
def test_containers_not_a_list(containers: object) -> None:
    with pytest.raises(PodRequestError) as e:
        podrequest.from_pod({"metadata": {}, "spec": {"containers": containers}})
    assert "spec.containers" in str(e.value)
