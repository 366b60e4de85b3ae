"""Finding jobs of ours that no Pod names yet, in slurmdbd instead of slurmctld's whole list.

A job of ours may exist that no Pod names: a submit whose answer was lost (slurmrestd made the
job after our request timed out), a submit handed off at admission, a binder that crashed
between a submit and the Pod's annotation. Slurmctld's REST API can only find those in its
whole job list, which on a busy site is the site's (at 50,000 jobs slurmrestd 24.11 grew to
23 GB writing it and was OOM-killed; bench.busy). slurmdbd's job query is filtered where it is
made, in the accounting database: by job name (we know the name of every job we might have
lost: it is the Pod's or the group's) or by partition, and by a time window. Its answer holds
the jobs asked about, so its cost follows those names, not the site's job count.

slurmdbd only serves as an index here: it stores no job comment unless the site set
AccountingStoreFlags=job_comment, and it hears of a job slightly after slurmctld, and only once
the job is eligible (measured on 26.05: a held job is not there; our placeholders are never
held). So the ids it
gives are read again from slurmctld (GET /job/{id}, one per job found), whose record (comment,
claim, state) is the truth; callers ask again for as long as the job may still appear.

Measured (24.11 and 22.05, a job of ours among others): the name filter returns just that job,
the partition filter the jobs of that partition active since start_time (pending and running
ones submitted earlier included, as sacct -S does).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from slurmgate import hostlist
from slurmgate.slurm.dialects import Dialect, job_state, num
from slurmgate.slurm.models import ENDED_STATES, RUNNING, SlurmError, SlurmUnavailable

if TYPE_CHECKING:
    from slurmgate.slurm.client import SlurmClient

# Names per query: each is up to ~330 characters escaped (a Pod's namespace and name); 40 keep
# the URL far below slurmrestd's and proxies' limits.
NAMES_PER_QUERY = 40
# slurmdbd's "Nothing found with query" (22.05 answers an empty result as this error)
ERRNO_NOTHING_FOUND = 9003


def query(d: Dialect, *, names: Sequence[str] = (), partitions: Sequence[str] = (),
          within: int, now: float | None = None) -> str:
    """The escaped query string of GET /slurmdb/{version}/jobs/: jobs named `names` (or in
    `partitions`) that were pending or running at some time in the last `within` seconds."""
    def csv(values: Iterable[str]) -> str:
        return quote(",".join(values), safe="")

    parts = ["skip_steps=true"]
    if names:
        parts.append(f"job_name={csv(names)}")
    if partitions:
        parts.append(f"partition={csv(partitions)}")
    since = (str(int((time.time() if now is None else now) - within)) if d.dbd_since_unix
             else f"now-{int(within)}")
    parts.append(f"start_time={quote(since, safe='')}")
    return "&".join(parts)


def live_ids(data: Mapping[str, Any], names: Iterable[str] = ()) -> set[int]:
    """The ids of the jobs slurmdbd does not know to have ended, of those named `names` when
    given (slurmdbd matched them already; this only keeps a looser server honest)."""
    wanted = set(names)
    out: set[int] = set()
    for j in data.get("jobs") or []:
        if not isinstance(j, Mapping):
            continue
        st = j.get("state")
        state, _ = job_state(st.get("current") if isinstance(st, Mapping) else st)
        if state in ENDED_STATES:
            continue
        if wanted and j.get("name") not in wanted:
            continue
        if (i := num(j.get("job_id"))) > 0:
            out.add(i)
    return out


async def accounted_ids(slurm: SlurmClient, *, names: Iterable[str] = (),
                        partitions: Iterable[str] = (), within: int) -> set[int] | None:
    """Ids of the jobs named `names` (or in `partitions`) that slurmdbd saw pending or running
    in the last `within` seconds and not ended. None where slurmrestd serves no slurmdbd
    endpoints (not started with its slurmdbd plugin, no accounting) or the dialect cannot ask:
    the caller reads the whole list instead."""
    d = await slurm.dialect()  # detects the version, and with it slurm.serves_dbd_jobs
    if not (slurm.serves_dbd_jobs and d.dbd_jobs):
        return None
    wanted, parts = sorted(set(names)), sorted(set(partitions))
    chunks = ([wanted[k:k + NAMES_PER_QUERY] for k in range(0, len(wanted), NAMES_PER_QUERY)]
              if wanted else [[]])
    out: set[int] = set()
    for chunk in chunks:
        q = query(d, names=chunk, partitions=parts, within=within)
        try:
            data = await slurm.get(f"/slurmdb/{d.version}/jobs/", query=q,
                                   what=f"slurmdbd jobs ({len(chunk)} names, "
                                        f"{len(parts)} partitions)")
        except SlurmUnavailable:
            raise
        except SlurmError as e:
            if ERRNO_NOTHING_FOUND in e.errnos:
                continue  # 22.05's empty answer
            if e.status == 404 and not e.errnos:
                slurm.serves_dbd_jobs = False  # slurmrestd's own "Unable find requested URL"
                return None
            raise
        out |= live_ids(data, chunk)
    return out


def running_on(data: Mapping[str, Any], slurm_node: str) -> list[dict[str, Any]]:
    """The jobs of slurmdbd's answer running on `slurm_node`. The node and state are checked
    here too: a server that ignored the filter costs more but does not mislead."""
    out = []
    for j in data.get("jobs") or []:
        if not isinstance(j, Mapping):
            continue
        st = j.get("state")
        state, _ = job_state(st.get("current") if isinstance(st, Mapping) else st)
        try:
            nodes = hostlist.expand(j.get("nodes"))
        except ValueError:
            continue
        if state == RUNNING and slurm_node in nodes:
            out.append(dict(j))
    return out


async def running_on_node(slurm: SlurmClient, slurm_node: str) -> list[dict[str, Any]] | None:
    """The jobs slurmdbd says run on `slurm_node` now (its records, steps left out). None where
    slurmrestd serves no slurmdbd endpoints. One query, filtered by node and state in slurmdbd:
    its cost follows that node's jobs, not the site's."""
    d = await slurm.dialect()
    if not (slurm.serves_dbd_jobs and d.dbd_jobs):
        return None
    # no time window: with a state, slurmdbd then asks what is in that state now (as sacct
    # -s R does); a window with it finds nothing on 22.05
    q = f"skip_steps=true&state=RUNNING&node={quote(slurm_node, safe='')}"
    try:
        data = await slurm.get(f"/slurmdb/{d.version}/jobs/", query=q, what="jobs on a node")
    except SlurmUnavailable:
        raise
    except SlurmError as e:
        if ERRNO_NOTHING_FOUND not in e.errnos:  # 22.05's empty answer
            raise
        return []
    return running_on(data, slurm_node)
