"""``EpochLineage`` answers a table's questions from one walk, its committed epoch and the record of it
(``committed_progress``) by one rule, on real Iceberg tables in a real SQLite catalog: no
ZooKeeper, the way a reader without it sees tables."""
from __future__ import annotations

import pytest

from coordinator import InputsExpired
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.publish import advance_committed_epoch, claim_table, publish_staged
from coordinator.iceberg.snapshots import COMMITTED_EPOCH_PROPERTY, appended_files, snapshot_index, snapshots_after
from coordinator.records import EpochProgress
from tests.helpers.lake import create_table, rows_of, stage_rows
from tests.helpers.present import present


def publish(table, epoch: int, rows: int = 1) -> int:
    staged = stage_rows(table, epoch, "job", 1, rows)
    return publish_staged(table, staged, epoch, 1).snapshot_id


def same_answers(table) -> EpochLineage:
    """The lineage's committed epoch is the one of the record ``committed_progress`` gives for ``table`` as loaded
    now."""
    table.refresh()
    lineage = EpochLineage(table)
    progress = lineage.committed_progress()
    assert lineage.committed_epoch == (progress.epoch if progress is not None else None)
    return lineage


def test_a_table_no_tidemark_job_writes_is_a_root_table(catalog, namespace):
    table = create_table(catalog, f"{namespace}.raw")
    table.append(rows_of(0, 3))
    lineage = same_answers(table)
    assert (lineage.committed_epoch, lineage.is_tidemark_table, lineage.first_epoch) == (None, False, None)


def test_a_claimed_table_with_no_epoch_yet_is_a_tidemark_table(catalog, namespace):
    table = create_table(catalog, f"{namespace}.claimed")
    claim_table(table, "job", 1)
    lineage = same_answers(table)
    assert (lineage.committed_epoch, lineage.is_tidemark_table) == (None, True)


def test_the_committed_epoch_is_the_newer_of_the_newest_epoch_snapshot_and_the_marker(catalog, namespace):
    table = create_table(catalog, f"{namespace}.t")
    claim_table(table, "job", 1)
    at_1000 = publish(table, 1000)
    at_2000 = publish(table, 2000)
    lineage = same_answers(table)
    assert lineage.committed_epoch == 2000 and lineage.first_epoch == 1000
    advance_committed_epoch(table, EpochProgress("job", 4000, 1), 1)  # 3000 and 4000 published nothing here
    lineage = same_answers(table)
    assert lineage.committed_epoch == 4000
    assert lineage.recorded_epochs() == ((1000, at_1000), (2000, at_2000), (4000, at_2000)), \
        "the marker's epoch is held by the newest snapshot below it"
    publish(table, 5000)
    assert same_answers(table).committed_epoch == 5000, "a snapshot newer than the marker"


def test_the_markers_epoch_is_read_alone_and_an_unreadable_one_goes_by_the_whole_record(catalog, namespace):
    table = create_table(catalog, f"{namespace}.m")
    claim_table(table, "job", 1)
    advance_committed_epoch(table, EpochProgress("job", 3000, 1), 1)
    assert same_answers(table).committed_epoch == 3000
    with table.transaction() as tx:
        tx.set_properties({COMMITTED_EPOCH_PROPERTY: "²"})  # a digit to str.isdigit, not to int()
    assert same_answers(table).committed_epoch == 3000, "the whole record (tidemark.committed) says 3000"


def test_the_rows_appended_after_a_snapshot_are_told_after_that_snapshot_itself_was_expired(catalog, namespace):
    """``appended_files(start, end)`` reads the snapshots above ``start``: age-based expiry removes ``start`` first.
    Iceberg's Java expiry (Trino's, Spark's, a catalog's) keeps its id as its child's parent, and the snapshots after
    it are still found (``snapshots_after``, on the table's real snapshots without ``start``); pyiceberg's expiry
    clears that parent id, and a gap in between is a gap: both are ``InputsExpired``, said as such."""
    table = create_table(catalog, f"{namespace}.raw")
    for first in (0, 3, 6):
        table.append(rows_of(first, 3))
    *_, start, middle, end = [s.snapshot_id for s in reversed(list(EpochLineage(table).main))]
    by_id = snapshot_index(table)
    assert sum(f.record_count for f in appended_files(table, start, end)) == 6, "the rows of the two appends"
    without_start = {i: s for i, s in by_id.items() if i != start}
    assert [s.snapshot_id for s in present(snapshots_after(without_start, start, end))] == [end, middle]
    assert snapshots_after({i: s for i, s in by_id.items() if i != middle}, start, end) is None, "a gap in between"
    table.maintenance.expire_snapshots().by_id(start).commit()
    table.refresh()
    with pytest.raises(InputsExpired, match="was expired outside Tidemark"):
        appended_files(table, start, end)
