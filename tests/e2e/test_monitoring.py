"""Every metric the monitoring component's alerts and dashboard name is exported by the running
binder and webhook (their /metrics as Prometheus scrapes them), not only registered in code."""

from __future__ import annotations

import re
import urllib.request

import pytest

from cluster.bridge import Bridge
from tests.e2e.tenantkit import _webhook_metrics
from tests.unit.test_monitoring import family, named_metrics

pytestmark = pytest.mark.e2e

TYPE = re.compile(r"^# TYPE (\S+) ")


def test_every_metric_the_alerts_and_dashboard_name_is_exported(bridge: Bridge) -> None:
    with urllib.request.urlopen(f"{bridge.binder_url}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines() + _webhook_metrics(bridge)
    exported = {m.group(1) for ln in lines if (m := TYPE.match(ln))}
    assert "slurmgate_binder_is_leader" in exported, sorted(exported)[:20]
    missing = sorted(n for n in named_metrics() if n not in exported and family(n) not in exported)
    assert not missing, f"named by the monitoring component, not exported: {missing}"
