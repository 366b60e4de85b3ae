"""Tenancy: which Slurm user a namespace's jobs run as, and which accounts, QOS and partitions
its Pods may name. Pure: the policy text in, decisions out (slurmgate.tenancy_source keeps the
policy current from its ConfigMap).

The policy is the key ``tenancy.yaml`` of a ConfigMap (env TENANCY_CONFIGMAP=namespace/name)::

    tenants:
      - namespaces: [team-a, team-a-dev]  # exact namespace names, each in one tenant at most
        user: team-a                      # Slurm (Unix) user the jobs run as; required
        account: team-a                   # account when the Pod names none; optional
        accounts: [team-a, shared]        # accounts a Pod may name; default: [account]
        qos: [normal]                     # QOS a Pod may name; absent/empty: none
        partitions: [k8s]                 # partitions a job may go to; absent: any
    default: deny                         # or a tenant body without `namespaces`
    priorityClasses: {}                   # PriorityClass -> QOS/partition/nice (priorities.py)

Decisions, so that nothing is left to guess:

- No `account` and no `accounts`: the Pod may name no account; Slurm's default account of
  the user applies. `account` must be one of `accounts` when both are given.
- `qos` absent or empty: the Pod may name no QOS (Slurm's default QOS applies).
- `partitions` set: the *effective* partition (the annotation, else the webhook's
  DEFAULT_PARTITION) must be listed; with neither, the job goes to the first listed one, never
  to a partition the policy cannot see. An empty list is an error (omit it to allow any).
- `default` absent means `deny`: a namespace in no tenant may not use Slurm.
- Unknown keys are errors (a typo such as `acounts` must not silently widen nothing or
  everything); a namespace in two tenants is an error.

Every PolicyError names the path of the bad field (`tenants[1].accounts[0]`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import yaml

from slurmgate import contract, names, priorities, reasons
from slurmgate.podrequest import PodRequest

POLICY_KEY = "tenancy.yaml"

# Denial reasons (AdmissionReview status.reason, binder Event reasons; users match on them).

# States of the policy source (slurmgate.tenancy_source).
DISABLED = "disabled"
LOADING = "loading"
READY = "ready"
MISSING = "missing"
INVALID = "invalid"
STATES = (DISABLED, LOADING, READY, MISSING, INVALID)

# The same names podrequest accepts in the Slurm annotations.
# Unix user names (POSIX portable set, as useradd takes them; 32 like Linux's limit).
_BODY_KEYS = ("user", "account", "accounts", "qos", "partitions")


class PolicyError(ValueError):
    """The policy document is wrong; `path` names the field (`tenants[0].user`)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class TenancyDenied(reasons.Denied):
    """The policy refuses the Pod; `reason` is one of the CamelCase reasons above."""


@dataclass(frozen=True)
class Tenant:
    user: str
    account: str | None = None
    accounts: frozenset[str] = frozenset()
    qos: frozenset[str] = frozenset()
    partitions: tuple[str, ...] | None = None  # None: any; ordered, the first is the fallback
    namespaces: tuple[str, ...] = ()  # () for the default tenant


@dataclass(frozen=True)
class Policy:
    tenants: tuple[Tenant, ...] = ()
    default: Tenant | None = None  # None: deny every namespace in no tenant
    # PriorityClass name (or priorities.ANY) -> what it gives the job (slurmgate.priorities)
    priority_classes: dict[str, priorities.Rule] = field(default_factory=dict, hash=False)
    _by_namespace: dict[str, Tenant] = field(default_factory=dict, compare=False, repr=False,
                                             hash=False)

    def resolve(self, namespace: str) -> Tenant | None:
        return self._by_namespace.get(namespace, self.default)


@dataclass(frozen=True)
class PolicyState:
    """What the policy source knows right now. `policy` is the one to enforce: in `invalid`
    it is the last good one (None if there never was one); `error` says what went wrong."""

    status: str
    policy: Policy | None = None
    error: str = ""


STATE_DISABLED = PolicyState(DISABLED)
STATE_LOADING = PolicyState(LOADING)


# ----------------------------------------------------------------------------- parsing


def _names(v: Any, path: str, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise PolicyError(path, f"must be a list of {what}")
    out: list[str] = []
    for i, item in enumerate(v):
        out.append(_name(item, f"{path}[{i}]", pattern, what))
    return tuple(out)


def _name(v: Any, path: str, pattern: re.Pattern[str], what: str) -> str:
    if not isinstance(v, str) or not pattern.fullmatch(v):
        shown = repr(v)[:70]
        raise PolicyError(path, f"{shown} is not a valid {what}")
    return v


def _body(doc: Any, path: str, namespaces: tuple[str, ...]) -> Tenant:
    if "user" not in doc:
        raise PolicyError(f"{path}.user", "is required (the Slurm user the jobs run as)")
    user = _name(doc["user"], f"{path}.user", names.UNIX_USER, "Unix user name")
    account = None
    if doc.get("account") is not None:
        account = _name(doc["account"], f"{path}.account", names.SLURM_NAME, "Slurm account name")
    if doc.get("accounts") is not None:
        accounts = frozenset(_names(doc["accounts"], f"{path}.accounts", names.SLURM_NAME,
                                    "Slurm account names"))
        if account is not None and account not in accounts:
            raise PolicyError(f"{path}.account", f"{account!r} is not among {path}.accounts")
    else:
        accounts = frozenset({account} if account else ())
    qos = frozenset(_names(doc.get("qos") or [], f"{path}.qos", names.SLURM_NAME,
                           "Slurm QOS names"))
    partitions = None
    if doc.get("partitions") is not None:
        partitions = _names(doc["partitions"], f"{path}.partitions", names.SLURM_NAME,
                            "Slurm partition names")
        if not partitions:
            raise PolicyError(f"{path}.partitions", "is empty (omit it to allow any partition)")
    return Tenant(user, account, accounts, qos, partitions, namespaces)


def _check_keys(doc: Any, path: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(doc, dict):
        raise PolicyError(path, "must be a map")
    unknown = sorted(str(k) for k in doc if k not in allowed)
    if unknown:
        raise PolicyError(f"{path}.{unknown[0]}" if path else unknown[0],
                          f"unknown field (allowed: {', '.join(allowed)})")


def parse(text: str) -> Policy:
    """The policy document (YAML) -> Policy. Raises PolicyError naming the bad field."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise PolicyError("", f"not valid YAML: {e}") from None
    if doc is None:
        raise PolicyError("", "the policy document is empty")
    _check_keys(doc, "", ("tenants", "default", "priorityClasses"))
    raw_tenants = doc.get("tenants") or []
    if not isinstance(raw_tenants, list):
        raise PolicyError("tenants", "must be a list")
    tenants: list[Tenant] = []
    where: dict[str, str] = {}
    by_namespace: dict[str, Tenant] = {}
    for i, t in enumerate(raw_tenants):
        path = f"tenants[{i}]"
        _check_keys(t, path, ("namespaces", *_BODY_KEYS))
        if not t.get("namespaces"):
            raise PolicyError(f"{path}.namespaces", "is required (a list of namespace names)")
        nss = _names(t["namespaces"], f"{path}.namespaces", names.DNS_LABEL, "namespace name")
        tenant = _body(t, path, nss)
        for j, ns in enumerate(nss):
            if ns in where:
                raise PolicyError(f"{path}.namespaces[{j}]",
                                  f"namespace {ns!r} is already in {where[ns]}")
            where[ns] = path
            by_namespace[ns] = tenant
        tenants.append(tenant)
    raw_default = doc.get("default", "deny")
    default = None
    if raw_default != "deny":
        if not isinstance(raw_default, dict):
            raise PolicyError("default", "must be `deny` or a tenant body (user, account, ...)")
        _check_keys(raw_default, "default", _BODY_KEYS)
        default = _body(raw_default, "default", ())
    try:
        rules = priorities.parse(doc.get("priorityClasses"))
    except priorities.RuleError as e:
        raise PolicyError(e.path, e.detail) from None
    return Policy(tuple(tenants), default, rules, by_namespace)


# ----------------------------------------------------------------------------- decisions


def _q(name: str) -> str:
    """Quoted as the user wrote it (names are validated: nothing to escape)."""
    return f'"{name}"'


def _allowed(names: frozenset[str] | tuple[str, ...]) -> str:
    return ", ".join(sorted(names)) or "none"


def admit(policy: Policy, namespace: str, req: PodRequest, priority_class: str | None = None,
          asked: Collection[str] = ()) -> PodRequest:
    """The request as the policy lets it run: what the Pod's PriorityClass gives applied
    (slurmgate.priorities; `asked`: the Slurm option annotations the Pod names), `user` set,
    `account` (and, when the tenant lists partitions and nothing chose one, `partition`)
    defaulted. Raises TenancyDenied (a PriorityClass conflict too, with its own reason)."""
    try:
        req, came_from = priorities.apply(policy.priority_classes, priority_class, req, asked)
    except priorities.PriorityDenied as e:
        raise TenancyDenied(e.reason, e.message) from None
    # a mapped value the tenant may not use is refused like an annotation, naming the class
    src = {k: f"from {v}" for k, v in came_from.items()}
    tenant = policy.resolve(namespace)
    if tenant is None:
        raise TenancyDenied(reasons.DENY_NAMESPACE_NOT_IN_TENANCY,
                            f"namespace {_q(namespace)} belongs to no tenant of the tenancy "
                            "policy and the default is deny: it may not run Pods on Slurm")
    account = req.account
    if account is None:
        account = tenant.account
    elif account not in tenant.accounts:
        raise TenancyDenied(reasons.DENY_ACCOUNT_NOT_ALLOWED,
                            f"namespace {_q(namespace)} may not use account {_q(account)} "
                            f"({contract.A_ACCOUNT}); allowed: {_allowed(tenant.accounts)}")
    if req.qos is not None and req.qos not in tenant.qos:
        raise TenancyDenied(reasons.DENY_QOS_NOT_ALLOWED,
                            f"namespace {_q(namespace)} may not use QOS {_q(req.qos)} "
                            f"({src.get('qos', contract.A_QOS)}); allowed: {_allowed(tenant.qos)}")
    partition = req.partition
    if tenant.partitions is not None:
        if partition is None:
            partition = tenant.partitions[0]
        elif partition not in tenant.partitions:
            where = src.get("partition",
                            f"{contract.A_PARTITION}, or the webhook's DEFAULT_PARTITION")
            raise TenancyDenied(reasons.DENY_PARTITION_NOT_ALLOWED,
                                f"namespace {_q(namespace)} may not use partition {_q(partition)} "
                                f"({where}); allowed: {_allowed(tenant.partitions)}")
    return dataclasses.replace(req, user=tenant.user, account=account, partition=partition)


def check(state: PolicyState, namespace: str, req: PodRequest,
          priority_class: str | None = None, asked: Collection[str] = ()) -> PodRequest:
    """`admit` under whatever the source knows: disabled lets everything through unchanged
    (every job as SLURM_USER, as before tenancy); every other state without a policy fails
    closed."""
    if state.status == DISABLED:
        return req
    if state.policy is not None:  # ready, or invalid with the last good policy kept
        return admit(state.policy, namespace, req, priority_class, asked)
    if state.status == MISSING:
        raise TenancyDenied(reasons.DENY_TENANCY_POLICY_MISSING,
                            f"the tenancy policy is missing ({state.error}); "
                            "Pods on Slurm are refused until an operator provides it")
    if state.status == INVALID:
        raise TenancyDenied(reasons.DENY_TENANCY_POLICY_INVALID,
                            f"the tenancy policy is invalid: {state.error}; "
                            "Pods on Slurm are refused until an operator fixes it")
    raise TenancyDenied(reasons.DENY_TENANCY_POLICY_LOADING,
                        "the tenancy policy is not loaded yet; retry shortly")
