"""Settings both processes read from the environment (a ConfigMap in a real deployment)."""

from __future__ import annotations

import os
from dataclasses import dataclass


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class SlurmSettings:
    url: str
    token_file: str
    user: str

    @classmethod
    def from_env(cls) -> SlurmSettings:
        return cls(
            url=os.environ.get("SLURMREST_URL", "http://127.0.0.1:6820"),
            token_file=os.environ.get("SLURM_JWT_FILE", "/etc/slurmgate/slurm-jwt/token"),
            user=os.environ.get("SLURM_USER", "root"),
        )
