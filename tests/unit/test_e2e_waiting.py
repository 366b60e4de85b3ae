"""The e2e tests' wait_until (tests/e2e/waiting.py): an assertion or a bug in a predicate fails at
once with its own message; the errors of a busy or restarting cluster are retried; the
timeout names what was awaited and the last value seen."""

from __future__ import annotations

import http.client
import subprocess
from collections.abc import Callable, Iterator

import pytest

from cluster.local import KubectlError
from slurmgate.slurm import SlurmUnavailable
from tests.e2e.waiting import TRANSIENT, WaitTimeout, wait_until

# A deadline these tests never reach: each predicate settles on its first or second call, so
# a wrong wait_until fails them by what it raises or returns, not by a slow timeout.
LONG = 5.0


def failing_once(error: BaseException, then: object) -> tuple[Callable[[], object], list[int]]:
    """A predicate raising `error` on its first call and returning `then` afterwards."""
    calls: list[int] = []

    def fn() -> object:
        calls.append(1)
        if len(calls) == 1:
            raise error
        return then

    return fn, calls


def test_an_assertion_in_the_predicate_fails_at_once_with_its_own_message() -> None:
    fn, calls = failing_once(AssertionError("bound to a Node without GPUs"), then="late")
    with pytest.raises(AssertionError) as e:
        wait_until("a NodeLacksGPUs Warning", fn, timeout=LONG, interval=0)
    assert not isinstance(e.value, WaitTimeout)
    assert str(e.value) == "bound to a Node without GPUs"
    assert len(calls) == 1


@pytest.mark.parametrize("error", [KeyError("nodeName"), TypeError("'NoneType' object is not "
                                   "subscriptable"), AttributeError("get"), IndexError(0),
                                   ValueError("could not convert string to float")])
def test_a_bug_in_the_predicate_is_not_taken_for_not_yet(error: Exception) -> None:
    fn, calls = failing_once(error, then="late")
    with pytest.raises(type(error)) as e:
        wait_until("the Pod bound", fn, timeout=LONG, interval=0)
    assert e.value is error
    assert len(calls) == 1


@pytest.mark.parametrize("error", [
    KubectlError("kubectl get pod p failed: connection refused"),
    subprocess.CalledProcessError(1, ["squeue"], stderr="slurm_load_jobs error"),
    subprocess.TimeoutExpired(["sinfo"], 30),
    ConnectionRefusedError(111, "Connection refused"),
    FileNotFoundError(2, "binder.log"),
    http.client.IncompleteRead(b"slurmgate_"),
    SlurmUnavailable("slurmrestd unreachable"),
], ids=lambda e: type(e).__name__)
def test_a_transient_error_is_retried(error: Exception) -> None:
    fn, calls = failing_once(error, then={"nodeName": "kwok-node-1"})
    assert wait_until("the Pod bound", fn, timeout=LONG, interval=0) == {
        "nodeName": "kwok-node-1"}
    assert len(calls) == 2


def test_the_transient_errors_are_no_programming_errors() -> None:
    # a broad base slipped into TRANSIENT (Exception, LookupError, RuntimeError...) would
    # swallow a predicate's bugs again
    for bug in (AssertionError, KeyError, IndexError, TypeError, AttributeError, ValueError,
                NameError, NotImplementedError):
        assert not issubclass(bug, TRANSIENT), bug


def test_the_timeout_names_what_was_awaited_and_the_last_value() -> None:
    # falsy values, then 0 for good: the message reports the last one seen, not the first
    seen: Iterator[object] = iter([None, [], {}])

    def running() -> object:
        return next(seen, 0)

    with pytest.raises(WaitTimeout) as e:
        wait_until("4 Pods Running", running, timeout=0.05, interval=0.001)
    assert str(e.value) == "timed out after 0.05s waiting for 4 Pods Running; last: 0"
    assert e.value.__cause__ is None


def test_the_timeout_names_and_chains_the_last_transient_error() -> None:
    refused = KubectlError('kubectl get pod p failed: pods "p" not found')

    def fn() -> object:
        raise refused

    with pytest.raises(WaitTimeout) as e:
        wait_until("p named its job", fn, timeout=0.05, interval=0.001)
    assert "waiting for p named its job; last: KubectlError('kubectl get pod p failed: " \
           "pods \"p\" not found')" in str(e.value)
    assert e.value.__cause__ is refused


def test_a_timeout_is_an_assertion_error_so_the_test_fails() -> None:
    assert issubclass(WaitTimeout, AssertionError)


def test_the_first_truthy_value_is_returned_without_waiting_the_interval() -> None:
    values = iter([None, 0, "", ["row"]])
    assert wait_until("a row", lambda: next(values), timeout=LONG, interval=0) == ["row"]


def test_the_predicate_runs_once_even_with_no_time_left() -> None:
    calls: list[int] = []

    def fn() -> str:
        calls.append(1)
        return "done"

    assert wait_until("done", fn, timeout=0) == "done"
    assert calls == [1]
