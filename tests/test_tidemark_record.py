"""``TableTidemark``, decoded on every tidemark read and built for every sink at every commit: its fast paths
(plain ints checked inline, a short list kept whole, no ``asdict``) keep every rule of the slow ones."""
from __future__ import annotations

import pytest

from coordinator.errors import CorruptState
from coordinator.records import RECENT_PER_LEVEL, TableTidemark, keep_recent


def test_a_tidemark_round_trips_and_keeps_the_newest_and_the_aligned_epochs():
    mark = TableTidemark("ns.t")
    for epoch in range(5_000, 200_000, 5_000):
        mark = mark.advanced(epoch, epoch * 10, epoch)
    assert TableTidemark.from_json(mark.to_json(), "t") == mark
    epochs = mark.epochs
    assert epochs[-RECENT_PER_LEVEL:] == tuple(range(200_000 - 5_000 * RECENT_PER_LEVEL, 200_000, 5_000))
    assert {60_000, 120_000, 180_000} <= set(epochs) and 10_000 not in epochs, "minute-aligned ones stay longer"
    short = [(3000, None), (1000, 5), (2000, 6), (1000, 7)]
    assert keep_recent(short) == ((1000, 7), (2000, 6), (3000, None)), "sorted, the last pair of an epoch wins"


@pytest.mark.parametrize("recent, message", [
    ('[[1000]]', "recent entries are \\[epoch, snapshot_id\\] pairs"),
    ('[{"a": 1}]', "recent entries are \\[epoch, snapshot_id\\] pairs"),
    ('["ab"]', "recent entries are \\[epoch, snapshot_id\\] pairs"),
    ('[[true, 1]]', "recent epoch must be a time in milliseconds"),
    ('[[-1, 1]]', "recent epoch must be a time in milliseconds"),
    ('[[1.5, 1]]', "recent epoch must be a time in milliseconds"),
    ('[[1000, "7"]]', "recent snapshot_id must be a 64-bit integer"),
    ('[[1000, 9223372036854775808]]', "recent snapshot_id must be a 64-bit integer"),
    ('{"1000": 1}', "recent must be a list"),
])
def test_a_corrupt_recent_list_is_refused_naming_the_znode(recent, message):
    raw = b'{"table": "ns.t", "epoch": 1000, "snapshot_id": 1, "recent": ' + recent.encode() + b'}'
    with pytest.raises(CorruptState, match=f"/t/tidemark: invalid TableTidemark: {message}"):
        TableTidemark.from_json(raw, "/t/tidemark")
