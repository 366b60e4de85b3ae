"""Kubernetes resource quantities ("1Gi", "500m", "2e3") as exact Fractions."""

from __future__ import annotations

import math
import re
from fractions import Fraction

# Kubernetes' suffixes: SI (n, u, m, none, k ... E: powers of 1000) and binary (Ki ... Ei)
_SUFFIX = {
    **{s: Fraction(1000) ** (i - 3) for i, s in enumerate(["n", "u", "m", "", *"kMGTPE"])},
    **{f"{s}i": Fraction(2 ** (10 * i)) for i, s in enumerate("KMGTPE", 1)},
}
_RE = re.compile(
    r"^([+-]?)(\d+(?:\.\d*)?|\.\d+)(?:([eE][+-]?\d{1,3})|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]))?$"
)


class QuantityError(ValueError):
    pass


def parse(value: object) -> Fraction:
    """Parse a quantity; ints/floats are accepted as plain numbers."""
    if isinstance(value, bool):
        raise QuantityError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"not a quantity: {value!r}")
        return Fraction(value)
    if not isinstance(value, str) or len(value) > 64:
        raise QuantityError(f"not a quantity: {str(value)[:64]!r}")
    m = _RE.match(value.strip())
    if not m:
        raise QuantityError(f"not a quantity: {value!r}")
    sign, number, exp, suffix = m.groups()
    q = Fraction(number)
    if exp:
        q *= Fraction(10) ** int(exp[1:])
    elif suffix:
        q *= _SUFFIX[suffix]
    return -q if sign == "-" else q


def to_mib_ceil(q: Fraction) -> int:
    return math.ceil(q / 2**20)


def to_int_ceil(q: Fraction) -> int:
    return math.ceil(q)
