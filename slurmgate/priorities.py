"""Kubernetes priorities in Slurm: the operator maps a Pod's PriorityClass to the QOS, partition
and nice of its Slurm job. Pure: the mapping is the `priorityClasses` map of the tenancy
policy document (slurmgate.tenancy parses it; one ConfigMap, one watch, fail-closed and
hot-reloaded like the rest of the policy)::

    priorityClasses:
      high:                        # metadata.name of a PriorityClass
        qos: prod                  # each of qos, partition, nice is optional
        partition: k8s
        nice: 0
        annotationsOverride: false # may slurmgate.io/qos|partition|nice say otherwise? default no
      "*": {qos: normal}           # every Pod whose class is not listed, or that has none

Decisions:

- The class is `spec.priorityClassName` as the apiserver's Priority admission plugin left it:
  that plugin runs before mutating webhooks and fills in the globalDefault class's name, so a
  Pod "without a class" on a cluster with a global default has that default's name here.
- A field the class sets is what the job gets. An explicit annotation asking for another
  value is refused (`PriorityClassForbidsQOS`, `...Partition`, `...Nice`, naming the class, the
  field and what the class gives) unless the class says `annotationsOverride: true`; an
  annotation equal to the class's value is fine. A field the class does not set is left to
  the annotation (and DEFAULT_PARTITION) as before.
- The mapped values are then checked by the tenancy policy like annotations are. Every
  namespace may use every PriorityClass (they are cluster-wide), so a mapping that bypassed
  the tenant's list would let any team take any QOS by naming a class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from slurmgate import contract, names, reasons
from slurmgate.kubeview import PodView
from slurmgate.podrequest import MAX_NICE, PodRequest

ANY = "*"  # not a valid PriorityClass name, so it never shadows one
RULE_KEYS = ("qos", "partition", "nice", "annotationsOverride")




class RuleError(ValueError):
    """The mapping is wrong; `path` names the field (`priorityClasses.high.qos`)."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


class PriorityDenied(reasons.Denied):
    """The Pod's PriorityClass forbids what its annotations ask; `reason` is CamelCase."""


@dataclass(frozen=True)
class Rule:
    name: str  # the class, or ANY
    qos: str | None = None
    partition: str | None = None
    nice: int | None = None
    annotations_override: bool = False


Rules = Mapping[str, Rule]


def _slurm_name(v: Any, path: str, what: str) -> str:
    if not isinstance(v, str) or not names.SLURM_NAME.fullmatch(v):
        raise RuleError(path, f"{repr(v)[:70]} is not a valid Slurm {what} name")
    return v


def parse(doc: Any, path: str = "priorityClasses") -> dict[str, Rule]:
    """The `priorityClasses` map -> {class name or ANY: Rule}. Raises RuleError."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise RuleError(path, "must be a map of PriorityClass name to {qos, partition, nice, "
                        "annotationsOverride}")
    rules: dict[str, Rule] = {}
    for name, body in doc.items():
        where = f"{path}.{name}"
        if not isinstance(name, str) or not (name == ANY or names.DNS_SUBDOMAIN.fullmatch(name)):
            raise RuleError(where, "is not a PriorityClass name (nor \"*\")")
        if not isinstance(body, dict):
            raise RuleError(where, "must be a map")
        unknown = sorted(str(k) for k in body if k not in RULE_KEYS)
        if unknown:
            raise RuleError(f"{where}.{unknown[0]}",
                            f"unknown field (allowed: {', '.join(RULE_KEYS)})")
        qos = body.get("qos")
        partition = body.get("partition")
        nice = body.get("nice")
        override = body.get("annotationsOverride", False)
        if qos is not None:
            _slurm_name(qos, f"{where}.qos", "QOS")
        if partition is not None:
            _slurm_name(partition, f"{where}.partition", "partition")
        if nice is not None and (not isinstance(nice, int) or isinstance(nice, bool)
                                 or abs(nice) > MAX_NICE):
            raise RuleError(f"{where}.nice", f"must be an integer from -{MAX_NICE} to {MAX_NICE}")
        if not isinstance(override, bool):
            raise RuleError(f"{where}.annotationsOverride", "must be true or false")
        rules[name] = Rule(name, qos, partition, nice, override)
    return rules


def rule_for(rules: Rules, priority_class: str | None) -> Rule | None:
    if priority_class and priority_class in rules:
        return rules[priority_class]
    return rules.get(ANY)


def _v(x: object) -> str:
    return f'"{x}"' if isinstance(x, str) else str(x)


def describe(rule: Rule) -> str:
    """`PriorityClass "high"`, or what `*` stands for."""
    return (f'PriorityClass "{rule.name}"' if rule.name != ANY
            else 'the PriorityClass mapping\'s "*" entry')


def apply(rules: Rules, priority_class: str | None, req: PodRequest,
          asked: Collection[str]) -> tuple[PodRequest, dict[str, str]]:
    """`req` with what the Pod's class sets, and, per field it set, where it came from (for
    messages: 'PriorityClass "high"'). `asked` holds the Slurm option annotations the Pod
    (or its owner) names explicitly; `req` carries their values. Raises PriorityDenied."""
    rule = rule_for(rules, priority_class)
    if rule is None:
        return req, {}
    who = describe(rule)
    changes: dict[str, Any] = {}
    sources: dict[str, str] = {}
    fields = (("qos", rule.qos, contract.A_QOS, reasons.DENY_CLASS_FORBIDS_QOS, "QOS"),
              ("partition", rule.partition, contract.A_PARTITION,
               reasons.DENY_CLASS_FORBIDS_PARTITION, "partition"),
              ("nice", rule.nice, contract.A_PRIORITY, reasons.DENY_CLASS_FORBIDS_NICE, "nice"))
    for attr, given, annotation, reason, label in fields:
        if given is None:
            continue
        have = getattr(req, attr)
        if annotation in asked and have != given:
            if rule.annotations_override:
                continue  # the operator lets the Pod's own choice win
            raise PriorityDenied(reason, f"{who} sets {label} {_v(given)} for Slurm, and "
                                 f"{annotation} asks for {_v(have)}; the class does not let "
                                 "annotations override it (annotationsOverride: false): "
                                 "remove the annotation or choose another PriorityClass")
        changes[attr] = given
        sources[attr] = who
    return dataclasses.replace(req, **changes), sources


def of_pod(pod: Mapping[str, Any]) -> tuple[str | None, frozenset[str]]:
    """(spec.priorityClassName, the Slurm option annotations the Pod names) of a Pod object,
    as `apply` takes them."""
    view = PodView(pod)
    name = view.spec.get("priorityClassName")
    asked = frozenset(k for k in view.annotations if k in contract.SLURM_OPTIONS)
    return (name if isinstance(name, str) and name else None), asked

