"""The push listener: slurmctld's PrologSlurmctld/EpilogSlurmctld hook (slurmgate/hooks/
slurmgate-notify) tells the binder "job N started on nodes X" or "job N ended" the moment it
happens, instead of the binder finding out at its next poll.

    POST /slurm/v1/job-events      Authorization: Bearer <token>
    job=<id>&event=started|ended&nodes=<Slurm hostlist>

What a push may do is bounded: a start of a job the binder already knows as ours (by id, from
its polls) is taken at its word, so the Pod is bound at once; everything else only makes the
binder poll now. Polls confirm every push within a second and overrule it (binder/jobs.py).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from slurmgate import hostlist
from slurmgate.logs import kv

from . import metrics
from .jobs import JobTracker

log = logging.getLogger("slurmgate.push")

PATH = "/slurm/v1/job-events"
EVENTS = ("started", "ended")
QUIET = ("ignored", "early")
MAX_BODY = 64 * 1024  # a hostlist of thousands of nodes compresses to far less


def read_token(path: str) -> bytes:
    token = Path(path).read_text().strip().encode()
    if len(token) < 16:
        raise ValueError(f"{path}: the push token must be at least 16 characters")
    return token


def _bad(reason: str, status: int = 400) -> web.Response:
    metrics.SLURM_PUSHES.labels("none", "rejected").inc()
    return web.Response(status=status, text=reason + "\n")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def handler(token: bytes, leading: Callable[[], JobTracker | None]) -> Handler:
    """`leading()`: the job tracker while this replica leads, else None (answered 503)."""

    async def job_events(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token):
            return _bad("missing or wrong bearer token", 401)
        if (request.content_length or 0) > MAX_BODY:
            return _bad("body too large", 413)
        form = await request.post()
        job_s, event = str(form.get("job", "")), str(form.get("event", ""))
        if not job_s.isdigit() or len(job_s) > 12 or event not in EVENTS:
            return _bad("want job=<id>&event=started|ended[&nodes=<hostlist>]")
        try:
            nodes = tuple(hostlist.expand(str(form.get("nodes", ""))))
        except ValueError as e:
            return _bad(f"nodes: {e}")
        tracker = leading()
        if tracker is None:
            # counted: a hook listing every replica reaches standbys too, and a standby alone
            # counting pushes tells an operator the hook is pointed away from the leader
            metrics.SLURM_PUSHES.labels(event, "standby").inc()
            return web.Response(status=503, text="not the leader\n")
        outcome = tracker.pushed(int(job_s), event, nodes)
        metrics.SLURM_PUSHES.labels(event, outcome).inc()
        # pushes about other people's jobs are most of them on a busy site: those stay quiet
        level = logging.DEBUG if outcome in QUIET else logging.INFO
        log.log(level, "slurm push", extra=kv(job=int(job_s), slurm_event=event, outcome=outcome))
        return web.Response(status=202, text=outcome + "\n")

    return job_events
