"""Real child processes standing in for daemons in unit tests of the cluster tooling."""

from __future__ import annotations

import subprocess
import time
from typing import Any


def gone(p: subprocess.Popen[Any], within: float = 10.0) -> bool:
    """Whether `p` has exited within `within` seconds (a deadline, polled)."""
    deadline = time.monotonic() + within
    while p.poll() is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
