"""`python -m cluster.local down` also stops the webhook and binder cluster.bridge started under
the same run dir (left running, they served the next cluster on the same ports), and only
processes that still carry the bridge's kubeconfig (PIDs get reused). Real `sleep` processes
stand in for them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from cluster import local, proc
from tests.unit.processes import gone


def _sleep(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(["sleep", "60"], env=env, start_new_session=True)



def test_down_stops_the_bridges_processes_and_nothing_else(tmp_path: Path) -> None:
    kc = str(tmp_path / "bridge" / "slurmgate.kubeconfig")
    ours = {n: _sleep({**os.environ, "KUBECONFIG": kc}) for n in ("webhook", "binder")}
    stranger = _sleep({**os.environ, "KUBECONFIG": "/elsewhere/kubeconfig"})
    try:
        (tmp_path / "bridge").mkdir()
        pids = {**{n: p.pid for n, p in ours.items()}, "binder-2": stranger.pid}
        (tmp_path / local.BRIDGE_STATE).write_text(json.dumps({"kubeconfig": kc, "pids": pids}))
        assert local.bridge_pids(tmp_path) == {n: p.pid for n, p in ours.items()}
        local.down(tmp_path)
        assert all(gone(p) for p in ours.values())
        assert stranger.poll() is None and proc.alive(stranger.pid)
    finally:
        for p in (*ours.values(), stranger):
            p.kill()
            p.wait()


def test_no_or_unreadable_bridge_state_stops_nothing(tmp_path: Path) -> None:
    assert local.bridge_pids(tmp_path) == {}
    (tmp_path / "bridge").mkdir()
    for text in ("not json", "[1, 2]", '{"pids": [3]}', '{"pids": {"webhook": "7"}}'):
        (tmp_path / local.BRIDGE_STATE).write_text(text)
        assert local.bridge_pids(tmp_path) == {}

