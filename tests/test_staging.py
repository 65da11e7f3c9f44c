"""Staging from plain Python on a real catalog: no catalog commit until the publish, which is one commit."""
from __future__ import annotations

import pytest

from coordinator.errors import PublishConflict
from coordinator.iceberg.publish import PublishOutcome, publish_staged
from coordinator.iceberg.snapshots import snapshot_epoch
from coordinator.iceberg.staging import stage_append, stage_overwrite, staged_snapshots
from coordinator.records import EpochRecord, EpochState, StagedWrite, WriteMode
from tests.helpers.lake import create_table, rows_of


def _metadata_files(table) -> int:
    """Metadata files the table has had (each catalog commit writes one)."""
    return len(table.metadata.metadata_log) + 1


def _publish(table, write: StagedWrite, epoch: int):
    return publish_staged(table, write.snapshot_id, epoch, term=1, write=write)


def test_a_staged_write_commits_nothing_and_publishes_in_one_commit(catalog_settings, namespace):
    table = create_table(catalog_settings.load(), f"{namespace}.staged")
    head = table.current_snapshot().snapshot_id
    before = _metadata_files(table)

    write = stage_overwrite(table, rows_of(1000, 3), 1000, "job", 1)

    table.refresh()
    assert _metadata_files(table) == before, "staging must make no catalog commit"
    assert table.snapshot_by_id(write.snapshot_id) is None and table.current_snapshot().snapshot_id == head
    assert write.mode == WriteMode.OVERWRITE and write.base == head
    snapshots = staged_snapshots(write)
    assert all(snapshot_epoch(s) == 1000 for s in snapshots) and snapshots[0].parent_snapshot_id == head
    assert all(table.io.new_input(s.manifest_list).exists() for s in snapshots), "its files are in storage"

    result = _publish(table, write, 1000)

    assert result.outcome == PublishOutcome.PUBLISHED and result.snapshot_id == write.snapshot_id
    assert _metadata_files(table) == before + 1, "the snapshots and the move of main must land in one commit"
    fresh = catalog_settings.load().load_table(table.name())
    assert fresh.current_snapshot().snapshot_id == write.snapshot_id and fresh.scan().to_arrow().num_rows == 3


def test_an_append_to_a_table_with_no_snapshot_publishes_with_no_empty_snapshot(catalog_settings, namespace):
    catalog = catalog_settings.load()
    table = create_table(catalog, f"{namespace}.fresh", first_snapshot=False)

    write = stage_append(table, rows_of(2000, 2), 2000, "job", 1)
    assert write.base is None
    _publish(table, write, 2000)

    fresh = catalog.load_table(table.name())
    assert [s.snapshot_id for s in fresh.snapshots()] == [write.snapshot_id], "no empty first snapshot"
    assert fresh.current_snapshot().parent_snapshot_id is None and fresh.scan().to_arrow().num_rows == 2


def test_a_write_built_on_a_head_another_snapshot_outnumbered_is_built_again(catalog_settings, namespace):
    """A snapshot added elsewhere (another branch) took the staged snapshot's sequence number: the publish builds
    the write again on main's head from the same data files, and the other branch is left as it is."""
    catalog = catalog_settings.load()
    table = create_table(catalog, f"{namespace}.outnumbered")
    table.append(rows_of(500, 4))
    write = stage_append(table, rows_of(3000, 3), 3000, "job", 1)
    outnumber(catalog, table)

    result = _publish(table, write, 3000)

    assert result.outcome == PublishOutcome.PUBLISHED and result.snapshot_id != write.snapshot_id
    fresh = catalog.load_table(table.name())
    published = fresh.snapshot_by_id(result.snapshot_id)
    assert snapshot_epoch(published) == 3000 and published.parent_snapshot_id == write.base
    assert sorted(fresh.scan().to_arrow()["epoch"].to_pylist()) == [500] * 4 + [3000] * 3
    staged_files = {f.file_path for f in _data_files(table, write.snapshot_id, staged_snapshots(write)[-1])}
    assert staged_files and staged_files <= {task.file.file_path for task in fresh.scan().plan_files()}, \
        "the rows staged are published, not written again"
    assert fresh.scan(snapshot_id=fresh.metadata.refs["audit"].snapshot_id).to_arrow().num_rows == 4 + 1


def outnumber(catalog, table) -> None:
    """Another handle adds a snapshot to a branch of its own, ``audit``: it takes the next sequence number, and
    ``main`` stays where it is."""
    other = catalog.load_table(table.name())
    other.manage_snapshots().create_branch(other.current_snapshot().snapshot_id, "audit").commit()
    other.append(rows_of(0, 1), branch="audit")


def _data_files(table, snapshot_id, snapshot):
    return [entry.data_file for manifest in snapshot.manifests(table.io) if manifest.added_snapshot_id == snapshot_id
            for entry in manifest.fetch_manifest_entry(table.io)]


def test_an_overwrite_built_again_replaces_every_row_of_the_new_head(catalog_settings, namespace):
    catalog = catalog_settings.load()
    table = create_table(catalog, f"{namespace}.replaced")
    table.append(rows_of(500, 4))
    write = stage_overwrite(table, rows_of(4000, 2), 4000, "job", 1)
    outnumber(catalog, table)

    result = _publish(table, write, 4000)

    fresh = catalog.load_table(table.name())
    assert result.snapshot_id == fresh.current_snapshot().snapshot_id
    assert fresh.scan().to_arrow()["epoch"].to_pylist() == [4000, 4000]


def test_a_write_whose_main_another_writer_moved_is_refused(catalog_settings, namespace):
    catalog = catalog_settings.load()
    table = create_table(catalog, f"{namespace}.moved")
    write = stage_append(table, rows_of(5000, 2), 5000, "job", 1)
    catalog.load_table(table.name()).append(rows_of(0, 1))  # outside Tidemark, on main

    with pytest.raises(PublishConflict, match="main moved"):
        _publish(table, write, 5000)
    assert all(snapshot_epoch(s) != 5000 for s in catalog.load_table(table.name()).snapshots())


def test_a_roll_forward_whose_staged_files_are_gone_says_so(catalog_settings, namespace):
    table = create_table(catalog_settings.load(), f"{namespace}.gone")
    write = stage_append(table, rows_of(6000, 2), 6000, "job", 1)
    table.io.delete(staged_snapshots(write)[-1].manifest_list)  # what an orphan removal with a short cutoff does

    with pytest.raises(PublishConflict, match="gone from storage"):
        publish_staged(table, write.snapshot_id, 6000, term=1, write=write, verify_files=True)


def test_a_precommitted_record_keeps_its_writes_and_a_committed_one_drops_them(catalog_settings, namespace):
    table = create_table(catalog_settings.load(), f"{namespace}.recorded")
    write = stage_append(table, rows_of(7000, 2), 7000, "job", 1)
    record = EpochRecord(epoch=7000, state=EpochState.PRECOMMITTED, term=1, staged={"t": write.snapshot_id},
                         writes={"t": write})

    again = EpochRecord.from_json(record.to_json())

    assert again.writes["t"] == write and staged_snapshots(again.writes["t"]) == staged_snapshots(write)
    assert again.writes["t"].snapshot_id == again.staged["t"]
