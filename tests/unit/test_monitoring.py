"""The monitoring component (kustomize/components/monitoring): it renders; promtool accepts its
alert rules and each alert fires on the series it is about (promtool test rules, with the
series written here); every metric a rule or a dashboard panel names is one the binder or the
webhook registers. tests/e2e/test_monitoring.py checks the same names on running processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from slurmgate.binder import metrics as binder_metrics
from slurmgate.webhook import metrics as webhook_metrics

ROOT = Path(__file__).resolve().parents[2]
COMPONENT = ROOT / "kustomize" / "components" / "monitoring"
PROMTOOL = os.environ.get("PROMTOOL") or str(Path.home() / ".cache/slurmgate/promtool/promtool")
METRIC = re.compile(r"\bslurmgate_[a-z_]+")
# what a histogram's series add to its name
SUFFIXES = ("_bucket", "_sum", "_count", "_created", "_total")


def rendered(tmp: Path) -> list[dict[str, Any]]:
    """The component, rendered by kustomize on an overlay of nothing else (it needs no base)."""
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "components": [os.path.relpath(COMPONENT, tmp)]}))
    return [d for d in yaml.safe_load_all(subprocess.run(
        ["kubectl", "kustomize", str(tmp)], check=True, capture_output=True, text=True,
        timeout=60).stdout) if d]


def rules_spec() -> dict[str, Any]:
    doc = yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text())
    spec: dict[str, Any] = doc["spec"]
    return spec


def named_metrics() -> set[str]:
    rules = " ".join(r["expr"] for g in rules_spec()["groups"] for r in g["rules"])
    dash = json.loads((COMPONENT / "grafana-dashboard.json").read_text())
    panels = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    return set(METRIC.findall(rules + " " + panels))


def family(name: str) -> str:
    for s in SUFFIXES:
        if name.endswith(s):
            return name[: -len(s)]
    return name


def registered() -> set[str]:
    out = set()
    for reg in (binder_metrics.REGISTRY, webhook_metrics.REGISTRY):
        for m in reg.collect():
            out.add(m.name)
    return out


def test_the_component_renders_a_rule_a_monitor_and_a_dashboard(tmp_path: Path) -> None:
    docs = rendered(tmp_path)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert kinds == {("PrometheusRule", "slurmgate"), ("PodMonitor", "slurmgate"),
                     ("ConfigMap", "slurmgate-grafana-dashboard")}, kinds
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["slurmgate.json"])["uid"] == "slurmgate"


def test_every_metric_named_is_registered() -> None:
    names = named_metrics()
    assert len(names) >= 10, names  # the regex finds them
    have = registered()
    missing = sorted(n for n in names if family(n) not in have and n not in have)
    assert not missing, f"named but never registered: {missing}"
    assert family("slurmgate_binder_nope_bucket") not in have  # the check can fail


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    if not Path(PROMTOOL).exists():
        pytest.fail(f"promtool not found at {PROMTOOL}: run `make promtool`")
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_promtool_accepts_the_rules(tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_spec()))
    p = promtool("check", "rules", "rules.yaml", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    # and it rejects a broken one, so the check means something
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(
        {"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "sum(("}]}]}))
    assert promtool("check", "rules", "bad.yaml", cwd=tmp_path).returncode != 0


# each alert: the series that should make it fire (promtool's expanding notation), the labels
# the alert then carries beyond its severity, and what its $value reads as in its annotations
FIRING: dict[str, tuple[list[str], dict[str, str], str]] = {
    "SlurmgateBinderLeaderAbsent": (['slurmgate_binder_is_leader{pod="a"}', "0x20"], {}, "0"),
    "SlurmgateSlurmUnreachable": ([
        'slurmgate_binder_slurm_polls_total{outcome="error"}', "0+10x20",
        'slurmgate_binder_slurm_polls_total{outcome="ids"}', "5x20"], {}, ""),
    "SlurmgatePodsStuck": (["slurmgate_binder_stuck_pods", "2x20"], {}, "2"),
    "SlurmgatePodsOverdue": (["slurmgate_binder_overdue_pods", "1x20"], {}, "1"),
    "SlurmgateUntaintedSlurmNodes": (["slurmgate_binder_untainted_slurm_nodes", "1x20"], {}, "1"),
    "SlurmgateTenancyPolicyInvalid": ([
        'slurmgate_webhook_tenancy_policy_state{state="invalid"}', "1x20"],
        {"state": "invalid"}, "1"),
    "SlurmgateWebhookErrors": ([
        'slurmgate_webhook_requests_total{code="200"}', "0+10x20",
        'slurmgate_webhook_requests_total{code="500"}', "0+5x20"], {}, "33.33%"),
}


def expected(rule: dict[str, Any], labels: dict[str, str], value: str) -> dict[str, Any]:
    """The alert promtool must see: the rule's labels and annotations, templates filled in."""
    def fill(text: str) -> str:
        text = text.replace("{{ $value | humanizePercentage }}", value)
        text = text.replace("{{ $value }}", value)
        for k, v in labels.items():
            text = text.replace(f"{{{{ $labels.{k} }}}}", v)
        return text
    return {"exp_labels": {**rule.get("labels", {}), **labels},
            "exp_annotations": {k: fill(v) for k, v in rule.get("annotations", {}).items()}}


def test_each_alert_fires_on_its_series_and_not_on_a_healthy_one(tmp_path: Path) -> None:
    rules = {r["alert"]: r for g in rules_spec()["groups"] for r in g["rules"]}
    assert set(rules) == set(FIRING), set(rules) ^ set(FIRING)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules_spec()))
    tests = []
    for alert, (series, labels, value) in FIRING.items():
        pairs = [{"series": series[i], "values": series[i + 1]} for i in range(0, len(series), 2)]
        firing = [{"eval_time": "19m", "alertname": alert,
                   "exp_alerts": [expected(rules[alert], labels, value)]}]
        tests.append({"interval": "1m", "input_series": pairs, "alert_rule_test": firing})
    # a healthy binder and webhook: a leader, polls that work, nothing stuck, no 5xx
    healthy = [{"series": 'slurmgate_binder_is_leader{pod="a"}', "values": "1x20"},
               {"series": 'slurmgate_binder_slurm_polls_total{outcome="ids"}',
                "values": "0+10x20"},
               {"series": "slurmgate_binder_stuck_pods", "values": "0x20"},
               {"series": 'slurmgate_webhook_requests_total{code="200"}', "values": "0+10x20"}]
    tests.append({"interval": "1m", "input_series": healthy, "alert_rule_test": [
        {"eval_time": "19m", "alertname": a, "exp_alerts": []} for a in FIRING]})
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}))
    p = promtool("test", "rules", "test.yaml", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
