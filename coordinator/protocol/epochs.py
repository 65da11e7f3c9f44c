"""The epoch state machine of one job, driven by its leader. The whole protocol is here (``EpochCoordinator``).

Transitions (anything else raises ``EpochOrderError``)::

    (none) | COMMITTED(L) --begin(T)--> STARTED(T)          T a barrier after L (the job's pacing picks it)
    (none) | COMMITTED(L) --commit_idle(T)--> COMMITTED(T)  inputs unchanged: nothing to compute
    STARTED(T) | ABORTED(T) --begin(T)--> STARTED(T)        recompute, same recorded inputs
    STARTED(T) | ABORTED(T) --commit_idle(T)--> COMMITTED(T)
    STARTED(T) --precommit--> PRECOMMITTED(T) --commit--> COMMITTED(T)
    STARTED(T) --abort--> ABORTED(T)

``begin`` refuses anything but a barrier of the grid after the last committed epoch. Which
barrier is the job's pacing (``pacing.py``): the newest one every managed source holds, so one
epoch may cover several barriers (coalescing), and the epoch's recorded inputs say exactly
which slice ``(previous epoch, T]`` of each source it covers. ``commit`` advances the tidemark
of every sink table and marks the epoch COMMITTED in one multi: the epoch becomes visible to
consistent readers everywhere at once, or not at all. A leader that finds no epoch history in
ZooKeeper, or one older than its sinks' Iceberg metadata records, resumes from that metadata
(``EpochCoordinator.recover``).
``docs/design.md``, "The epoch state machine", says why each step is there.
"""
from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Callable, Optional

from coordinator.errors import ConfigurationError, CorruptState, EpochOrderError, MultiFailed
from coordinator.iceberg.progress import ResumePoint
from coordinator.names import parse_epoch
from coordinator.protocol.barriers import BarrierGrid, Barriers
from coordinator.protocol.leadership import Leadership
from coordinator.records import EpochInputs, EpochRecord, EpochState, StagedWrite, TableTidemark
from coordinator.zookeeper.ops import Create, Delete, Op, SetData
from coordinator.zookeeper.session import ZooKeeperSession

log = logging.getLogger(__name__)


def newest_epoch(tm: ZooKeeperSession, job: str) -> Optional[int]:
    """The newest epoch ``job`` has a record of (``/jobs/<job>/epochs/<T>``), whatever its state: its epoch in
    flight when it is newer than the job's tidemarks (None: no record)."""
    recorded = (parse_epoch(name) for name in tm.children(tm.paths.epochs(job)))
    return max((e for e in recorded if e is not None), default=None)


class RecoveryAction(str, enum.Enum):
    """What a new leader does first, by the state of the job's last epoch (``EpochCoordinator.recover``).

    ``START``: no epoch yet, begin at the first barrier the job may process. ``NEXT``: the last epoch is
    committed, begin the next one its pacing picks. ``ROLL_FORWARD``: the last epoch is precommitted, publish its
    staged snapshots, then commit it. ``RECOMPUTE``: it is started or aborted, compute it again from its recorded
    inputs (``EpochCoordinator.to_recompute``).
    """

    START = "START"                # no epoch yet: begin at the first barrier the job may process
    NEXT = "NEXT"                  # the last epoch is committed: begin the next one its pacing picks
    ROLL_FORWARD = "ROLL_FORWARD"  # precommitted: publish the staged snapshots, then commit
    RECOMPUTE = "RECOMPUTE"        # started or aborted: recompute from the recorded inputs


@dataclass(frozen=True)
class Recovery:
    """What ``EpochCoordinator.recover`` found: the ``action`` to take, the last epoch's record and the last
    committed epoch, and the Iceberg progress written back when ZooKeeper held no epoch of the job, or only older
    ones."""

    action: RecoveryAction
    epoch: Optional[EpochRecord]        # the last epoch's record (None for START)
    last_committed: Optional[int]
    resumed_from: Optional[ResumePoint] = None   # the Iceberg progress written back (ZooKeeper's was behind)


class EpochCoordinator:
    """The epoch state machine of one job, run by its leader through the ``Leadership`` it holds: one per term,
    ``recover`` first.

        epochs = EpochCoordinator(leadership, sinks=["lake.db.word_counts"])
        recovery = epochs.recover()                 # what to do with the last epoch after a failover
        epochs.begin(T, EpochInputs(...))           # T = Pacing.choose(...).epoch, after epochs.last_committed
        ... stage each sink, with summary tidemark.epoch=T ...
        epochs.precommit(T, staged={"lake.db.word_counts": 42})
        ... publish each staged snapshot (idempotent) ...
        epochs.commit(T, published={"lake.db.word_counts": 42})

        epochs.commit_idle(T, inputs)               # no source changed: COMMITTED in one multi

    Znodes: ``/jobs/<job>/epochs/<T>`` (an ``EpochRecord`` each, in the states of ``EpochState``; only the newest
    ``history`` are kept, older ones deleted in the multi of the next ``begin`` or ``commit_idle``) and each
    sink's ``/tables/<sink>/tidemark``, advanced in the multi that commits an epoch. Records and tidemarks are stamped
    on ZooKeeper's clock. ``grid`` says which times are barriers (default: ``Barriers.grid``, a read per epoch).

    Failure behaviour: every write is a leader ``transact`` (the term and incarnation checks in the same multi),
    so a replica that may not write now gets ``NotLeader`` (connection suspended) or ``Fenced`` (session lost,
    term or registration moved on) and changes nothing. A step out of order raises ``EpochOrderError``. A write
    whose reply was lost and that was applied all the same is recognised as applied by re-reading the epoch
    znode; an epoch znode someone else changed raises ``CorruptState`` (call ``recover`` again). ``history``
    below 2 is a ``ConfigurationError``.
    """

    def __init__(self, leadership: Leadership, sinks: Iterable[str], history: int = 100,
                 grid: Optional[Callable[[], BarrierGrid]] = None) -> None:
        if history < 2:
            raise ConfigurationError("history must keep at least 2 epochs (the last committed and the one in flight)")
        self.leadership = leadership
        self.tm = leadership.tm
        self.job = leadership.job
        self.sinks = tuple(sorted(sinks))
        self.history = history
        self._grid = grid or Barriers(leadership.tm).grid  # a writer passes its watched copy: no read per epoch
        self.current: Optional[EpochRecord] = None
        self.last_committed: Optional[int] = None
        self._version = -1       # znode version of the current epoch's record
        self._known: list[int] = []
        self._marks: dict[str, TableTidemark] = {}

    # -- recovery -----------------------------------------------------------------------------

    def recover(self, resume: Optional[Callable[[], ResumePoint]] = None, after_loss: bool = False) -> Recovery:
        """Read the job's epochs and say what the new leader must do; call it once after acquiring leadership.

        ``resume()`` (the sinks' Iceberg progress) is read and written back first, in one leader multi, when
        ZooKeeper holds no epoch of the job (a new chroot, an unregistered and re-registered job, a rebuilt
        ensemble) or only epochs older than the newest its sinks record (a tree restored from an older copy: its
        epochs are deleted in the same multi): its committed epoch as the job's COMMITTED epoch (with its input
        ranges, and the sinks' tidemarks at it, with a read floor) and an epoch in flight as STARTED with its
        recorded inputs, so the job carries on exactly where its sinks say it was.

        :param resume: reads the sinks' ``ResumePoint``.
        :param after_loss: this process found ZooKeeper behind its session (rebuilt or restored) and started over:
            the sinks' tidemarks get a read floor even when ZooKeeper's history is not behind Iceberg's, since the
            epochs committed after the copy was taken, and marked nowhere else, were read.
        :raises CorruptState: an epoch or tidemark znode cannot be decoded, or ZooKeeper holds no epoch of the job
            and its sinks' progress cannot be resumed from (``resume_point``).
        :raises Fenced: writing the resumed history back, this replica no longer holds its term.
        """
        p = self.tm.paths
        self._known = self._recorded()
        try:
            seeded = resume() if resume is not None else None
        except CorruptState:
            if not self._known:
                raise
            seeded = None  # progress of a release before format 1: no resuming from it, and ZooKeeper has history
        newest = seeded.newest_epoch if seeded is not None else None
        if newest is None or (self._known and newest <= self._known[-1]):
            seeded = None  # nothing of this job in Iceberg, or ZooKeeper's history covers it
        if seeded is not None:
            if self._known:
                log.warning("job %s: ZooKeeper's newest epoch of it (%s) is older than its sinks' Iceberg metadata "
                            "records (%s): the tree was restored from an older copy; resuming from Iceberg",
                            self.job, self._known[-1], newest)
            self._seed(seeded, stale=self._known)
            self._known = self._recorded()
        marks = self.tm.get_many([p.tidemark(t) for t in self.sinks])
        self._marks = {t: TableTidemark.from_json(m[0], p.tidemark(t)) if m else TableTidemark(t)
                       for t, m in zip(self.sinks, marks)}
        if after_loss and seeded is None:
            self._raise_floors()
        self.current, self.last_committed = None, None
        for epoch in reversed(self._known):
            found = self.tm.read(p.epoch(self.job, epoch), EpochRecord)
            if found is None:
                continue
            record, stat = found
            if self.current is None:
                self.current, self._version = record, stat.version
            if record.state == EpochState.COMMITTED:
                self.last_committed = record.epoch
                break
        last = self.current
        if last is None:
            return Recovery(RecoveryAction.START, None, None)
        if last.state == EpochState.COMMITTED:
            return Recovery(RecoveryAction.NEXT, last, last.epoch, seeded)
        if last.state == EpochState.PRECOMMITTED:
            return Recovery(RecoveryAction.ROLL_FORWARD, last, self.last_committed, seeded)
        return Recovery(RecoveryAction.RECOMPUTE, last, self.last_committed, seeded)

    def _recorded(self) -> list[int]:
        return sorted(e for e in map(parse_epoch, self.tm.children(self.tm.paths.epochs(self.job))) if e is not None)

    def _read_floor(self, stamp: int) -> int:
        """The read floor of a resumption at ``stamp`` (ZooKeeper's clock): the newest barrier then, at or above any
        epoch committed before ZooKeeper's state was lost."""
        return self._grid().floor(stamp)

    def _raise_floors(self) -> None:
        """Every sink's tidemark with the read floor ``_seed`` gives, in one leader multi."""
        floor = self._read_floor(self._now())
        self._marks = {t: replace(m, read_floor=max(floor, m.read_floor or 0)) for t, m in self._marks.items()}
        self.leadership.transact([SetData(self.tm.paths.tidemark(t), m.to_json()) for t, m in self._marks.items()])

    def _seed(self, resume: ResumePoint, stale: Iterable[int] = ()) -> None:
        """Write the Iceberg progress back as the job's epoch history (one leader multi).

        Iceberg may be behind what ZooKeeper had committed (an idle epoch is marked once per marker period, and
        the loss may fall between an epoch's ZooKeeper commit and its marks), so every sink's tidemark gets a read
        floor: the newest barrier now, at or above any epoch committed before the loss. No consistent version
        below it is read until the job has committed past it ("When ZooKeeper loses its state" in
        docs/design.md)."""
        p = self.tm.paths
        ops: list[Op] = [Delete(p.epoch(self.job, e)) for e in stale]
        stamp = self._now()
        floor = self._read_floor(stamp)
        committed, in_flight = resume.committed, resume.in_flight
        if committed is not None:
            published = {t: resume.snapshots.get(t) for t in self.sinks}
            record = EpochRecord(epoch=committed.epoch, state=EpochState.COMMITTED, term=committed.term,
                                 inputs=committed.inputs or EpochInputs(), published=published, updated_ms=stamp)
            ops.append(Create(p.epoch(self.job, committed.epoch), record.to_json()))
            first = resume.first_epoch if resume.first_epoch is not None else committed.epoch
            ops += [SetData(p.tidemark(t), TableTidemark(t, committed.epoch, published[t], stamp, first,
                                                         resume.recorded.get(t, ()), floor).to_json())
                    for t in self.sinks]
        else:
            ops += [SetData(p.tidemark(t), TableTidemark(t, read_floor=floor).to_json()) for t in self.sinks]
        if in_flight is not None:
            record = EpochRecord(epoch=in_flight.epoch, state=EpochState.STARTED, term=self.leadership.leading_term,
                                 inputs=in_flight.inputs or EpochInputs(), updated_ms=stamp)
            ops.append(Create(p.epoch(self.job, in_flight.epoch), record.to_json()))
        self.leadership.transact(ops)

    def _now(self) -> int:
        """Records and tidemarks are stamped on ZooKeeper's clock ("Clocks" in docs/design.md): a table's commit
        time, and every freshness figure read from it, stay true whatever this host's clock says."""
        return self.tm.server_clock.now_ms()

    def mark(self, table: str) -> TableTidemark:
        """The sink's tidemark as this leader last read or wrote it."""
        return self._marks.get(table) or TableTidemark(table)

    @property
    def first_epoch(self) -> Optional[int]:
        """The job's first committed epoch (its sinks have no exact state before it)."""
        firsts = [m.first_epoch for m in self._marks.values() if m.first_epoch is not None]
        return min(firsts) if firsts else None

    # -- transitions ----------------------------------------------------------------------------

    def begin(self, epoch: int, inputs: Optional[EpochInputs] = None) -> EpochRecord:
        """Record epoch ``epoch``'s inputs (or reuse the recorded ones when recomputing).

        :param inputs: what the epoch reads (None: the recorded inputs of an epoch recomputed, else none).
        :raises EpochOrderError: ``epoch`` is not a barrier of the grid after the last committed epoch, another
            epoch is in flight, or ``inputs`` differ from the ones recorded for the epoch recomputed.
        :raises NotLeader: the connection is suspended (``Leadership.transact``).
        :raises Fenced: this replica no longer holds its term.
        """
        redo, inputs = self._prepare(epoch, inputs)
        record = EpochRecord(epoch=epoch, state=EpochState.STARTED, term=self.leadership.leading_term,
                             inputs=inputs, updated_ms=self._now())
        self._write(self._record_ops(record, redo), record, created=not redo)
        return record

    def commit_idle(self, epoch: int, inputs: Optional[EpochInputs] = None) -> EpochRecord:
        """Commit epoch ``epoch`` in which no sink changes (the caller established that its inputs did not
        change): one multi, and every sink keeps its snapshot.

        :raises EpochOrderError: as ``begin``.
        :raises NotLeader: the connection is suspended (``Leadership.transact``).
        :raises Fenced: this replica no longer holds its term.
        """
        redo, inputs = self._prepare(epoch, inputs)
        published = {t: self._marks[t].snapshot_id if t in self._marks else None for t in self.sinks}
        record = EpochRecord(epoch=epoch, state=EpochState.COMMITTED, term=self.leadership.leading_term,
                             inputs=inputs, published=published, updated_ms=self._now())
        marks = self._advanced(epoch, published, record.updated_ms)
        self._write(self._tidemark_ops(marks) + self._record_ops(record, redo), record, created=not redo)
        self._committed(epoch, marks)
        return record

    def to_recompute(self, epoch: int) -> Optional[EpochInputs]:
        """The inputs recorded for ``epoch`` when it is the job's current epoch, STARTED or ABORTED: it must be
        recomputed from exactly those (None: ``epoch`` is not one to recompute)."""
        current = self.current
        if current is not None and current.epoch == epoch and current.state in (EpochState.STARTED,
                                                                                 EpochState.ABORTED):
            return current.inputs
        return None

    def _prepare(self, epoch: int, inputs: Optional[EpochInputs]) -> tuple[bool, EpochInputs]:
        recorded = self.to_recompute(epoch)
        if recorded is not None:
            if inputs is not None and inputs != recorded:
                raise EpochOrderError(f"job {self.job!r} epoch {epoch} is being recomputed: it must read the "
                                      f"recorded inputs {recorded.to_dict()}, not {inputs.to_dict()}")
            return True, recorded
        self._check_can_begin(epoch)
        return False, inputs or EpochInputs()

    def _record_ops(self, record: EpochRecord, redo: bool) -> list[Op]:
        path = self.tm.paths.epoch(self.job, record.epoch)
        ops: list[Op] = [SetData(path, record.to_json(), self._version) if redo else Create(path, record.to_json())]
        excess = len(self._known) + (0 if redo else 1) - self.history
        stale = [e for e in self._known if e != record.epoch][:max(0, excess)]
        return ops + [Delete(self.tm.paths.epoch(self.job, e)) for e in stale]

    def _check_can_begin(self, epoch: int) -> None:
        current = self.current
        if current is not None and current.state == EpochState.PRECOMMITTED:
            raise EpochOrderError(f"job {self.job!r} epoch {current.epoch} is PRECOMMITTED: commit it (roll it "
                                  f"forward) before beginning {epoch}")
        if current is not None and current.state in (EpochState.STARTED, EpochState.ABORTED):
            raise EpochOrderError(f"job {self.job!r} epoch {current.epoch} is {current.state.value}: finish or "
                                  f"recompute it before beginning {epoch}")
        if self.last_committed is not None and epoch <= self.last_committed:
            raise EpochOrderError(f"job {self.job!r} already committed barrier {self.last_committed}; {epoch} is "
                                  "not after it (barriers are never repeated)")
        if not self._grid().is_barrier(epoch):
            raise EpochOrderError(f"{epoch} is not a barrier of the grid under {self.tm.paths.barriers}: only "
                                  "barriers are epochs")

    def precommit(self, epoch: int, staged: Mapping[str, Optional[int]],
                  writes: Mapping[str, StagedWrite] = MappingProxyType({})) -> EpochRecord:
        """Record the staged snapshot of every sink (None: nothing to publish); from now on the epoch must commit.

        :param staged: the staged snapshot id of each of the job's sinks, every sink named.
        :param writes: the writes of the sinks staged with no catalog commit, which the publish adds to them.
        :raises EpochOrderError: ``epoch`` is not the epoch in flight or not STARTED, or ``staged`` does not name
            exactly the sinks.
        :raises NotLeader: the connection is suspended (``Leadership.transact``).
        :raises Fenced: this replica no longer holds its term.
        """
        current = self._require(epoch, EpochState.STARTED, "precommit")
        self._require_sinks(staged, epoch, "precommit")
        record = replace(current, state=EpochState.PRECOMMITTED, term=self.leadership.leading_term, staged=dict(staged),
                         writes=dict(writes), updated_ms=self._now())
        self._write([SetData(self.tm.paths.epoch(self.job, epoch), record.to_json(), self._version)], record)
        return record

    def commit(self, epoch: int, published: Mapping[str, Optional[int]]) -> EpochRecord:
        """Advance every sink's tidemark to ``epoch`` and mark the epoch COMMITTED, in one multi.

        ``published`` is each sink's snapshot at epoch ``epoch`` (its newest snapshot with
        ``tidemark.epoch <= epoch``; None for a table that has none).

        :raises EpochOrderError: ``epoch`` is not the epoch in flight or not PRECOMMITTED, or ``published`` does
            not name exactly the sinks.
        :raises NotLeader: the connection is suspended (``Leadership.transact``).
        :raises Fenced: this replica no longer holds its term.
        """
        current = self._require(epoch, EpochState.PRECOMMITTED, "commit")
        self._require_sinks(published, epoch, "commit")
        stamp = self._now()
        record = replace(current, state=EpochState.COMMITTED, term=self.leadership.leading_term,
                         published=dict(published), writes={}, updated_ms=stamp)
        marks = self._advanced(epoch, published, stamp)
        ops = self._tidemark_ops(marks)
        ops.append(SetData(self.tm.paths.epoch(self.job, epoch), record.to_json(), self._version))
        self._write(ops, record)
        self._committed(epoch, marks)
        return record

    def _advanced(self, epoch: int, published: Mapping[str, Optional[int]], stamp: int) -> dict[str, TableTidemark]:
        """Every sink's tidemark after committing ``epoch``: built once, written, then kept as this leader's."""
        return {t: self.mark(t).advanced(epoch, published[t], stamp) for t in self.sinks}

    def _tidemark_ops(self, marks: Mapping[str, TableTidemark]) -> list[Op]:
        return [SetData(self.tm.paths.tidemark(t), mark.to_json()) for t, mark in marks.items()]

    def _committed(self, epoch: int, marks: dict[str, TableTidemark]) -> None:
        self.last_committed = epoch
        self._marks = marks

    def abort(self, epoch: int, reason: str = "") -> EpochRecord:
        """Give up an epoch that was not precommitted: its staged snapshots will never be published.

        :param reason: why, recorded as the epoch's ``abort_reason`` (empty: none).
        :raises EpochOrderError: ``epoch`` is not the epoch in flight or not STARTED.
        :raises NotLeader: the connection is suspended (``Leadership.transact``).
        :raises Fenced: this replica no longer holds its term.
        """
        current = self._require(epoch, EpochState.STARTED, "abort")
        record = replace(current, state=EpochState.ABORTED, abort_reason=reason or None, updated_ms=self._now())
        self._write([SetData(self.tm.paths.epoch(self.job, epoch), record.to_json(), self._version)], record)
        return record

    # -- plumbing -----------------------------------------------------------------------------------

    def _require(self, epoch: int, state: EpochState, step: str) -> EpochRecord:
        current = self.current
        if current is None or current.epoch != epoch:
            raise EpochOrderError(f"job {self.job!r} cannot {step} epoch {epoch}: the epoch in flight is "
                                  f"{current.epoch if current else 'none'}")
        if current.state != state:
            raise EpochOrderError(f"job {self.job!r} cannot {step} epoch {epoch}: it is {current.state.value}, "
                                  f"not {state.value}")
        return current

    def _require_sinks(self, per_sink: Mapping[str, Any], epoch: int, step: str) -> None:
        if tuple(sorted(per_sink)) != self.sinks:
            raise EpochOrderError(f"{step} of job {self.job!r} epoch {epoch} must name exactly its sinks "
                                  f"{list(self.sinks)}, got {sorted(per_sink)}")

    def _write(self, ops: list[Op], record: EpochRecord, created: bool = False) -> None:
        path = self.tm.paths.epoch(self.job, record.epoch)
        try:
            self.leadership.transact(ops)
        except MultiFailed:
            # The reply of an earlier attempt may have been lost after it was applied: check.
            found = self.tm.read(path, EpochRecord)
            if found is None or found[0].state != record.state or found[0].term != record.term:
                raise CorruptState(f"{path}: changed behind this leader's back (found "
                                   f"{found[0].state.value if found else 'nothing'}); run recover()") from None
            self.current, self._version = found[0], found[1].version
            self._known = sorted(set(self._known) | {record.epoch})
            return
        self.current = record
        self._version = 0 if created else self._version + 1
        deleted = {int(op.path.rsplit("/", 1)[1]) for op in ops if op.kind == "delete"}
        self._known = sorted(set(self._known) - deleted | {record.epoch})
