"""Writing Iceberg tables from plain Python the way a Tidemark writer does (for tests without Spark)."""
from __future__ import annotations

import uuid

import pyarrow as pa

from coordinator import CatalogSettings, EpochState, EpochWriter
from coordinator.iceberg.snapshots import summary_properties
from tests.helpers.present import present

SCHEMA = pa.schema([pa.field("epoch", pa.int64(), nullable=False), pa.field("row", pa.int64(), nullable=False)])


def create_table(catalog, identifier: str, schema: pa.Schema = SCHEMA, *, first_snapshot: bool = True):
    """A table in its namespace (created if need be), with one empty, epoch-less snapshot unless ``first_snapshot``
    is False (pyiceberg's branching in ``stage_rows`` starts from an existing snapshot; a writer's does not)."""
    namespace = identifier.rsplit(".", 1)[0]
    catalog.create_namespace_if_not_exists(namespace)
    table = catalog.create_table(identifier, schema=schema)
    if first_snapshot:
        table.append(schema.empty_table())
        assert table.current_snapshot() is not None
    return table


def rows_of(epoch: int, rows: int) -> pa.Table:
    """``rows`` rows of ``epoch``, numbered from 0."""
    return pa.table({"epoch": pa.array([epoch] * rows, pa.int64()), "row": pa.array(range(rows), pa.int64())},
                    schema=SCHEMA)


def stage_rows(table, epoch: int, job: str, term: int, rows: int) -> int:
    """Write ``rows`` rows of ``epoch`` as a staged snapshot (not on main); returns its id."""
    table.refresh()
    branch = f"stage-{epoch}-{uuid.uuid4().hex[:6]}"
    head = table.current_snapshot()
    if head is not None:
        table.manage_snapshots().create_branch(head.snapshot_id, branch).commit()
    table.append(rows_of(epoch, rows), snapshot_properties=summary_properties(epoch, job, term), branch=branch)
    staged = table.metadata.refs[branch].snapshot_id
    table.manage_snapshots().remove_branch(branch).commit()
    return staged


def lead_job(tm, settings: CatalogSettings, job: str, sinks: list[str], sources: tuple[str, ...] = (),
             **options) -> EpochWriter:
    """An ``EpochWriter`` for ``job`` on the shared 1-second grid, opened: registered, leading, recovered
    (``options``: more ``EpochWriter`` arguments, such as ``marker_every``)."""
    writer = EpochWriter(tm, job, sources=sources, sinks=sinks, catalog=settings, interval_ms=1000, grace_ms=0,
                         **options)
    writer.open(leader_timeout=30)
    return writer


def commit_rows(writer: EpochWriter, epoch: int, rows: int = 1) -> int:
    """Process barrier ``epoch`` with ``writer`` (any grid point after its last epoch: a job picks its own
    epochs), appending ``rows`` rows to its only sink; returns the snapshot published for the epoch."""
    (sink,) = writer.sinks
    record = writer.process(epoch, lambda ctx: ctx.append(sink, rows_of(epoch, rows)),
                            inputs=writer.inputs_for(epoch))
    assert record.state == EpochState.COMMITTED and record.staged[sink] == record.published[sink]
    return present(record.published[sink])
