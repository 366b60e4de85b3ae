"""The busy-site bench's pure parts (bench/busy*.py): its arguments, the slurm.conf of its
cluster (and that every other cluster's is unchanged), the foreign jobs' bodies, the
metric-scrape diff by endpoint, the CPU subtraction, the tables and the verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench import busy, busy_cost, busy_load, busy_report, busy_targets, util
from bench.stats import binned_lat, lat
from cluster import slurm_release
from cluster.slurm_accounting import TENANTS
from cluster.slurm_conf import SiteLayout, slurm_conf_text
from slurmgate.slurm.dialects import DIALECTS, dialect
from slurmgate.slurm.restmetrics import LAT_BUCKETS, RestMetrics

EVERY = list(slurm_release.RELEASES)


@pytest.fixture(autouse=True)
def no_slurm_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(slurm_release.VERSION_ENV, raising=False)


# ------------------------------------------------------------------------------ arguments


def test_defaults_three_sizes_every_release() -> None:
    a = busy.parse_args([])
    assert a.background_jobs == [0, 10_000, 50_000]
    assert a.versions == EVERY
    assert (a.churn, a.pods, a.window, a.nodes, a.site_nodes) == (5.0, 16, 30.0, 4, 4)
    assert a.latency_pods == 32  # the p99s of submits, cancels and binds: not 16 samples
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
                                  ["--latency-pods", "0"],
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


# Keys of v0.0.38's job parser (22.05's openapi/v0.0.38 job_params table: each is an sbatch
# option) that the foreign jobs use; a key outside the table, or a disabled one, fails the submit
V38_KEYS = {"name", "partition", "account", "tasks", "current_working_directory",
            "standard_output", "standard_error", "memory_per_node", "time_limit",
            "environment", "nodes", "hold", "array", "begin_time"}
# ...and of v0.0.40+'s job_desc_msg (the data parser), script included
NEWER_KEYS = (V38_KEYS - {"nodes"}) | {"minimum_nodes", "maximum_nodes", "script"}
KINDS = ("held", "begin", "array", "short")


@pytest.mark.parametrize("version", sorted(DIALECTS))
@pytest.mark.parametrize("kind", KINDS)
def test_foreign_body_in_every_dialect(version: str, kind: str) -> None:
    d = dialect(version)
    t = TENANTS[1]
    body = busy_load.job_body(d, kind, 3, t, "site", 1000)
    job = body["job"]
    script = busy_load.SCRIPT_SHORT if kind == "short" else busy_load.SCRIPT_WAIT
    # the script where the dialect puts it, and only there
    if d.script_in_job:
        assert set(body) == {"job"} and job["script"] == script
    else:
        assert body["script"] == script and "script" not in job
    assert set(job) <= (NEWER_KEYS if d.number_objects else V38_KEYS)
    assert (job["name"], job["partition"], job["account"], job["tasks"]) == \
        (f"site-{kind}-3", "site", t.account, 1)

    def n(x: int) -> Any:
        return {"set": True, "infinite": False, "number": x} if d.number_objects else x

    assert (job["memory_per_node"], job["time_limit"]) == (n(100), n(10))
    env = job["environment"]
    assert env == (["PATH=/usr/bin:/bin"] if d.environment_list else {"PATH": "/usr/bin:/bin"})
    if d.node_range:
        assert (job["minimum_nodes"], job["maximum_nodes"]) == (1, 1) and "nodes" not in job
    else:
        assert job["nodes"] == 1 and "minimum_nodes" not in job  # a boolean on v0.0.38
    # held standing jobs and arrays: hold (never a priority); arrays a string everywhere
    assert job.get("hold") is (True if kind in ("held", "array") else None)
    assert "priority" not in job
    assert job.get("array") == ("0-9" if kind == "array" else None)
    if kind == "begin":
        at = 1000 + busy_load.BEGIN_AHEAD_S
        # v0.0.38 reads it as sbatch's --begin text, where a bare epoch is a bad date
        assert job["begin_time"] == (n(at) if d.number_objects else f"uts{at}")
    else:
        assert "begin_time" not in job


def test_foreign_bodies_of_the_tested_releases() -> None:
    """The dialects slurmgate picks on 22.05, 24.11 and 26.05, spelled out."""
    t = TENANTS[0]
    old = busy_load.job_body(dialect("v0.0.38"), "begin", 1, t, "site", 1000)
    assert old == {"script": busy_load.SCRIPT_WAIT, "job": {
        "name": "site-begin-1", "partition": "site", "account": t.account, "tasks": 1,
        "current_working_directory": "/tmp", "standard_output": "/dev/null",
        "standard_error": "/dev/null", "memory_per_node": 100, "time_limit": 10,
        "environment": {"PATH": "/usr/bin:/bin"}, "nodes": 1, "begin_time": "uts87400"}}
    for v in ("v0.0.42", "v0.0.45"):
        job = busy_load.job_body(dialect(v), "array", 2, t, "site", 1000)["job"]
        assert job["hold"] is True and job["array"] == "0-9"
        assert job["environment"] == ["PATH=/usr/bin:/bin"]
        assert job["time_limit"] == {"set": True, "infinite": False, "number": 10}
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
    # the histogram's method label keeps the cancel apart from the (slow) single-job read
    by_method = out["job/{id}"]["methods"]
    assert set(by_method) == {"DELETE", "GET"}
    assert by_method["DELETE"]["requests"] == 1 and by_method["DELETE"]["n"] == 1
    assert 10 <= by_method["DELETE"]["p99_ms"] <= 20
    assert by_method["GET"]["p99_ms"] >= 2500 and by_method["DELETE"]["per_min"] == 6.0
    assert 10 <= out["job/{id}"]["p50_ms"]  # the endpoint's own figures mix the two
    assert set(jobs["methods"]) == {"GET"} and jobs["methods"]["GET"]["requests"] == 3
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


def calls() -> dict[str, Any]:
    """The whole running phase's requests: the webhook's submits; the binder's cancels and its
    slower single-job reads on the one endpoint job/{id}."""
    reg = CollectorRegistry()
    binder, webhook = RestMetrics("binder", reg), RestMetrics("webhook", reg)
    before = scrape(reg)
    for t in (0.005, 0.006):
        webhook.observe("POST", "/slurm/v0.0.42/job/submit", 200, 300, t)
    for i in range(8):
        binder.observe("GET", f"/slurm/v0.0.42/job/{i}", 200, 4000, 0.04)
    for i in range(2):
        binder.observe("DELETE", f"/slurm/v0.0.42/job/{i}", 200, 100, 0.009)
    after = scrape(reg)
    return {c: busy_cost.rest_by_endpoint(before, after, c, 600.0) for c in ("binder", "webhook")}


def whole_list(wall_s: list[float], cpu_s: float, nbytes: float, interval: float
               ) -> dict[str, Any]:
    runs = [{"wall_s": w, "answer_s": w - 0.1, "bytes": nbytes,
             "cpu_s": {"slurmctld": cpu_s / 5, "slurmrestd": 4 * cpu_s / 5,
                       "slurmscriptd": 7.0}} for w in wall_s]
    out = busy_cost.list_cost(runs, interval, background_per_s=0.1)
    out["binder_timeout_s"] = 5.0
    return out


def seg(n: int, restd: float, p99_s: float, rb: list[float], rss: float) -> dict[str, Any]:
    stopped = {"seconds": 60.0,
               "cpu_pct": busy_cost.pct_of_core({"slurmctld": 0.6, "slurmrestd": 0.6}, 60.0)}
    s: dict[str, Any] = {"n": n, "background": {"standing": n, "array_tasks": n // 10 * 10},
                         "churn": {"changes_per_s": 5.0 if n else 0}, "stopped": stopped,
                         "rss_peak_mib": {"binder": rss, "webhook": 60.0}}
    for k, jobs in (("idle", 6), ("idle_nohook", 60), ("idle_bound", 48),
                    ("idle_bound_nograce", 5), ("pods", 600)):
        s[k] = window(jobs, p99_s, {"slurmctld": 0.6, "slurmrestd": 0.6 + restd,
                                    "binder": 1.2})
    s["cost"] = {k: busy_cost.site_cost(stopped["cpu_pct"], s[k]["cpu_pct"])
                 for k in busy_report.CALM}
    s["latency_hook"] = {"running_to_bound": lat(rb), "admission": lat([0.01, 0.02])}
    s["floor"] = {"submit": lat([0.004, 0.005]), "cancel": lat([0.008, 0.01]),
                  "submit_binned": binned_lat([0.004, 0.005], LAT_BUCKETS),
                  "cancel_binned": binned_lat([0.008, 0.01], LAT_BUCKETS),
                  # the binder's periodic read made directly: as slow as the binder's own
                  # at N = 0, a third of it at N = 2,000
                  "read_endpoint": "jobs",
                  "read_binned": binned_lat([p99_s if n == 0 else p99_s / 3] * 20,
                                            LAT_BUCKETS)}
    s["calls"] = calls()
    s["calls_one_by_one"] = calls()
    s["whole_list"] = {"jobs": whole_list([1.2, 1.0, 1.4], 3.0 * (1 + n / 1000), 4e7, 300.0),
                       "nodes": whole_list([0.01, 0.01, 0.02], 0.003, 2e4, 300.0)}
    return s


def test_whole_list_cost_median_net_of_the_background_amortized() -> None:
    d = whole_list([1.2, 1.0, 1.4], 3.0, 4e7, 300.0)
    assert d["runs"] == 3 and d["wall_ms"] == 1200.0 and d["answer_ms"] == 1100.0
    assert d["bytes"] == 4e7
    assert d["slurm_cpu_s"] == 3.0  # slurmctld + slurmrestd: slurmscriptd is no part of it
    assert d["by_daemon"] == {"slurmctld": 0.6, "slurmrestd": 2.4}
    assert d["slurm_cpu_s_net"] == pytest.approx(2.88)  # the median of 3 - 0.1/s * wall
    assert d["amortized_pct"] == pytest.approx(0.96)
    assert busy_cost.list_cost([], 300.0) == {"runs": 0}
    # a list quicker than the background's noise costs nothing, never less
    tiny = busy_cost.list_cost([{"wall_s": 1.0, "answer_s": 1.0, "bytes": 1,
                                 "cpu_s": {"slurmrestd": 0.01}}], 300.0, 0.5)
    assert tiny["slurm_cpu_s_net"] == 0.0 and tiny["amortized_pct"] == 0.0
    assert busy_cost.background_rate({"slurmctld": 0.6, "slurmrestd": 1.2,
                                      "slurmscriptd": 9.0}, 60.0) == pytest.approx(0.03)
    assert busy_cost.background_rate({"slurmrestd": 1.0}, 0.0) == 0.0


def test_release_table_a_column_per_n_and_verdicts() -> None:
    results = {"slurm_version": "26.05", "rest_api": "v0.0.45",
               "by_n": [seg(0, 0.3, 0.004, [0.02, 0.03], 80.0),
                        seg(2000, 3.0, 0.3, [0.02, 0.05], 120.0)]}
    results["targets"] = busy_targets.targets(results)
    t = results["targets"]
    assert t["added_cpu_idle_pct"] == {"value": 5.0, "limit": 2.0, "ok": False}
    # the window's figure plus both whole lists amortized over their 300 s
    jobs = results["by_n"][1]["whole_list"]["jobs"]["amortized_pct"]
    nodes = results["by_n"][1]["whole_list"]["nodes"]["amortized_pct"]
    assert jobs == pytest.approx(100 * (9.0 - 0.12) / 300, 1e-3)
    both = t["added_cpu_idle_with_whole_lists_pct"]
    assert both["value"] == pytest.approx(5.0 + jobs + nodes, 1e-3) and both["ok"] is False
    assert "held 6 whole job list" in both["note"]  # this idle window's GET jobs
    assert t["idle_requests_per_min"]["value"] == 6.0 and t["idle_requests_per_min"]["ok"]
    assert t["slowest_read_p99_ms"]["ok"] is False  # 0.3 s lists
    assert t["running_to_bound_p99_vs_smallest_n"]["value"] == pytest.approx(50 / 30, 1e-3)
    assert t["binder_rss_peak_vs_smallest_n"] == {"value": 1.5, "limit": 1.2, "ok": False}
    # POST job/submit (5 and 6 ms) against the direct submit (4 and 5 ms), both read at the
    # same buckets: p99 5 + 2.5 * 0.98 = 7.45 ms against 4 + 1 * 0.98 = 4.98 ms, figures
    # kept to 0.1 ms (7.5 and 5.0)
    assert t["submit_p99_vs_direct"]["value"] == pytest.approx(7.5 / 5.0, 1e-3)
    # DELETE job/{id} alone (9 ms twice) against the direct cancel (8 and 10 ms), all in the
    # 7.5-10 ms bucket (10.0 ms each, to 0.1 ms): the 40 ms reads on job/{id} are not in it
    assert t["cancel_p99_vs_direct"] == {"value": 1.0, "limit": 1.2, "ok": True}
    # the binder's GET jobs in the Pods window (300 ms each) against the same read made
    # directly (100 ms each), both at the same buckets
    read = t["state_read_p99_vs_direct"]
    assert read["ok"] is False and read["value"] == pytest.approx(
        busy_report.by_method(results["by_n"][1]["pods"]["rest"]["binder"]["jobs"], "GET")[
            "p99_ms"] / binned_lat([0.1] * 20, LAT_BUCKETS)["p99_ms"], 1e-3)
    assert busy_targets.targets({"by_n": [results["by_n"][0]]})[
        "state_read_p99_vs_direct"] == {"value": 1.0, "limit": 1.2, "ok": True}
    # measured side by side (the same seconds, the same ids): that pair is the verdict's,
    # not the floor's reads made at another moment
    side = {"endpoint": "jobs/state", "ours": binned_lat([0.012] * 30, LAT_BUCKETS),
            "direct": binned_lat([0.011] * 190, LAT_BUCKETS)}
    results["by_n"][1]["pods"]["reads_side_by_side"] = side
    read = busy_targets.targets(results)["state_read_p99_vs_direct"]
    assert read["ok"] is True and read["value"] == pytest.approx(
        side["ours"]["p99_ms"] / side["direct"]["p99_ms"], 1e-3)
    assert "side by side" in busy_report.release_table(results, 8)
    del results["by_n"][1]["pods"]["reads_side_by_side"]

    text = busy_report.release_table(results, 8)
    lines = text.splitlines()
    assert lines[0] == "### Slurm 26.05 (REST v0.0.45)"
    assert "|  | N = 0 | N = 2,000 |" in lines
    row = next(x for x in lines if x.startswith("| slurmgate -> slurmrestd requests/min"))
    assert row.endswith("| 6 / 60 / 48 / 5 / 600 | 6 / 60 / 48 / 5 / 600 |")
    added = next(x for x in lines if x.startswith("| **added by slurmgate**"))
    assert added.endswith("| 0.5 / 0.5 / 0.5 / 0.5 / 0.5 | 5 / 5 / 5 / 5 / 5 |")
    jl = next(x for x in lines if x.startswith("| binder's whole job list"))
    assert jl.endswith("| whole list: 1,200 ms, 40 MB, 8.88 CPU-s of Slurm; amortized at the "
                       "300 s interval: 2.96 % of a core |")
    nl = next(x for x in lines if x.startswith("| binder's whole node list"))
    assert nl.endswith("| whole list: 10 ms, 0.02 MB, 0.002 CPU-s of Slurm; amortized at the "
                       "300 s interval: 0.001 % of a core |")  # 0.003 - 0.1/s * 10 ms
    both_row = next(x for x in lines if x.startswith("| **added by slurmgate, idle**"))
    assert both_row.endswith("| 5; 7.96 |")
    # by "component METHOD endpoint": the histogram's p99, interpolated in its bucket
    # (Prometheus' histogram_quantile); the method's latency over the whole running phase
    assert "| binder GET jobs | 6 / 60 / 48 / 5 / 600; 10.0 KiB/s; - | " \
        "6 / 60 / 48 / 5 / 600; 10.0 KiB/s; - |" in lines
    # 9 ms twice in the 7.5-10 ms bucket: p50 7.5 + 2.5 / 2, p99 7.5 + 2.5 * 0.99
    assert "| binder DELETE job/{id} | - / - / - / - / -; -; 8.8 / 10 | " \
        "- / - / - / - / -; -; 8.8 / 10 |" in lines
    # 40 ms, 8 times, in the 30-40 ms bucket
    assert "| binder GET job/{id} | - / - / - / - / -; -; 35 / 39.9 | " \
        "- / - / - / - / -; -; 35 / 39.9 |" in lines
    by_endpoint = lines[lines.index("| endpoint | N = 0 | N = 2,000 |") + 2:]
    assert [x.split(" |")[0] for x in by_endpoint if x.startswith("| ")] == [
        "| binder DELETE job/{id}", "| binder GET job/{id}", "| binder GET jobs",
        "| webhook POST job/submit"]
    assert "| submit p50 / p99 ms, one at a time: slurmgate POST job/submit; direct, same " \
        "buckets (p99 ratio) | 5 / 7.5; 4 / 5 (1.50x), n = 2 |" in text
    assert "| 8.8 / 10; 8.8 / 10 (1.00x), n = 2 |" in text  # the cancels
    assert "| single-job read p50 / p99 ms: binder GET job/{id} | 35 / 39.9, n = 8 |" in text
    assert "added_cpu_idle_pct 5 (<= 2): MISSED" in text
    assert "(the idle window held 6 whole job list(s)" in text
    # every row has a cell per N: no pipe inside a cell
    assert all(x.count("|") == 4 for x in lines if x.startswith("| "))
    json.dumps(results)  # the JSON the bench writes holds the same


def test_report_reads_rows_without_methods() -> None:
    """A row from before the histogram had a method label: the endpoint's figures stand for a
    method only where the endpoint had that one method."""
    only_post = {"requests": 2, "by": {"POST 200": 2}, "n": 2, "p50_ms": 5.0, "p99_ms": 6.0}
    mixed = {"requests": 10, "by": {"GET 200": 8, "DELETE 200": 2}, "n": 10, "p99_ms": 9.0}
    assert busy_report.by_method(only_post, "POST") is only_post
    assert busy_report.by_method(mixed, "DELETE") is None
    assert busy_report.by_method(None, "GET") is None
    win = {"rest": {"binder": {"job/{id}": mixed, "jobs": {
        "requests": 1, "by": {"GET 200": 1}, "n": 1, "p99_ms": 30.0}}, "webhook": {}}}
    assert busy_report.worst_read(win) == ("binder jobs", 30.0)
    s = {"calls": {"binder": {"job/{id}": mixed}}, "floor": {"cancel": lat([0.01])}}
    assert busy_targets.targets({"by_n": [{**s, "pods": {}}]})["cancel_p99_vs_direct"][
        "ok"] is None


def test_whole_list_over_the_binders_timeout_and_failed() -> None:
    slow = whole_list([9.0, 8.0, 10.0], 20.0, 3e8, 300.0)
    assert "(over the binder's 5 s request timeout)" in busy_report.list_cell(slow)
    failed = {**busy_cost.list_cost([], 300.0), "error": "SlurmUnavailable: x"}
    assert busy_report.list_cell(failed) == "- (SlurmUnavailable: x)"
    assert busy_report.list_cell(None) == "-"
    assert busy_report.with_whole_lists({"cost": {"idle": {"slurmrestd+slurmctld": 1.0}}}) \
        is None


def test_table_of_a_run_that_stopped_early() -> None:
    text = busy_report.release_table({"slurm_version": "22.05", "by_n": [{"n": 0}],
                                      "error": "TimeoutError: x"}, 8)
    assert "|  | N = 0 |" in text and "**stopped early:** TimeoutError: x" in text
    assert busy_targets.targets({"by_n": [{"n": 0}]}) == {}


# ------------------------------------------------------------------------------ whole lists


class Ticking(busy_cost.Watched):
    """Slurm's daemons as /proc would show them: each sample 0.1 s of slurmctld and 0.4 s of
    slurmrestd later than the one before."""

    def __init__(self) -> None:
        super().__init__({})
        self.ticks = 0

    def cpu(self) -> dict[str, dict[int, float]]:
        self.ticks += 1
        return {"slurmctld": {1: 0.1 * self.ticks}, "slurmrestd": {2: 0.4 * self.ticks}}


async def test_whole_lists_made_through_slurmgates_client(tmp_path: Path) -> None:
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    from bench import busy_phases  # imports cluster.*: after the defaults test

    jobs = {"jobs": [{"job_id": 1, "comment": "slurmgate claim=a pod=ns/p", "job_state":
                      ["RUNNING"]}] + [{"job_id": i, "comment": "", "job_state": ["PENDING"]}
                                       for i in range(2, 50)],
            "last_update": {"set": True, "infinite": False, "number": 1000}}
    body = json.dumps(jobs).encode()
    seen: list[str] = []

    async def openapi(_: web.Request) -> web.Response:
        return web.json_response({"paths": {"/slurm/v0.0.42/jobs/": {}}})

    async def job_list(req: web.Request) -> web.Response:
        seen.append(req.path_qs)
        return web.Response(body=body, content_type="application/json")

    async def nodes(_: web.Request) -> web.Response:
        return web.json_response({"errors": [{"error": "boom"}]}, status=500)

    app = web.Application()
    app.router.add_get("/openapi/v3", openapi)
    app.router.add_get("/slurm/v0.0.42/jobs", job_list)
    app.router.add_get("/slurm/v0.0.42/nodes", nodes)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    token = tmp_path / "token"
    token.write_text("eyJhbGciOiJIUzI1NiJ9.x\n")
    try:
        out = await busy_phases.whole_lists(
            str(server.make_url("")).rstrip("/"), token, Ticking(),
            {"seconds": 30.0, "cpu_s": {"slurmctld": 0.3, "slurmrestd": 0.6}},
            {"jobs": 300.0, "nodes": 600.0})
    finally:
        await server.close()
    assert seen == ["/slurm/v0.0.42/jobs"] * 3  # the whole list: no update_time
    j = out["jobs"]
    assert j["runs"] == 3 and j["bytes"] == len(body) and j["interval_s"] == 300.0
    assert 0 < j["answer_ms"] <= j["wall_ms"]
    assert j["slurm_cpu_s"] == pytest.approx(0.5)  # one sample before, one after
    # the background's 0.03 CPU-s a second over the list's wall time comes off
    assert j["slurm_cpu_s_net"] == pytest.approx(0.5 - 0.03 * j["wall_ms"] / 1000, abs=2e-3)
    assert j["amortized_pct"] == pytest.approx(100 * j["slurm_cpu_s_net"] / 300, abs=1e-3)
    assert j["binder_timeout_s"] == 5.0  # SlurmClient's default, which the binder runs with
    # a list that fails is a result too, with what it measured before
    assert out["nodes"]["runs"] == 0 and "boom" in out["nodes"]["error"]
    assert busy_report.list_cell(out["nodes"]).startswith("- (SlurmRefused")


# sdiag's tail on 22.05 (the same lines on 24.11 and 26.05, which add sections after it)
SDIAG = """Remote Procedure Call statistics by message type
\tREQUEST_JOB_INFO_SINGLE                 ( 2021) count:900    ave_time:300    total_time:270000
\tREQUEST_KILL_JOB                        ( 5032) count:10     ave_time:500    total_time:5000

Remote Procedure Call statistics by user
\troot            (       0) count:{n}   ave_time:250    total_time:{t}
\tsg-team-a       (    1001) count:5000   ave_time:100    total_time:500000

Pending RPC statistics
\tREQUEST_TERMINATE_JOB                   ( 6011) count:1
"""


def test_slurmctlds_time_on_our_rpcs_comes_from_its_per_user_statistics() -> None:
    before = busy_cost.rpcs_by_user(SDIAG.format(n=100, t=25_000))
    # the message-type section (same line shape) is not read as users
    assert before == {"root": (100, 0.025), "sg-team-a": (5000, 0.5)}
    after = busy_cost.rpcs_by_user(SDIAG.format(n=161, t=325_000))
    d = busy_cost.rpc_delta(before, after, "root", seconds=30.0)
    # 60 RPCs of ours (sdiag's own one taken off), 0.3 s of slurmctld in 30 s: 1 % of a core
    assert d == {"rpcs": 60, "seconds": 0.3, "pct": 1.0, "per_min": 120.0}
    assert busy_cost.rpc_delta(before, {}, "root", 30.0) is None  # sdiag failed
    # a restarted slurmctld counts from zero again: no figure rather than a negative one
    assert busy_cost.rpc_delta(after, before, "root", 30.0) is None


def test_pods_in_flight_are_judged_over_the_same_jobs_made_directly() -> None:
    """What Slurm spends scheduling and running 16 jobs is any client's; the in-flight target
    holds slurmgate to what its Pods add over the same jobs made directly, by both measures."""
    results = {"slurm_version": "22.05", "rest_api": "v0.0.38",
               "by_n": [seg(0, 0.3, 0.004, [0.02, 0.03], 80.0),
                        seg(50000, 3.0, 0.3, [0.02, 0.05], 120.0)]}
    last = results["by_n"][1]
    t = busy_targets.targets(results)
    assert t["added_cpu_pods_in_flight_pct"]["value"] == last["cost"]["pods"][
        busy_cost.SITE_TOTAL]  # no direct window in this run: the Pods window alone
    assert t["ctld_rpc_time_pods_in_flight_over_direct_pct"]["ok"] is None
    last["pods"]["ctld_rpc"] = {"rpcs": 300, "seconds": 9.0, "pct": 30.0, "per_min": 600.0}
    last["direct"] = {"ctld_rpc": {"rpcs": 60, "seconds": 7.8, "pct": 26.0, "per_min": 120.0}}
    last["cost"]["direct"] = {busy_cost.SITE_TOTAL: 17.0}
    last["cost"]["pods_over_direct"] = {busy_cost.SITE_TOTAL: 2.5}
    t = busy_targets.targets(results)
    assert t["added_cpu_pods_in_flight_pct"] == {"value": 2.5, "limit": 5.0, "ok": True}
    assert t["ctld_rpc_time_pods_in_flight_over_direct_pct"] == {
        "value": 4.0, "limit": 5.0, "ok": True}
    text = busy_report.release_table(results, 16)
    assert "| 17; 26 (120) |" in text  # the direct window: CPU added; sdiag % (a minute)
    assert "| 2.5; 4 |" in text  # slurmgate's own over it
    assert all(x.count("|") == 4 for x in text.splitlines() if x.startswith("| "))


async def test_the_bench_waits_for_the_binders_cancel_in_its_log(tmp_path: Path) -> None:
    """The latency phase's cancels are left to meet slurmctld alone: the bench waits for the
    binder's own line, written after an earlier one at the offset, before it reads Slurm."""
    import asyncio

    from bench import busy_phases
    log_file = tmp_path / "binder.log"
    old = {"msg": busy_phases.CANCELLED, "pod": "ns/p1", "job": 7}
    log_file.write_text(json.dumps(old) + "\n")
    offset = log_file.stat().st_size
    assert not await busy_phases.binder_said(log_file, busy_phases.CANCELLED, "ns", "p1",
                                             offset, limit=0.2)  # only before the offset

    async def later() -> None:
        await asyncio.sleep(0.1)
        with log_file.open("a") as f:
            f.write(json.dumps({"msg": busy_phases.CANCELLED, "pod": "other/p1"}) + "\n")
            f.write("Traceback (most recent call last):\n")
            f.write(json.dumps({**old, "job": 8}) + "\n")
    writer = asyncio.create_task(later())
    assert await busy_phases.binder_said(log_file, busy_phases.CANCELLED, "ns", "p1", offset,
                                         limit=10)
    await writer
