"""``read_many``: many znodes in one ZooKeeper ``multiRead`` per batch, on a real server, answering exactly as
``get_many`` (one request per znode) does: data and stat, None for a missing znode, ``PermissionDenied`` for a
znode this session may not read."""
from __future__ import annotations

import pytest
from kazoo.security import make_digest_acl

from coordinator.errors import PermissionDenied
from coordinator.zookeeper.multiread import BATCH, read_many


def test_read_many_answers_as_get_many_across_batches(tm):
    paths = [f"{tm.paths.tables}/t{i:04d}" for i in range(BATCH + 44)]
    for i, path in enumerate(paths):
        if i % 7:  # every 7th one is missing
            tm.client.create(path, f"value {i}".encode() * (i % 5), makepath=True)
    found = read_many(tm, paths)
    assert found == tm.get_many(paths)
    assert [i for i, f in enumerate(found) if f is None] == list(range(0, len(paths), 7))
    assert found[3] is not None and found[3][0] == b"value 3" * 3
    assert read_many(tm, []) == []


def test_a_znode_this_session_may_not_read_is_refused_as_by_get(tm):
    secret = f"{tm.paths.tables}/secret"
    tm.client.create(secret, b"x", acl=[make_digest_acl("someone", "else", all=True)], makepath=True)
    open_one = f"{tm.paths.tables}/open"
    tm.client.create(open_one, b"y")
    with pytest.raises(PermissionDenied):
        tm.get(secret)
    with pytest.raises(PermissionDenied):
        read_many(tm, [open_one, secret])
