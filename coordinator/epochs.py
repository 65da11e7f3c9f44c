"""The epoch state machine of one job, driven by its leader. The whole protocol is here.

    epochs = EpochCoordinator(leadership, sinks=["lake.db.word_counts"], grid=tm.barriers.grid())
    recovery = epochs.recover()                     # what to do with the last epoch after a failover
    epochs.begin(T, inputs={"lake.db.words": [s0, s1]})
    ... stage each sink, with summary tidemark.epoch=T ...
    epochs.precommit(T, staged={"lake.db.word_counts": 42})
    ... publish each staged snapshot (idempotent) ...
    epochs.commit(T, published={"lake.db.word_counts": 42})

Transitions (anything else raises ``EpochOrderError``)::

    (none) | COMMITTED(T-1) --begin(T)--> STARTED(T)          T = the grid's next barrier
    STARTED(T) | ABORTED(T) --begin(T)--> STARTED(T)          recompute, same recorded inputs
    STARTED(T) --precommit--> PRECOMMITTED(T) --commit--> COMMITTED(T)
    STARTED(T) --abort--> ABORTED(T)

Every write is a leader ``transact`` (term check in the same multi). ``commit`` advances the
tidemark of every sink table and marks the epoch COMMITTED in one multi: the epoch becomes
visible to consistent readers everywhere at once, or not at all. A write whose reply was
lost and that is retried is recognised as already applied by re-reading the epoch znode.
Only the newest ``history`` epoch znodes are kept.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional

from .barriers import BarrierGrid
from .client import MultiFailed, Op, create, delete, set_data
from .errors import CorruptState, EpochOrderError
from .leadership import Leadership
from .records import EpochRecord, EpochState, TableTidemark, now_ms


class RecoveryAction(str, enum.Enum):
    START = "START"                # no epoch yet: begin at any barrier of the grid
    NEXT = "NEXT"                  # the last epoch is committed: begin the next barrier
    ROLL_FORWARD = "ROLL_FORWARD"  # precommitted: publish the staged snapshots, then commit
    RECOMPUTE = "RECOMPUTE"        # started or aborted: recompute from the recorded inputs


@dataclass(frozen=True)
class Recovery:
    action: RecoveryAction
    epoch: Optional[EpochRecord]        # the last epoch's record (None for START)
    last_committed: Optional[int]
    next_epoch: Optional[int]           # the barrier to process next (None for START)


class EpochCoordinator:
    def __init__(self, leadership: Leadership, sinks, grid: BarrierGrid, history: int = 100) -> None:
        if history < 2:
            raise ValueError("history must keep at least 2 epochs (the last committed and the one in flight)")
        self.leadership = leadership
        self.tm = leadership.tm
        self.job = leadership.job
        self.sinks = tuple(sorted(sinks))
        self.grid = grid
        self.history = history
        self.current: Optional[EpochRecord] = None
        self.last_committed: Optional[int] = None
        self._version = -1       # znode version of the current epoch's record
        self._known: list[int] = []

    # -- recovery -----------------------------------------------------------------------------

    def recover(self) -> Recovery:
        """Read the job's epochs and say what the new leader must do; call it once after acquiring leadership."""
        p = self.tm.paths
        self._known = sorted(int(c) for c in self.tm.children(p.epochs(self.job)) if c.isdigit())
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
            return Recovery(RecoveryAction.START, None, None, None)
        if last.state == EpochState.COMMITTED:
            return Recovery(RecoveryAction.NEXT, last, last.epoch, self.grid.next_after(last.epoch))
        if last.state == EpochState.PRECOMMITTED:
            return Recovery(RecoveryAction.ROLL_FORWARD, last, self.last_committed, last.epoch)
        return Recovery(RecoveryAction.RECOMPUTE, last, self.last_committed, last.epoch)

    # -- transitions ----------------------------------------------------------------------------

    def expected_next(self) -> Optional[int]:
        return None if self.last_committed is None else self.grid.next_after(self.last_committed)

    def begin(self, epoch: int, inputs: Optional[Mapping[str, Any]] = None) -> EpochRecord:
        """Record epoch ``epoch``'s inputs (or reuse the recorded ones when recomputing)."""
        current = self.current
        redo = current is not None and current.epoch == epoch and current.state in (EpochState.STARTED,
                                                                                     EpochState.ABORTED)
        if redo:
            recorded = dict(current.inputs)  # type: ignore[union-attr]
            if inputs is not None and dict(inputs) != recorded:
                raise EpochOrderError(f"job {self.job!r} epoch {epoch} is being recomputed: it must read the "
                                      f"recorded inputs {recorded}, not {dict(inputs)}")
            inputs = recorded
        else:
            self._check_can_begin(epoch)
        record = EpochRecord(epoch=epoch, state=EpochState.STARTED, term=self.leadership.term,  # type: ignore[arg-type]
                             inputs=dict(inputs or {}))
        path = self.tm.paths.epoch(self.job, epoch)
        ops: list[Op] = [set_data(path, record.to_json(), self._version) if redo else create(path, record.to_json())]
        stale = [e for e in self._known if e != epoch][:max(0, len(self._known) + (0 if redo else 1) - self.history)]
        ops += [delete(self.tm.paths.epoch(self.job, e)) for e in stale]
        self._write(ops, record, created=not redo)
        self._known = sorted(set(self._known) - set(stale) | {epoch})
        return record

    def _check_can_begin(self, epoch: int) -> None:
        current = self.current
        if current is not None and current.state == EpochState.PRECOMMITTED:
            raise EpochOrderError(f"job {self.job!r} epoch {current.epoch} is PRECOMMITTED: commit it (roll it "
                                  f"forward) before beginning {epoch}")
        if current is not None and current.state in (EpochState.STARTED, EpochState.ABORTED):
            raise EpochOrderError(f"job {self.job!r} epoch {current.epoch} is {current.state.value}: finish or "
                                  f"recompute it before beginning {epoch}")
        if not self.grid.is_barrier(epoch):
            raise EpochOrderError(f"{epoch} is not a barrier of the shared grid (every {self.grid.interval_at(epoch)} ms)")
        expected = self.expected_next()
        if expected is not None and epoch != expected:
            word = "already committed" if epoch <= (self.last_committed or 0) else "skips barriers"
            raise EpochOrderError(f"job {self.job!r} must process barrier {expected} next; {epoch} {word} "
                                  "(barriers are never merged or repeated)")

    def precommit(self, epoch: int, staged: Mapping[str, Optional[int]]) -> EpochRecord:
        """Record the staged snapshot of every sink (None: nothing to publish); from now on the epoch must commit."""
        current = self._require(epoch, EpochState.STARTED, "precommit")
        self._require_sinks(staged, epoch, "precommit")
        record = replace(current, state=EpochState.PRECOMMITTED, term=self.leadership.term, staged=dict(staged),
                         updated_ms=now_ms())
        self._write([set_data(self.tm.paths.epoch(self.job, epoch), record.to_json(), self._version)], record)
        return record

    def commit(self, epoch: int, published: Mapping[str, Optional[int]]) -> EpochRecord:
        """Advance every sink's tidemark to ``epoch`` and mark the epoch COMMITTED, in one multi.

        ``published`` is each sink's snapshot at epoch ``epoch`` (its newest snapshot with
        ``tidemark.epoch <= epoch``; None for a table that has none).
        """
        current = self._require(epoch, EpochState.PRECOMMITTED, "commit")
        self._require_sinks(published, epoch, "commit")
        stamp = now_ms()
        record = replace(current, state=EpochState.COMMITTED, term=self.leadership.term, published=dict(published),
                         updated_ms=stamp)
        p = self.tm.paths
        ops = [set_data(p.tidemark(t), TableTidemark(t, epoch, published[t], stamp).to_json()) for t in self.sinks]
        ops.append(set_data(p.epoch(self.job, epoch), record.to_json(), self._version))
        self._write(ops, record)
        self.last_committed = epoch
        return record

    def abort(self, epoch: int, reason: str = "") -> EpochRecord:
        """Give up an epoch that was not precommitted: its staged snapshots will never be published."""
        current = self._require(epoch, EpochState.STARTED, "abort")
        record = replace(current, state=EpochState.ABORTED, inputs={**current.inputs, "_abort_reason": reason}
                         if reason else current.inputs, updated_ms=now_ms())
        self._write([set_data(self.tm.paths.epoch(self.job, epoch), record.to_json(), self._version)], record)
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
            return
        self.current = record
        self._version = 0 if created else self._version + 1
