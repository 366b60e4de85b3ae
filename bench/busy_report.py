"""The busy-site bench's tables (Markdown, one per release, a column per background size N)
and its verdicts against issue 29's targets. Pure: reads the results dict only."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from bench.busy_cost import SITE_TOTAL
from bench.stats import fmt

Seg = dict[str, Any]
COMPONENTS = ("binder", "webhook")
# the cost windows with slurmgate running: nothing of ours (hook on, off), our Pods bound and
# idle (in a GraceTime partition, in one without), K Pods in flight
CALM = ("idle", "idle_nohook", "idle_bound", "idle_bound_nograce", "pods")
ONE = "calls_one_by_one"  # slurmgate's calls while Pods were made one at a time
LISTS = ("jobs", "nodes")  # the binder's whole lists (seg["whole_list"])


def get(d: Any, *path: str) -> Any:
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, int | float) or math.isnan(x):
        return None
    return float(x)


def num(x: Any) -> str:
    v = number(x)
    if v is None:
        return "-"
    if v.is_integer() or abs(v) >= 1000:
        return f"{v:,.0f}"
    return fmt(v)


def fig(x: Any) -> str:
    """A small figure with its three significant digits (0.00299, 2.96, 40), a big one whole."""
    v = number(x)
    if v is None:
        return "-"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def p50_99(d: Any) -> str:
    """"p50 / p99" of a latency summary (bench.stats.lat or hist_lat), in ms."""
    if not isinstance(d, dict) or not d.get("n"):
        return "-"
    return f"{num(d.get('p50_ms'))} / {num(d.get('p99_ms'))}"


def ratio(x: Any, floor: Any) -> str:
    a, b = number(x), number(floor)
    return "-" if a is None or not b else f"{a / b:.2f}x"


def rest_total(win: Any, key: str) -> float | None:
    """A window's `key` (per_min, bytes_per_s) over the binder and the webhook together."""
    rest = get(win, "rest")
    if not isinstance(rest, dict):
        return None
    return sum(get(rest, c, "all", key) or 0.0 for c in COMPONENTS)


def kib(x: float | None) -> str:
    return "-" if x is None else f"{x / 1024:,.1f} KiB/s"


def by_method(row: Any, method: str) -> dict[str, Any] | None:
    """One method's figures of an endpoint row of busy_cost.rest_by_endpoint (requests,
    per_min, p50/p99 ms). A row from before the histogram had a method label has none apart:
    the endpoint's own figures stand for the method only when it is the endpoint's one
    method."""
    if not isinstance(row, dict):
        return None
    methods = row.get("methods")
    if isinstance(methods, dict):
        m = methods.get(method)
        return m if isinstance(m, dict) else None
    by = row.get("by") or {}
    return row if by and all(k.split(" ", 1)[0] == method for k in by) else None


def worst_read(win: Any) -> tuple[str, float] | None:
    """(component endpoint, p99 ms) of slurmgate's slowest read (the GETs of an endpoint)."""
    worst: tuple[str, float] | None = None
    for c in COMPONENTS:
        for ep, r in (get(win, "rest", c) or {}).items():
            m = by_method(r, "GET") if ep != "all" else None
            p99 = number(m.get("p99_ms")) if m and m.get("n") else None
            if p99 is None:
                continue
            if worst is None or p99 > worst[1]:
                worst = (f"{c} {ep}", p99)
    return worst


def call(s: Seg, component: str, method: str, ep: str, phase: str = "calls"
         ) -> dict[str, Any] | None:
    """slurmgate's METHOD endpoint over the whole running phase (seg["calls"]), or while
    Pods were made one at a time ("calls_one_by_one")."""
    return by_method(get(s, phase, component, ep), method)


def list_cell(d: Any) -> str:
    """A whole list (busy_cost.list_cost) as the report's sentence."""
    if not isinstance(d, dict) or not d.get("runs"):
        return f"- ({d['error']})" if isinstance(d, dict) and d.get("error") else "-"
    mb = number(d.get("bytes"))
    text = (f"whole list: {fig(d.get('wall_ms'))} ms, {fig(None if mb is None else mb / 1e6)} "
            f"MB, {fig(d.get('slurm_cpu_s_net'))} CPU-s of Slurm; amortized at the "
            f"{num(d.get('interval_s'))} s interval: {fig(d.get('amortized_pct'))} % of a core")
    answer, limit = number(d.get("answer_ms")), number(d.get("binder_timeout_s"))
    if answer is not None and limit and answer > 1000 * limit:
        text += f" (over the binder's {num(limit)} s request timeout)"
    if d.get("error"):
        text += f" (failed: {d['error']})"
    return text


def with_whole_lists(s: Seg) -> float | None:
    """The idle window's added % of a core plus both whole lists amortized; None when any of
    them was not measured."""
    parts = [number(get(s, "cost", "idle", SITE_TOTAL)),
             *(number(get(s, "whole_list", k, "amortized_pct")) for k in LISTS)]
    return None if any(p is None for p in parts) else sum(p for p in parts if p is not None)


# ------------------------------------------------------------------------------ the rows


def _background(s: Seg) -> str:
    return (f"{num(get(s, 'background', 'standing'))} "
            f"({num(get(s, 'background', 'array_tasks'))})")


def _per_window(s: Seg, f: Callable[[Any], Any]) -> str:
    return " / ".join(num(f(s.get(k))) for k in CALM)


def _requests(s: Seg) -> str:
    return _per_window(s, lambda w: rest_total(w, "per_min"))


def _bytes(s: Seg) -> str:
    return " / ".join(kib(rest_total(s.get(k), "bytes_per_s")) for k in ("idle", "pods"))


def _added(daemon: str) -> Callable[[Seg], str]:
    return lambda s: " / ".join(num(get(s, "cost", k, daemon)) for k in CALM)


def rpc_cell(w: Any) -> str:
    """A window's slurmctld time on root's RPCs (sdiag): % of a core (RPCs a minute)."""
    r = get(w, "ctld_rpc")
    return f"{num(get(r, 'pct'))} ({num(get(r, 'per_min'))})" if r else "-"


def _ctld_rpc(s: Seg) -> str:
    """slurmctld's own time on root's RPCs (sdiag), % of a core (RPCs a minute), per window."""
    return f"{rpc_cell(s.get('stopped'))}; " + " / ".join(rpc_cell(s.get(k)) for k in CALM)


def rpc_pct_over_direct(s: Seg) -> float | None:
    """slurmctld's time on root's RPCs (sdiag) with the Pods in flight less with the same
    jobs made directly: slurmgate's own, lock waits included (an upper bound)."""
    a, b = number(get(s, "pods", "ctld_rpc", "pct")), number(get(s, "direct", "ctld_rpc", "pct"))
    return None if a is None or b is None else round(a - b, 2)


def _direct(s: Seg) -> str:
    return f"{num(get(s, 'cost', 'direct', SITE_TOTAL))}; {rpc_cell(s.get('direct'))}"


def _over_direct(s: Seg) -> str:
    return f"{num(get(s, 'cost', 'pods_over_direct', SITE_TOTAL))}; {num(rpc_pct_over_direct(s))}"


def _own(role: str) -> Callable[[Seg], str]:
    return lambda s: (f"{num(get(s, 'idle', 'cpu_pct', role))} / "
                      f"{num(get(s, 'pods', 'cpu_pct', role))}, "
                      f"{num(get(s, 'rss_peak_mib', role))}")


def _slowest_read(s: Seg) -> str:
    w = worst_read(s.get("pods"))
    return f"{num(w[1])} ({w[0]})" if w else "-"


def read_versus_direct(s: Seg) -> tuple[dict[str, Any] | None, Any]:
    """The binder's periodic state read (jobs/state, or job/{id} on 22.05) and the same read
    made directly: side by side, over the same seconds and ids with our Pods in flight, where
    the run measured it (seg["pods"]["reads_side_by_side"]); else the binder's in the Pods
    window against the floor's own reads (seg["floor"]), made at another moment."""
    side = get(s, "pods", "reads_side_by_side")
    if side:
        return get(side, "ours"), get(side, "direct")
    ep = get(s, "floor", "read_endpoint")
    ours = by_method(get(s, "pods", "rest", "binder", ep), "GET") if ep else None
    return ours, get(s, "floor", "read_binned")


def _read_versus(s: Seg) -> str:
    ours, direct = read_versus_direct(s)
    if direct is None:
        return "-"
    return (f"{p50_99(ours)}; {p50_99(direct)} "
            f"({ratio(get(ours, 'p99_ms'), get(direct, 'p99_ms'))}), "
            f"n = {num(get(ours, 'n'))} / {num(get(direct, 'n'))}")


def _lats(*paths: tuple[str, ...]) -> Callable[[Seg], str]:
    return lambda s: "; ".join(p50_99(get(s, *p)) for p in paths)


def _versus(component: str, method: str, ep: str, floor: str) -> Callable[[Seg], str]:
    """slurmgate's METHOD endpoint against the same request made directly (seg["floor"]),
    and how many slurmgate made."""
    def f(s: Seg) -> str:
        ours = call(s, component, method, ep, "calls_one_by_one")
        direct = get(s, "floor", f"{floor}_binned")
        return (f"{p50_99(ours)}; {p50_99(direct)} "
                f"({ratio(get(ours, 'p99_ms'), get(direct, 'p99_ms'))}), "
                f"n = {num(get(ours, 'requests'))}")
    return f


def _read(component: str, ep: str) -> Callable[[Seg], str]:
    def f(s: Seg) -> str:
        ours = call(s, component, "GET", ep)
        return f"{p50_99(ours)}, n = {num(get(ours, 'requests'))}"
    return f


def _list(what: str) -> Callable[[Seg], str]:
    return lambda s: list_cell(get(s, "whole_list", what))


def _added_with_lists(s: Seg) -> str:
    return f"{fig(get(s, 'cost', 'idle', SITE_TOTAL))}; {fig(with_whole_lists(s))}"


def rows(pods: int) -> list[tuple[str, Callable[[Seg], str]]]:
    win = f"idle hook on / hook off / bound, GraceTime / bound, none / {pods} Pods"
    return [
        ("foreign jobs standing (array tasks)", _background),
        ("churn issued, changes/s", lambda s: num(get(s, "churn", "changes_per_s"))),
        (f"slurmgate -> slurmrestd requests/min: {win}", _requests),
        (f"slurmgate <- slurmrestd bytes: idle / {pods} Pods", _bytes),
        ("Slurm's CPU % of a core, slurmgate stopped (ctld + scriptd + restd)",
         lambda s: num(get(s, "stopped", "cpu_pct", SITE_TOTAL))),
        (f"**added by slurmgate**, % of a core: {win}", _added(SITE_TOTAL)),
        (f"  of which slurmrestd: {win}", _added("slurmrestd")),
        ("slurmctld's own time on root's RPCs (sdiag; slurmgate's, and the churn's cancels), "
         f"% of a core (RPCs a minute): slurmgate stopped; {win}", _ctld_rpc),
        (f"the same {pods} jobs in flight made directly (no Pods; what Slurm spends on "
         "jobs, any client's): added % of a core; slurmctld's time on root's RPCs % "
         "(a minute)", _direct),
        (f"**slurmgate's own in flight**: {pods} Pods less the same jobs made directly, % of a "
         "core: CPU difference; slurmctld's time on root's RPCs (sdiag, lock waits included)",
         _over_direct),
        ("binder's whole job list (GET jobs, made directly, median of 3)", _list("jobs")),
        ("binder's whole node list (GET nodes, node drift check, median of 3)",
         _list("nodes")),
        ("**added by slurmgate, idle**, % of a core: the window; + both whole lists amortized",
         _added_with_lists),
        (f"binder CPU %: idle / {pods} Pods, RSS peak MiB", _own("binder")),
        (f"webhook CPU %: idle / {pods} Pods, RSS peak MiB", _own("webhook")),
        (f"slowest read p99 ms ({pods} Pods window)", _slowest_read),
        (f"binder's state read p50 / p99 ms ({pods} Pods in flight); the same read direct, "
         "side by side, same buckets (p99 ratio)", _read_versus),
        ("admission p50 / p99 ms: marked; unmarked",
         _lats(("latency_hook", "admission"), ("unmarked", "admission"))),
        ("create -> bound p50 / p99 ms: hook on; off; kube-scheduler",
         _lats(("latency_hook", "create_to_bound"), ("latency_nohook", "create_to_bound"),
               ("unmarked", "create_to_bound"))),
        ("Slurm's own submit -> RUNNING p50 / p99 ms", _lats(("floor", "submit_to_running"))),
        ("Slurm RUNNING -> bound p50 / p99 ms: hook on; off",
         _lats(("latency_hook", "running_to_bound"), ("latency_nohook", "running_to_bound"))),
        ("start noticed by polls alone (hook off), RUNNING -> noticed p50 / p99 ms",
         _lats(("latency_nohook", "running_to_noticed"))),
        ("end noticed (Pod evicted) p50 / p99 ms: hook off; on",
         _lats(("latency_nohook", "end_noticed"), ("latency_hook", "end_noticed"))),
        ("submit p50 / p99 ms, one at a time: slurmgate POST job/submit; direct, same buckets "
         "(p99 ratio)",
         _versus("webhook", "POST", "job/submit", "submit")),
        ("slurmctld's own time on each submit (its usec=, lock waits included) p50 / p99 ms: "
         "the webhook's, hook off; on; the direct ones",
         _lats(("latency_nohook", "ctld_submit"), ("latency_hook", "ctld_submit"),
               ("floor", "ctld_submit"))),
        ("cancel p50 / p99 ms, Pods made one at a time: slurmgate DELETE job/{id}; direct, "
         "same buckets (p99 ratio)",
         _versus("binder", "DELETE", "job/{id}", "cancel")),
        ("single-job read p50 / p99 ms: binder GET job/{id}", _read("binder", "job/{id}")),
    ]


def endpoint_rows(segs: list[Seg]) -> list[str]:
    """Every "component METHOD endpoint" slurmgate called in any window or the whole running
    phase, sorted."""
    seen: set[str] = set()
    for s in segs:
        for rest in [get(s, k, "rest") for k in CALM] + [get(s, "calls")]:
            for c in COMPONENTS:
                for ep, r in (get(rest, c) or {}).items():
                    if ep == "all" or not isinstance(r, dict):
                        continue
                    seen.update(f"{c} {how.split(' ', 1)[0]} {ep}" for how in r.get("by") or {})
    return sorted(seen)


def _endpoint_cell(s: Seg, key: str) -> str:
    c, method, ep = key.split(" ", 2)
    per_min = _per_window(s, lambda w: get(by_method(get(w, "rest", c, ep), method),
                                           "per_min"))
    pods = get(s, "pods", "rest", c, ep) or {}
    shared = len({how.split(" ", 1)[0] for how in pods.get("by") or {}}) > 1
    return (f"{per_min}; {kib(number(pods.get('bytes_per_s')))}{'*' if shared else ''}; "
            f"{p50_99(call(s, c, method, ep))}")


def cell(text: str) -> str:
    """A Markdown table cell: a pipe in it would start the next one."""
    return text.replace("|", "\\|")


def release_table(results: dict[str, Any], pods: int) -> str:
    """The release's table: a row per figure, a column per N; then requests by endpoint."""
    segs = [s for s in results.get("by_n") or [] if isinstance(s, dict)]
    head = ["", *(f"N = {num(s.get('n'))}" for s in segs)]
    out = [f"### Slurm {results.get('slurm_version')} "
           f"(REST {results.get('rest_api', '?')})", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, f in rows(pods):
        out.append("| " + " | ".join(cell(x) for x in [label, *(f(s) for s in segs)]) + " |")
    eps = endpoint_rows(segs)
    if eps:
        out += ["", f"requests/min ({' / '.join(CALM)}); bytes/s in the {pods} Pods window "
                "(* the endpoint's, all its methods: bytes are counted per endpoint); "
                "p50 / p99 ms over the whole running phase", "",
                "| " + " | ".join(["endpoint", *head[1:]]) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join([e, *(_endpoint_cell(s, e) for s in segs)]) + " |"
                for e in eps]
    if results.get("error"):
        out += ["", f"**stopped early:** {results['error']}"]
    verdicts = results.get("targets") or {}
    if verdicts:
        out += ["", "targets (issue 29) at the largest N: " + "; ".join(
            f"{k} {num(v.get('value'))} (<= {num(v.get('limit'))}): "
            f"{'ok' if v.get('ok') else ('MISSED' if v.get('ok') is False else '-')}"
            + (f" ({v['note']})" if v.get("note") else "")
            for k, v in verdicts.items())]
    return "\n".join(out)
