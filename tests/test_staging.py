"""Staging from plain Python on a real catalog: one catalog commit per staged write, invisible to readers."""
from __future__ import annotations

from coordinator.iceberg.publish import publish_staged
from coordinator.iceberg.snapshots import snapshot_epoch
from coordinator.iceberg.staging import stage_append, stage_overwrite
from tests.helpers.lake import create_table, rows_of


def _metadata_files(table) -> int:
    """Metadata files the table has had (each catalog commit writes one)."""
    return len(table.metadata.metadata_log) + 1


def test_a_staged_write_is_one_commit_in_no_ref_and_publishes(catalog_settings, namespace):
    table = create_table(catalog_settings.load(), f"{namespace}.staged")
    head = table.current_snapshot().snapshot_id
    before = _metadata_files(table)

    staged = stage_overwrite(table, rows_of(1000, 3), 1000, "job", 1)

    table.refresh()
    assert _metadata_files(table) == before + 1, "branch, write and branch removal must land in one commit"
    assert set(table.metadata.refs) == {"main"} and table.current_snapshot().snapshot_id == head
    assert snapshot_epoch(table.snapshot_by_id(staged)) == 1000
    publish_staged(table, staged, 1000, term=1)
    assert table.scan().to_arrow().num_rows == 3


def test_a_branch_left_by_a_crashed_attempt_is_replaced(catalog_settings, namespace):
    table = create_table(catalog_settings.load(), f"{namespace}.leftover")
    branch = "tidemark-stage-job-2000-1"
    table.manage_snapshots().create_branch(table.current_snapshot().snapshot_id, branch).commit()

    staged = stage_append(table, rows_of(2000, 2), 2000, "job", 1)

    table.refresh()
    assert branch not in table.metadata.refs
    assert table.scan(snapshot_id=staged).to_arrow().num_rows == 2
