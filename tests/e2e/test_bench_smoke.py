"""`make bench` works: a --quick run of every phase on its own cluster (figures not judged)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.kube_side]
REPO = Path(__file__).resolve().parents[2]


def test_bench_quick_runs_every_phase(tmp_path: Path) -> None:
    env = {**os.environ, "SLURMGATE_PORT_OFFSET": "2000"}
    p = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(tmp_path),
         "--run-dir", "/tmp/slurmgate-bench-smoke"],
        cwd=REPO, env=env, text=True, capture_output=True, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # --quick runs one release: $SLURM_VERSION (make test-matrix sets it), else the newest
    (result,) = tmp_path.glob("bench-*-slurm-*.json")
    (summary,) = tmp_path.glob("bench-*-summary.json")
    doc = json.loads(result.read_text())
    assert [v["slurm_version"] for v in json.loads(summary.read_text())["versions"]] == \
        [doc["slurm_version"]]
    assert f"Slurm {doc['slurm_version']}" in p.stdout
    assert "error" not in doc, doc.get("error")
    assert doc["admission"] and len(doc["bursts"]) == 2
    for burst in doc["bursts"]:
        assert burst["size"] in (10, 20)
    assert "slurmgate" in p.stdout and "overhead" in p.stdout
