"""The local cluster's Unix users get one uid each, alone on the host and in the root."""

from __future__ import annotations

from cluster.unix_users import Change, Table, plan


def test_a_tenant_sharing_the_roots_uid_moves_the_roots_user_not_the_tenant() -> None:
    # what a fresh machine really had: host sg-team-a=999, the cached root's slurmrest=999
    # (and sg-team-a added beside it with -o by an older cluster)
    host = Table({"root": 0, "sg-team-a": 999, "sg-team-b": 995})
    root = Table({"root": 0, "slurmrest": 999, "sg-team-a": 999, "sg-team-b": 995})
    changes = plan(["slurmrest", "sg-team-a", "sg-team-b"], host, root)
    (new,) = {c.uid for c in changes}
    assert changes == [Change("host", "add", "slurmrest", new),
                       Change("root", "move", "slurmrest", new)]
    assert new not in (0, 995, 999)
    for t in (host, root):
        assert len(set(t.uids.values())) == len(t.uids)  # nobody shares a uid any more


def test_a_new_user_gets_a_uid_free_on_both_sides() -> None:
    host = Table({"a": 999, "b": 998})
    root = Table({"c": 997})
    assert plan(["t"], host, root) == [Change("host", "add", "t", 996),
                                       Change("root", "add", "t", 996)]


def test_settled_users_need_nothing_and_the_host_alone_works() -> None:
    assert plan(["t"], Table({"t": 990}), Table({"t": 990})) == []
    assert plan(["t"], Table({"x": 999}), None) == [Change("host", "add", "t", 998)]


def test_the_root_uid_is_kept_when_only_the_host_lacks_the_user() -> None:
    assert plan(["t"], Table({"x": 999}), Table({"t": 980})) == [Change("host", "add", "t", 980)]
