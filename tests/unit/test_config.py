"""Settings are parsed once, at start: defaults, every variable, flags, and bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurmgate import jsonpool
from slurmgate.binder import __main__ as binder_main
from slurmgate.binder import config as binder_config
from slurmgate.binder.config import BinderConfig, LeaseSettings, ReconcileSettings
from slurmgate.config import (
    JSON_OFFLOAD_BYTES,
    ConfigError,
    SlurmSettings,
    env_bool,
    env_float,
    env_int,
    env_optional,
)
from slurmgate.webhook import __main__ as webhook_main
from slurmgate.webhook import config as webhook_config
from slurmgate.webhook.config import Settings, WebhookConfig
from slurmgate.webhook.grace import LongGrace

SLURM_ENV = {
    "SLURMREST_URL": "http://slurm:6820",
    "SLURM_JWT_FILE": "/run/jwt",
    "SLURM_USER": "alice",
    "SLURMGATE_JSON_OFFLOAD_BYTES": "1024",
}
SLURM = SlurmSettings(url="http://slurm:6820", token_file=Path("/run/jwt"), user="alice",
                      json_offload_bytes=1024)


def test_slurm_defaults() -> None:
    assert SlurmSettings.from_env({}) == SlurmSettings(
        url="http://127.0.0.1:6820", token_file=Path("/etc/slurmgate/slurm-jwt/token"),
        user="root", json_offload_bytes=256 * 1024)
    assert JSON_OFFLOAD_BYTES == jsonpool.OFFLOAD_BYTES == 256 * 1024


def test_slurm_every_variable() -> None:
    assert SlurmSettings.from_env(SLURM_ENV) == SLURM


@pytest.mark.parametrize(("raw", "want"), [
    (None, False), ("", False), ("1", True), ("true", True), (" Yes ", True), ("ON", True),
    ("0", False), ("false", False), ("maybe", False),
])
def test_env_bool(raw: str | None, want: bool) -> None:
    env = {} if raw is None else {"FAIL_OPEN": raw}
    assert env_bool(env, "FAIL_OPEN", False) is want
    assert env_bool({"FAIL_OPEN": ""}, "FAIL_OPEN", True) is True  # empty: the default


def test_env_numbers_and_optional() -> None:
    assert env_int({}, "N", 7) == 7
    assert env_int({"N": " 12 "}, "N", 7) == 12  # int() takes surrounding blanks, as before
    assert env_float({"F": "2.5"}, "F", 1.0) == 2.5
    assert env_optional({}, "X") is None
    assert env_optional({"X": ""}, "X") is None
    assert env_optional({"X": "1Gi"}, "X") == "1Gi"
    for bad in ("", "abc", "1.5"):
        with pytest.raises(ConfigError, match=r"^N='.*' is not an integer$"):
            env_int({"N": bad}, "N", 7)
    with pytest.raises(ConfigError, match="F='x' is not a number"):
        env_float({"F": "x"}, "F", 1.0)


# --- webhook


def test_webhook_defaults() -> None:
    assert webhook_config.load([], {}) == WebhookConfig(
        slurm=SlurmSettings(), admission=Settings(), listen="0.0.0.0:8443",
        tls_cert_file=Path("/etc/slurmgate/tls/tls.crt"),
        tls_key_file=Path("/etc/slurmgate/tls/tls.key"), kubeconfig=None, log_level="INFO")


def test_webhook_every_variable() -> None:
    env = {**SLURM_ENV, "FAIL_OPEN": "true", "DEFAULT_MEMORY": "1Gi",
           "DEFAULT_PARTITION": "k8s", "LONG_TERMINATION_GRACE": "deny",
           "WEBHOOK_LISTEN": "127.0.0.1:9443",
           "WEBHOOK_TLS_CERT": "/c.crt", "WEBHOOK_TLS_KEY": "/c.key",
           "KUBECONFIG": "/kc", "LOG_LEVEL": "debug"}
    assert webhook_config.load([], env) == WebhookConfig(
        slurm=SLURM,
        admission=Settings(fail_open=True, default_memory="1Gi", default_partition="k8s",
                           long_grace=LongGrace.DENY),
        listen="127.0.0.1:9443", tls_cert_file=Path("/c.crt"), tls_key_file=Path("/c.key"),
        kubeconfig="/kc", log_level="debug")


def test_webhook_flags_win_over_variables() -> None:
    env = {"WEBHOOK_LISTEN": "127.0.0.1:1", "WEBHOOK_TLS_CERT": "/env.crt", "LOG_LEVEL": "debug"}
    cfg = webhook_config.load(["--listen=127.0.0.1:2", "--tls-cert-file=/flag.crt",
                               "--tls-key-file=/flag.key", "--kubeconfig=/kc",
                               "--log-level=WARNING"], env)
    assert (cfg.listen, cfg.tls_cert_file, cfg.tls_key_file, cfg.kubeconfig, cfg.log_level) == (
        "127.0.0.1:2", Path("/flag.crt"), Path("/flag.key"), "/kc", "WARNING")


def test_webhook_blank_defaults_mean_none() -> None:
    a = webhook_config.load([], {"DEFAULT_MEMORY": "", "DEFAULT_PARTITION": ""}).admission
    assert (a.default_memory, a.default_partition) == (None, None)


# --- binder


def test_binder_defaults() -> None:
    cfg = binder_config.load([], {})
    assert cfg == BinderConfig(
        slurm=SlurmSettings(),
        reconcile=ReconcileSettings(workers=16, default_memory=None, default_partition=None,
                                    orphan_grace=60.0, evict_grace=60.0, group_timeout=300.0,
                                    warm_connections=20),
        lease=LeaseSettings(namespace="slurmgate-system", name="slurmgate-binder", seconds=15,
                            identity=None),
        health_listen="0.0.0.0:8080", kubeconfig=None, log_level="INFO")
    assert cfg.lease.renew_seconds == 5.0


def test_binder_every_variable() -> None:
    env = {**SLURM_ENV, "DEFAULT_MEMORY": "512Mi", "DEFAULT_PARTITION": "gpu",
           "BINDER_WORKERS": "4", "BINDER_ORPHAN_GRACE": "10", "BINDER_EVICT_GRACE": "8",
           "BINDER_GROUP_TIMEOUT": "30.5", "BINDER_WARM_CONNECTIONS": "0",
           "SLURM_KILL_WAIT": "5", "LEASE_NAMESPACE": "ns", "LEASE_NAME": "lease",
           "LEASE_DURATION_SECONDS": "120", "POD_NAME": "binder-0",
           "BINDER_HEALTH_LISTEN": "127.0.0.1:8081", "KUBECONFIG": "/kc", "LOG_LEVEL": "debug"}
    assert binder_config.load([], env) == BinderConfig(
        slurm=SLURM,
        reconcile=ReconcileSettings(workers=4, default_memory="512Mi", default_partition="gpu",
                                    orphan_grace=10.0, evict_grace=8.0, group_timeout=30.5,
                                    warm_connections=0, kill_wait=5.0),
        lease=LeaseSettings(namespace="ns", name="lease", seconds=120, identity="binder-0"),
        health_listen="127.0.0.1:8081", kubeconfig="/kc", log_level="debug")


def test_binder_flags_win_over_variables() -> None:
    env = {"LEASE_DURATION_SECONDS": "30", "BINDER_WORKERS": "4", "LEASE_NAME": "env"}
    cfg = binder_config.load(["--health-listen=127.0.0.1:1", "--kubeconfig=/kc",
                              "--lease-namespace=fns", "--lease-name=flag", "--lease-seconds=60",
                              "--workers=2", "--log-level=ERROR"], env)
    assert cfg.lease == LeaseSettings(namespace="fns", name="flag", seconds=60, identity=None)
    assert (cfg.reconcile.workers, cfg.health_listen, cfg.kubeconfig, cfg.log_level) == (
        2, "127.0.0.1:1", "/kc", "ERROR")


@pytest.mark.parametrize(("env", "argv"), [
    ({"LEASE_DURATION_SECONDS": "1"}, []),
    ({"LEASE_DURATION_SECONDS": "-5"}, []),
    ({}, ["--lease-seconds=0"]),
])
def test_binder_lease_floor(env: dict[str, str], argv: list[str]) -> None:
    lease = binder_config.load(argv, env).lease
    assert (lease.seconds, lease.renew_seconds) == (3, 1.0)


def test_binder_blank_pod_name_makes_its_own_identity() -> None:
    assert binder_config.load([], {"POD_NAME": ""}).lease.identity is None


@pytest.mark.parametrize(("name", "kind"), [
    ("LEASE_DURATION_SECONDS", "an integer"),
    ("BINDER_WORKERS", "an integer"),
    ("BINDER_WARM_CONNECTIONS", "an integer"),
    ("SLURMGATE_JSON_OFFLOAD_BYTES", "an integer"),
    ("BINDER_ORPHAN_GRACE", "a number"),
    ("BINDER_EVICT_GRACE", "a number"),
    ("BINDER_GROUP_TIMEOUT", "a number"),
    ("SLURM_KILL_WAIT", "a number"),
])
def test_binder_bad_number_names_the_variable(name: str, kind: str) -> None:
    with pytest.raises(ConfigError, match=f"^{name}='soon' is not {kind}$"):
        binder_config.load([], {name: "soon"})


@pytest.mark.parametrize("raw", ["-1", "nan", "70000"])
def test_binder_kill_wait_out_of_slurms_bounds_is_refused(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"SLURM_KILL_WAIT=.* must be slurm\.conf's KillWait"):
        binder_config.load([], {"SLURM_KILL_WAIT": raw})


def test_binder_negative_warm_connections_is_refused() -> None:
    with pytest.raises(ConfigError, match="BINDER_WARM_CONNECTIONS=-1 is negative"):
        binder_config.load([], {"BINDER_WARM_CONNECTIONS": "-1"})


def test_binder_bad_variable_fails_even_when_a_flag_overrides_it() -> None:
    with pytest.raises(ConfigError, match="BINDER_WORKERS"):
        binder_config.load(["--workers=3"], {"BINDER_WORKERS": "many"})


def test_webhook_bad_number_names_the_variable() -> None:
    with pytest.raises(ConfigError, match="SLURMGATE_JSON_OFFLOAD_BYTES"):
        webhook_config.load([], {"SLURMGATE_JSON_OFFLOAD_BYTES": "256k"})


def test_bad_flag_exits_like_argparse() -> None:
    with pytest.raises(SystemExit) as e:
        binder_config.load(["--workers=lots"], {})
    assert e.value.code == 2


@pytest.mark.parametrize(("main", "prog", "name"), [
    (binder_main.main, "slurmgate-binder", "LEASE_DURATION_SECONDS"),
    (webhook_main.main, "slurmgate-webhook", "SLURMGATE_JSON_OFFLOAD_BYTES"),
])
def test_main_stops_at_start_naming_the_variable(main: object, prog: str, name: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(name, "x")
    with pytest.raises(SystemExit) as e:
        main([])  # type: ignore[operator]
    # a string code: Python prints it on stderr and exits 1, as the old traceback did
    assert e.value.code == f"{prog}: {name}='x' is not an integer"


async def test_offload_threshold_is_passed_down(monkeypatch: pytest.MonkeyPatch) -> None:
    jsonpool.shutdown()
    monkeypatch.setattr(jsonpool, "OFFLOAD_BYTES", 10)  # the caller's threshold wins
    assert (await jsonpool.load_async(b'{"jobs": []}', None, 1 << 30)) == {"jobs": []}
    assert jsonpool._pool is None
