"""Writing Iceberg tables from plain Python the way a Tidemark writer does (for tests without Spark)."""
from __future__ import annotations

import uuid

import pyarrow as pa

from coordinator.snapshots import summary_properties

SCHEMA = pa.schema([pa.field("epoch", pa.int64(), nullable=False), pa.field("row", pa.int64(), nullable=False)])


def create_table(catalog, identifier: str):
    """A table with one empty, epoch-less snapshot (pyiceberg can only branch from an existing snapshot)."""
    namespace = identifier.rsplit(".", 1)[0]
    catalog.create_namespace_if_not_exists(namespace)
    table = catalog.create_table(identifier, schema=SCHEMA)
    table.append(SCHEMA.empty_table())
    assert table.current_snapshot() is not None
    return table


def stage_rows(table, epoch: int, job: str, term: int, rows: int) -> int:
    """Write ``rows`` rows of ``epoch`` as a staged snapshot (not on main); returns its id."""
    table.refresh()
    branch = f"stage-{epoch}-{uuid.uuid4().hex[:6]}"
    head = table.current_snapshot()
    if head is not None:
        table.manage_snapshots().create_branch(head.snapshot_id, branch).commit()
    data = pa.table({"epoch": pa.array([epoch] * rows, pa.int64()), "row": pa.array(range(rows), pa.int64())},
                    schema=SCHEMA)
    table.append(data, snapshot_properties=summary_properties(epoch, job, term), branch=branch)
    staged = table.metadata.refs[branch].snapshot_id
    table.manage_snapshots().remove_branch(branch).commit()
    return staged


def lead_job(tm, catalog, job: str, sinks: list[str]):
    """Register ``job``, lead it and recover: an ``EpochCommitter`` ready for its next epoch."""
    from coordinator import EpochCoordinator
    from coordinator.commit import EpochCommitter
    tm.register_job(job, sources=[], sinks=sinks)
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, sinks, tm.barriers.ensure_grid(1000))
    epochs.recover()
    return EpochCommitter(epochs, catalog.load_table)


def commit_rows(committer, table, epoch: int, rows: int = 1) -> int:
    """Run one whole epoch that stages ``rows`` rows into ``table`` (the job's only sink); returns the snapshot."""
    committer.epochs.begin(epoch, {})
    staged = stage_rows(table, epoch, committer.epochs.job, committer.epochs.leadership.term, rows)
    committer.finish(epoch, {committer.epochs.sinks[0]: staged})
    return staged
