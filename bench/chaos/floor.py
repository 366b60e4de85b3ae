"""The least a chaos run must have done for its verdict to mean anything: a run with no
violations passes only if it also created and bound enough Pods and injected every fault it was
asked for. Without this a run cut short (its fault driver or churn thread dead, the minutes up
before the round ended) or a binder that bound nothing passed with "violations: 0".

The defaults are sized on what the short CI round (`--rounds 1 --gap 5 12`, four nodes, about
six Pods alive, each living some 30 s) did on a healthy cluster: 26 release-runs of it on
2026-12-06 (22.05, 24.11 and 26.05; results in ~/.cache/slurmgate/chaos) created 47 to 77 Pods
and bound 14 to 37 (median 24, a quarter to a half of those created). How many are bound is set
by how often Slurm has a node for them (two scavenger jobs to preempt, an hpc job now and then,
gangs that need two nodes, the churn deleting Pods that still wait), not by the binder's speed:
that is the rule "unbound while its job runs" (a violation after 30 s). An earlier floor of 15
bound, sized on two rounds that bound some 40, sat at the bottom of that spread and failed a
healthy 26.05 run that bound 14 (the same seed replayed bound 22). The floors are now about half
of the lowest healthy figure, so the spread clears them, while a churn that stopped within its
first ninety seconds, a webhook refusing every create, or a binder that binds nothing (or one in
four of what it should) does not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_PODS_CREATED = 30
MIN_PODS_BOUND = 7


@dataclass(frozen=True)
class Floor:
    pods_created: int = MIN_PODS_CREATED
    pods_bound: int = MIN_PODS_BOUND
    faults: tuple[str, ...] = ()  # each injected (killed and brought back) at least once


def missed(s: dict[str, Any], floor: Floor) -> list[str]:
    """Each floor the run summary `s` (report.summary) fell short of, with its figures."""
    out = []
    if s["pods_created"] < floor.pods_created:
        out.append(f"Pods created: {s['pods_created']}, under the floor of "
                   f"{floor.pods_created} (creates refused {s['creates_refused']})")
    if s["pods_bound"] < floor.pods_bound:
        out.append(f"Pods bound: {s['pods_bound']} of {s['pods_created']} created, under the "
                   f"floor of {floor.pods_bound}")
    for name in floor.faults:
        if s["faults"].get(name, 0) >= 1:
            continue
        skipped = s["faults_skipped"].get(name, [])
        failed = [f for f in s["faults_not_restored"] if f.startswith(f"{name}: ")]
        tries = (f"skipped {len(skipped)} time(s): {'; '.join(sorted(set(skipped)))}"
                 if skipped else "")
        tries += ("; " if tries and failed else "") + (
            f"failed {len(failed)} time(s)" if failed else "")
        out.append(f"fault {name}: never injected ({tries or 'never tried'})")
    return out


def failures(r: dict[str, Any]) -> list[str]:
    """Why one release's result (a summary, or the error a run that died left) fails the run:
    a violation; a component that did not come back (its settling was never judged); a floor
    missed (its "no violations" rests on too little). Empty: it passes."""
    return ([f"the run itself failed: {r['error']}"] if r.get("error") else []) + [
        f"{len(r['violations'])} violation(s): "
        + "; ".join(sorted({v['rule'] for v in r['violations']}))] * bool(r["violations"]) + [
        f"not restored: {f}" for f in r.get("faults_not_restored", ())] + [
        f"floor missed: {m}" for m in r.get("floors_missed", ())]
