"""A failed chaos release keeps its logs, and prints the binder's lines about what it names."""

from __future__ import annotations

from pathlib import Path

from bench.chaos.report import keep_logs


def test_the_logs_are_copied_and_the_lines_about_the_violations_printed(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "bridge" / "log").mkdir(parents=True)
    (run / "slurm" / "log").mkdir(parents=True)
    (run / "slurm" / "log" / "ctld.log").write_text("[t] kill_job 43\n")
    (run / "bridge" / "log" / "binder.log").write_text(
        '{"msg": "group job submitted", "group": "chaos/g45", "job": 43}\n'
        '{"msg": "pod bound", "job": 44}\n'
        '{"msg": "group released", "group": "chaos/g45"}\n')
    out = keep_logs(run, tmp_path / "out", 7, "26.05", [
        {"rule": "leaked job", "detail": "job 43 (k8s:chaos/group:g45, RUNNING) has no Pod"}],
        "chaos")
    lines = out.splitlines()
    assert lines[0].startswith("logs kept in ") and len(lines) == 3, out
    assert "group job submitted" in lines[1] and "group released" in lines[2]
    kept = Path(lines[0].removeprefix("logs kept in "))
    assert (kept / "slurm" / "ctld.log").read_text() == "[t] kill_job 43\n"
    assert (kept / "bridge" / "binder.log").is_file()
