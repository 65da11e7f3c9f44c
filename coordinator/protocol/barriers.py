"""The barrier grid shared by every job: the candidate times a job's epochs are chosen from.

    barriers = tm.barriers
    grid = barriers.ensure_grid(interval_ms=5000)        # first caller defines it; the rest must agree
    grid.floor(now_ms() - grace)                          # the newest grid point the clock has passed
    barriers.change_interval(10_000, effective_from=T)   # for everyone, at a future grid point

``/barriers`` records the interval, the mode and future interval changes. A barrier is a
grid point ``T = start + k * interval_ms``; epoch ``T`` is the slice of data "up to ``T``".
No barrier is agreed or listed: each job picks its own epochs among the grid points
(``pacing.py``), a root job by the clock, a derived job among the epochs its sources hold,
so no job reads or writes anything of another pipeline to take its next epoch. The grid
is what makes those choices meet: every job's epochs are points of the one grid, and a
cadence (``every``) is a multiple of its interval, so an hourly job's epochs are also
epochs of every healthy 5-second job.

Grid changes are conditional on ``/barriers``' version (a compare-and-set, retried with a
deadline when another writer moved it), and take effect only at a future grid point, so no
epoch any job already chose leaves the grid.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Optional, TypeVar

from kazoo.exceptions import BadVersionError
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from coordinator.errors import (
    ConfigurationError,
    EpochOrderError,
    InvalidArgument,
    MultiFailed,
    ZooKeeperUnavailable,
)
from coordinator.names import validate_epoch
from coordinator.records import BarrierMode, JsonRecord, _epoch, _int, now_ms
from coordinator.zookeeper.ops import Op, SetData
from coordinator.zookeeper.session import ZooKeeperSession

T = TypeVar("T")


@dataclass(frozen=True)
class BarrierGrid(JsonRecord):
    """``/barriers``: the interval, the mode and future interval changes ``[{from_epoch, interval_ms}]``.

    A grid written by a release that agreed barriers also holds ``newest_agreed``: it is ignored."""

    interval_ms: int
    mode: BarrierMode = BarrierMode.PROCESSING_TIME
    changes: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
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
        """The first grid point after ``t``."""
        start, interval = self._segment(t)
        candidate = start + ((t - start) // interval + 1) * interval
        upcoming = [c["from_epoch"] for c in self.changes if t < c["from_epoch"] < candidate]
        return min(upcoming) if upcoming else candidate

    def interval_at(self, t: int) -> int:
        return self._segment(t)[1]


class _Moved(Exception):
    """``/barriers`` changed between our read and our conditional write; decide again."""


def grid_from(found: Optional[tuple[bytes, Any]], path: str) -> BarrierGrid:
    """The grid in ``/barriers``' data as read (``ConfigurationError`` while none is defined)."""
    if found is None or not found[0]:
        raise ConfigurationError("no barrier grid is defined yet: a job must call "
                                 "tm.barriers.ensure_grid(interval_ms=...) (EpochWriter does)")
    return BarrierGrid.from_json(found[0], path)


class Barriers:
    def __init__(self, tm: ZooKeeperSession) -> None:
        self.tm = tm

    def _read(self) -> tuple[BarrierGrid, Any]:
        found = self.tm.get(self.tm.paths.barriers)
        return grid_from(found, self.tm.paths.barriers), found[1] if found else None

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
            if isinstance(failed.error, BadVersionError) and isinstance(failed.op, SetData) \
                    and failed.op.version == expected_version:
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
            now = now_ms()
            if not current.is_barrier(effective_from) or effective_from <= now:
                raise EpochOrderError(f"an interval change must take effect at a future point of the current grid "
                                      f"(the next one is {current.next_candidate(now)}); {effective_from} is not one")
            try:
                changed = replace(current, changes=(*current.changes,
                                                    {"from_epoch": effective_from, "interval_ms": interval_ms}))
            except ValueError as exc:
                raise ConfigurationError(f"cannot change the barrier interval: {exc}") from None
            self._write([SetData(self.tm.paths.barriers, changed.to_json(), stat.version)], stat.version)
            return changed
        return self._conditionally("changing the interval", attempt)

__all__ = ["BarrierGrid", "BarrierMode", "Barriers", "grid_from"]
