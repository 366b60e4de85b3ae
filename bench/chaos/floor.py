"""The least a chaos run must have done for its verdict to mean anything: a run with no
violations passes only if it also created and bound enough Pods and injected every fault it was
asked for. Without this a run cut short (its fault driver or churn thread dead, the minutes up
before the round ended) or a binder that bound nothing passed with "violations: 0".

The defaults are sized on the short round CI runs (`--rounds 1 --gap 5 12`): two such rounds
on 26.05 created 66 and 72 Pods in about 3.3 minutes of churn (some 20 a minute: a tick every
1.5 s, about six Pods alive on four nodes, each living some 30 s). About four of those six
hold a node at any time, so roughly two in three Pods are bound before the churn deletes them:
some 40 a round, fewer while the binder, slurmctld or the API server is down. The floors are
under half of that, so a healthy round clears them twice over, while a churn that stopped
within its first ninety seconds, webhook refusing every create, or a binder that binds nothing
does not."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_PODS_CREATED = 30
MIN_PODS_BOUND = 15


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
