"""The local cluster's Unix users (slurmrestd's and the tenants'), with one uid per name on the
host and in the root of a newer release.

Slurm resolves a job's owner by uid wherever it runs: slurmrestd and slurmctld in the root (a
chroot with its own /etc/passwd), sacct through slurmdbd, tests on the host. The root is built
once and cached with its own system users, so a tenant created later on the host can get a uid
the root already gives someone else (seen: the host's sg-team-a had 999, the root's slurmrest
too, and `sprio` named the team's job "slurmrest"). So every name gets a uid that no other name
holds on either side, moving our own nologin users (never anybody else's) when needed.
"""

from __future__ import annotations

import pwd
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from cluster import slurm_release
from cluster.proc import ClusterError

# useradd -r allocates here (Debian's SYS_UID_MIN..SYS_UID_MAX); we pick downwards like it does
SYSTEM_UIDS = range(999, 99, -1)


@dataclass
class Table:
    """name -> uid of one passwd database, changed as the plan goes."""
    uids: dict[str, int] = field(default_factory=dict)

    def holders(self, uid: int) -> set[str]:
        return {n for n, u in self.uids.items() if u == uid}


@dataclass(frozen=True)
class Change:
    side: str  # "host" or "root"
    verb: str  # "add" or "move"
    user: str
    uid: int


def plan(users: list[str], host: Table, root: Table | None) -> list[Change]:
    """The adds and moves that give each of `users` one uid that is its alone on both sides.
    Pure (the tables are updated in place as the plan goes), so unit tests can check it."""
    changes: list[Change] = []
    sides = [("host", host)] + ([("root", root)] if root is not None else [])

    def alone(user: str, uid: int) -> bool:
        return all(t.holders(uid) <= {user} for _, t in sides)

    for user in users:
        candidates = [t.uids[user] for _, t in sides if user in t.uids]
        uid = next((c for c in candidates if alone(user, c)), None)
        if uid is None:
            uid = next((u for u in SYSTEM_UIDS if alone(user, u)), None)
            if uid is None:
                raise ClusterError(f"no free system uid (100-999) for {user!r}")
        for side, t in sides:
            if t.uids.get(user) != uid:
                changes.append(Change(side, "move" if user in t.uids else "add", user, uid))
                t.uids[user] = uid
    return changes


def _host_table() -> Table:
    return Table({p.pw_name: p.pw_uid for p in pwd.getpwall()})


def _root_table(root: str) -> Table:
    t = Table()
    for line in (Path(root) / "etc" / "passwd").read_text().splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            t.uids.setdefault(parts[0], int(parts[2]))
    return t


def _argv(c: Change) -> list[str]:
    if c.verb == "add":
        return ["useradd", "-r", "-M", "-u", str(c.uid), "-s", "/usr/sbin/nologin", c.user]
    return ["usermod", "-u", str(c.uid), c.user]


def ensure(root: str, users: list[str], attempts: int = 3) -> None:
    """Create or move `users` so that each has the same uid, held by nobody else, on the host
    and (on 24.11+) in `root`. A cluster starting beside us may add the same users at the same
    moment, so a failed change is answered by planning again from what the tables now hold."""
    errors: list[str] = []
    for _ in range(attempts):
        changes = plan(users, _host_table(), _root_table(root) if root else None)
        if not changes:
            return
        for c in changes:
            argv, env = (_argv(c), None) if c.side == "host" else slurm_release.command(
                root, _argv(c), {})
            out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
            if out.returncode != 0:
                errors.append(f"{' '.join(_argv(c))} ({c.side}): {out.stderr.strip()}")
                break
    if not plan(users, _host_table(), _root_table(root) if root else None):
        return
    raise ClusterError("could not give the cluster's Unix users one uid each: "
                       + "; ".join(errors[-attempts:]))
