"""wait_until: the e2e tests' one way to wait for the cluster, a poll with a deadline.

Its own module, free of the session fixtures, so that tests/unit can test it without a cluster
(tests/unit/test_e2e_waiting.py). conftest.py re-exports it.

A predicate is polled until it returns something truthy. Only the errors of a cluster that is
busy, restarting or briefly unreachable are retried (TRANSIENT); anything else a predicate
raises propagates at once: an assert in a predicate fails the test with its own message, and a
bug in a predicate (a KeyError, a TypeError) is not mistaken for "not yet" and waited out.
A predicate that is legitimately "not there yet" returns a falsy value (use .get()).
"""

from __future__ import annotations

import http.client
import subprocess
import time
from collections.abc import Callable
from typing import TypeVar

from cluster.local import KubectlError
from slurmgate.slurm import SlurmUnavailable

T = TypeVar("T")

# What a poll may hit while the cluster is still settling, or while a fault test holds a
# daemon down. Each is retried until the deadline, and named in the timeout's message.
TRANSIENT: tuple[type[BaseException], ...] = (
    KubectlError,  # kubectl exited non-zero: apiserver down, object not created yet
    subprocess.SubprocessError,  # Slurm's CLI failed (slurmctld away) or hung (TimeoutExpired)
    OSError,  # refused or reset connections, urllib's URLError, TLS, a log file not written yet
    http.client.HTTPException,  # an answer cut short (IncompleteRead, BadStatusLine)
    SlurmUnavailable,  # slurmrestd or slurmctld not answering (slurmgate's own REST client)
)


class WaitTimeout(AssertionError):
    """The deadline passed: an AssertionError, so the test fails (not errors) on it, and a
    caller can tell it from an assertion raised inside the predicate."""


def wait_until(what: str, fn: Callable[[], T], timeout: float = 30.0,
               interval: float = 0.2) -> T:
    """Poll fn() until it is truthy and return that value. At the deadline, WaitTimeout says
    what was awaited and the last value (or the last transient error, also chained)."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
        except TRANSIENT as e:
            last = e
        else:
            if value:
                return value
            last = value
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(interval, left))
    raise WaitTimeout(f"timed out after {timeout}s waiting for {what}; last: {last!r}") from (
        last if isinstance(last, BaseException) else None)
