"""Staged (unpublished) writes from plain Python with pyiceberg: write-audit-publish without Spark.

    snapshot_id = stage_append(table, arrow_table, epoch=T, job="counts", term=3, inputs=ctx.inputs)
    snapshot_id = stage_overwrite(table, arrow_table, epoch=T, job="counts", term=3, inputs=ctx.inputs)

The rows are committed to a private branch ``tidemark-stage-<job>-<T>-<term>`` cut from
``main``'s head; the branch is then dropped, leaving a snapshot that is in no ref (invisible
to readers) whose summary carries the epoch's progress record (``snapshots.summary_properties``),
until ``publish_staged`` moves ``main`` to it.
pyiceberg cannot branch from a table with no snapshot, so an empty table first gets one
empty snapshot on ``main`` (it carries no epoch and no rows).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH

from coordinator.iceberg.snapshots import summary_properties
from coordinator.records import EpochInputs

if TYPE_CHECKING:
    import pyarrow as pa


def _stage(table: Table, epoch: int, job: str, term: int, inputs: Optional[EpochInputs],
           write: Callable[[str, dict[str, str]], None]) -> int:
    table.refresh()
    if table.current_snapshot() is None:
        table.append(table.schema().as_arrow().empty_table())
    branch = f"tidemark-stage-{job}-{epoch}-{term}"
    if branch in table.metadata.refs:  # left by a crashed attempt of this very epoch and term
        table.manage_snapshots().remove_branch(branch).commit()
    table.manage_snapshots().create_branch(table.metadata.refs[MAIN_BRANCH].snapshot_id, branch).commit()
    write(branch, summary_properties(epoch, job, term, inputs))
    staged = table.metadata.refs[branch].snapshot_id
    table.manage_snapshots().remove_branch(branch).commit()
    return staged


def stage_append(table: Table, rows: pa.Table, epoch: int, job: str, term: int,
                 inputs: Optional[EpochInputs] = None) -> int:
    """Stage ``rows`` (a ``pyarrow.Table``) appended to ``table`` as epoch ``epoch``; returns the staged snapshot."""
    return _stage(table, epoch, job, term, inputs,
                  lambda branch, props: table.append(rows, snapshot_properties=props, branch=branch))


def stage_overwrite(table: Table, rows: pa.Table, epoch: int, job: str, term: int,
                    inputs: Optional[EpochInputs] = None) -> int:
    """Stage ``table`` replaced by ``rows`` as epoch ``epoch``; returns the staged snapshot (the last of the write)."""
    return _stage(table, epoch, job, term, inputs,
                  lambda branch, props: table.overwrite(rows, snapshot_properties=props, branch=branch))
