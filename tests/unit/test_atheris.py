"""A short, bounded atheris run (tests/fuzz/fuzz_admission.py); skipped without atheris."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("atheris")

SCRIPT = Path(__file__).resolve().parents[1] / "fuzz" / "fuzz_admission.py"


def test_atheris_bounded_run(tmp_path: Path) -> None:
    p = subprocess.run([sys.executable, str(SCRIPT), "-atheris_runs=5000", "-max_len=4096",
                        f"-artifact_prefix={tmp_path}/"], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
