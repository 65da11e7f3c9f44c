"""Publishing staged writes (write-audit-publish) conditionally and idempotently, fenced by term.

    claim_table(table, job, term)                        # a new leader, before anything else: Fenced if outranked
    result = publish_staged(table, write.snapshot_id, epoch=T, term=term, write=write)   # staging.py's write
    result = publish_staged(table, staged_snapshot_id, epoch=T, term=term)              # Spark's WAP snapshot
    result.outcome        # PUBLISHED, or ALREADY_PUBLISHED when main's lineage already holds epoch T
    advance_committed_epoch(table, EpochProgress(job, T, term_of_T, inputs), term)   # after the ZooKeeper commit

A publish is one catalog commit, conditional twice: we check that ``main`` is the staged write's base, and the
commit asserts ``main`` has not moved since we loaded the table. A write staged with no catalog commit
(``staging.py``) is published by adding its snapshots and moving ``main`` in that one commit; a snapshot staged in
the catalog (Spark's WAP) by moving ``main`` alone. Losing a race is therefore never silent: either the winner
published this epoch (``ALREADY_PUBLISHED``) or ``PublishConflict`` is raised. One move of ``main`` is no conflict:
compactions alone (``replace`` commits, another engine's maintenance) on top of the base change no row, so the
staged write is published over them (``rewrites_only``; a write with no catalog commit is built again on top of
them, ``staging.restage``) instead of leaving a precommitted epoch that could never publish.

**Fencing in Iceberg** (docs/design.md, "Monotonic fencing", says why it holds): a new leader raises
``tidemark.term`` to its own term (``claim_table``) before it writes anything, and every commit Tidemark makes to
a sink (claim, publish, marker) requires ``tidemark.term <= term`` (``AssertTermAtMost``), which pyiceberg's SQL,
Hive, Glue and DynamoDB catalogs check atomically with the commit; a REST catalog cannot be sent it, so there the
term is checked just before the commit.

Failure behaviour: a commit that lost a race (``lost_race``: the catalog's ``CommitFailedException``,
``CommitStateUnknownException``, or pyiceberg's ``ValueError`` for updates that no longer apply to the newer
metadata; a REST catalog's 400 for such updates, ``stale_update_as_lost_race``) is looked at again from a fresh
load, up to ``PUBLISH_ATTEMPTS`` times within ``PUBLISH_DEADLINE_S`` seconds; then ``PublishConflict`` is raised.
Any other error propagates.
"""
from __future__ import annotations

import contextlib
import enum
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Callable, Literal, Optional, TypeVar, Union, cast

from pydantic import Field
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import BadRequestError, CommitFailedException, CommitStateUnknownException
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot
from pyiceberg.table.update import (
    AddSnapshotUpdate,
    AssertRefSnapshotId,
    AssertTableUUID,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
    TableUpdate,
    ValidatableTableRequirement,
)
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, wait_random_exponential

from coordinator.errors import Fenced, PublishConflict
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.metadata_files import delete_unlogged_metadata
from coordinator.iceberg.snapshots import (
    FIRST_EPOCH_PROPERTY,
    RELEASED_PROPERTY,
    TERM_PROPERTY,
    WRITER_PROPERTY,
    claimed_term,
    committed_properties,
    snapshot_epoch,
    snapshot_of_epoch,
)
from coordinator.iceberg.staging import applies_to, restage, staged_snapshots
from coordinator.iceberg.transactions import TableChange, commit_tables
from coordinator.records import EpochProgress, StagedWrite

T = TypeVar("T")

PUBLISH_ATTEMPTS = 5
PUBLISH_DEADLINE_S = 60.0

# pyiceberg's catalogs (SQL, Hive, Glue, DynamoDB) validate a commit's requirements against the table's
# current metadata and then re-apply its updates to that metadata (``update_table_metadata``). An update
# that no longer applies because another commit landed since our load is refused with a plain ValueError,
# not CommitFailedException: these are those messages (pyiceberg 0.12), matched whole so that a
# ValueError of a real bug is never taken for a race and retried.
_LOST_RACE_MESSAGES = re.compile("|".join((
    # a snapshot was added since our load (format v2): ours carries a stale sequence number
    r"Cannot add snapshot with sequence number \d+ older than last sequence number \d+",
    # the same for format v3's row lineage
    r"Cannot add a snapshot with first row id smaller than the table's next-row-id \d+ < \d+",
    # the snapshot a ref is set to was expired since our load (a staged snapshot, or the head we branched from)
    r"Cannot set \S+ to unknown snapshot -?\d+",
    # our snapshot is already in the table: an earlier commit of it landed although it was reported lost
    r"Snapshot with id -?\d+ already exists",
)))


def lost_race(error: BaseException) -> bool:
    """Whether ``error``, raised by a catalog commit, means another commit landed since the table was loaded
    (or, ``CommitStateUnknownException``, that ours may have): the caller looks again from a fresh load.

    ``CommitStateUnknownException`` (a REST catalog's 500/502/504) counts because every Tidemark commit is
    checked again after the reload: a publish that did land is found in ``main`` (``ALREADY_PUBLISHED``),
    the property commits are idempotent, and a staged snapshot that landed is in no ref (readers never see
    it; GC expires it once its epoch is behind the table's tidemark).
    """
    if isinstance(error, (CommitFailedException, CommitStateUnknownException)):
        return True
    return type(error) is ValueError and _LOST_RACE_MESSAGES.fullmatch(str(error)) is not None


@contextlib.contextmanager
def stale_update_as_lost_race(*tables: Table) -> Iterator[None]:
    """A commit of ``tables`` inside this block whose updates a REST catalog refused as no longer applying raises
    ``CommitFailedException``, a lost race (``lost_race``), rather than pyiceberg's ``BadRequestError``.

    A REST catalog applies a commit's updates itself and answers 400 for an update that no longer fits the
    table's newer metadata (a stale sequence number, a ref to a snapshot expired meanwhile), in each server's
    own words, where pyiceberg's own catalogs raise the ``ValueError`` ``lost_race`` recognises. So a 400 is a
    lost race when a table, loaded again, moved since it was loaded; if none did, the request itself was bad,
    and the error propagates.
    """
    loaded = [table.metadata_location for table in tables]
    try:
        yield
    except BadRequestError as exc:
        # Looked up on handles of their own: the caller's retry loads the tables again anyway.
        if all(t.catalog.load_table(t.name()).metadata_location == at for t, at in zip(tables, loaded)):
            raise
        raise CommitFailedException(f"the catalog refused updates that no longer apply to a table, which "
                                    f"moved since it was loaded ({exc})") from exc


class PublishOutcome(str, enum.Enum):
    """What ``publish_staged`` did: moved ``main`` to the staged snapshot, or found a snapshot of the epoch in
    ``main``'s lineage already (an earlier attempt, or another leader, published it)."""

    PUBLISHED = "PUBLISHED"
    ALREADY_PUBLISHED = "ALREADY_PUBLISHED"


@dataclass(frozen=True)
class PublishResult:
    """What ``publish_staged`` returns: the table, the epoch, its snapshot now in ``main``, and the outcome."""

    table: str
    epoch: int
    snapshot_id: int          # the snapshot of epoch ``epoch`` now in main
    outcome: PublishOutcome


class _Lost(Exception):
    """Our conditional commit lost a race (the message says how); look again at what the winner did."""


class AssertTermAtMost(ValidatableTableRequirement):
    """Tidemark's fencing requirement: the table's ``tidemark.term`` property is at most ``term``."""

    type: Literal["tidemark-assert-term-at-most"] = Field(default="tidemark-assert-term-at-most")
    term: int

    # pyiceberg's requirements all override pydantic's deprecated classmethod BaseModel.validate this way.
    def validate(self, base_metadata: Optional[TableMetadata]) -> None:  # type: ignore[override]
        """Refuse the commit unless the metadata it replaces records a ``tidemark.term`` of at most ``term``.

        :param base_metadata: the table's current metadata, as the catalog is about to replace it.
        :raises CommitFailedException: the table is claimed by a higher term, or has no current metadata.
        """
        if base_metadata is None:
            raise CommitFailedException("Requirement failed: current table metadata is missing")
        recorded = claimed_term(base_metadata.properties)
        if recorded > self.term:
            raise CommitFailedException(f"Requirement failed: the table is claimed by term {recorded}, "
                                        f"above this writer's term {self.term}")


def _fenced(table: Table, term: int) -> Fenced:
    return Fenced(f"table {'.'.join(table.name())} is claimed by term {claimed_term(table.properties)}, above this "
                  f"writer's term {term}: a newer leader took over; this driver is a zombie and changes nothing")


def _guard(table: Table, term: int, requirements: tuple) -> tuple:
    """A commit's requirements with Tidemark's: the table's identity, and its term at most ``term`` (checked here,
    just before the commit, on a REST catalog, which cannot be sent that requirement: ``Fenced``)."""
    guard = (AssertTableUUID(uuid=table.metadata.table_uuid), *requirements)
    if isinstance(table.catalog, RestCatalog):
        if claimed_term(table.properties) > term:
            raise _fenced(table, term)
        return guard
    return (*guard, AssertTermAtMost(term=term))


@contextlib.contextmanager
def _lost_races_told_apart(tables: tuple[Table, ...], term: int) -> Iterator[None]:
    """A commit of ``tables`` inside this block that lost a race (``lost_race``: a failed requirement, an update
    that no longer applies, an unknown outcome) is told apart after a reload: outranked (``Fenced``) or a lost
    race (``_Lost``, the caller looks again). Any other error propagates."""
    try:
        with stale_update_as_lost_race(*tables):
            yield
    except (CommitFailedException, CommitStateUnknownException, ValueError) as exc:
        if not lost_race(exc):
            raise
        for table in tables:
            table.refresh()
            if claimed_term(table.properties) > term:
                raise _fenced(table, term) from None
        raise _Lost(f"{type(exc).__name__}: {exc}") from None


def _commit(table: Table, term: int, updates: tuple[TableUpdate, ...], requirements: tuple = ()) -> None:
    """One catalog commit of ``updates``, refused (``Fenced``) when the table is claimed by a higher term; a lost
    race is ``_Lost`` (``_lost_races_told_apart``)."""
    guard = _guard(table, term, requirements)
    with _lost_races_told_apart((table,), term):
        response = table.catalog.commit_table(table, guard, updates)
    delete_unlogged_metadata(table, table.metadata, response.metadata)
    table.metadata, table.metadata_location = response.metadata, response.metadata_location


def _retry_lost_races(attempt: Callable[[], T], what: str) -> T:
    """``attempt()`` again while it loses commit races (``_Lost``), up to ``PUBLISH_ATTEMPTS`` times within
    ``PUBLISH_DEADLINE_S`` seconds (a catalog slow to answer must not hold the driver indefinitely); then
    ``PublishConflict`` naming the last race lost."""
    retrying = Retrying(stop=stop_after_attempt(PUBLISH_ATTEMPTS) | stop_after_delay(PUBLISH_DEADLINE_S),
                        wait=wait_random_exponential(0.01, 0.5), retry=retry_if_exception_type(_Lost), reraise=True)
    try:
        return retrying(attempt)
    except _Lost as exc:
        raise PublishConflict(f"kept losing commit races while {what} (last: {exc})") from None


def publish_staged(table: Table, snapshot_id: int, epoch: int, term: int,
                   write: Optional[StagedWrite] = None, verify_files: bool = False) -> PublishResult:
    """Move ``main`` to the staged ``snapshot_id`` of epoch ``epoch``, unless that epoch is already there.

    ``write``: the sink's write staged with no catalog commit (``staging.py``), whose snapshot ``snapshot_id`` is
    in no metadata yet: one commit adds its snapshots and moves ``main``, on the condition that ``main`` is still
    its base. Without it, ``snapshot_id`` is a snapshot staged in the catalog (Spark's write-audit-publish) and the
    commit moves ``main`` alone. A compaction on top of the base (``rewrites_only``) is published over: a staged
    snapshot replaces it, a staged write is built again on top of it (``staging.restage``).

    ``verify_files``: check first that the write's manifest list is still in storage (a roll-forward after a
    take-over: the write may be older than an orphan-file removal's cutoff); when it is gone the epoch cannot be
    published, and ``PublishConflict`` says so.

    ``Fenced`` when the table is claimed by a term above ``term`` (checked atomically with the ref move).

    An attempt uses the table's loaded metadata when it holds what is published (the writer's table object
    follows its own commits): if ``main`` moved since, the commit's ``main``-unchanged requirement fails, and the
    next attempt is on the metadata the failed commit reloaded. No metadata load per epoch.
    """
    _verify_files(table, epoch, write, verify_files)

    def attempt() -> PublishResult:
        planned = _plan(table, snapshot_id, epoch, term, write)
        if isinstance(planned, _Change):
            _commit(table, term, planned.updates, planned.requirements)
            return planned.result
        return planned

    return _retry_lost_races(attempt, f"publishing epoch {epoch} of table {'.'.join(table.name())}")


def publish_together(tables: Mapping[str, Table], staged: Mapping[str, tuple[int, Optional[StagedWrite]]],
                     epoch: int, term: int, verify_files: bool = False) -> dict[str, PublishResult]:
    """``publish_staged`` for several tables of one REST catalog that supports multi-table commits
    (``transactions.supports_multi_table_commit``), in one atomic commit: a reader of the catalog sees them move
    together. Tables that hold the epoch already are skipped (``ALREADY_PUBLISHED``), as is the commit when all do.

    :param staged: per table, its staged snapshot and its write staged with no catalog commit (or None).
    :raises Fenced: a table is claimed by a term above ``term``.
    :raises PublishConflict: as ``publish_staged``, for any of the tables.
    """
    for name, table in tables.items():
        _verify_files(table, epoch, staged[name][1], verify_files)

    def attempt() -> dict[str, PublishResult]:
        results, changes = {}, {}
        for name, table in sorted(tables.items()):
            snapshot_id, write = staged[name]
            planned = _plan(table, snapshot_id, epoch, term, write)
            if isinstance(planned, _Change):
                changes[name] = planned
            else:
                results[name] = planned
        if changes:
            committed = tuple(tables[name] for name in changes)
            requests = [TableChange(tables[name], _guard(tables[name], term, c.requirements), c.updates)
                        for name, c in changes.items()]
            with _lost_races_told_apart(committed, term):
                commit_tables(cast(RestCatalog, committed[0].catalog), requests)
            for table in committed:  # the server answers no metadata
                previous = table.metadata
                table.refresh()
                delete_unlogged_metadata(table, previous, table.metadata)
            results.update({name: change.result for name, change in changes.items()})
        return results

    return _retry_lost_races(attempt, f"publishing epoch {epoch} of tables {', '.join(sorted(tables))} together")


def _verify_files(table: Table, epoch: int, write: Optional[StagedWrite], verify_files: bool) -> None:
    if write is None or not verify_files:
        return
    manifest_list = staged_snapshots(write)[-1].manifest_list
    if not table.io.new_input(manifest_list).exists():
        raise PublishConflict(f"table {'.'.join(table.name())}: the files staged for epoch {epoch} are gone from "
                              f"storage ({manifest_list}: removed as orphans by a cutoff shorter than the epoch's "
                              "age?); the epoch cannot be published and must be recomputed")


@dataclass(frozen=True)
class _Change:
    """What publishing one table's staged write takes: a commit of ``updates`` under ``requirements``."""

    updates: tuple[TableUpdate, ...]
    requirements: tuple
    result: PublishResult


def _plan(table: Table, snapshot_id: int, epoch: int, term: int,
          write: Optional[StagedWrite]) -> Union[PublishResult, _Change]:
    """The epoch already in ``main`` (``ALREADY_PUBLISHED``), or the commit that publishes it."""
    name = ".".join(table.name())
    # A lost race reloaded the table already (``_lost_races_told_apart``); a snapshot staged in the catalog after
    # the load needs one.
    if write is None and table.snapshot_by_id(snapshot_id) is None:
        table.refresh()
    if claimed_term(table.properties) > term:
        raise _fenced(table, term)
    present = snapshot_of_epoch(table, epoch)
    if present is not None:
        return PublishResult(name, epoch, present.snapshot_id, PublishOutcome.ALREADY_PUBLISHED)
    current = table.current_snapshot()
    current_id = current.snapshot_id if current else None
    unmoved = (AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=current_id),)
    staged = table.snapshot_by_id(snapshot_id)
    if staged is None and write is not None:
        if not applies_to(table, write):
            if current_id != write.base and not rewrites_only(table, current, write.base):
                raise _moved(name, epoch, current_id, write.base)
            write = restage(table, write)
        updates: tuple[TableUpdate, ...] = (*(AddSnapshotUpdate(snapshot=s) for s in staged_snapshots(write)),
                                            _main_to(write.snapshot_id))
        return _Change(updates, unmoved, PublishResult(name, epoch, write.snapshot_id, PublishOutcome.PUBLISHED))
    if staged is None:
        raise PublishConflict(f"table {name}: staged snapshot {snapshot_id} of epoch {epoch} does not exist "
                              "(expired?); the epoch must be recomputed")
    if snapshot_epoch(staged) != epoch:
        raise PublishConflict(f"table {name}: snapshot {snapshot_id} carries epoch {snapshot_epoch(staged)}, "
                              f"not {epoch}")
    base = staged_base(table, staged, epoch)
    if base != current_id and not rewrites_only(table, current, base):
        raise _moved(name, epoch, current_id, base)
    return _Change((_main_to(snapshot_id),), unmoved, PublishResult(name, epoch, snapshot_id,
                                                                    PublishOutcome.PUBLISHED))


def _main_to(snapshot_id: int) -> SetSnapshotRefUpdate:
    return SetSnapshotRefUpdate(ref_name=MAIN_BRANCH, type=SnapshotRefType.BRANCH, snapshot_id=snapshot_id,
                                max_ref_age_ms=None, max_snapshot_age_ms=None, min_snapshots_to_keep=None)


def _moved(name: str, epoch: int, current_id: Optional[int], base: Optional[int]) -> PublishConflict:
    return PublishConflict(
        f"table {name}: main moved to {current_id} since epoch {epoch} was staged on {base}; publishing it would "
        "drop that snapshot. Recompute the epoch (is another writer committing to this table outside Tidemark?)")


def rewrites_only(table: Table, head: Optional[Snapshot], base: Optional[int]) -> bool:
    """Whether ``main`` moved from ``base`` to ``head`` by ``replace`` commits alone: compactions (a catalog's
    maintenance, Trino's ``optimize``, Spark's ``rewrite_data_files``) that put the same rows in other files. A
    write staged on ``base`` then holds exactly the rows it would hold on ``head``, so publishing it drops only that
    rewrite (Tidemark's GC expires it), no row; the engine compacts again at its next run."""
    snapshot = head
    while snapshot is not None and snapshot.snapshot_id != base:
        if snapshot.summary is None or snapshot.summary.operation != Operation.REPLACE:
            return False
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return snapshot is not None


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


def advance_committed_epoch(table: Table, progress: EpochProgress, term: int) -> bool:
    """Record in the table that ``progress.epoch`` committed (monotonic, idempotent), as leader ``term``;
    False when the table already records it or a later epoch.

    This is how an epoch with no new data is marked: one metadata-only commit, no snapshot,
    no manifest, carrying the whole ``EpochProgress`` (job, epoch, term, inputs). An epoch
    that published a snapshot needs no mark (its snapshot carries the same), except the
    writer's first, which records ``tidemark.first-epoch``.
    """
    def attempt() -> bool:
        table.refresh()
        lineage = EpochLineage(table)
        current = lineage.committed_progress()
        newer = current is None or current.epoch < progress.epoch or (
            current.epoch == progress.epoch and current.inputs is None and progress.inputs is not None)
        updates = committed_properties(progress) if newer else {}
        if table.properties.get(FIRST_EPOCH_PROPERTY) is None:
            updates[FIRST_EPOCH_PROPERTY] = str(lineage.first_epoch or progress.epoch)
        if not updates:
            return False
        _commit(table, term, (SetPropertiesUpdate(updates=updates),))
        return True

    return _retry_lost_races(attempt, f"marking epoch {progress.epoch} committed in table {'.'.join(table.name())}")


def claim_table(table: Table, job: str, term: int, release: bool = False) -> None:
    """Record ``job`` as the table's writer and ``term`` as its fencing floor (idempotent).

    A new leader calls it before it writes anything: from then on no commit of a lower term
    lands on the table. ``Fenced`` when the table is already claimed by a higher term.
    ``release``: ``tidemark unregister`` fences the table for good and records that its writer
    released it (``is_released``; a later leader's claim, at a higher term, undoes that).
    """
    updates = {WRITER_PROPERTY: job, TERM_PROPERTY: str(term), **({RELEASED_PROPERTY: str(term)} if release else {})}

    def attempt() -> None:
        table.refresh()
        recorded = claimed_term(table.properties)
        if recorded > term:
            raise _fenced(table, term)
        if all(table.properties.get(key) == value for key, value in updates.items()):
            return
        _commit(table, term, (SetPropertiesUpdate(updates=updates),))

    _retry_lost_races(attempt, f"claiming table {'.'.join(table.name())} for job {job} (term {term})")
