"""py-spy sampling of a running webhook or binder, and the summary of its hottest functions
that goes into the results JSON (bench/run.py --profile)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.stats import log


class Profiler:
    """py-spy record on a pid until stopped (SIGINT makes py-spy write its output)."""

    def __init__(self, pid: int, out: Path) -> None:
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        exe = Path(sys.executable).parent / "py-spy"
        if not exe.exists():
            log("py-spy not installed (.venv/bin/pip install py-spy); not profiling")
            return
        self.proc = subprocess.Popen(
            [str(exe), "record", "--pid", str(pid), "--rate", "200", "--format", "raw",
             "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, Any]:
        if self.proc is None:
            return {}
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return summarize_profile(self.out)


def _fn(frame: str) -> str:
    """'func (path/file.py:123)' -> 'func (path/file.py)': one entry per function."""
    head, _, rest = frame.rpartition(":")
    return f"{head})" if rest.rstrip(")").isdigit() else frame


def summarize_profile(path: Path, top: int = 15) -> dict[str, Any]:
    """From py-spy's collapsed stacks: the functions with most self and total samples."""
    self_s: dict[str, int] = {}
    total_s: dict[str, int] = {}
    n = 0
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        n += c
        frames = stack.split(";")
        # skip the thread name frame py-spy may put first
        frames = [_fn(f) for f in frames if "(" in f]
        if not frames:
            continue
        self_s[frames[-1]] = self_s.get(frames[-1], 0) + c
        for f in set(frames):
            total_s[f] = total_s.get(f, 0) + c

    def rank(d: dict[str, int]) -> list[tuple[str, float]]:
        return [(k, round(100 * v / max(1, n), 1))
                for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"samples": n, "file": str(path), "self_pct": rank(self_s),
            "total_pct": rank(total_s)}
