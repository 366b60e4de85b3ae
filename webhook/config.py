"""The webhook's configuration: environment plus flags, parsed once at start."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from slurmgate.config import (
    ConfigError,
    Env,
    ObjectRef,
    SlurmSettings,
    env_bool,
    env_float,
    env_optional,
    tenancy_configmap,
)

from . import grace
from .grace import LongGrace


@dataclass(frozen=True)
class Settings:
    """What an admission does, as the operator set it (owned here, read by admission.py)."""

    fail_open: bool = False
    default_memory: str | None = None
    default_partition: str | None = None
    dedup_entries: int = 10_000
    # Longest an admission waits for Slurm to answer the submit (seconds; 0, the default: as
    # long as the Slurm client does). Past it the Pod is admitted gated as Submitting while
    # the submit goes on here, and the binder adopts the job by its claim. slurmctld answers
    # slowly while it starts jobs; a site may prefer fast Pod creates to an error at create
    # time when Slurm turns out to be down (the Pod then waits, gated, for the binder).
    submit_budget: float = 0.0
    # Longest an admission waits for the submit's answer when it does not hand off (seconds).
    # A denied Pod's submit goes on past it (up to the Slurm client's own limit, LATE_ANSWER
    # in webhook/__main__.py): slurmctld may still make the job once it is back, and only the
    # answer names it, so the job is cancelled then rather than left to the binder's rare
    # whole list (chaos, 22.05-26.05: a slurmctld restart made a denied Pod's job 12 s later).
    answer_within: float = 5.0
    # a Pod whose terminationGracePeriodSeconds outlasts its partition's preemption GraceTime
    # (webhook/grace.py): its grace lowered, or the Pod refused
    long_grace: LongGrace = LongGrace.CLAMP


@dataclass(frozen=True)
class WebhookConfig:
    slurm: SlurmSettings
    admission: Settings
    listen: str = "0.0.0.0:8443"
    tls_cert_file: Path = Path("/etc/slurmgate/tls/tls.crt")
    tls_key_file: Path = Path("/etc/slurmgate/tls/tls.key")
    kubeconfig: str | None = None
    log_level: str = "INFO"
    # the tenancy policy's ConfigMap (TENANCY_CONFIGMAP); None: tenancy off
    tenancy_configmap: ObjectRef | None = None


def _submit_budget(env: Env) -> float:
    budget = env_float(env, "SUBMIT_BUDGET", Settings.submit_budget)
    # below the apiserver's webhook timeout (10 s in our MutatingWebhookConfiguration), or
    # the handoff could never happen before the apiserver gives up on the call
    if not 0.0 <= budget <= 8.0:  # also refuses nan
        raise ConfigError(f"SUBMIT_BUDGET={budget!r} must be between 0 (wait for Slurm as long "
                          "as its client does) and 8 seconds")
    return budget


def _long_grace(env: Env) -> grace.LongGrace:
    raw = env.get(grace.SETTING)
    if not raw:  # unset or left blank in the ConfigMap: the safe default
        return Settings.long_grace
    try:
        return grace.LongGrace(raw.strip().lower())
    except ValueError:
        raise ConfigError(
            f"{grace.SETTING}={raw!r} must be clamp (lower a Pod's terminationGracePeriodSeconds "
            "to what its partition's preemption GraceTime leaves) or deny (refuse the Pod)"
        ) from None


def load(argv: Sequence[str] | None, env: Env) -> WebhookConfig:
    """Parse `env` and the command line (flags win over the variables that default them).

    Raises ConfigError naming the variable for a bad value; argparse exits on a bad flag.
    """
    slurm = SlurmSettings.from_env(env)
    admission = Settings(
        fail_open=env_bool(env, "FAIL_OPEN", False),
        default_memory=env_optional(env, "DEFAULT_MEMORY"),
        default_partition=env_optional(env, "DEFAULT_PARTITION"),
        submit_budget=_submit_budget(env),
        long_grace=_long_grace(env),
    )
    tenancy = tenancy_configmap(env)
    d = WebhookConfig(slurm, admission)
    ap = argparse.ArgumentParser(prog="slurmgate-webhook")
    ap.add_argument("--listen", default=env.get("WEBHOOK_LISTEN", d.listen))
    ap.add_argument("--tls-cert-file", default=env.get("WEBHOOK_TLS_CERT", str(d.tls_cert_file)))
    ap.add_argument("--tls-key-file", default=env.get("WEBHOOK_TLS_KEY", str(d.tls_key_file)))
    ap.add_argument("--kubeconfig", default=env.get("KUBECONFIG"))
    ap.add_argument("--log-level", default=env.get("LOG_LEVEL", d.log_level))
    a = ap.parse_args(argv)
    return WebhookConfig(
        slurm=slurm,
        admission=admission,
        listen=a.listen,
        tls_cert_file=Path(a.tls_cert_file),
        tls_key_file=Path(a.tls_key_file),
        kubeconfig=a.kubeconfig,
        log_level=a.log_level,
        tenancy_configmap=tenancy,
    )
