"""bench/run.py's arguments (burst sizes, --scale, --versions, the probe's counts) and
bench/suite.py's loop over Slurm releases, with the cluster part replaced: nothing starts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench import run
from cluster import slurm_release
from cluster.proc import ClusterError

EVERY = list(slurm_release.RELEASES)


@pytest.fixture(autouse=True)
def no_slurm_version(monkeypatch: pytest.MonkeyPatch) -> None:
    # `make` exports SLURM_VERSION; these tests say when they want it
    monkeypatch.delenv(slurm_release.VERSION_ENV, raising=False)


def test_defaults_two_sizes_every_release_probe_up_to_500() -> None:
    a = run.parse_args([])
    assert a.sizes == [100, 500]
    assert a.versions == EVERY == ["22.05", "24.11", "26.05"]
    assert a.nodes is None  # the probe decides
    assert a.probe == [50, 100, 200, 400, 500]
    assert (a.idle_window, a.admission_pods, a.max_nodes) == (65.0, 100, 1000)


def test_scale_adds_the_1000_burst_and_probes_up_to_it() -> None:
    a = run.parse_args(["--scale"])
    assert a.sizes == [100, 500, 1000]
    assert a.probe == [50, 100, 200, 400, 1000]


def test_sizes_override_scale_and_cap_the_probe() -> None:
    a = run.parse_args(["--scale", "--sizes", "30,60"])
    assert a.sizes == [30, 60]
    assert a.probe == [50, 60]
    assert run.parse_args(["--sizes", "50"]).probe == [50]
    assert run.parse_args(["--sizes", "100,500", "--probe", "10,20"]).probe == [10, 20]


@pytest.mark.parametrize("argv", [["--sizes", "10,x"], ["--sizes", "0"], ["--sizes", ","],
                                  ["--probe", "a"], ["--quick", "--scale"],
                                  ["--versions", "23.02"], ["--versions", ","],
                                  ["--phase", "1"], ["--phase", "-0.1"],
                                  ["--slurmd-nice", "20"], ["--slurmd-nice", "-1"]])
def test_bad_arguments_exit(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        run.parse_args(argv)
    assert e.value.code == 2
    assert "error" in capsys.readouterr().err


def test_versions_keep_order_and_drop_repeats() -> None:
    a = run.parse_args(["--versions", "26.05, 22.05,26.05"])
    assert a.versions == ["26.05", "22.05"]


def test_unknown_version_names_the_ones_there_are(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--versions", "22.05,25.05"])
    assert "25.05" in capsys.readouterr().err


def test_full_run_ignores_slurm_version_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(slurm_release.VERSION_ENV, "22.05")
    assert run.parse_args([]).versions == EVERY


def test_quick_is_tiny_and_on_one_release(monkeypatch: pytest.MonkeyPatch) -> None:
    a = run.parse_args(["--quick"])
    assert a.sizes == [10, 20] and a.nodes == 20
    assert a.versions == [slurm_release.NEWEST] == ["26.05"]
    assert (a.idle_window, a.admission_pods) == (5.0, 20)
    monkeypatch.setenv(slurm_release.VERSION_ENV, "22.05")  # as make test-matrix runs it
    assert run.parse_args(["--quick"]).versions == ["22.05"]
    assert run.parse_args(["--quick", "--versions", "22.05,24.11"]).versions == \
        ["22.05", "24.11"]
    a = run.parse_args(["--quick", "--sizes", "5", "--nodes", "3", "--idle-window", "2"])
    assert (a.sizes, a.nodes, a.idle_window) == ([5], 3, 2.0)


def test_quick_with_a_bad_slurm_version_env_exits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(slurm_release.VERSION_ENV, "21.08")
    with pytest.raises(SystemExit):
        run.parse_args(["--quick"])


class FakeRuns:
    """suite.run_version without a cluster: records the calls, returns a canned outcome."""

    def __init__(self, codes: dict[str, int]) -> None:
        self.codes = codes
        self.calls: list[tuple[str, bool]] = []
        self.env_seen: list[str | None] = []

    def __call__(self, a: Any, version: str, stamp: str,
                 keep: bool) -> tuple[int, dict[str, Any], Path]:
        self.calls.append((version, keep))
        self.env_seen.append(os.environ.get("SLURM_CONF"))
        os.environ["SLURM_CONF"] = f"/tmp/{version}/slurm.conf"  # as harness.Env.open does
        path = a.out / f"bench-{stamp}-slurm-{version}.json"
        r = {"slurm_version": version, "nodes": 20, "bursts": [],
             "targets": {"[100] makespan overhead <= 1.15x": f"{version} OK"}}
        path.write_text(json.dumps(r))
        return self.codes.get(version, 0), r, path


def run_suite(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, argv: list[str],
              codes: dict[str, int] | None = None,
              root_error: str | None = None) -> tuple[int, FakeRuns, list[str]]:
    from bench import suite

    roots: list[str] = []

    def build_root(r: slurm_release.Release) -> str:
        roots.append(r.version)
        if root_error:
            raise ClusterError(root_error)
        return ""

    fake = FakeRuns(codes or {})
    monkeypatch.setattr(suite, "run_version", fake)
    monkeypatch.setattr(slurm_release, "build_root", build_root)
    monkeypatch.delenv("SLURM_CONF", raising=False)
    code = suite.main(run.parse_args([*argv, "--out", str(tmp_path)]))
    assert "SLURM_CONF" not in os.environ  # each release's run leaves the environment as found
    return code, fake, roots


def test_suite_runs_each_release_in_turn_then_the_summary(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    code, fake, roots = run_suite(monkeypatch, tmp_path, ["--keep"])
    assert code == 0
    assert roots == EVERY  # every root before the first run
    # only the last release may keep its cluster: the next one needs the run dir and ports
    assert fake.calls == [("22.05", False), ("24.11", False), ("26.05", True)]
    assert fake.env_seen == [None, None, None]
    (summary,) = tmp_path.glob("bench-*-summary.json")
    doc = json.loads(summary.read_text())
    assert [v["slurm_version"] for v in doc["versions"]] == EVERY
    assert len(list(tmp_path.glob("bench-*-slurm-*.json"))) == 3
    out = capsys.readouterr().out
    assert "summary of 3 Slurm release(s)" in out and "26.05 OK" in out


def test_suite_goes_on_after_a_failed_release_and_stops_when_interrupted(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, fake, _ = run_suite(monkeypatch, tmp_path, [], codes={"22.05": 1})
    assert code == 1 and [v for v, _ in fake.calls] == EVERY
    code, fake, _ = run_suite(monkeypatch, tmp_path / "b", [], codes={"24.11": 130})
    assert code == 130 and [v for v, _ in fake.calls] == ["22.05", "24.11"]
    (summary,) = (tmp_path / "b").glob("bench-*-summary.json")
    assert [v["exit"] for v in json.loads(summary.read_text())["versions"]] == [0, 130]


def test_suite_stops_before_measuring_when_a_root_cannot_be_built(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    code, fake, _ = run_suite(monkeypatch, tmp_path, ["--versions", "24.11,26.05"],
                              root_error="debootstrap failed")
    assert code == 1 and fake.calls == []
    assert list(tmp_path.glob("*.json")) == []


def test_bursts_start_at_half_a_second_unless_told() -> None:
    assert run.parse_args([]).phase == 0.5
    assert run.parse_args(["--phase", "0.25"]).phase == 0.25
    assert run.parse_args(["--no-phase"]).phase is None
    assert run.parse_args([]).slurmd_nice == 0
    assert run.parse_args(["--slurmd-nice", "19"]).slurmd_nice == 19
