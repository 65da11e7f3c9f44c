"""The barrier grid shared by every job, and barriers agreed on demand.

    barriers = tm.barriers
    grid = barriers.ensure_grid(interval_ms=5000)        # first caller defines it; the rest must agree
    barriers.agree(grid.floor(now_ms() - grace), proposed_by="ingest")   # a root job, when it may
    barriers.next_after(last_committed)                  # the barrier a job must process next

The grid (``/barriers``: interval, mode, future interval changes) only gives the
*candidate* times ``T = start + k * interval_ms``. Only **agreed** barriers,
``/barriers/<T>``, are epochs, and every job processes every agreed barrier, in order.

Why the agreed barriers are append-only and strictly increasing, whatever the races:
``/barriers`` also records the newest agreed barrier, and agreeing ``T`` is one multi,
``set(/barriers, newest=T, version=v)`` plus ``Create(/barriers/T)``, decided on the
record read at version ``v`` and refused unless ``T > newest``. ZooKeeper applies
multis one at a time and the version check makes each one conditional on no other
agreement (nor grid change) having been applied since the read. So every applied
agreement compares ``T`` with the true newest barrier at the moment it is applied, and
no barrier can ever be agreed below (or equal to) one that exists. A proposer that
loses the race re-reads and finds its candidate already covered: it then processes the
barriers that were agreed instead. Interval changes go through the same version, so a
change can only take effect after the newest agreed barrier.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, TypeVar

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from coordinator.errors import (
    ConfigurationError,
    EpochOrderError,
    InvalidArgument,
    InvalidName,
    MultiFailed,
    ZooKeeperUnavailable,
)
from coordinator.names import parse_epoch, validate_epoch
from coordinator.records import BarrierMode, BarrierRecord, JsonRecord, _epoch, _int, _opt_epoch, now_ms
from coordinator.zookeeper.ops import Create, Delete, Op, SetData
from coordinator.zookeeper.session import ZooKeeperSession

# Backpressure: a root job agrees no new barrier while a live job is more agreed barriers behind than this.
DEFAULT_MAX_PENDING_BARRIERS = 2
T = TypeVar("T")


@dataclass(frozen=True)
class BarrierGrid(JsonRecord):
    """``/barriers``: the interval, the mode, future interval changes ``[{from_epoch, interval_ms}]`` and the
    newest agreed barrier (the compare-and-set point of agreement)."""

    interval_ms: int
    mode: BarrierMode = BarrierMode.PROCESSING_TIME
    changes: tuple[Any, ...] = ()
    newest_agreed: Optional[int] = None

    def __post_init__(self) -> None:
        _opt_epoch(self.newest_agreed, "newest_agreed")
        if _int(self.interval_ms, "interval_ms") <= 0:
            raise InvalidArgument(f"interval_ms must be positive, got {self.interval_ms}")
        object.__setattr__(self, "mode", BarrierMode(self.mode))
        changes = tuple(dict(c) for c in self.changes)
        for change in changes:
            _epoch(change.get("from_epoch"), "from_epoch")
            if _int(change.get("interval_ms"), "interval_ms") <= 0:
                raise InvalidArgument(f"invalid interval change {change!r}")
        object.__setattr__(self, "changes", tuple(sorted(changes, key=lambda c: c["from_epoch"])))

    def _segment(self, t: int) -> tuple[int, int]:
        start, interval = 0, self.interval_ms
        for change in self.changes:
            if change["from_epoch"] <= t:
                start, interval = change["from_epoch"], change["interval_ms"]
        return start, interval

    def is_barrier(self, t: int) -> bool:
        start, interval = self._segment(t)
        return (t - start) % interval == 0

    def floor(self, wall_ms: int) -> int:
        """The newest barrier at or before ``wall_ms``."""
        start, interval = self._segment(wall_ms)
        return start + (wall_ms - start) // interval * interval

    def next_candidate(self, t: int) -> int:
        """The first grid point after ``t`` (a candidate; only agreed barriers are epochs)."""
        start, interval = self._segment(t)
        candidate = start + ((t - start) // interval + 1) * interval
        upcoming = [c["from_epoch"] for c in self.changes if t < c["from_epoch"] < candidate]
        return min(upcoming) if upcoming else candidate

    def interval_at(self, t: int) -> int:
        return self._segment(t)[1]


class _Moved(Exception):
    """``/barriers`` changed between our read and our conditional write; decide again."""


class Barriers:
    def __init__(self, tm: ZooKeeperSession) -> None:
        self.tm = tm

    def _read(self) -> tuple[BarrierGrid, Any]:
        found = self.tm.get(self.tm.paths.barriers)
        if found is None or not found[0]:
            raise ConfigurationError("no barrier grid is defined yet: a job must call "
                                     "tm.barriers.ensure_grid(interval_ms=...) (EpochWriter does)")
        return BarrierGrid.from_json(found[0], self.tm.paths.barriers), found[1]

    def grid(self) -> BarrierGrid:
        return self._read()[0]

    def _conditionally(self, what: str, attempt: Callable[[], T]) -> T:
        retrying = Retrying(stop=stop_after_delay(self.tm.operation_timeout), reraise=False,
                            wait=wait_random_exponential(0.005, 0.2), retry=retry_if_exception_type(_Moved),
                            before_sleep=self.tm.count_retries("barriers"))
        try:
            return retrying(attempt)
        except RetryError:
            raise ZooKeeperUnavailable(f"{what} kept racing with other writers of /barriers for "
                                       f"{self.tm.operation_timeout:.0f}s; try again") from None

    def _write(self, ops: list[Op], expected_version: int) -> None:
        try:
            self.tm.multi(ops)
        except MultiFailed as failed:
            if (isinstance(failed.error, BadVersionError) and not isinstance(failed.op, Create)
                    and failed.op.version == expected_version):
                raise _Moved() from None
            raise

    def ensure_grid(self, interval_ms: int, mode: BarrierMode = BarrierMode.PROCESSING_TIME) -> BarrierGrid:
        """Define the grid if nobody has; otherwise check it matches (every job shares one grid)."""
        try:
            wanted = BarrierGrid(interval_ms, mode)
        except (TypeError, ValueError) as exc:
            raise ConfigurationError(f"invalid barrier grid: {exc}") from None
        path = self.tm.paths.barriers

        def attempt() -> BarrierGrid:
            found = self.tm.get(path)
            if found is not None and not found[0]:
                self._write([SetData(path, wanted.to_json(), found[1].version)], found[1].version)
                return wanted
            current = self.grid()
            if (current.interval_ms, current.mode) != (wanted.interval_ms, wanted.mode) and not current.changes:
                raise ConfigurationError(
                    f"the shared barrier grid is every {current.interval_ms} ms ({current.mode.value}); this job "
                    f"asked for {interval_ms} ms ({BarrierMode(mode).value}). Use the shared grid, or change it for "
                    "everyone with `tidemark barriers --set-interval MS --from T`")
            return current
        return self._conditionally("defining the barrier grid", attempt)

    def change_interval(self, interval_ms: int, effective_from: int) -> BarrierGrid:
        """Switch to ``interval_ms`` at barrier ``effective_from``, which must be a future barrier of the grid."""
        validate_epoch(effective_from, "the barrier an interval change takes effect at")

        def attempt() -> BarrierGrid:
            current, stat = self._read()
            newest = self._newest(current)
            if not current.is_barrier(effective_from) or (newest is not None and effective_from <= newest):
                raise EpochOrderError(f"an interval change must take effect at a future barrier of the current grid "
                                      f"(newest agreed barrier: {newest}); {effective_from} is not one")
            try:
                changed = replace(current, changes=(*current.changes,
                                                    {"from_epoch": effective_from, "interval_ms": interval_ms}))
            except ValueError as exc:
                raise ConfigurationError(f"cannot change the barrier interval: {exc}") from None
            self._write([SetData(self.tm.paths.barriers, changed.to_json(), stat.version)], stat.version)
            return changed
        return self._conditionally("changing the interval", attempt)

    def agree(self, epoch: int, proposed_by: str) -> bool:
        """Agree barrier ``epoch`` unless a barrier at or after it is already agreed; True when this call agreed it.

        The agreement is conditional on ``/barriers``' version (see the module docstring),
        so ``epoch`` is agreed only if it is above every barrier that exists.
        """
        validate_epoch(epoch, "barrier")
        try:
            record = BarrierRecord(proposed_by=proposed_by, wall_ms=now_ms())
        except ValueError as exc:
            raise InvalidName(str(exc)) from None
        path = self.tm.paths.barriers

        def attempt() -> bool:
            grid, stat = self._read()
            if not grid.is_barrier(epoch):
                raise EpochOrderError(f"{epoch} is not a barrier of the shared grid")
            newest = self._newest(grid)
            if newest is not None and epoch <= newest:
                return False
            self._write([SetData(path, replace(grid, newest_agreed=epoch).to_json(), stat.version),
                         Create(self.tm.paths.barrier(epoch), record.to_json())], stat.version)
            return True
        try:
            return self._conditionally(f"agreeing barrier {epoch}", attempt)
        except MultiFailed as failed:
            if isinstance(failed.error, NodeExistsError):
                return False  # /barriers/<epoch> left by hand or by an older release: it is agreed already
            raise

    def _newest(self, grid: BarrierGrid) -> Optional[int]:
        if grid.newest_agreed is not None:
            return grid.newest_agreed
        agreed = self.agreed()  # a grid written before the newest barrier was recorded in it
        return agreed[-1] if agreed else None

    def agreed(self) -> list[int]:
        """Every agreed barrier still recorded, oldest first."""
        return sorted(e for e in map(parse_epoch, self.tm.children(self.tm.paths.barriers)) if e is not None)

    def after(self, epoch: Optional[int]) -> list[int]:
        """The agreed barriers after ``epoch`` (all of them for None), oldest first."""
        agreed = self.agreed()
        return agreed if epoch is None else agreed[bisect.bisect_right(agreed, epoch):]

    def next_after(self, epoch: Optional[int]) -> Optional[int]:
        """The agreed barrier a job whose last committed epoch is ``epoch`` must process next (None: none yet)."""
        pending = self.after(epoch)
        return pending[0] if pending else None

    def latest(self) -> Optional[int]:
        found = self.tm.get(self.tm.paths.barriers)
        if found is None or not found[0]:
            return None
        return self._newest(BarrierGrid.from_json(found[0], self.tm.paths.barriers))

    def prune(self, below: int) -> list[int]:
        """Delete the agreed barrier znodes below ``below``; returns them.

        Only ``coordinator.gc`` calls it, with the lowest last committed epoch of every
        registered job: a job only ever looks for barriers after its own last committed
        epoch, so a lagging or stopped job still finds each barrier it must process. The
        newest agreed barrier is recorded in ``/barriers`` itself and is never needed here.
        """
        old = [t for t in self.agreed() if t < below]
        for start in range(0, len(old), 200):
            try:
                self.tm.multi([Delete(self.tm.paths.barrier(t)) for t in old[start:start + 200]])
            except MultiFailed as failed:
                if not isinstance(failed.error, NoNodeError):
                    raise
                for epoch in old[start:start + 200]:  # another GC pruned some of them concurrently
                    path = self.tm.paths.barrier(epoch)
                    try:
                        self.tm.call(f"delete {path}", self.tm.client.delete_async, path)
                    except NoNodeError:
                        pass
        return old


__all__ = ["BarrierGrid", "BarrierMode", "Barriers"]
