"""Kubernetes' RFC 3339 timestamps, apart from the API client: the pure decisions read them
(a Pod's creationTimestamp) without loading aiohttp."""

from __future__ import annotations

import datetime as dt

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # Kubernetes' RFC 3339 seconds timestamps


def parse_time(ts: object) -> float | None:
    """A Kubernetes RFC 3339 seconds timestamp (e.g. creationTimestamp) as unix time."""
    if not isinstance(ts, str):
        return None
    try:
        return dt.datetime.strptime(ts, TIME_FORMAT).replace(tzinfo=dt.UTC).timestamp()
    except ValueError:
        return None


def format_time(unix: float) -> str:
    """Unix time as a Kubernetes timestamp (UTC, whole seconds)."""
    return dt.datetime.fromtimestamp(unix, dt.UTC).strftime(TIME_FORMAT)


def now_time() -> str:
    """Now, as a Kubernetes timestamp (Events, condition transition times)."""
    return dt.datetime.now(dt.UTC).strftime(TIME_FORMAT)
