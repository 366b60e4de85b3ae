"""The shapes of the names slurmgate takes from users and hands on to Slurm or Kubernetes,
written once. Use them with `fullmatch`: a `^...$` pattern with `match` lets a trailing newline
through."""

from __future__ import annotations

import re

# A Slurm account, QOS, partition or gres (GPU) type: what Slurm itself accepts, and no
# character a shell or a Slurm option parser would read as syntax.
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# A Unix user name as Slurm looks it up (the jobs' user).
UNIX_USER = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,31}")
# Kubernetes: a namespace (RFC 1123 label), an object name (RFC 1123 subdomain).
DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?")
