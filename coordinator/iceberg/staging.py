"""Staged (unpublished) writes from plain Python with pyiceberg: write-audit-publish without Spark.

    snapshot_id = stage_append(table, arrow_table, epoch=T, job="counts", term=3, inputs=ctx.inputs)
    snapshot_id = stage_overwrite(table, arrow_table, epoch=T, job="counts", term=3, inputs=ctx.inputs)

The rows are committed to a private branch ``tidemark-stage-<job>-<T>-<term>`` cut from
``main``'s head, and the branch is dropped again, all in one catalog commit: what lands is
a snapshot that is in no ref (invisible to readers) whose summary carries the epoch's
progress record (``snapshots.summary_properties``), until ``publish_staged`` moves
``main`` to it. pyiceberg cannot branch from a table with no snapshot, so an empty table
first gets one empty snapshot on ``main`` (it carries no epoch and no rows).

Failure behaviour: a commit that loses a race with another commit on the table (GC, a
tag) is retried from a fresh load of the table, up to ``STAGE_ATTEMPTS`` times; then
pyiceberg's ``CommitFailedException`` propagates and the epoch is recomputed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.update.snapshot import ManageSnapshots
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from coordinator.iceberg.snapshots import summary_properties
from coordinator.records import EpochInputs

if TYPE_CHECKING:
    import pyarrow as pa

STAGE_ATTEMPTS = 5


class _StagingTransaction(Transaction):
    """The branch, the write and the branch's removal as one commit.

    pyiceberg recomputes the transaction's metadata, a deep copy of the whole table history,
    on every read of ``table_metadata`` (dozens per overwrite), which made staging cost grow
    with the table's history. The metadata models are frozen, so it is computed once per
    set of staged updates. pyiceberg's own retry of a lost commit rebuilds only the snapshot
    updates and would drop the branch's creation, so it is refused here: ``_stage`` retries
    the whole write from a fresh load instead.
    """

    _base: Optional[TableMetadata] = None
    _for: tuple = ()
    _metadata: Optional[TableMetadata] = None

    @property
    def table_metadata(self) -> TableMetadata:
        if self._metadata is None or self._base is not self._table.metadata or self._for is not self._updates:
            self._base, self._for = self._table.metadata, self._updates
            self._metadata = super().table_metadata
        return self._metadata

    def _rebuild_snapshot_updates(self) -> None:
        raise CommitFailedException("the staging commit lost a race; the write is retried from a fresh load")


def _stage(table: Table, epoch: int, job: str, term: int, inputs: Optional[EpochInputs],
           write: Callable[[Transaction, str, dict[str, str]], None]) -> int:
    def attempt() -> int:
        table.refresh()
        if table.current_snapshot() is None:
            table.append(table.schema().as_arrow().empty_table())
        branch = f"tidemark-stage-{job}-{epoch}-{term}"
        transaction = _StagingTransaction(table)
        refs = ManageSnapshots(transaction)
        if branch in table.metadata.refs:  # left by a crashed attempt of this very epoch and term (older releases)
            refs.remove_branch(branch)
        refs.create_branch(table.metadata.refs[MAIN_BRANCH].snapshot_id, branch).commit()
        write(transaction, branch, summary_properties(epoch, job, term, inputs))
        staged = transaction.table_metadata.refs[branch].snapshot_id
        ManageSnapshots(transaction).remove_branch(branch).commit()
        transaction.commit_transaction()
        return staged

    retrying = Retrying(stop=stop_after_attempt(STAGE_ATTEMPTS), wait=wait_random_exponential(0.01, 0.5),
                        retry=retry_if_exception_type(CommitFailedException), reraise=True)
    return retrying(attempt)


def stage_append(table: Table, rows: pa.Table, epoch: int, job: str, term: int,
                 inputs: Optional[EpochInputs] = None) -> int:
    """Stage ``rows`` (a ``pyarrow.Table``) appended to ``table`` as epoch ``epoch``; returns the staged snapshot."""
    return _stage(table, epoch, job, term, inputs,
                  lambda tx, branch, props: tx.append(rows, snapshot_properties=props, branch=branch))


def stage_overwrite(table: Table, rows: pa.Table, epoch: int, job: str, term: int,
                    inputs: Optional[EpochInputs] = None) -> int:
    """Stage ``table`` replaced by ``rows`` as epoch ``epoch``; returns the staged snapshot (the last of the write)."""
    return _stage(table, epoch, job, term, inputs,
                  lambda tx, branch, props: tx.overwrite(rows, snapshot_properties=props, branch=branch))
