"""Settings both processes take from the environment (a ConfigMap in a real deployment).

Each process parses its environment once, in its `__main__`, into a frozen config object
(webhook.config.WebhookConfig, binder.config.BinderConfig) and hands the values down; no module
reads a setting at import time. The helpers here take the environment as a mapping, so the
parsers are plain functions of their input and tests need no monkeypatching.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from slurmgate import names

Env = Mapping[str, str]
N = TypeVar("N", int, float)

# A changed job list of a busy cluster is megabytes; below this a body is parsed inline.
JSON_OFFLOAD_BYTES = 256 * 1024


class ConfigError(ValueError):
    """A setting the process cannot start with; the message names the variable."""


def env_bool(env: Env, name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in ("1", "true", "yes", "on")


def env_optional(env: Env, name: str) -> str | None:
    """Unset and empty both mean "not configured" (a ConfigMap key left blank)."""
    return env.get(name) or None


def _env_number(env: Env, name: str, default: N, parse: Callable[[str], N], what: str) -> N:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        return parse(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not {what}") from None


def env_int(env: Env, name: str, default: int) -> int:
    # An empty value is an error, not the default: that is how these were always read
    # (`int(os.environ.get(name, default))`), and a blank number is more likely a mistake.
    return _env_number(env, name, default, int, "an integer")


def env_float(env: Env, name: str, default: float) -> float:
    return _env_number(env, name, default, float, "a number")


@dataclass(frozen=True)
class ObjectRef:
    """A namespaced Kubernetes object, e.g. the tenancy policy's ConfigMap."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"




def env_object_ref(env: Env, name: str) -> ObjectRef | None:
    """`namespace/name`; unset or empty = not configured."""
    raw = env_optional(env, name)
    if raw is None:
        return None
    ns, sep, obj = raw.strip().partition("/")
    if not sep or not names.DNS_LABEL.fullmatch(ns) or not names.DNS_SUBDOMAIN.fullmatch(obj):
        raise ConfigError(f"{name}={raw!r} is not namespace/name")
    return ObjectRef(ns, obj)


def tenancy_configmap(env: Env) -> ObjectRef | None:
    """The tenancy policy's ConfigMap (TENANCY_CONFIGMAP); None: tenancy is off, every job
    runs as SLURM_USER with no checks (both processes read it through here)."""
    return env_object_ref(env, "TENANCY_CONFIGMAP")


@dataclass(frozen=True)
class SlurmSettings:
    url: str = "http://127.0.0.1:6820"
    token_file: Path = Path("/etc/slurmgate/slurm-jwt/token")
    user: str = "root"
    json_offload_bytes: int = JSON_OFFLOAD_BYTES

    @classmethod
    def from_env(cls, env: Env) -> SlurmSettings:
        d = cls()
        return cls(
            url=env.get("SLURMREST_URL", d.url),
            token_file=Path(env.get("SLURM_JWT_FILE", str(d.token_file))),
            user=env.get("SLURM_USER", d.user),
            json_offload_bytes=env_int(env, "SLURMGATE_JSON_OFFLOAD_BYTES",
                                       d.json_offload_bytes),
        )
