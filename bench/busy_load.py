"""Other users' work on a busy site (bench/busy.py): standing jobs of other Unix users and
accounts in a partition of their own, submitted in parallel through slurmrestd, and churn.

Standing jobs (`grow`), by MIX: held batch jobs, jobs pending until a begin time a day away,
and held job arrays (ARRAY_TASKS tasks each, one record until a task starts). None of them
ever runs, so N stays N. Churn (`churn`) at R changes a second, in cycles of CYCLE_CHANGES:
one short job that runs on the site's nodes (its submit, its start, its end), one standing job
cancelled and one of the same kind submitted in its place.

The bodies follow the server's dialect (slurmgate.slurm.dialects.Dialect), as the placeholder's
do: numbers as plain ints or {"set", "infinite", "number"} objects, the script at the top or in
the job, the environment as a dict or a list, `nodes` or minimum_/maximum_nodes. Held is
`hold: true` and an array `array: "0-9"` on every release: v0.0.38 (22.05) hands each job field
to sbatch's own option parser (`hold` is --hold, which submits with priority 0; `array` is
--array), v0.0.40+ to the data parser, and both know the two. The begin time is the one field
whose form is not a number's on v0.0.38: that parser reads begin_time as --begin's text
(parse_time), where a bare epoch misreads as a date (MMDDYY) and fails; "uts<epoch>" is
parse_time's own form for an epoch.

Every job is submitted as a tenant of the local cluster (cluster/slurm_accounting.TENANTS:
user sg-team-a with account team-a, sg-team-b with team-b) through the X-SLURM-USER-NAME
header with the cluster's root token, as slurmgate's SlurmClient submits with `user=`.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from cluster.slurm_accounting import TENANTS, Tenant
from slurmgate.slurm.dialects import Dialect, body_warnings, error_text, num

MIX = (("held", 0.7), ("begin", 0.2), ("array", 0.1))
ARRAY_TASKS = 10
SHORT_SECONDS = 3
# one churn cycle: a short job's submit, start and end; a cancel; a submit
CYCLE_CHANGES = 5
BEGIN_AHEAD_S = 86400
SCRIPT_WAIT = "#!/bin/sh\nsleep 600\n"
SCRIPT_SHORT = f"#!/bin/sh\nsleep {SHORT_SECONDS}\n"


def plan_mix(n: int) -> dict[str, int]:
    """How many standing jobs of each kind make n (held takes the rounding)."""
    out = {kind: int(n * share) for kind, share in MIX if kind != "held"}
    out["held"] = n - sum(out.values())
    return {kind: out[kind] for kind, _ in MIX}


def number(d: Dialect, n: int) -> Any:
    return {"set": True, "infinite": False, "number": n} if d.number_objects else n


def begin_time(d: Dialect, epoch: int) -> Any:
    """A begin time: a number on the dialects of number objects (the data parser, v0.0.40+);
    on the dialect of plain numbers (v0.0.38, sbatch's option parser) --begin's text, which
    takes an epoch only as "uts<epoch>"."""
    return number(d, epoch) if d.number_objects else f"uts{epoch}"


def job_body(d: Dialect, kind: str, seq: int, tenant: Tenant, partition: str,
             now: int) -> dict[str, Any]:
    """POST /job/submit body for one foreign job of `kind` (held, begin, array, short) in the
    server's dialect."""
    if kind not in ("held", "begin", "array", "short"):
        raise ValueError(f"unknown kind of foreign job {kind!r}")

    env = {"PATH": "/usr/bin:/bin"}
    job: dict[str, Any] = {
        "name": f"site-{kind}-{seq}", "partition": partition, "account": tenant.account,
        "tasks": 1, "current_working_directory": "/tmp",
        "standard_output": "/dev/null", "standard_error": "/dev/null",
        "memory_per_node": number(d, 100), "time_limit": number(d, 10),
        "environment": [f"{k}={v}" for k, v in env.items()] if d.environment_list else env,
    }
    if d.node_range:
        job["minimum_nodes"] = job["maximum_nodes"] = 1
    else:
        job["nodes"] = 1
    if kind in ("held", "array"):
        job["hold"] = True
    if kind == "array":
        job["array"] = f"0-{ARRAY_TASKS - 1}"
    if kind == "begin":
        job["begin_time"] = begin_time(d, now + BEGIN_AHEAD_S)
    script = SCRIPT_SHORT if kind == "short" else SCRIPT_WAIT
    if d.script_in_job:
        return {"job": {**job, "script": script}}
    return {"script": script, "job": job}


def job_id_of(data: dict[str, Any]) -> int:
    jid = num(data.get("job_id"), -1)
    result = data.get("result")
    if jid <= 0 and isinstance(result, dict):
        jid = num(result.get("job_id"), -1)
    return jid


@dataclass
class Counts:
    submitted: dict[str, int] = field(default_factory=dict)
    cancelled: int = 0
    errors: int = 0
    error_samples: list[str] = field(default_factory=list)

    def error(self, text: str) -> None:
        self.errors += 1
        if text not in self.error_samples and len(self.error_samples) < 5:
            self.error_samples.append(text[:300])


class ForeignLoad:
    """Standing foreign jobs and churn through one aiohttp session (`concurrency` at once)."""

    def __init__(self, rest_url: str, token_file: Path, dialect: Dialect, partition: str,
                 concurrency: int = 32) -> None:
        self.base = f"{rest_url.rstrip('/')}/slurm/{dialect.version}"
        self.token_file = token_file
        self.dialect = dialect
        self.partition = partition
        self.concurrency = concurrency
        self.standing: deque[tuple[str, int]] = deque()
        self.counts = Counts()
        self._seq = 0
        self._session: aiohttp.ClientSession | None = None
        self._token = ""
        self._churn: asyncio.Task[None] | None = None
        self._churn_stop = asyncio.Event()
        self.churn_cycles = 0
        self.churn_started = 0.0

    async def __aenter__(self) -> ForeignLoad:
        self._token = await asyncio.to_thread(lambda: self.token_file.read_text().strip())
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.concurrency),
            timeout=aiohttp.ClientTimeout(total=60))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_churn()
        if self._session is not None:
            await self._session.close()

    def _headers(self, user: str) -> dict[str, str]:
        return {"X-SLURM-USER-NAME": user,
                "X-SLURM-USER-TOKEN": self._token,
                "Accept": "application/json"}

    async def submit(self, kind: str) -> int | None:
        assert self._session is not None
        self._seq += 1
        tenant = TENANTS[self._seq % len(TENANTS)]
        body = job_body(self.dialect, kind, self._seq, tenant, self.partition, int(time.time()))
        try:
            async with self._session.post(f"{self.base}/job/submit", json=body,
                                          headers=self._headers(tenant.user)) as r:
                data = await r.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            self.counts.error(f"submit {kind}: {type(e).__name__}: {e}")
            return None
        data = data if isinstance(data, dict) else {}
        errs = [error_text(e)[0] for e in data.get("errors") or []] + body_warnings(data)
        jid = job_id_of(data)
        if errs or jid <= 0:
            self.counts.error(f"submit {kind}: {'; '.join(errs) or 'no job id'}")
        if jid <= 0:
            return None
        self.counts.submitted[kind] = self.counts.submitted.get(kind, 0) + 1
        if kind != "short":
            self.standing.append((kind, jid))
        return jid

    async def cancel(self, job_id: int) -> bool:
        assert self._session is not None
        try:
            async with self._session.delete(f"{self.base}/job/{job_id}",
                                            headers=self._headers("root")) as r:
                await r.read()
                ok = r.status < 300
        except (aiohttp.ClientError, TimeoutError) as e:
            self.counts.error(f"cancel: {type(e).__name__}: {e}")
            return False
        if ok:
            self.counts.cancelled += 1
        else:
            self.counts.error(f"cancel {job_id}: HTTP {r.status}")
        return ok

    async def grow(self, target: int) -> dict[str, Any]:
        """Submit standing jobs until `target` stand (by MIX); returns how fast it went."""
        have: dict[str, int] = {}
        for kind, _ in self.standing:
            have[kind] = have.get(kind, 0) + 1
        todo = [kind for kind, want in plan_mix(target).items()
                for _ in range(max(0, want - have.get(kind, 0)))]
        it = iter(todo)
        errors0 = self.counts.errors
        t0 = time.monotonic()

        async def worker() -> None:
            for kind in it:
                await self.submit(kind)

        await asyncio.gather(*(worker() for _ in range(self.concurrency)))
        dt = time.monotonic() - t0
        return {"target": target, "submitted": len(todo), "seconds": round(dt, 1),
                "per_s": round(len(todo) / dt, 1) if dt > 0 else None,
                "errors": self.counts.errors - errors0, "standing": len(self.standing),
                "array_tasks": ARRAY_TASKS * sum(k == "array" for k, _ in self.standing)}

    def start_churn(self, rate: float) -> None:
        if rate <= 0 or self._churn is not None:
            return
        self._churn_stop.clear()
        self.churn_cycles = 0
        self.churn_started = time.monotonic()
        self._churn = asyncio.create_task(self._run_churn(CYCLE_CHANGES / rate))

    async def _run_churn(self, period: float) -> None:
        due = time.monotonic()
        while not self._churn_stop.is_set():
            steps: list[Any] = [self.submit("short")]
            if self.standing:
                kind, jid = self.standing.popleft()
                steps += [self.cancel(jid), self.submit(kind)]
            await asyncio.gather(*steps)
            self.churn_cycles += 1
            # a slow cycle is not made up in a burst: the rate is a ceiling
            due = max(due + period, time.monotonic() - period)
            try:
                await asyncio.wait_for(self._churn_stop.wait(), max(0.0, due - time.monotonic()))
            except TimeoutError:
                pass

    async def stop_churn(self) -> dict[str, Any]:
        """Stop the churn; what it issued: cycles, and changes a second (CYCLE_CHANGES each)."""
        if self._churn is None:
            return {}
        self._churn_stop.set()
        await self._churn
        self._churn = None
        dt = time.monotonic() - self.churn_started
        return {"cycles": self.churn_cycles, "seconds": round(dt, 1),
                "changes_per_s": round(CYCLE_CHANGES * self.churn_cycles / dt, 2) if dt else 0}
