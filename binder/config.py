"""The binder's configuration: environment plus flags, parsed once at start."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from slurmgate.config import (
    ConfigError,
    Env,
    ObjectRef,
    SlurmSettings,
    env_float,
    env_int,
    env_optional,
    tenancy_configmap,
)

# Renewed every third of its duration, so this floor keeps renewals at most once a second.
MIN_LEASE_SECONDS = 3


@dataclass(frozen=True)
class ReconcileSettings:
    """What the reconcilers need; the defaults are those of an unset environment."""

    workers: int = 16
    # connections to the API server kept open while leading (KubeClient.keep_warm): one per
    # bind worker and per background write slot; 0 lets the pool close when idle
    warm_connections: int = 20
    default_memory: str | None = None
    default_partition: str | None = None
    # a job whose claim no Pod carries, older than this, is cancelled
    orphan_grace: float = 60.0
    # eviction refused (PodDisruptionBudget) this long -> delete: Slurm has taken the node back
    evict_grace: float = 60.0
    # slurm.conf's KillWait (SLURM_KILL_WAIT; Slurm's default is 30): a Pod evicted because its
    # job was cancelled or ran out of time gets no more grace than Slurm leaves before it
    # SIGKILLs the placeholder and gives the Node to the next job
    kill_wait: float = 30.0
    # an incomplete gang is reported (GroupIncomplete) after this, and again every period
    group_timeout: float = 300.0
    # a Pod waits this long for its allocated Node to show the GPUs it asks for; then its job
    # is given back to Slurm (NodeLacksGPUs)
    gpu_grace: float = 60.0
    # The safety net runs this often (binder/lostjobs.py): it finds jobs of ours no Pod names
    # that nothing else finds (a webhook killed between its submit and its answer). Where
    # slurmrestd serves slurmdbd it asks for our partitions' jobs; elsewhere it reads Slurm's
    # whole job list (only ours kept), whose cost grows with the site's jobs: 5.9 CPU-s of
    # slurmctld and slurmrestd at 10,000 jobs (bench.busy). Every other poll asks about our
    # jobs by id, a submit whose answer was lost is looked up by its job name, and the webhook
    # cancels the jobs of Pods refused after admission itself.
    full_list_interval: float = 3600.0


@dataclass(frozen=True)
class LeaseSettings:
    namespace: str = "slurmgate-system"
    name: str = "slurmgate-binder"
    seconds: int = 15  # already floored to MIN_LEASE_SECONDS
    identity: str | None = None  # POD_NAME; None: the elector makes one up (host + random)
    # POD_NAMESPACE: with POD_NAME, the Pod that carries contract.LEADER_LABEL while it leads
    pod_namespace: str | None = None

    @property
    def renew_seconds(self) -> float:
        return self.seconds / 3


@dataclass(frozen=True)
class BinderConfig:
    slurm: SlurmSettings = field(default_factory=SlurmSettings)
    reconcile: ReconcileSettings = field(default_factory=ReconcileSettings)
    lease: LeaseSettings = field(default_factory=LeaseSettings)
    health_listen: str = "0.0.0.0:8080"
    # the bearer token slurmctld's hook presents (binder/push.py); None: no push listener
    push_token_file: str | None = None
    kubeconfig: str | None = None
    log_level: str = "INFO"
    # the tenancy policy's ConfigMap (TENANCY_CONFIGMAP); None: tenancy off
    tenancy_configmap: ObjectRef | None = None


def _warm_connections(env: Env) -> int:
    warm = env_int(env, "BINDER_WARM_CONNECTIONS", ReconcileSettings.warm_connections)
    if warm < 0:
        raise ConfigError(f"BINDER_WARM_CONNECTIONS={warm} is negative (0 turns it off)")
    return warm


def _kill_wait(env: Env) -> float:
    kill_wait = env_float(env, "SLURM_KILL_WAIT", ReconcileSettings.kill_wait)
    if not 0 <= kill_wait <= 65533:  # Slurm's own bounds; also refuses nan
        raise ConfigError(f"SLURM_KILL_WAIT={kill_wait} must be slurm.conf's KillWait, in "
                          "seconds (0 to 65533)")
    return kill_wait


def _full_list_interval(env: Env) -> float:
    full_list = env_float(env, "BINDER_FULL_LIST_INTERVAL", ReconcileSettings.full_list_interval)
    if full_list < 1:
        raise ConfigError(f"BINDER_FULL_LIST_INTERVAL={full_list} is under 1 s: every poll "
                          "would read the site's whole job list")
    return full_list


def _reconcile_from_env(env: Env) -> ReconcileSettings:
    """The reconcilers' settings as the environment gives them (BINDER_WORKERS before --workers).

    Keyword arguments are evaluated in the order written, which is the order of the checks:
    with two bad variables, the first one here is the one the error names.
    """
    r = ReconcileSettings()
    return ReconcileSettings(
        workers=env_int(env, "BINDER_WORKERS", r.workers),
        warm_connections=_warm_connections(env),
        orphan_grace=env_float(env, "BINDER_ORPHAN_GRACE", r.orphan_grace),
        evict_grace=env_float(env, "BINDER_EVICT_GRACE", r.evict_grace),
        kill_wait=_kill_wait(env),
        group_timeout=env_float(env, "BINDER_GROUP_TIMEOUT", r.group_timeout),
        gpu_grace=env_float(env, "BINDER_GPU_GRACE", r.gpu_grace),
        full_list_interval=_full_list_interval(env),
        default_memory=env_optional(env, "DEFAULT_MEMORY"),
        default_partition=env_optional(env, "DEFAULT_PARTITION"),
    )


def _parse_flags(argv: Sequence[str] | None, env: Env, lease_seconds: int,
                 workers: int) -> argparse.Namespace:
    d, le = BinderConfig(), LeaseSettings()
    ap = argparse.ArgumentParser(prog="slurmgate-binder")
    ap.add_argument("--health-listen", default=env.get("BINDER_HEALTH_LISTEN", d.health_listen))
    ap.add_argument("--kubeconfig", default=env.get("KUBECONFIG"))
    ap.add_argument("--lease-namespace", default=env.get("LEASE_NAMESPACE", le.namespace))
    ap.add_argument("--lease-name", default=env.get("LEASE_NAME", le.name))
    ap.add_argument("--lease-seconds", type=int, default=lease_seconds,
                    help="leader Lease duration; renewed every third of it")
    ap.add_argument("--workers", type=int, default=workers)
    ap.add_argument("--log-level", default=env.get("LOG_LEVEL", d.log_level))
    return ap.parse_args(argv)


def load(argv: Sequence[str] | None, env: Env) -> BinderConfig:
    """Parse `env` and the command line (flags win over the variables that default them).

    Raises ConfigError naming the variable for a bad value; argparse exits on a bad flag.
    Every variable is checked, even one a flag overrides, as it always was.
    """
    slurm = SlurmSettings.from_env(env)
    lease_seconds = env_int(env, "LEASE_DURATION_SECONDS", LeaseSettings.seconds)
    reconcile = _reconcile_from_env(env)
    tenancy = tenancy_configmap(env)
    a = _parse_flags(argv, env, lease_seconds, reconcile.workers)
    return BinderConfig(
        slurm=slurm,
        reconcile=replace(reconcile, workers=a.workers),
        lease=LeaseSettings(
            namespace=a.lease_namespace,
            name=a.lease_name,
            seconds=max(MIN_LEASE_SECONDS, a.lease_seconds),
            identity=env_optional(env, "POD_NAME"),
            pod_namespace=env_optional(env, "POD_NAMESPACE"),
        ),
        health_listen=a.health_listen,
        push_token_file=env_optional(env, "SLURM_PUSH_TOKEN_FILE"),
        kubeconfig=a.kubeconfig,
        log_level=a.log_level,
        tenancy_configmap=tenancy,
    )
