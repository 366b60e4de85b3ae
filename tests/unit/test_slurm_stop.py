"""Stopping a local Slurm cluster also kills a slurmstepd that carries no trace of the cluster
in its environment (26.05's rewrites its environ) by the unix socket it listens on under the
run dir. Real processes listening on real sockets stand in for slurmstepd."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from cluster import proc, slurm_stop
from tests.unit.processes import gone

LISTEN = ("import socket, sys, time\n"
          "s = socket.socket(socket.AF_UNIX)\n"
          "s.bind(sys.argv[1]); s.listen()\n"
          "print('up', flush=True)\n"
          "time.sleep(60)\n")


def _listener(path: Path) -> subprocess.Popen[str]:
    path.parent.mkdir(parents=True, exist_ok=True)
    # an environment with nothing of Slurm's in it, as a stepd whose environ was rewritten
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    p = subprocess.Popen([sys.executable, "-c", LISTEN, str(path)], env=env,
                         stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "up"
    return p



def test_holders_of_sockets_under_a_prefix(tmp_path: Path) -> None:
    ours = _listener(tmp_path / "run" / "spool" / "n1" / "n1_38.4294967291")
    other = _listener(tmp_path / "runner" / "n1_39.0")  # a sibling whose name shares the prefix
    try:
        assert proc.unix_socket_holders(str(tmp_path / "run")) == {ours.pid}
        assert proc.unix_socket_holders(str(tmp_path / "nowhere")) == set()
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def test_stop_kills_a_stepd_found_only_by_its_socket(tmp_path: Path) -> None:
    run = tmp_path / "run"
    stepd = _listener(run / "spool" / "n1" / "n1_38.4294967291")
    stranger = _listener(tmp_path / "elsewhere" / "n1_38.0")
    try:
        slurm_stop.stop(run)
        assert gone(stepd)
        assert stranger.poll() is None and proc.alive(stranger.pid)
    finally:
        for p in (stepd, stranger):
            p.kill()
            p.wait()
