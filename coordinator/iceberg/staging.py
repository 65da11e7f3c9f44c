"""Staged (unpublished) writes from plain Python with pyiceberg: written to storage, with no catalog commit.

    write = stage_append(table, arrow_table, epoch=T, job="counts", term=3, inputs=ctx.inputs)
    write = stage_overwrite(table, arrow_table, epoch=T, job="counts", term=3, inputs=ctx.inputs)
    write.snapshot_id      # the staged snapshot: in no metadata yet
    snapshots = staged_snapshots(write)                  # pyiceberg Snapshot models, oldest first
    write = restage(table, write)                        # the same rows on main's head, when main moved

A staged write is what a pyiceberg commit on ``main`` would add, stopped before the commit: the data files,
manifests and manifest list are written to the table's storage, and the snapshots that reference them
(carrying the epoch's progress record, ``snapshots.summary_properties``) are kept as a ``StagedWrite``, built
on ``main``'s head as the table's loaded metadata has it (the writer's table object follows its own commits,
and only this writer moves ``main``). The epoch's precommit records the write in ZooKeeper and
``publish.publish_staged`` adds its snapshots and moves ``main`` to them in one catalog commit: one catalog
round per sink and epoch, as Flink's Iceberg sink makes (docs/design.md, "Staging without a catalog commit").

A write built on a head that is no longer ``main``'s (a compaction landed meanwhile, or another snapshot took
its sequence number) is built again on the new head from the same data files (``restage``): no row is
recomputed, only manifests and a manifest list are written again.

Failure behaviour: an error writing to storage propagates (the epoch is recomputed from its recorded inputs;
the files written so far stay behind as orphans for ``tidemark gc --orphans``), as does the ``ValueError`` of a
write pyiceberg refuses (a schema that does not match). Nothing here commits, so nothing here races.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from pyiceberg.expressions import AlwaysTrue
from pyiceberg.manifest import DataFile, ManifestEntryStatus
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata, TableMetadataV1
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.snapshots import Snapshot

from coordinator.errors import CorruptState
from coordinator.iceberg.snapshots import snapshot_progress, summary_properties
from coordinator.records import EpochInputs, StagedWrite, WriteMode

if TYPE_CHECKING:
    import pyarrow as pa


class _UncommittedTransaction(Transaction):
    """A transaction that is never committed: its updates are read back as a ``StagedWrite``.

    pyiceberg recomputes the transaction's metadata, a deep copy of the whole table history,
    on every read of ``table_metadata`` (dozens per overwrite), which made staging cost grow
    with the table's history. The metadata models are frozen, so it is computed once per
    set of staged updates.
    """

    _base: Optional[TableMetadata] = None
    _for: tuple = ()
    _metadata: Optional[TableMetadata] = None

    def __init__(self, table: Table) -> None:
        super().__init__(table, autocommit=False)

    @property
    def table_metadata(self) -> TableMetadata:
        if self._metadata is None or self._base is not self._table.metadata or self._for is not self._updates:
            self._base, self._for = self._table.metadata, self._updates
            self._metadata = super().table_metadata
        return self._metadata

    def staged(self, mode: WriteMode, base: Optional[int]) -> StagedWrite:
        """The snapshots this transaction added on ``main``, from its head back to ``base``."""
        metadata = self.table_metadata
        head = metadata.refs.get(MAIN_BRANCH)
        chain: list[Snapshot] = []
        snapshot_id = head.snapshot_id if head is not None else None
        while snapshot_id is not None and snapshot_id != base:
            snapshot = metadata.snapshot_by_id(snapshot_id)
            if snapshot is None:
                raise CorruptState(f"table {'.'.join(self._table.name())}: the staged snapshot {snapshot_id} "
                                   "is not in the write's own metadata")
            chain.append(snapshot)
            snapshot_id = snapshot.parent_snapshot_id
        return StagedWrite(mode=mode, base=base, snapshots=tuple(
            s.model_dump(mode="json", by_alias=True, exclude_none=True) for s in reversed(chain)))


def _head(table: Table) -> Optional[int]:
    current = table.current_snapshot()
    return current.snapshot_id if current is not None else None


def stage_append(table: Table, rows: pa.Table, epoch: int, job: str, term: int,
                 inputs: Optional[EpochInputs] = None) -> StagedWrite:
    """Stage ``rows`` (a ``pyarrow.Table``) appended to ``table`` as epoch ``epoch``, with no catalog commit."""
    transaction = _UncommittedTransaction(table)
    transaction.append(rows, snapshot_properties=summary_properties(epoch, job, term, inputs))
    return transaction.staged(WriteMode.APPEND, _head(table))


def stage_overwrite(table: Table, rows: pa.Table, epoch: int, job: str, term: int,
                    inputs: Optional[EpochInputs] = None) -> StagedWrite:
    """Stage ``table`` replaced by ``rows`` as epoch ``epoch``, with no catalog commit (a delete, then an append:
    pyiceberg's overwrite)."""
    transaction = _UncommittedTransaction(table)
    transaction.overwrite(rows, snapshot_properties=summary_properties(epoch, job, term, inputs))
    return transaction.staged(WriteMode.OVERWRITE, _head(table))


def staged_snapshots(write: StagedWrite) -> list[Snapshot]:
    """The write's snapshots as pyiceberg models, oldest first (each one's parent is the one before)."""
    return [Snapshot.model_validate(snapshot) for snapshot in write.snapshots]


def applies_to(table: Table, write: StagedWrite) -> bool:
    """Whether ``write`` can be added to ``table`` as it is: ``main`` is still at its base and no snapshot took its
    sequence number (Iceberg refuses a snapshot whose sequence number is not above the table's last)."""
    first, metadata = staged_snapshots(write)[0], table.metadata
    if _head(table) != write.base:
        return False
    if isinstance(metadata, TableMetadataV1) or first.sequence_number is None:
        return True
    if metadata.last_sequence_number >= first.sequence_number:
        return False
    next_row_id = getattr(metadata, "next_row_id", None)  # format 3's row lineage: ids must not be handed out twice
    return first.first_row_id is None or next_row_id is None or next_row_id <= first.first_row_id


def _added_files(table: Table, write: StagedWrite) -> list[DataFile]:
    """The data files the write's snapshots added (read back from the manifests it wrote)."""
    files = []
    for snapshot in staged_snapshots(write):
        for manifest in snapshot.manifests(table.io):
            if manifest.added_snapshot_id != snapshot.snapshot_id:
                continue
            files += [entry.data_file for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
                      if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id]
    return files


def restage(table: Table, write: StagedWrite) -> StagedWrite:
    """``write`` built again on ``main``'s current head from the data files it wrote: the same rows on top of a
    compaction (``publish.rewrites_only``), or after another snapshot took its sequence number.

    :raises CorruptState: the write's snapshots carry no Tidemark progress record.
    """
    progress = snapshot_progress(staged_snapshots(write)[-1])
    if progress is None:
        raise CorruptState(f"table {'.'.join(table.name())}: a staged write carries no Tidemark epoch")
    properties = summary_properties(progress.epoch, progress.job, progress.term, progress.inputs)
    files = _added_files(table, write)
    transaction = _UncommittedTransaction(table)
    if write.mode == WriteMode.OVERWRITE:
        transaction.delete(AlwaysTrue(), snapshot_properties=properties)
    with transaction.update_snapshot(snapshot_properties=properties).fast_append() as append:
        for data_file in files:
            append.append_data_file(data_file)
    return transaction.staged(write.mode, _head(table))
