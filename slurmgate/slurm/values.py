"""Reading Slurm's JSON values, whatever the release writes: plain numbers (v0.0.38) or
``{"set", "infinite", "number"}`` objects (v0.0.40+), a string or a list of strings. Shared by
the dialects and the records read beside them (slurmgate/slurm/allocation.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def num(v: Any, default: int = 0) -> int:
    """int from a plain number or a v0.0.40+ ``{"set", "infinite", "number"}`` object."""
    if v is None or isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
    if isinstance(v, Mapping):
        if not v.get("set", True) or v.get("infinite", False):
            return default
        return num(v.get("number"), default)
    if isinstance(v, str) and v.lstrip("-").isdigit():
        return int(v)
    return default


def opt_num(v: Any) -> int | None:
    """None for unset/infinite (and v0.0.38's -1/None), else the number."""
    if v is None:
        return None
    if isinstance(v, Mapping):
        if not v.get("set", True) or v.get("infinite", False):
            return None
        return opt_num(v.get("number"))
    n = num(v, -1)
    return None if n < 0 else n


def strs(v: Any) -> list[str]:
    if v is None:
        return []
    if isinstance(v, str):
        return [v] if v else []
    if isinstance(v, list | tuple):
        return [str(x) for x in v if x is not None and str(x)]
    return [str(v)]
