"""Node drain/resume through `scontrol`, for Slurm 22.05 whose REST API (v0.0.38) has no node
update: SlurmClient.drain/resume (nodeops.py) come here for that dialect. Runs scontrol with an
argument list (never a shell) and the JWT in its environment."""

from __future__ import annotations

import asyncio
import os
import re

from slurmgate.slurm.models import SlurmError

# used with fullmatch, as slurmgate/names.py's: `^...$` with match lets a trailing newline by
_NODE_RE = re.compile(r"[A-Za-z0-9_.\[\],-]{1,128}")
_REASON_RE = re.compile(r"[A-Za-z0-9 _.:/@-]{1,200}")


async def update_node(node: str, state: str, reason: str | None, token: str,
                      scontrol: str | None = None, deadline: float = 20.0) -> None:
    if not _NODE_RE.fullmatch(node):
        raise SlurmError(f"refusing node name {node!r}")
    args = [scontrol or os.environ.get("SCONTROL", "scontrol"), "update", f"NodeName={node}",
            f"State={state}"]
    if reason is not None:
        if not _REASON_RE.fullmatch(reason):
            raise SlurmError(f"refusing drain reason {reason!r}")
        args.append(f"Reason={reason}")
    env = {**os.environ, "SLURM_JWT": token}
    proc = await asyncio.create_subprocess_exec(
        *args, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(deadline):
            out, err = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise SlurmError(f"scontrol update {node} timed out after {deadline:.0f}s") from None
    if proc.returncode != 0:
        raise SlurmError(f"scontrol update {node} State={state}: "
                         f"{(err or out).decode(errors='replace').strip()[:300]}")
