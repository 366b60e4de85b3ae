"""bench.util: both bursts of a comparison start at the same fraction of a wall-clock second
(slurmctld's one-second tick falls on whole seconds), and the CPU table names Python processes
by role (binder, its worker, webhook, bench)."""

from __future__ import annotations

import asyncio
import time

import pytest

from bench import util


@pytest.mark.parametrize(("now", "phase", "wait"), [
    (100.0, 0.5, 0.5), (100.2, 0.5, 0.3), (100.5, 0.5, 0.0), (100.7, 0.5, 0.8),
    (100.9, 0.0, 0.1), (100.0, 0.0, 0.0), (1_764_950_000.25, 0.75, 0.5),
])
def test_wait_until_the_next_phase(now: float, phase: float, wait: float) -> None:
    assert util.until_phase(phase, now) == pytest.approx(wait, abs=1e-6)


@pytest.mark.parametrize("phase", [1.0, -0.01, 2.5])
def test_a_phase_outside_a_second_is_refused(phase: float) -> None:
    with pytest.raises(ValueError, match="fraction of a second"):
        util.until_phase(phase, 100.0)


def test_at_phase_returns_at_that_fraction_of_the_wall_clock() -> None:
    for phase in (0.3, 0.8):
        asyncio.run(util.at_phase(phase))
        # the event loop wakes a little late, never early
        assert (time.time() - phase) % 1.0 < 0.1


def test_no_phase_returns_at_once() -> None:
    t0 = time.monotonic()
    asyncio.run(util.at_phase(None))
    assert time.monotonic() - t0 < 0.1


@pytest.mark.parametrize(("cmdline", "parent", "role"), [
    (".venv/bin/python -m slurmgate.binder --health-listen=127.0.0.1:15480", None,
     "python:binder"),
    (".venv/bin/python -m slurmgate.webhook --listen=127.0.0.1:15443", None, "python:webhook"),
    (".venv/bin/python -m bench.run --versions 26.05", None, "python:bench"),
    ("python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=36)",
     "python:binder", "python:binder-worker"),
    ("python -B -c from multiprocessing.spawn import spawn_main", None, "python:worker"),
    ("python3 /tmp/somebody_elses.py", None, "python"),
])
def test_python_processes_are_named_by_role(cmdline: str, parent: str | None,
                                            role: str) -> None:
    assert util.python_role(cmdline, parent) == role


def test_cpu_by_command_names_a_python_process_by_its_role() -> None:
    import subprocess
    import sys

    # a Python process whose command line names the webhook's module, as the webhook's does
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)",
                          "-m", "slurmgate.webhook"])
    try:
        assert (p.pid, "python:webhook") in util.cpu_by_command()
    finally:
        p.kill()
        p.wait()
