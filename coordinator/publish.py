"""Publishing staged snapshots (write-audit-publish) conditionally and idempotently.

    result = publish_staged(table, staged_snapshot_id, epoch=T)
    result.outcome        # PUBLISHED, or ALREADY_PUBLISHED when main's lineage already holds epoch T
    advance_committed_epoch(table, T)     # after the epoch committed in ZooKeeper

The ref move is alone in its pyiceberg commit (pyiceberg keeps one requirement per type
in a transaction and its retries drop ref updates) and is conditional twice: we check
that ``main`` is the staged write's base (``staged_base``), and pyiceberg's commit asserts ``main`` has
not moved since we loaded the table. Losing a race is therefore never silent: either the
winner published this epoch (``ALREADY_PUBLISHED``) or ``PublishConflict`` is raised.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Optional

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from .errors import PublishConflict
from .snapshots import (COMMITTED_EPOCH_PROPERTY, FIRST_EPOCH_PROPERTY, WRITER_PROPERTY, committed_epoch, first_epoch,
                        snapshot_epoch, snapshot_of_epoch, staged_snapshots)


class PublishOutcome(str, enum.Enum):
    PUBLISHED = "PUBLISHED"
    ALREADY_PUBLISHED = "ALREADY_PUBLISHED"


@dataclass(frozen=True)
class PublishResult:
    table: str
    epoch: int
    snapshot_id: int          # the snapshot of epoch ``epoch`` now in main
    outcome: PublishOutcome


class _Lost(Exception):
    """Our conditional commit lost a race; look again at what the winner did."""


def _retry_lost_races(attempt, what: str):
    retrying = Retrying(stop=stop_after_attempt(5), wait=wait_random_exponential(0.01, 0.5),
                        retry=retry_if_exception_type(_Lost), reraise=True)
    try:
        return retrying(attempt)
    except _Lost:
        raise PublishConflict(f"kept losing commit races while {what}") from None


def publish_staged(table: Table, snapshot_id: int, epoch: int) -> PublishResult:
    """Move ``main`` to the staged ``snapshot_id`` of epoch ``epoch``, unless that epoch is already there.

    The first attempt uses the table's loaded metadata when it already holds the staged snapshot (the
    writer loaded it after staging): if ``main`` moved since, the commit's ``main``-unchanged
    requirement fails and the next attempt reloads. One metadata load per epoch saved.
    """
    name = ".".join(table.name())
    attempts = 0

    def attempt() -> PublishResult:
        nonlocal attempts
        if attempts or table.snapshot_by_id(snapshot_id) is None:
            table.refresh()
        attempts += 1
        present = snapshot_of_epoch(table, epoch)
        if present is not None:
            return PublishResult(name, epoch, present.snapshot_id, PublishOutcome.ALREADY_PUBLISHED)
        staged = table.snapshot_by_id(snapshot_id)
        if staged is None:
            raise PublishConflict(f"table {name}: staged snapshot {snapshot_id} of epoch {epoch} does not exist "
                                  "(expired?); the epoch must be recomputed")
        if snapshot_epoch(staged) != epoch:
            raise PublishConflict(f"table {name}: snapshot {snapshot_id} carries epoch {snapshot_epoch(staged)}, "
                                  f"not {epoch}")
        current = table.current_snapshot()
        current_id = current.snapshot_id if current else None
        base = staged_base(table, staged, epoch)
        if base != current_id:
            raise PublishConflict(
                f"table {name}: main moved to {current_id} since snapshot {snapshot_id} (epoch {epoch}) was staged "
                f"on {base}; publishing it would drop that snapshot. Recompute the epoch "
                "(is another writer committing to this table outside Tidemark?)")
        try:
            table.manage_snapshots().set_current_snapshot(snapshot_id).commit()
        except CommitFailedException:
            raise _Lost() from None
        return PublishResult(name, epoch, snapshot_id, PublishOutcome.PUBLISHED)

    return _retry_lost_races(attempt, f"publishing epoch {epoch} of table {name}")


def staged_base(table: Table, staged: Snapshot, epoch: int) -> Optional[int]:
    """The snapshot a staged write of ``epoch`` was built on: the first ancestor not of that epoch.

    A staged write may be several snapshots (pyiceberg's overwrite is a delete, then an append).
    """
    snapshot: Optional[Snapshot] = staged
    while snapshot is not None and snapshot_epoch(snapshot) == epoch:
        parent = snapshot.parent_snapshot_id
        if parent is None:
            return None
        snapshot = table.snapshot_by_id(parent)
    return snapshot.snapshot_id if snapshot is not None else None


def advance_committed_epoch(table: Table, epoch: int) -> bool:
    """Record in the table that ``epoch`` committed (monotonic, idempotent); False when already at or past it.

    This is how an epoch with no new data is marked: one metadata-only commit, no snapshot,
    no manifest. An epoch that published a snapshot needs no mark (its snapshot carries
    the epoch), except the writer's first, which records ``tidemark.first-epoch``.
    """
    def attempt() -> bool:
        table.refresh()
        current = committed_epoch(table)
        updates = {} if current is not None and current >= epoch else {COMMITTED_EPOCH_PROPERTY: str(epoch)}
        if table.properties.get(FIRST_EPOCH_PROPERTY) is None:
            updates[FIRST_EPOCH_PROPERTY] = str(first_epoch(table) or epoch)
        if not updates:
            return False
        try:
            with table.transaction() as tx:
                tx.set_properties(updates)
        except CommitFailedException:
            raise _Lost() from None
        return True

    return _retry_lost_races(attempt, f"marking epoch {epoch} committed in table {'.'.join(table.name())}")


def claim_table(table: Table, job: str) -> None:
    """Record ``job`` as the table's writer in Iceberg (idempotent), so Iceberg-only readers know it is managed."""
    table.refresh()
    if table.properties.get(WRITER_PROPERTY) != job:
        with table.transaction() as tx:
            tx.set_properties({WRITER_PROPERTY: job})


def expire_unpublished(table: Table, up_to_epoch: Optional[int] = None) -> list[int]:
    """Expire staged snapshots that were never published (aborted or superseded epochs).

    Only snapshots with ``tidemark.epoch <= up_to_epoch`` (default: the committed epoch) go:
    an epoch still in flight keeps its staged snapshot. Returns the expired ids.
    """
    table.refresh()
    limit = committed_epoch(table) if up_to_epoch is None else up_to_epoch
    if limit is None:
        return []
    tagged = {ref.snapshot_id for ref in table.metadata.refs.values()}
    doomed = [s.snapshot_id for s in staged_snapshots(table)
              if snapshot_epoch(s) <= limit and s.snapshot_id not in tagged]  # type: ignore[operator]
    if doomed:
        table.maintenance.expire_snapshots().by_ids(doomed).commit()
    return doomed
