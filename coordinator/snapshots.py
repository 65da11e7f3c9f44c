"""Epochs in Iceberg metadata: the summary keys on snapshots and the committed-epoch table property.

Every snapshot Tidemark stages carries ``tidemark.epoch``, ``tidemark.job`` and
``tidemark.term`` in its summary. A reader with no ZooKeeper at hand tells how far a table
is committed from the newest epoch in ``main``'s lineage (a published snapshot belongs to
a precommitted epoch, which always commits with exactly that snapshot) and, for epochs
that published nothing, from the table property ``tidemark.committed-epoch``.
``tidemark.first-epoch`` is the writer's first epoch (the table has no exact state before
it) and ``tidemark.writer`` names the job that claimed the table, so a table with no
committed epoch yet is not mistaken for a root table. The lineage helpers walk ``main``
from its head through parent ids; pyiceberg's ``Summary`` is read with ``.get`` only
(``in`` and ``dict()`` misbehave on it).
"""
from __future__ import annotations

from typing import Iterator, Optional

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of

EPOCH_KEY = "tidemark.epoch"
JOB_KEY = "tidemark.job"
TERM_KEY = "tidemark.term"
COMMITTED_EPOCH_PROPERTY = "tidemark.committed-epoch"
FIRST_EPOCH_PROPERTY = "tidemark.first-epoch"
WRITER_PROPERTY = "tidemark.writer"


WAP_ID_KEY = "wap.id"
WAP_PREFIX = "tidemark:"


def summary_properties(epoch: int, job: str, term: int) -> dict[str, str]:
    """The summary keys of a snapshot staged for ``job``'s epoch ``epoch`` under ``term``."""
    return {EPOCH_KEY: str(epoch), JOB_KEY: job, TERM_KEY: str(term)}


def wap_id(epoch: int, job: str, term: int) -> str:
    """The ``spark.wap.id`` of a staged write. Spark records it in every staged snapshot's summary,
    including SQL ``MERGE INTO``, which cannot carry custom summary keys."""
    return f"{WAP_PREFIX}{job}:{epoch}:{term}"


def snapshot_epoch(snapshot: Snapshot) -> Optional[int]:
    """The epoch a snapshot belongs to: ``tidemark.epoch``, else a Tidemark ``wap.id``, else None."""
    if snapshot.summary is None:
        return None
    value = snapshot.summary.get(EPOCH_KEY)
    if value is not None:
        return int(value)
    wap = snapshot.summary.get(WAP_ID_KEY)
    if wap is not None and wap.startswith(WAP_PREFIX):
        return int(wap.rsplit(":", 2)[1])
    return None


def main_lineage(table: Table) -> Iterator[Snapshot]:
    """``main``'s snapshots, newest first."""
    return iter(ancestors_of(table.current_snapshot(), table.metadata))


def snapshot_of_epoch(table: Table, epoch: int) -> Optional[Snapshot]:
    """The snapshot of ``main``'s lineage that carries epoch ``epoch``, if any."""
    for snapshot in main_lineage(table):
        found = snapshot_epoch(snapshot)
        if found == epoch:
            return snapshot
        if found is not None and found < epoch:
            return None
    return None


def snapshot_at_epoch(table: Table, epoch: int) -> Optional[Snapshot]:
    """The newest snapshot of ``main`` with ``tidemark.epoch <= epoch`` (None: the table was empty then)."""
    for snapshot in main_lineage(table):
        found = snapshot_epoch(snapshot)
        if found is not None and found <= epoch:
            return snapshot
    return None


def snapshot_at_time(table: Table, wall_ms: int) -> Optional[Snapshot]:
    """For a root table written outside Tidemark: the newest ``main`` snapshot committed at or before ``wall_ms``."""
    for snapshot in main_lineage(table):
        if snapshot.timestamp_ms <= wall_ms:
            return snapshot
    return None


def highest_epoch(table: Table) -> Optional[int]:
    """The highest epoch present in ``main``'s lineage (published, not necessarily committed)."""
    for snapshot in main_lineage(table):
        found = snapshot_epoch(snapshot)
        if found is not None:
            return found
    return None


def committed_epoch(table: Table) -> Optional[int]:
    """The table's committed epoch as Iceberg records it: the newer of its newest published epoch and the
    ``tidemark.committed-epoch`` property."""
    value = table.properties.get(COMMITTED_EPOCH_PROPERTY)
    marked = int(value) if value is not None else None
    published = highest_epoch(table)
    candidates = [e for e in (marked, published) if e is not None]
    return max(candidates) if candidates else None


def first_epoch(table: Table) -> Optional[int]:
    """The writer's first epoch as Iceberg records it (property, else the oldest epoch in ``main``'s lineage)."""
    value = table.properties.get(FIRST_EPOCH_PROPERTY)
    if value is not None:
        return int(value)
    epochs = [e for e in (snapshot_epoch(s) for s in main_lineage(table)) if e is not None]
    return min(epochs) if epochs else None


def is_tidemark_table(table: Table) -> bool:
    """True for a table some Tidemark job writes (as opposed to a root table written by something else)."""
    return (table.properties.get(WRITER_PROPERTY) is not None or committed_epoch(table) is not None
            or highest_epoch(table) is not None)


def staged_snapshots(table: Table) -> list[Snapshot]:
    """Snapshots that carry an epoch but are not in ``main``'s lineage (staged, never published)."""
    lineage = {s.snapshot_id for s in main_lineage(table)}
    return [s for s in table.snapshots() if s.snapshot_id not in lineage and snapshot_epoch(s) is not None]
