"""``TableTidemark``, decoded on every tidemark read and built for every sink at every commit: its fast paths
(plain ints checked inline, a short list kept whole, a newer epoch appended without checking the kept ones
again, no ``asdict``, the JSON written out) keep every rule of the slow ones and give the same bytes."""
from __future__ import annotations

import random

import pytest

from coordinator.errors import CorruptState, InvalidArgument
from coordinator.records import (
    RECENT_PER_LEVEL,
    EpochInputs,
    EpochRecord,
    EpochState,
    JsonOutput,
    SourceRange,
    TableTidemark,
    keep_recent,
)


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


def test_advancing_and_encoding_a_tidemark_give_what_the_checked_constructor_and_the_generic_encoder_give():
    rng = random.Random(21)
    for table in ("ns.t", "ns.t\u00e9\"q"):
        mark, epoch = TableTidemark(table), 1_795_531_200_000
        for _ in range(300):
            epoch += rng.choice((1, 7, 1000, 60_000 - epoch % 60_000, 3_600_000 - epoch % 3_600_000))
            snapshot_id = rng.choice((None, rng.randrange(-2**63, 2**63)))
            advanced = mark.advanced(epoch, snapshot_id, epoch + 5)
            first = mark.first_epoch if mark.first_epoch is not None else epoch
            assert advanced == TableTidemark(table, epoch, snapshot_id, epoch + 5, first,
                                             (*mark.recent, (epoch, snapshot_id)))
            assert advanced.to_json() == JsonOutput.to_json(advanced)
            assert TableTidemark.from_json(advanced.to_json(), "t") == advanced
            mark = advanced
    assert TableTidemark("ns.t").to_json() == JsonOutput.to_json(TableTidemark("ns.t"))


@pytest.mark.parametrize("epoch, snapshot_id, committed_ms, message", [
    (True, 1, 2_000, "epoch must be a time"), (2**60, 1, 2_000, "epoch must be a time"),
    (2_000, "1", 2_000, "snapshot_id must be a 64-bit integer"), (2_000, 2**63, 2_000, "snapshot_id must be"),
    (2_000, 1, -1, "committed_ms must be a time"), (2_000, 1, 1.5, "committed_ms must be a time"),
])
def test_advancing_with_values_that_are_not_plain_checked_ints_is_refused(epoch, snapshot_id, committed_ms, message):
    mark = TableTidemark("ns.t").advanced(1_000, 1, 1_000)
    with pytest.raises(InvalidArgument, match=message):
        mark.advanced(epoch, snapshot_id, committed_ms)


def test_an_older_or_repeated_epoch_goes_through_the_checked_constructor():
    mark = TableTidemark("ns.t").advanced(1_000, 1, 1_000).advanced(3_000, 3, 3_000)
    assert mark.advanced(2_000, 2, 4_000).epochs == (1_000, 2_000, 3_000)
    assert mark.advanced(3_000, 4, 4_000).recent == ((1_000, 1), (3_000, 4)), "the last pair of an epoch wins"


def test_an_epoch_record_encodes_as_the_generic_encoder_does():
    inputs = EpochInputs({"ns.src": SourceRange(None, 5), "ns.other": SourceRange(3, 9)}, batch_id=4)
    record = EpochRecord(epoch=2_000, state=EpochState.COMMITTED, term=3, inputs=inputs,
                         staged={"ns.a": 1, "ns.b": None}, published={"ns.a": 1, "ns.b": 7}, updated_ms=2_001,
                         abort_reason="why")
    assert record.to_json() == JsonOutput.to_json(record)
    assert EpochRecord.from_json(record.to_json(), "e") == record
