"""`make image`'s recipe agrees with the package: the Containerfile checks and runs the console
scripts pyproject.toml declares, the default tag is the release tag, and the build script and
make target parse. (Building the image itself takes buildah and a minute: `make image`.)"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", (ROOT / "Containerfile").read_text())
    lines = [ln.strip() for ln in text.splitlines()]
    return [(i.upper(), a.strip()) for i, _, a in
            (ln.partition(" ") for ln in lines if ln and not ln.startswith("#"))]


def test_containerfile_entry_points_are_the_console_scripts() -> None:
    # the processes' scripts; kubectl-slurm is a client for people's machines, not the image's
    scripts = {s for s in PROJECT["scripts"] if s.startswith("slurmgate-")}
    assert set(PROJECT["scripts"]) - scripts == {"kubectl-slurm"}
    runs = " ".join(a for i, a in _instructions() if i == "RUN")
    # the builder runs every console script once, from the venv the runtime stage copies
    assert set(re.findall(r"/opt/venv/bin/(slurmgate-[\w-]+) --help", runs)) == scripts
    cmd = json.loads([a for i, a in _instructions() if i == "CMD"][-1])
    assert cmd[0] in scripts


def test_default_tag_is_the_release_tag() -> None:
    kust = yaml.safe_load((ROOT / "kustomize/base/deployment/kustomization.yaml").read_text())
    (image,) = kust["images"]
    assert image["newTag"] == PROJECT["version"]


def test_build_script_parses() -> None:
    script = ROOT / "cluster/build-image.sh"
    assert "set -euo pipefail" in script.read_text()
    subprocess.run(["bash", "-n", str(script)], check=True)


@pytest.mark.skipif(shutil.which("make") is None, reason="no make")
def test_make_image_runs_the_build_script() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert makefile.count("include mk/image.mk\n") == 1
    out = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), "image"],
                         check=True, capture_output=True, text=True).stdout.strip()
    want = f"bash cluster/build-image.sh localhost/slurmgate/slurmgate {PROJECT['version']}"
    assert out == want
