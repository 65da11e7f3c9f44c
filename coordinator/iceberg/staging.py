"""Staged (unpublished) writes from plain Python with pyiceberg: write-audit-publish without Spark.

    snapshot_id = stage_append(table, arrow_table, epoch=T, job="counts", term=3, inputs=ctx.inputs)
    snapshot_id = stage_overwrite(table, arrow_table, epoch=T, job="counts", term=3, inputs=ctx.inputs)

The rows are committed to a private branch ``tidemark-stage-<job>-<T>-<term>`` cut from
``main``'s head, and the branch is dropped again, all in one catalog commit: what lands is
a snapshot that is in no ref (invisible to readers) whose summary carries the epoch's
progress record (``snapshots.summary_properties``), until ``publish_staged`` moves
``main`` to it. pyiceberg cannot branch from a table with no snapshot, so an empty table
first gets one empty snapshot on ``main`` (it carries no epoch and no rows).

The first attempt branches from ``main`` as the table's loaded metadata has it (the writer's table
object follows its own commits, and only this writer moves ``main``), saving a metadata load per
sink and epoch; if the table moved since, the commit loses a race and the next attempt reloads.
A compaction that moved ``main`` meanwhile is published over as ``publish_staged`` says.

Failure behaviour: a commit that loses a race with another commit on the table (GC, a
tag, another writer's snapshot) is retried from a fresh load of the table, up to
``STAGE_ATTEMPTS`` times within ``STAGE_DEADLINE_S`` seconds; then ``PublishConflict`` is
raised (the epoch is recomputed). Lost races are what ``publish.lost_race`` recognises:
``CommitFailedException`` (a requirement failed: the staging branch was created or moved
concurrently, or the catalog's pointer swap lost), ``CommitStateUnknownException``, and
pyiceberg's ``ValueError`` for a write that no longer applies to the newer metadata (a
snapshot added since the load: "Cannot add snapshot with sequence number N older than last
sequence number M"; the head we branched from expired meanwhile), or a REST catalog's 400 for such a write
(``publish.stale_update_as_lost_race``). Any other error, a
``ValueError`` of a write pyiceberg refuses included, propagates at once, unretried. A lost
attempt's data and manifest files stay behind as orphans (``tidemark gc --orphans``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Optional

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.update.snapshot import ManageSnapshots
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from coordinator.errors import PublishConflict
from coordinator.iceberg.publish import lost_race, stale_update_as_lost_race
from coordinator.iceberg.snapshots import summary_properties
from coordinator.records import EpochInputs

if TYPE_CHECKING:
    import pyarrow as pa

STAGE_ATTEMPTS = 5
STAGE_DEADLINE_S = 120.0  # each attempt rewrites the data: a long write is not redone STAGE_ATTEMPTS times


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
    attempts = 0

    def attempt() -> int:
        nonlocal attempts
        if attempts:
            table.refresh()
        attempts += 1
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
        with stale_update_as_lost_race(table):
            transaction.commit_transaction()
        return staged

    # pyiceberg reports some lost races as a plain ValueError (it re-applies our updates to the metadata
    # another commit produced and refuses them): those are retried too, recognised by their message
    # (``lost_race``), so that the ValueError of a real bug fails at once instead of being retried.
    retrying = Retrying(stop=stop_after_attempt(STAGE_ATTEMPTS) | stop_after_delay(STAGE_DEADLINE_S),
                        wait=wait_random_exponential(0.01, 0.5), retry=retry_if_exception(lost_race), reraise=True)
    try:
        return retrying(attempt)
    except Exception as exc:
        if not lost_race(exc):
            raise
        attempts = retrying.statistics.get("attempt_number", STAGE_ATTEMPTS)
        raise PublishConflict(f"table {'.'.join(table.name())}: staging epoch {epoch} lost {attempts} commit races "
                              f"in a row (last: {type(exc).__name__}: {exc}); is something else committing to it "
                              "all the time?") from None


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
