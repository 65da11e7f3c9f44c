"""A table's lineage of epochs in Iceberg: which snapshot of ``main`` holds which epoch, which epochs the table
records, and whether its older history was expired. The resolver, garbage collection and recovery all read a
table's epochs through it (docs/design.md, "Consistency levels").

    lineage = EpochLineage(table)            # main's snapshots, newest first, indexed once
    lineage.recorded_epochs()                # ((epoch, snapshot id), ...), oldest first: what Iceberg records
    lineage.at_epoch(T)                      # newest main snapshot with tidemark.epoch <= T (None: empty then)
    lineage.at_time(wall_ms)                 # a root table: newest main snapshot committed at or before wall_ms
    lineage.root_at(wall_ms, read)           # a root table at a barrier: as its readers read it, else by time
    lineage.main_since(T)                    # main from the snapshot at T up to the head
    lineage.truncated                        # main's older history was expired
    lineage.ancestors(snapshot_id)           # any ref's snapshots, newest first
    lineage.committed_epoch, lineage.first_epoch, lineage.is_tidemark_table   # from one walk of main
    lineage.committed_progress()             # the record at the committed epoch (what recovery resumes from)
    lineage.inputs_at(T)                     # the inputs epoch T records here (its snapshot's, or the marker's)
    lineage.summary()                        # what resolution keeps of it: no snapshot, no metadata
    proven_committed_epoch(table, job, above=T)  # an epoch above T the metadata proves committed (ZooKeeper behind)

``EpochLineage`` is the one reader of a table's progress in Iceberg: it applies the rules of ``snapshots.py``
(how one snapshot or property is read) to a lineage indexed once; ``LineageSummary`` is what a resolver keeps of
it between resolutions, ``LineageRecords`` what GC hands the consistency rule.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Optional

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from coordinator.iceberg.snapshots import (
    JOB_KEY,
    ancestors,
    carrying_epoch,
    first_epoch_property,
    is_released,
    marker_epoch,
    marker_progress,
    newest_at_epoch,
    newest_at_time,
    snapshot_epoch,
    snapshot_index,
    snapshot_progress,
    writer_job,
)
from coordinator.records import EpochInputs, EpochProgress, RootRead


@dataclass(frozen=True)
class LineageSummary:
    """What a resolver keeps of one table's lineage between resolutions (``EpochLineage.summary``): ints and tuples
    of ints only, so the table's metadata and ``main``'s snapshots are garbage as soon as they are indexed. Kept for
    every table of a lake, they would stay alive for the whole resolution, and each pass of Python's cyclic garbage
    collector, which the allocations of loading the next tables start, would walk them all again."""

    location: str  # the metadata file it was read from: a refresh that finds the same one does not index again
    committed_epoch: Optional[int]
    is_tidemark_table: bool
    first_epoch: Optional[int]
    truncated: bool
    recorded: tuple[tuple[int, Optional[int]], ...]  # ``recorded_epochs()``: (epoch, snapshot id), oldest first
    committed_inputs: Optional[EpochInputs]  # ``inputs_at(committed_epoch)``: where its job read its sources then
    released: bool  # its writer released it (``is_released``): with no tidemark, its records are complete


class EpochLineage:
    """One table's ``main`` lineage and the epochs it records, read from the table's metadata as loaded.

    The rules that pick a snapshot from a walk (``newest_at_epoch`` and the others) are those of ``snapshots.py``,
    which applies them to ``main`` for callers holding only a table; here they run over the lineage indexed once,
    so a reader with no ZooKeeper walks each table's history once per resolution (its committed epoch, whether
    Tidemark writes it, its first epoch and the epochs it records), not once per question.
    """

    def __init__(self, table: Table) -> None:
        self.table = table
        self.by_id: dict[int, Snapshot] = snapshot_index(table)
        self.main: list[Snapshot] = list(ancestors(self.by_id, table.metadata.current_snapshot_id))  # newest first
        self.main_ids = {s.snapshot_id for s in self.main}
        self._position = {s.snapshot_id: i for i, s in enumerate(self.main)}
        self._epochs: Optional[list[Optional[int]]] = None  # each main snapshot's epoch, parsed once
        self._recorded: Optional[dict[int, Optional[int]]] = None
        self._marker: Optional[tuple[Optional[int]]] = None  # the marker's epoch, read once

    def ancestors(self, snapshot_id: Optional[int]) -> Iterator[Snapshot]:
        """The snapshot ``snapshot_id`` and its ancestors, newest first (a branch's or a tag's history)."""
        return ancestors(self.by_id, snapshot_id)

    @property
    def truncated(self) -> bool:
        """True when ``main``'s older history was expired (its oldest snapshot is not the table's first).

        Expiry removes the oldest snapshots of ``main`` and leaves the parent id of the oldest one left pointing at
        a snapshot that is gone; only a table's very first snapshot has sequence number 1 (0 in format 1 tables),
        so either sign says the walk ends on a cut history.
        """
        if not self.main:
            return False
        oldest = self.main[-1]
        return oldest.parent_snapshot_id is not None or (oldest.sequence_number or 0) > 1

    @property
    def committed_epoch(self) -> Optional[int]:
        """The table's committed epoch, the one rule: the newer of ``main``'s newest snapshot carrying an epoch and
        the committed-epoch marker (None: neither). A published snapshot belongs to a precommitted epoch, which
        always commits with exactly that snapshot, so it counts as committed for that table. A job with several
        sinks is committed in Iceberg up to the *lowest* of its sinks' (``progress.py``)."""
        newest = next((e for e in self._walked_epochs() if e is not None), None)
        candidates = [e for e in (newest, self.marker_epoch) if e is not None]
        return max(candidates) if candidates else None

    def committed_progress(self) -> Optional[EpochProgress]:
        """What the table records of its committed epoch: the snapshot carrying it or the marker, whichever it is
        (on a tie, the one that records inputs); None before the first epoch."""
        epoch = self.committed_epoch
        if epoch is None:
            return None
        snapshot = carrying_epoch(self.main, epoch, self._walked_epochs())
        candidates = [p for p in (snapshot_progress(snapshot) if snapshot is not None else None,
                                  marker_progress(self.table) if self.marker_epoch == epoch else None)
                      if p is not None]
        return max(candidates, key=lambda p: p.inputs is not None)

    @property
    def marker_epoch(self) -> Optional[int]:
        """The committed-epoch marker's epoch (``snapshots.marker_epoch``), read once."""
        if self._marker is None:
            self._marker = (marker_epoch(self.table),)
        return self._marker[0]

    @property
    def is_tidemark_table(self) -> bool:
        """True for a table some Tidemark job writes (as opposed to a root table written by something else): it
        names a writer, or records an epoch."""
        return writer_job(self.table) is not None or self.committed_epoch is not None

    @property
    def first_epoch(self) -> Optional[int]:
        """The writer's first epoch as Iceberg records it: ``tidemark.first-epoch``, else the oldest epoch in
        ``main``'s lineage."""
        recorded = first_epoch_property(self.table)
        if recorded is not None:
            return recorded
        epochs = [e for e in self._main_epochs() if e is not None]
        return min(epochs) if epochs else None

    def summary(self) -> LineageSummary:
        """This lineage's answers that a resolution reads for every table, without the metadata they came from."""
        committed = self.committed_epoch
        return LineageSummary(self.table.metadata_location, committed, self.is_tidemark_table,
                              self.first_epoch, self.truncated, self.recorded_epochs(),
                              None if committed is None else self.inputs_at(committed),
                              is_released(self.table.properties))

    # -- one snapshot -------------------------------------------------------------------------

    def at_epoch(self, epoch: int) -> Optional[Snapshot]:
        """The newest ``main`` snapshot with ``tidemark.epoch <= epoch``: the table's state at an epoch it holds
        (None: it had no Tidemark snapshot then, or that history was expired: see ``truncated``)."""
        return newest_at_epoch(self.main, epoch, self._main_epochs())

    def at_time(self, wall_ms: int) -> Optional[Snapshot]:
        """For a root table (written outside Tidemark): the newest ``main`` snapshot committed at or before
        ``wall_ms``, which is what barrier ``wall_ms`` reads of it."""
        return newest_at_time(self.main, wall_ms)

    def root_at(self, wall_ms: int, read: Optional[RootRead] = None) -> Optional[RootRead]:
        """A root table at barrier ``wall_ms`` in a consistent version: as the jobs reading it read it then
        (``read``, from ``held_epochs.Evidence.root_reads``: a commit that became visible late, after they read,
        is not in it) while that snapshot is retained, else cut by commit time. None: neither is known any more
        (its history at ``wall_ms`` was expired)."""
        if read is not None and (read.snapshot_id is None or read.snapshot_id in self.by_id):
            return read
        found = self.at_time(wall_ms)
        if found is None and self.truncated:
            return None
        return RootRead(found.snapshot_id if found is not None else None)

    def main_since(self, epoch: int) -> list[Snapshot]:
        """``main`` from the snapshot at ``epoch`` up to the head, newest first (all of ``main`` when it has no
        snapshot that old: nothing below is known not to be needed)."""
        found = self.at_epoch(epoch)
        return self.main if found is None else self.main[:self._position[found.snapshot_id] + 1]

    def inputs_at(self, epoch: int) -> Optional[EpochInputs]:
        """What epoch ``epoch`` of the table's writer records of its inputs here: the snapshot carrying the epoch,
        else the committed-epoch marker when it is that epoch's (None: neither, or written before inputs were)."""
        snapshot = carrying_epoch(self.main, epoch, self._main_epochs())
        if snapshot is not None:
            progress = snapshot_progress(snapshot)
            return None if progress is None else progress.inputs
        if self.marker_epoch == epoch:
            marker = marker_progress(self.table)
            return None if marker is None else marker.inputs
        return None

    # -- the epochs it records ------------------------------------------------------------------

    def recorded_epochs(self, up_to: Optional[int] = None) -> tuple[tuple[int, Optional[int]], ...]:
        """The epochs the table records in Iceberg with the snapshot holding each (None: the table was empty then),
        oldest first; only those at or below ``up_to`` when given.

        These are what a reader with no ZooKeeper goes by: the ``tidemark.epoch`` of every snapshot in ``main``'s
        lineage (an overwrite is a delete and an append snapshot of one epoch: the newer one holds it), plus the
        committed-epoch marker's epoch, held by the newest snapshot with a lower epoch (the marker is written for
        an epoch that published nothing in the table). A published snapshot counts as committed
        (``committed_epoch``). Idle
        epochs get a marker only once per marker period (``coordinator.job.commit``), so Iceberg records a subset
        of the epochs a table holds, and ZooKeeper's tidemark (``TableTidemark.recent``) lists more of the recent
        ones. An epoch whose snapshot is older than the expired history is not recorded any more: its state is
        unknown.
        """
        return tuple((e, s) for e, s in sorted(self._held().items()) if up_to is None or e <= up_to)

    def _main_epochs(self) -> list[Optional[int]]:
        """The epoch of each snapshot of ``main``, in its order: a resolution asks for the recorded epochs and the
        snapshot at the marker's epoch, and each summary is parsed once for both."""
        if self._epochs is None:
            self._epochs = [snapshot_epoch(s) for s in self.main]
        return self._epochs

    def _walked_epochs(self) -> Iterable[Optional[int]]:
        """The epochs of ``main``'s snapshots in its order, parsed as a walk reaches them unless all were already:
        the committed epoch of a long history is near its head."""
        return self._epochs if self._epochs is not None else map(snapshot_epoch, self.main)

    def _held(self) -> dict[int, Optional[int]]:
        if self._recorded is None:
            held: dict[int, Optional[int]] = {}
            for snapshot, epoch in zip(self.main, self._main_epochs()):  # newest first: the first snapshot of an
                if epoch is not None and epoch not in held:                # epoch seen is the one holding it
                    held[epoch] = snapshot.snapshot_id
            marker = self.marker_epoch
            if marker is not None and marker not in held:
                at = self.at_epoch(marker)
                if at is not None or not self.truncated:  # below a cut history its state is unknown
                    held[marker] = None if at is None else at.snapshot_id
            self._recorded = held
        return self._recorded


class LineageRecords:
    """What the tables' Iceberg records say of their epochs, from their lineages indexed once: the
    ``held_epochs.IcebergRecords`` a caller holding ``EpochLineage`` objects (garbage collection) hands the rule."""

    lineages: Mapping[str, EpochLineage]

    def __init__(self, lineages: Mapping[str, EpochLineage]) -> None:
        self.lineages = lineages

    def recorded(self, table: str) -> Mapping[int, Optional[int]]:
        """The epochs ``table`` records, each with its snapshot (``EpochLineage.recorded_epochs``)."""
        return dict(self.lineages[table].recorded_epochs())

    def committed_epoch(self, table: str) -> Optional[int]:
        """``table``'s committed epoch in Iceberg."""
        return self.lineages[table].committed_epoch

    def inputs_at(self, table: str, epoch: int) -> Optional[EpochInputs]:
        """The inputs ``table``'s epoch ``epoch`` records."""
        return self.lineages[table].inputs_at(epoch)

    def first_epoch(self, table: str) -> Optional[int]:
        """``table``'s first epoch as Iceberg records it."""
        return self.lineages[table].first_epoch


PROOF_WALK = 32  # main's newest snapshots read for a proof: two epochs of a writer are a few snapshots apart


def proven_committed_epoch(table: Table, job: str, above: Optional[int]) -> Optional[int]:
    """The newest epoch of ``job`` that ``table``'s metadata proves committed in ZooKeeper, if it is above ``above``
    (None otherwise). The proofs: the committed-epoch marker (written after the epoch's ZooKeeper commit), and the
    older of the two newest epochs of ``job`` in ``main`` (a writer begins an epoch only once the one before it is
    committed; the newest may be in flight). A healthy tree's tidemark of the table is never below it, so a tidemark
    that is holds the state of an older copy of the tree (restored). Reads the marker and at most ``PROOF_WALK`` of
    ``main``'s newest snapshots, found from the end of the snapshot list: no index of the whole lineage."""
    marker = marker_epoch(table)
    proven = marker if marker is not None and (above is None or marker > above) else None
    newer: list[int] = []
    for snapshot in _main_newest_first(table, PROOF_WALK):
        epoch = snapshot_epoch(snapshot)
        if epoch is None or (snapshot.summary is not None and snapshot.summary.get(JOB_KEY, job) != job):
            continue  # not this writer's (a compaction, a foreign write)
        if above is not None and epoch <= above:
            break
        if epoch not in newer:
            newer.append(epoch)
        if len(newer) == 2:
            return max(newer[1], proven or 0)
    return proven


def _main_newest_first(table: Table, most: int) -> Iterator[Snapshot]:
    """``main``'s snapshots from the head back, at most ``most``; the list is searched from its end (snapshots are
    appended as they are committed), so the head and its parents are found at once."""
    pending = reversed(table.metadata.snapshots)
    seen: dict[int, Snapshot] = {}
    wanted = table.metadata.current_snapshot_id
    for _ in range(most):
        while wanted is not None and wanted not in seen:
            found = next(pending, None)
            if found is None:
                return  # expired
            seen[found.snapshot_id] = found
        if wanted is None:
            return
        snapshot = seen[wanted]
        yield snapshot
        wanted = snapshot.parent_snapshot_id


__all__ = ["EpochLineage", "LineageRecords", "LineageSummary", "proven_committed_epoch"]

