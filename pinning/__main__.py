"""`python -m slurmgate.pinning RUNC_ARGS...`: runc's command line, as containerd's shim gives it.

Configured by the environment its launcher script sets (cluster/realnode_conf.py writes one
per Node): SLURMGATE_RUNC the real runc, SLURMGATE_SLURM_NODES the Slurm node(s) this Node
stands for (comma-separated), SLURMGATE_GPU_DEVICES its GPU device files in gres index order."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from . import placeholder
from .placeholder import Refused
from .spec import rewrite

RUNC_ENV = "SLURMGATE_RUNC"
NODES_ENV = "SLURMGATE_SLURM_NODES"
# this Node's GPU device files in gres index order (gres.conf's File=), comma-separated
GPUS_ENV = "SLURMGATE_GPU_DEVICES"
DEFAULT_RUNC = "/usr/sbin/runc"
# runc's global options that take a value (runc --help), so the subcommand is found after them
VALUED = {"--root", "--log", "--log-format", "--criu", "--rootless"}


def command(argv: list[str]) -> tuple[str, dict[str, str]]:
    """runc's subcommand and the options given before and after it that take a value."""
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            opts[k] = v
        elif a in VALUED or a in ("--bundle", "-b", "--pid-file", "--console-socket"):
            opts[a] = argv[i + 1] if i + 1 < len(argv) else ""
            i += 1
        elif not a.startswith("-") and "cmd" not in opts:
            opts["cmd"] = a
        i += 1
    return opts.pop("cmd", ""), opts


def _log_refusal(opts: dict[str, str], msg: str) -> None:
    """As runc reports an error: a JSON line in its --log file (containerd puts the last one
    into the error the kubelet shows as the Pod's Event), and on stderr."""
    line = json.dumps({"level": "error", "msg": f"slurmgate: {msg}",
                       "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    if opts.get("--log"):
        try:
            with open(opts["--log"], "a") as f:
                f.write(line + "\n")
        except OSError:
            pass
    print(f"slurmgate: {msg}", file=sys.stderr)


def main(argv: list[str]) -> int:
    runc = os.environ.get(RUNC_ENV, DEFAULT_RUNC)
    cmd, opts = command(argv)
    if cmd in ("create", "run"):
        bundle = Path(opts.get("--bundle") or opts.get("-b") or ".")
        nodes = frozenset(n for n in os.environ.get(NODES_ENV, "").split(",") if n)
        gpus = tuple(p for p in os.environ.get(GPUS_ENV, "").split(",") if p)
        try:
            rewrite(bundle, nodes, placeholder.find, gpus)
        except Refused as e:
            _log_refusal(opts, str(e))
            return 1
    os.execv(runc, [runc, *argv])
    return 127  # not reached: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
