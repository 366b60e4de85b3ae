"""Crash points for fault tests: `SLURMGATE_CRASH_AT=<point>` makes the process SIGKILL itself
the first time it reaches that point (a marker file keeps it to once across restarts).

Unset in production; costs one dict lookup per call.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

POINTS = ("webhook_after_submit", "binder_after_ungate", "binder_after_bind")


def point(name: str) -> None:
    if os.environ.get("SLURMGATE_CRASH_AT") != name:
        return
    marker = Path(os.environ.get("SLURMGATE_CRASH_MARKER", f"/tmp/slurmgate-crashed-{name}"))
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return  # crashed here once already
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
