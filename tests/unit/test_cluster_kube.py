"""cluster/kube.py's process handling (now cluster/proc.py's) keeps its contract: logs in
<name>.log, TimeoutError / RuntimeError from wait_for, process groups stopped, daemons
killed and started again with the same argv. Only `sleep` and `sh` are started."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cluster import kube, proc


def gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while proc.alive(pid):
        proc.reap(pid)
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_wait_for_retries_a_raising_check() -> None:
    calls = []

    def check() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise OSError("not listening yet")
        return True

    kube.wait_for("thing", check, 5, interval=0.01)
    assert len(calls) == 3


def test_wait_for_times_out_with_timeout_error(tmp_path: Path) -> None:
    log = tmp_path / "d.log"
    log.write_text("line 1\nlast words\n")
    with pytest.raises(TimeoutError, match=r"(?s)thing: not ready after 0s.*last words"):
        kube.wait_for("thing", lambda: False, 0.1, log=log, interval=0.01)


def test_wait_for_fails_early_when_the_daemon_dies(tmp_path: Path) -> None:
    pid = kube._spawn("quick", ["sh", "-c", "echo bye; exit 3"], tmp_path)
    assert (tmp_path / "quick.log").exists()
    assert gone(pid)
    calls = []

    def check() -> bool:  # would pass on a second look: a death is final all the same
        calls.append(1)
        return len(calls) > 1

    with pytest.raises(RuntimeError, match=r"(?s)quick: the daemon died.*bye") as e:
        kube.wait_for("quick", check, 30, pid, tmp_path / "quick.log")
    assert not isinstance(e.value, TimeoutError) and calls == [1]


def _group(tmp_path: Path, name: str, script: str) -> tuple[int, int]:
    """A shell that leads its own group, and the background sleep it started."""
    child = tmp_path / f"{name}.child"
    pid = kube._spawn(name, ["sh", "-c", f"{script} sleep 30 & echo $! > '{child}'; wait"],
                      tmp_path)
    kube.wait_for("child started", lambda: child.read_text().strip(), 5, pid, interval=0.01)
    return pid, int(child.read_text())


def test_stop_pids_stops_the_whole_group(tmp_path: Path) -> None:
    pid, child = _group(tmp_path, "polite", "")
    kube.stop_pids({"polite": pid}, timeout=5)
    assert gone(pid) and gone(child)


def test_stop_pids_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    pid, child = _group(tmp_path, "stubborn", "trap '' TERM;")
    t = time.monotonic()
    kube.stop_pids({"stubborn": pid}, timeout=0.3)
    assert time.monotonic() - t < 2
    assert gone(pid) and gone(child)


def test_kill_start_stop_daemon(tmp_path: Path) -> None:
    (tmp_path / "log").mkdir()
    pid = kube._spawn("d", ["sleep", "30"], tmp_path / "log")
    kc = kube.KubeCluster(str(tmp_path), "/bin", "https://127.0.0.1:1", "kc", "ca.crt",
                          {"d": pid})
    kube._save(kc)
    kube.kill_daemon(tmp_path, "d")
    assert gone(pid, 0)
    assert json.loads((tmp_path / "argv-d.json").read_text()) == ["sleep", "30"]
    new = kube.start_daemon(tmp_path, "d")
    assert new != pid and proc.alive(new)
    assert kube.load(tmp_path).pids == {"d": new}
    assert Path(f"/proc/{new}/cmdline").read_bytes() == b"sleep\x0030\x00"
    kube.stop(tmp_path)
    assert gone(new) and not (tmp_path / "kube.json").exists()
