"""Slurm hostlist expressions: ``"n[1-3,5]"`` <-> ``["n1", "n2", "n3", "n5"]``.

Supported: comma-separated items at top level, any number of bracket groups per item
(``"r[1-2]n[01-02]"`` expands as a cartesian product, leftmost group outermost), ranges
``lo-hi`` with zero padding taken from ``lo`` (``"[08-10]"`` -> 08, 09, 10), and text after a
bracket (``"n[1-2]-ib"``). Expansion keeps the order of the expression (Slurm's order).
"""

from __future__ import annotations

import itertools
import re

__all__ = ["compress", "expand"]

_MAX_HOSTS = 1_000_000  # refuse absurd expressions instead of eating all memory
_TRAILING_DIGITS = re.compile(r"^(.*?)(\d+)$", re.DOTALL)


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    items: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in expr:
        if ch == "[":
            if depth:
                raise ValueError(f"nested '[' in hostlist {expr!r}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"unbalanced ']' in hostlist {expr!r}")
            depth = 0
        elif ch == "," and not depth:
            items.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {expr!r}")
    items.append("".join(cur))
    return [i.strip() for i in items if i.strip()]


def _expand_range(body: str, expr: str) -> list[str]:
    out: list[str] = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise ValueError(f"empty range in hostlist {expr!r}")
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {part!r} in hostlist {expr!r}")
        if not sep:
            out.append(lo)
            continue
        a, b = int(lo), int(hi)
        if b < a:
            raise ValueError(f"descending range {part!r} in hostlist {expr!r}")
        if b - a >= _MAX_HOSTS:
            raise ValueError(f"range {part!r} too large in hostlist {expr!r}")
        width = len(lo)
        out.extend(str(n).zfill(width) for n in range(a, b + 1))
    return out


def _expand_item(item: str, expr: str) -> list[str]:
    # Alternate literal text and bracket bodies: "r", "1-2", "n", "01-02", "".
    pieces = re.split(r"\[([^\]]*)\]", item)
    choices: list[list[str]] = []
    for i, piece in enumerate(pieces):
        if i % 2 == 0:
            if "[" in piece or "]" in piece:
                raise ValueError(f"unbalanced brackets in hostlist {expr!r}")
            choices.append([piece])
        else:
            choices.append(_expand_range(piece, expr))
    total = 1
    for c in choices:
        total *= len(c)
    if total > _MAX_HOSTS:
        raise ValueError(f"hostlist {expr!r} expands to too many hosts")
    return ["".join(p) for p in itertools.product(*choices)]


def expand(expr: str | None) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in expression order.

    ``""``, ``None`` and Slurm's ``"(null)"`` give ``[]``. Raises ValueError when malformed.
    """
    if not expr or expr.strip() in ("", "(null)", "None"):
        return []
    out: list[str] = []
    for item in _split_top(expr):
        out.extend(_expand_item(item, expr))
        if len(out) > _MAX_HOSTS:
            raise ValueError(f"hostlist {expr!r} expands to too many hosts")
    return out


def _fmt_range(lo: str, hi: str) -> str:
    return lo if lo == hi else f"{lo}-{hi}"


def compress(hosts: list[str] | tuple[str, ...]) -> str:
    """Compress host names into a hostlist expression, keeping their order.

    Consecutive names sharing a prefix and ending in consecutive numbers of the same padding
    merge into one bracket: ``["n1", "n2", "n3", "n5", "x"]`` -> ``"n[1-3,5],x"``.
    ``expand(compress(hosts)) == list(hosts)`` for names without ``[``, ``]`` or ``,``.
    """
    groups: list[tuple[str, list[list[str]]]] = []  # prefix, [lo, hi] digit strings
    plain: list[str | None] = []  # parallel to groups: a non-numeric name, else None
    for h in hosts:
        if any(c in h for c in "[],") or not h.strip() or h != h.strip():
            raise ValueError(f"cannot compress host name {h!r}")
        m = _TRAILING_DIGITS.match(h)
        if not m:
            groups.append((h, []))
            plain.append(h)
            continue
        prefix, digits = m.group(1), m.group(2)
        if groups and plain[-1] is None and groups[-1][0] == prefix:
            ranges = groups[-1][1]
            lo, hi = ranges[-1]
            if str(int(hi) + 1).zfill(len(lo)) == digits:
                ranges[-1][1] = digits
            else:
                ranges.append([digits, digits])
            continue
        groups.append((prefix, [[digits, digits]]))
        plain.append(None)

    out: list[str] = []
    for (prefix, ranges), name in zip(groups, plain, strict=True):
        if name is not None:
            out.append(name)
            continue
        parts = [_fmt_range(lo, hi) for lo, hi in ranges]
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            out.append(prefix + parts[0])
        else:
            out.append(f"{prefix}[{','.join(parts)}]")
    return ",".join(out)
