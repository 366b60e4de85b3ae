"""The local control plane stops in dependency order: the apiserver's clients, then
kube-apiserver, then etcd, each once the one before is gone (cluster/kube.stop_in_order)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from cluster import kube

# each stand-in says it is ready once its trap is set, notes when its SIGTERM came, then exits
TRAP = ('trap "echo $0 >> {log}; exit 0" TERM; touch {ready}/$0; '
        'while :; do sleep 0.05; done')


def _spawn(name: str, log: Path, ready: Path) -> int:
    return subprocess.Popen(["sh", "-c", TRAP.format(log=log, ready=ready), name],
                            start_new_session=True).pid


def test_clients_then_apiserver_then_etcd(tmp_path: Path) -> None:
    log = tmp_path / "order"
    names = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
    ready = tmp_path / "ready"
    ready.mkdir()
    pids = {n: _spawn(n, log, ready) for n in names}
    deadline = time.monotonic() + 10
    while len(list(ready.iterdir())) < len(names):  # a SIGTERM before the trap would be lost
        assert time.monotonic() < deadline, "stand-ins never ready"
        time.sleep(0.01)
    kube.stop_in_order(pids, timeout=10)
    order = log.read_text().split()
    assert sorted(order[:3]) == ["kube-controller-manager", "kube-scheduler", "kwok"]
    assert order[3:] == ["kube-apiserver", "etcd"]
