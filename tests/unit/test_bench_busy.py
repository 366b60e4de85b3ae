"""The busy-site bench's pure parts (bench/busy*.py): its arguments, the slurm.conf of its
cluster (and that every other cluster's is unchanged), the foreign jobs' bodies, the
metric-scrape diff by endpoint, the CPU subtraction, the tables and the verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench import busy, busy_cost, busy_load, busy_report, util
from bench.stats import lat
from cluster import slurm_release
from cluster.slurm_accounting import TENANTS
from cluster.slurm_conf import SiteLayout, slurm_conf_text
from slurmgate.slurm.dialects import dialect
from slurmgate.slurm.restmetrics import RestMetrics

EVERY = list(slurm_release.RELEASES)


@pytest.fixture(autouse=True)
def no_slurm_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(slurm_release.VERSION_ENV, raising=False)


# ------------------------------------------------------------------------------ arguments


def test_defaults_three_sizes_every_release() -> None:
    a = busy.parse_args([])
    assert a.background_jobs == [0, 10_000, 50_000]
    assert a.versions == EVERY
    assert (a.churn, a.pods, a.window, a.nodes, a.site_nodes) == (5.0, 8, 30.0, 4, 4)
    assert a.run_dir == Path("/tmp/slurmgate-busy")


def test_sizes_sorted_and_unique_versions_kept_in_order() -> None:
    a = busy.parse_args(["--background-jobs", "2000,0,2000", "--versions", "26.05,22.05,26.05",
                         "--churn", "0", "--window", "20", "--pods", "4"])
    assert a.background_jobs == [0, 2000]
    assert a.versions == ["26.05", "22.05"]
    assert (a.churn, a.window, a.pods) == (0.0, 20.0, 4)


@pytest.mark.parametrize("argv", [["--background-jobs", "-1"], ["--background-jobs", "x"],
                                  ["--background-jobs", ","], ["--churn", "-1"],
                                  ["--window", "0"], ["--pods", "0"], ["--site-nodes", "0"],
                                  ["--versions", "23.02"], ["--versions", ","]])
def test_bad_arguments_exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        busy.parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_refuses_the_default_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMGATE_PORT_OFFSET", "0")
    monkeypatch.setenv("SLURMGATE_RUN_DIR", "/tmp/slurmgate")
    assert busy.main(["--versions", "26.05"]) == 2


# ------------------------------------------------------------------------------ slurm.conf

CONF_ARGS = (Path("/tmp/x"), ["n1", "n2", "n3", "n4"], 8, 16000, 16800, Path("/tmp/m.sock"),
             "sg16800", 20)


def test_default_slurm_conf_is_unchanged() -> None:
    text = slurm_conf_text(*CONF_ARGS)
    assert text == slurm_conf_text(*CONF_ARGS, site=SiteLayout())
    assert "MinJobAge=300\n" in text and "MaxJobCount" not in text
    for part in ("k8s", "hpc", "scavenger", "spot"):
        assert f"PartitionName={part} Nodes=ALL " in text
    assert "PartitionName=site" not in text
    assert text.count("NodeName=") == 4
    assert text.endswith("  GraceTime=5\n")


def test_bench_slurm_conf_has_the_site_partition_and_limits() -> None:
    from bench.busy_run import site_layout  # imports cluster.local: after the defaults test

    site = site_layout(busy.parse_args(["--background-jobs", "0,2000"]))
    assert site.max_job_count == 100_000 and site.min_job_age == 30
    assert site_layout(busy.parse_args(["--background-jobs", "80000"])).max_job_count == 160_000
    text = slurm_conf_text(*CONF_ARGS, site=site)
    assert "MaxJobCount=100000\nMinJobAge=30\n" in text
    for part in ("k8s", "hpc", "scavenger", "spot"):
        assert f"PartitionName={part} Nodes=n[1-4] " in text
    assert "PartitionName=site Nodes=x[1-4] MaxTime=INFINITE State=UP" in text
    # the site's slurmd come after ours, with ports of their own
    assert "NodeName=x1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=16905 " in text
    assert "NodeName=n4 NodeHostname=localhost NodeAddr=127.0.0.1 Port=16904 " in text


# ------------------------------------------------------------------------------ foreign jobs


def test_mix_adds_up() -> None:
    assert busy_load.plan_mix(1000) == {"held": 700, "begin": 200, "array": 100}
    assert busy_load.plan_mix(7) == {"held": 6, "begin": 1, "array": 0}
    assert sum(busy_load.plan_mix(50_001).values()) == 50_001
    assert busy_load.plan_mix(0) == {"held": 0, "begin": 0, "array": 0}


def test_foreign_bodies_in_each_dialect() -> None:
    t = TENANTS[1]
    old = busy_load.job_body(dialect("v0.0.38"), "array", 3, t, "site", 1000)
    assert old["script"] == busy_load.SCRIPT_WAIT and "script" not in old["job"]
    assert old["job"]["hold"] is True and old["job"]["array"] == "0-9"
    assert (old["job"]["account"], old["job"]["partition"], old["job"]["nodes"]) == \
        (t.account, "site", 1)
    assert old["job"]["environment"] == {"PATH": "/usr/bin:/bin"}
    new = busy_load.job_body(dialect("v0.0.45"), "begin", 4, t, "site", 1000)["job"]
    assert new["begin_time"] == {"set": True, "infinite": False,
                                 "number": 1000 + busy_load.BEGIN_AHEAD_S}
    assert "hold" not in new and new["minimum_nodes"] == new["maximum_nodes"] == 1
    assert new["environment"] == ["PATH=/usr/bin:/bin"]
    short = busy_load.job_body(dialect("v0.0.42"), "short", 5, t, "site", 1000)["job"]
    assert short["script"] == busy_load.SCRIPT_SHORT and "hold" not in short
    with pytest.raises(ValueError):
        busy_load.job_body(dialect("v0.0.42"), "bogus", 1, t, "site", 0)


def test_job_id_from_either_answer() -> None:
    assert busy_load.job_id_of({"job_id": 17}) == 17
    assert busy_load.job_id_of({"result": {"job_id": {"set": True, "number": 18}}}) == 18
    assert busy_load.job_id_of({"errors": [{"error": "MaxJobCount limit reached"}]}) == -1


# ------------------------------------------------------------------------------ metrics diff


def scrape(reg: CollectorRegistry) -> busy_cost.Samples:
    return util.parse_prom(generate_latest(reg).decode())


def test_rest_by_endpoint_diffs_two_real_scrapes() -> None:
    reg = CollectorRegistry()
    binder, webhook = RestMetrics("binder", reg), RestMetrics("webhook", reg)
    binder.observe("GET", "/slurm/v0.0.42/jobs?update_time=5", 200, 900, 0.003)
    binder.observe("GET", "/slurm/v0.0.42/nodes", 200, 5000, 0.002)
    before = scrape(reg)
    binder.observe("GET", "/slurm/v0.0.42/jobs?update_time=6", 200, 1000, 0.004)
    binder.observe("GET", "/slurm/v0.0.42/jobs", 200, 3000, 0.2)
    binder.observe("GET", "/slurm/v0.0.38/jobs", 304, 0, 0.001)
    binder.observe("DELETE", "/slurm/v0.0.42/job/17", 200, 100, 0.015)
    binder.observe("GET", "/slurm/v0.0.42/job/18", None, 0, 5.0)
    webhook.observe("POST", "/slurm/v0.0.42/job/submit", 200, 200, 0.006)
    after = scrape(reg)

    out = busy_cost.rest_by_endpoint(before, after, "binder", 10.0)
    assert list(out) == ["jobs", "job/{id}", "all"]  # busiest first; nodes did not change
    jobs = out["jobs"]
    assert jobs["requests"] == 3 and jobs["by"] == {"GET 200": 2, "GET 304": 1}
    assert (jobs["per_s"], jobs["per_min"], jobs["bytes_per_s"]) == (0.3, 18.0, 400.0)
    assert 100 <= jobs["p99_ms"] <= 250  # the 0.2 s list, in its bucket
    assert out["job/{id}"]["by"] == {"DELETE 200": 1, "GET error": 1}
    assert out["all"]["requests"] == 5 and out["all"]["bytes"] == 4100
    hook = busy_cost.rest_by_endpoint(before, after, "webhook", 10.0)
    assert list(hook) == ["job/submit", "all"] and hook["job/submit"]["per_min"] == 6.0
    assert busy_cost.rest_by_endpoint(after, after, "binder", 10.0) == {}


# ------------------------------------------------------------------------------ CPU


def test_cpu_delta_counts_new_workers_and_drops_gone_ones() -> None:
    before = {"binder": {10: 5.0, 11: 1.0}, "slurmrestd": {20: 100.0}}
    after = {"binder": {10: 6.5, 12: 0.25}, "slurmrestd": {20: 103.0}}
    assert busy_cost.cpu_delta_by_role(before, after) == {"binder": 1.75, "slurmrestd": 3.0}


def test_site_cost_is_running_minus_stopped_per_core() -> None:
    stopped = busy_cost.pct_of_core({"slurmctld": 0.6, "slurmscriptd": 0.3, "slurmrestd": 1.5},
                                    30.0)
    assert stopped == {"slurmctld": 2.0, "slurmscriptd": 1.0, "slurmrestd": 5.0,
                       "slurmrestd+slurmctld": 8.0}
    running = busy_cost.pct_of_core({"slurmctld": 0.8, "slurmscriptd": 0.3, "slurmrestd": 9.0,
                                     "binder": 3.0}, 20.0)
    assert running["binder"] == 15.0 and running["slurmrestd+slurmctld"] == 50.5
    assert busy_cost.site_cost(stopped, running) == {
        "slurmctld": 2.0, "slurmscriptd": 0.5, "slurmrestd": 40.0,
        "slurmrestd+slurmctld": 42.5}


# ------------------------------------------------------------------------------ the report


def window(per_min_jobs: float, p99_s: float, cpu: dict[str, float]) -> dict[str, Any]:
    reg = CollectorRegistry()
    m = RestMetrics("binder", reg)
    before = scrape(reg)
    for _ in range(int(per_min_jobs)):
        m.observe("GET", "/slurm/v0.0.42/jobs", 200, 1024, p99_s)
    rest = busy_cost.rest_by_endpoint(before, scrape(reg), "binder", 60.0)
    return {"seconds": 60.0, "cpu_pct": busy_cost.pct_of_core(cpu, 60.0), "rest": {
        "binder": rest, "webhook": {}}}


def seg(n: int, restd: float, p99_s: float, rb: list[float], rss: float) -> dict[str, Any]:
    stopped = {"seconds": 60.0,
               "cpu_pct": busy_cost.pct_of_core({"slurmctld": 0.6, "slurmrestd": 0.6}, 60.0)}
    s: dict[str, Any] = {"n": n, "background": {"standing": n, "array_tasks": n // 10 * 10},
                         "churn": {"changes_per_s": 5.0 if n else 0}, "stopped": stopped,
                         "rss_peak_mib": {"binder": rss, "webhook": 60.0}}
    for k, jobs in (("idle", 6), ("idle_nohook", 60), ("pods", 600)):
        s[k] = window(jobs, p99_s, {"slurmctld": 0.6, "slurmrestd": 0.6 + restd,
                                    "binder": 1.2})
    s["cost"] = {k: busy_cost.site_cost(stopped["cpu_pct"], s[k]["cpu_pct"])
                 for k in ("idle", "idle_nohook", "pods")}
    s["latency_hook"] = {"running_to_bound": lat(rb), "admission": lat([0.01, 0.02])}
    s["floor"] = {"submit": lat([0.004, 0.005])}
    s["calls"] = {"webhook": {"job/submit": {"n": 2, "p50_ms": 5.0, "p99_ms": 6.0}},
                  "binder": {"job/{id}": {"n": 10, "p50_ms": 3.0, "p99_ms": 9.0,
                                          "by": {"GET 200": 8, "DELETE 200": 2}}}}
    return s


def test_release_table_a_column_per_n_and_verdicts() -> None:
    results = {"slurm_version": "26.05", "rest_api": "v0.0.45",
               "by_n": [seg(0, 0.3, 0.004, [0.02, 0.03], 80.0),
                        seg(2000, 3.0, 0.3, [0.02, 0.05], 120.0)]}
    results["targets"] = busy_report.targets(results)
    t = results["targets"]
    assert t["added_cpu_idle_pct"] == {"value": 5.0, "limit": 2.0, "ok": False}
    assert t["idle_requests_per_min"]["value"] == 6.0 and t["idle_requests_per_min"]["ok"]
    assert t["slowest_read_p99_ms"]["ok"] is False  # 0.3 s lists
    assert t["running_to_bound_p99_vs_smallest_n"]["value"] == pytest.approx(50 / 30, 1e-3)
    assert t["binder_rss_peak_vs_smallest_n"] == {"value": 1.5, "limit": 1.2, "ok": False}
    assert t["cancel_p99_vs_direct"]["ok"] is None  # not measured: neither passed nor missed
    assert t["submit_p99_vs_direct"]["value"] == pytest.approx(1.2)

    text = busy_report.release_table(results, 8)
    lines = text.splitlines()
    assert lines[0] == "### Slurm 26.05 (REST v0.0.45)"
    assert "|  | N = 0 | N = 2,000 |" in lines
    row = next(x for x in lines if x.startswith("| slurmgate -> slurmrestd requests/min"))
    assert row.endswith("| 6 / 60 / 600 | 6 / 60 / 600 |")
    added = next(x for x in lines if x.startswith("| **added by slurmgate**"))
    assert added.endswith("| 0.5 / 0.5 / 0.5 | 5 / 5 / 5 |")
    # the histogram's p99, interpolated in its bucket (Prometheus' histogram_quantile)
    assert "| binder jobs | 6 / 60 / 600; 10.0 KiB/s, p99 5 | " \
        "6 / 60 / 600; 10.0 KiB/s, p99 497.5 |" in lines
    assert "| submit p50 / p99 ms: slurmgate; direct (p99 ratio) | 5 / 6; 4 / 5 (1.20x) |" in text
    # cancels share job/{id} with single-job reads: the cell says how many were cancels
    assert "| 3 / 9; - (-), DELETE 2 of 10 |" in text
    assert "added_cpu_idle_pct 5 (<= 2): MISSED" in text
    # every row has a cell per N: no pipe inside a cell
    assert all(x.count("|") == 4 for x in lines if x.startswith("| "))
    json.dumps(results)  # the JSON the bench writes holds the same


def test_table_of_a_run_that_stopped_early() -> None:
    text = busy_report.release_table({"slurm_version": "22.05", "by_n": [{"n": 0}],
                                      "error": "TimeoutError: x"}, 8)
    assert "|  | N = 0 |" in text and "**stopped early:** TimeoutError: x" in text
    assert busy_report.targets({"by_n": [{"n": 0}]}) == {}
