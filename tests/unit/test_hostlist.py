from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmgate.hostlist import compress, expand

EXPAND_CASES: list[tuple[str | None, list[str]]] = [
    (None, []),
    ("", []),
    ("(null)", []),
    ("n1", ["n1"]),
    ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
    ("gpu[01-02],cpu1", ["gpu01", "gpu02", "cpu1"]),
    ("a,b,c", ["a", "b", "c"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[08-10]", ["n08", "n09", "n10"]),
    ("n[1-2]-ib", ["n1-ib", "n2-ib"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("n[3,1-2],m[7]", ["n3", "n1", "n2", "m7"]),
    ("node-a, node-b", ["node-a", "node-b"]),
    ("n[5]", ["n5"]),
]


@pytest.mark.parametrize(("expr", "hosts"), EXPAND_CASES)
def test_expand(expr: str | None, hosts: list[str]) -> None:
    assert expand(expr) == hosts


COMPRESS_CASES: list[tuple[list[str], str]] = [
    ([], ""),
    (["n1"], "n1"),
    (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
    (["gpu01", "gpu02", "cpu1"], "gpu[01-02],cpu1"),
    (["n8", "n9", "n10"], "n[8-10]"),
    (["n09", "n10"], "n[09-10]"),
    (["n9", "n010"], "n[9,010]"),
    (["a", "b"], "a,b"),
    (["n2", "n1"], "n[2,1]"),
    (["n1", "x", "n2"], "n1,x,n2"),
]


@pytest.mark.parametrize(("hosts", "expr"), COMPRESS_CASES)
def test_compress(hosts: list[str], expr: str) -> None:
    assert compress(hosts) == expr
    assert expand(expr) == hosts


@pytest.mark.parametrize(
    "bad", ["n[1-", "n]1", "n[a-b]", "n[3-1]", "n[1-2", "n[[1]]", "n[1,,2]", "n[0-99999999]"]
)
def test_expand_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        expand(bad)


@pytest.mark.parametrize("bad", ["n[1]", "a,b", "", " x"])
def test_compress_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        compress([bad])


_name = st.builds(
    lambda prefix, num, pad: prefix + (str(num).zfill(pad) if num is not None else ""),
    st.text(alphabet="abcxyz-_.", min_size=1, max_size=4),
    st.one_of(st.none(), st.integers(min_value=0, max_value=120)),
    st.integers(min_value=0, max_value=4),
)


@given(st.lists(_name, max_size=30))
def test_round_trip(hosts: list[str]) -> None:
    assert expand(compress(hosts)) == hosts


@given(st.lists(st.integers(min_value=0, max_value=200), max_size=40))
def test_round_trip_numbers(nums: list[int]) -> None:
    hosts = [f"n{n}" for n in nums]
    expr = compress(hosts)
    assert expand(expr) == hosts
    assert expr.count("[") <= 1
