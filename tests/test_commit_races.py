"""Publishing when another commit lands between loading the table and committing to it.

pyiceberg reports some of those lost races as a plain ``ValueError`` (the catalog re-applies our
updates to the newer metadata and refuses them), not as ``CommitFailedException``; a driver must
see them retried, then ``PublishConflict``, never the raw error. The concurrent commit is made to
land at an exact point (right after a load), not by timing.
"""
from __future__ import annotations

import pytest
from pyiceberg.exceptions import CommitStateUnknownException

from coordinator.errors import PublishConflict
from coordinator.iceberg import publish
from coordinator.iceberg.publish import PublishOutcome, publish_staged
from coordinator.iceberg.snapshots import snapshot_epoch
from coordinator.iceberg.staging import stage_append
from tests.helpers.lake import create_table, rows_of, stage_rows


def _commit_after_loads(monkeypatch, table, catalog_settings, loads: int) -> list[int]:
    """Now, then after each of ``table``'s next loads (``refresh``), ``loads`` times in all, another handle appends
    a row to a branch of its own (a snapshot that takes the next sequence number, main unmoved): the write staged
    on the metadata as loaded no longer applies; returns the sequence numbers the loads saw, the first one's first."""
    other = catalog_settings.load().load_table(table.name())
    other.manage_snapshots().create_branch(other.current_snapshot().snapshot_id, "side").commit()
    refresh, seen = table.refresh, [table.metadata.last_sequence_number]
    if loads:
        other.append(rows_of(0, 1), branch="side")

    def load_then_race():
        loaded = refresh()
        seen.append(table.metadata.last_sequence_number)
        if len(seen) <= loads:
            other.append(rows_of(0, 1), branch="side")
        return loaded

    monkeypatch.setattr(table, "refresh", load_then_race)
    return seen


def test_a_publish_that_lost_a_race_is_retried_from_a_fresh_load(catalog_settings, namespace, monkeypatch):
    table = create_table(catalog_settings.load(), f"{namespace}.raced")
    write = stage_append(table, rows_of(3000, 3), 3000, "job", 1)
    seen = _commit_after_loads(monkeypatch, table, catalog_settings, loads=1)

    # was: ValueError "Cannot add snapshot with sequence number 2 older than last sequence number 2"
    result = publish_staged(table, write.snapshot_id, 3000, term=1, write=write)

    assert result.outcome == PublishOutcome.PUBLISHED
    assert len(seen) == 2 and seen[1] > seen[0], "the lost attempt is retried from a fresh load"
    assert snapshot_epoch(table.current_snapshot()) == 3000 and table.scan().to_arrow().num_rows == 3


def test_a_publish_that_keeps_losing_raises_publish_conflict(catalog_settings, namespace, monkeypatch):
    table = create_table(catalog_settings.load(), f"{namespace}.contended")
    write = stage_append(table, rows_of(4000, 2), 4000, "job", 1)
    seen = _commit_after_loads(monkeypatch, table, catalog_settings, loads=publish.PUBLISH_ATTEMPTS)

    with pytest.raises(PublishConflict, match="kept losing commit races"):
        publish_staged(table, write.snapshot_id, 4000, term=1, write=write)

    assert len(seen) == 1 + publish.PUBLISH_ATTEMPTS, "one load per lost attempt"
    assert all(snapshot_epoch(s) != 4000 for s in catalog_settings.load().load_table(table.name()).snapshots()), \
        "no attempt landed"


def test_staging_does_not_hide_a_value_error_of_its_own(catalog_settings, namespace):
    """A write pyiceberg refuses fails at once, unchanged."""
    table = create_table(catalog_settings.load(), f"{namespace}.refused")

    with pytest.raises(ValueError) as raised:
        stage_append(table, rows_of(5000, 1).drop_columns(["row"]), 5000, "job", 1)

    assert not isinstance(raised.value, PublishConflict)


def test_publishing_a_snapshot_expired_after_the_load_raises_publish_conflict(catalog_settings, namespace):
    """A snapshot staged in the catalog (as Spark's write-audit-publish stages one)."""
    table = create_table(catalog_settings.load(), f"{namespace}.expired")
    staged = stage_rows(table, 6000, "job", 1, 2)
    # GC (another handle) expires the unpublished snapshot after this driver loaded the table: main did not
    # move, so the commit's requirements hold and pyiceberg refuses the update itself ("Cannot set main to
    # unknown snapshot"), a ValueError
    catalog_settings.load().load_table(table.name()).maintenance.expire_snapshots().by_id(staged).commit()

    with pytest.raises(PublishConflict, match="does not exist"):
        publish_staged(table, staged, 6000, term=1)


@pytest.mark.parametrize("staged_in_catalog", [False, True], ids=["staged-write", "staged-snapshot"])
def test_publishing_whose_commit_state_is_unknown_finds_it_published(catalog_settings, namespace, monkeypatch,
                                                                     staged_in_catalog):
    """A catalog that answers 'state unknown' (a REST 502 after the commit landed): the retry looks again."""
    table = create_table(catalog_settings.load(), f"{namespace}.unknown")
    if staged_in_catalog:
        write, staged = None, stage_rows(table, 7000, "job", 1, 2)
    else:
        write = stage_append(table, rows_of(7000, 2), 7000, "job", 1)
        staged = write.snapshot_id
    commit_table, answered = table.catalog.commit_table, []

    def commit_then_lose_the_answer(*args, **kwargs):
        commit_table(*args, **kwargs)
        answered.append(False)
        raise CommitStateUnknownException("502 Bad Gateway")

    monkeypatch.setattr(table.catalog, "commit_table", commit_then_lose_the_answer)
    result = publish_staged(table, staged, 7000, term=1, write=write)

    assert answered == [False] and result.outcome == PublishOutcome.ALREADY_PUBLISHED
    assert result.snapshot_id == staged == table.current_snapshot().snapshot_id
    assert table.scan().to_arrow().num_rows == 2
