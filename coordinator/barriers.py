"""The barrier grid shared by every job, and barrier agreement by create-if-absent.

    barriers = tm.barriers
    grid = barriers.ensure_grid(interval_ms=5000)        # first caller defines it; the rest must agree
    T = grid.floor(now_ms())                             # the newest barrier a root job has reached
    barriers.agree(T, proposed_by="ingest")              # first creator wins, the rest observe

Barrier ``T`` is an integer (ms since the Unix epoch) on the grid ``T = k * interval_ms``.
The grid never changes silently: ``change_interval`` records a change that takes effect at
a future barrier, so every job still sees one totally ordered list of barriers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from kazoo.exceptions import BadVersionError, NodeExistsError

from .client import MultiFailed, delete, set_data
from .errors import ConfigurationError, EpochOrderError
from .records import BarrierMode, BarrierRecord, JsonRecord, _int, now_ms


@dataclass(frozen=True)
class BarrierGrid(JsonRecord):
    """``/barriers``: the interval, the mode and future interval changes ``[{from_epoch, interval_ms}]``."""

    interval_ms: int
    mode: BarrierMode = BarrierMode.PROCESSING_TIME
    changes: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if _int(self.interval_ms, "interval_ms") <= 0:
            raise ValueError(f"interval_ms must be positive, got {self.interval_ms}")
        object.__setattr__(self, "mode", BarrierMode(self.mode))
        changes = tuple(dict(c) for c in self.changes)
        for change in changes:
            if _int(change.get("interval_ms"), "interval_ms") <= 0 or _int(change.get("from_epoch"), "from_epoch") < 0:
                raise ValueError(f"invalid interval change {change!r}")
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

    def next_after(self, t: int) -> int:
        start, interval = self._segment(t)
        candidate = start + ((t - start) // interval + 1) * interval
        upcoming = [c["from_epoch"] for c in self.changes if t < c["from_epoch"] < candidate]
        return min(upcoming) if upcoming else candidate

    def interval_at(self, t: int) -> int:
        return self._segment(t)[1]


class Barriers:
    def __init__(self, tm) -> None:
        self.tm = tm

    def grid(self) -> BarrierGrid:
        found = self.tm.get(self.tm.paths.barriers)
        if found is None or not found[0]:
            raise ConfigurationError("no barrier grid is defined yet: a job must call "
                                     "tm.barriers.ensure_grid(interval_ms=...) (EpochJob does)")
        return BarrierGrid.from_json(found[0], self.tm.paths.barriers)

    def ensure_grid(self, interval_ms: int, mode: BarrierMode = BarrierMode.PROCESSING_TIME) -> BarrierGrid:
        """Define the grid if nobody has; otherwise check it matches (every job shares one grid)."""
        wanted = BarrierGrid(interval_ms, mode)
        path = self.tm.paths.barriers
        found = self.tm.get(path)
        if found is not None and not found[0]:
            try:
                self.tm.multi([set_data(path, wanted.to_json(), found[1].version)])
                return wanted
            except MultiFailed as failed:
                if not isinstance(failed.error, BadVersionError):
                    raise
        current = self.grid()
        if (current.interval_ms, current.mode) != (wanted.interval_ms, wanted.mode) and not current.changes:
            raise ConfigurationError(
                f"the shared barrier grid is every {current.interval_ms} ms ({current.mode.value}); this job asked "
                f"for {interval_ms} ms ({BarrierMode(mode).value}). Use the shared grid, or change it for everyone "
                "with `tidemark barriers set-interval`")
        return current

    def change_interval(self, interval_ms: int, effective_from: int) -> BarrierGrid:
        """Switch to ``interval_ms`` at barrier ``effective_from``, which must be a future barrier of the grid."""
        path = self.tm.paths.barriers
        found = self.tm.get(path)
        current = self.grid()
        newest = self.latest()
        if not current.is_barrier(effective_from) or (newest is not None and effective_from <= newest):
            raise EpochOrderError(f"an interval change must take effect at a future barrier of the current grid "
                                  f"(newest agreed barrier: {newest}); {effective_from} is not one")
        changed = BarrierGrid(current.interval_ms, current.mode,
                              (*current.changes, {"from_epoch": effective_from, "interval_ms": interval_ms}))
        self.tm.multi([set_data(path, changed.to_json(), found[1].version)])  # type: ignore[index]
        return changed

    def agree(self, epoch: int, proposed_by: str) -> tuple[BarrierRecord, bool]:
        """Create barrier ``epoch`` if nobody has; returns the agreed record and whether this call created it."""
        if not self.grid().is_barrier(epoch):
            raise EpochOrderError(f"{epoch} is not a barrier of the shared grid")
        record = BarrierRecord(proposed_by=proposed_by, wall_ms=now_ms())
        path = self.tm.paths.barrier(epoch)
        try:
            self.tm.call(f"create {path}", self.tm.client.create_async, path, record.to_json())
            return record, True
        except NodeExistsError:
            existing = self.tm.read(path, BarrierRecord)
            return (existing[0] if existing else record), False

    def agreed(self) -> list[int]:
        return sorted(int(c) for c in self.tm.children(self.tm.paths.barriers) if c.isdigit())

    def latest(self) -> Optional[int]:
        agreed = self.agreed()
        return agreed[-1] if agreed else None

    def prune(self, keep: int = 1000) -> int:
        """Delete all but the newest ``keep`` barrier znodes; returns how many went."""
        old = self.agreed()[:-keep] if keep > 0 else self.agreed()
        for start in range(0, len(old), 200):
            try:
                self.tm.multi([delete(self.tm.paths.barrier(t)) for t in old[start:start + 200]])
            except MultiFailed:
                pass  # another job pruned the same barriers concurrently
        return len(old)


__all__ = ["BarrierGrid", "Barriers", "BarrierMode"]
