"""The barrier grid shared by every job: the candidate times a job's epochs are chosen from.

    barriers = tm.barriers
    grid = barriers.ensure_grid(interval_ms=5000)        # first caller defines it; the rest must agree
    grid.floor(now_ms() - grace)                          # the newest grid point the clock has passed
    barriers.change_interval(10_000, effective_from=T)   # for everyone, at a future grid point
    barriers.revert_changes()                            # cancel the changes that have not taken effect yet

``/barriers`` records the interval, the mode and future interval changes. A barrier is a
grid point ``T = start + k * interval_ms``; epoch ``T`` is the slice of data "up to ``T``".
No barrier is agreed or listed: each job picks its own epochs among the grid points
(``pacing.py``), a root job by the clock, a derived job among the epochs its sources hold,
so no job reads or writes anything of another pipeline to take its next epoch. The grid
is what makes those choices meet: every job's epochs are points of the one grid, and a
cadence (``every``) is a multiple of its interval, so an hourly job's epochs are also
epochs of every healthy 5-second job.

Grid changes are conditional on ``/barriers``' version (a compare-and-set, retried with a
deadline when another writer moved it), and take effect only in the future, at least
``CHANGE_LEAD_MS`` ahead of the clock, so no epoch any job already chose leaves the grid. A change
takes effect at a multiple of the new interval (so cadences, multiples of it, meet the new
points) that is a point of the current grid, or, to leave a grid whose next point is far away
(an absurd interval in force), any such multiple before that next point: either way no grid
point the clock has passed changes. Intervals are bounded (``MAX_INTERVAL_MS``, a
day: an hourly or daily job is a cadence, not a grid), and a change that has not taken effect
yet can be cancelled (``revert_changes``) while it is still ``CHANGE_LEAD_MS`` ahead.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Callable, Optional, TypeVar

from kazoo.exceptions import BadVersionError

from coordinator.errors import (
    ConfigurationError,
    EpochOrderError,
    InvalidArgument,
    MultiFailed,
)
from coordinator.formatting import fmt_epoch
from coordinator.names import validate_epoch
from coordinator.protocol.pacing import Pacing
from coordinator.records import BarrierMode, JsonRecord, epoch_field, int_field, now_ms
from coordinator.zookeeper.ops import Op, SetData
from coordinator.zookeeper.races import Raced
from coordinator.zookeeper.session import ZooKeeperSession

T = TypeVar("T")
MAX_INTERVAL_MS = 24 * 3600 * 1000  # a day: a coarser rhythm is a job's cadence (every=), not the grid's interval
# A change (or its cancellation) lies at least this far ahead of the clock: a driver whose clock runs a little
# ahead of this one must not have taken an epoch on the old grid there yet.
CHANGE_LEAD_MS = 5_000
MAX_CHANGE_AHEAD_MS = 30 * 24 * 3600 * 1000  # further ahead is a typo more often than a plan


@dataclass(frozen=True)
class BarrierGrid(JsonRecord):
    """``/barriers``: the interval, the mode and future interval changes ``[{from_epoch, interval_ms}]``.

    A grid written by a release that agreed barriers also holds ``newest_agreed``: it is ignored."""

    interval_ms: int
    mode: BarrierMode = BarrierMode.PROCESSING_TIME
    changes: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if int_field(self.interval_ms, "interval_ms") <= 0:
            raise InvalidArgument(f"interval_ms must be positive, got {self.interval_ms}")
        object.__setattr__(self, "mode", BarrierMode(self.mode))
        changes = tuple(dict(c) for c in self.changes)
        for change in changes:
            epoch_field(change.get("from_epoch"), "from_epoch")
            if int_field(change.get("interval_ms"), "interval_ms") <= 0:
                raise InvalidArgument(f"invalid interval change {change!r}")
        object.__setattr__(self, "changes", tuple(sorted(changes, key=lambda c: c["from_epoch"])))

    def _segment(self, t: int) -> tuple[int, int]:
        start, interval = 0, self.interval_ms
        for change in self.changes:
            if change["from_epoch"] <= t:
                start, interval = change["from_epoch"], change["interval_ms"]
        return start, interval

    def is_barrier(self, t: int) -> bool:
        """Whether ``t`` is a point of the grid, in the interval in force at ``t``."""
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
        """The interval in force at ``t``: the last change's at or before ``t``, else ``interval_ms``."""
        return self._segment(t)[1]

    def pending(self, now: int) -> tuple[Any, ...]:
        """The interval changes that have not taken effect at ``now``."""
        return tuple(c for c in self.changes if c["from_epoch"] > now)

    def earliest_change(self, interval_ms: int, now: int) -> Optional[int]:
        """The first time an interval change to ``interval_ms`` may take effect (see ``with_change``); None when no
        point of the grid in the next ``MAX_CHANGE_AHEAD_MS`` is a multiple of ``interval_ms``."""
        lead = now + CHANGE_LEAD_MS
        aligned = -(-lead // interval_ms) * interval_ms
        if aligned < self.next_candidate(now):
            return aligned
        t = lead if self.is_barrier(lead) else self.next_candidate(lead)
        for _ in range(10_000):  # a few steps for intervals that divide each other
            if t > now + MAX_CHANGE_AHEAD_MS:
                break
            if t % interval_ms == 0:
                return t
            t = self.next_candidate(t)
        return None

    def with_change(self, interval_ms: int, effective_from: int, now: int) -> BarrierGrid:
        """This grid with the interval ``interval_ms`` from ``effective_from`` on; ``EpochOrderError`` (or
        ``ConfigurationError`` for an interval out of range) when that change is not allowed at ``now``.

        ``effective_from`` lies ``CHANGE_LEAD_MS`` to ``MAX_CHANGE_AHEAD_MS`` ahead of ``now``; it is a multiple
        of ``interval_ms`` (so the new grid points are too, and every cadence that is a multiple of the interval
        meets them); and it is a point of this grid, or before this grid's next point (the way out of a grid
        whose next point is far away). No point the clock has passed changes either way."""
        check_interval(interval_ms)
        validate_epoch(effective_from, "the barrier an interval change takes effect at")
        next_point = self.next_candidate(now)
        placed = self.is_barrier(effective_from) or effective_from < next_point
        if not (now + CHANGE_LEAD_MS <= effective_from <= now + MAX_CHANGE_AHEAD_MS) or not placed \
                or effective_from % interval_ms:
            earliest = self.earliest_change(interval_ms, now)
            raise EpochOrderError(
                f"an interval change must take effect at a future point of the current grid, at least "
                f"{CHANGE_LEAD_MS // 1000} s and at most {MAX_CHANGE_AHEAD_MS // 86_400_000} days ahead (or, to "
                f"leave a grid whose next point is far away, before that point, {_when(next_point)}), and at a "
                f"multiple of the new interval, so that cadences meet its points; {effective_from} is not one. "
                + (f"The earliest is {_when(earliest)}" if earliest is not None else
                   "No point of the current grid in that window is a multiple of it: choose another interval"))
        return replace(self, changes=(*self.changes, {"from_epoch": effective_from, "interval_ms": interval_ms}))

    def without_pending(self, now: int, effective_from: Optional[int] = None) -> tuple[BarrierGrid, tuple[Any, ...]]:
        """This grid without its pending changes (only the one at ``effective_from`` when given), and the changes
        removed; ``EpochOrderError`` when there is none, or one takes effect within ``CHANGE_LEAD_MS``."""
        pending = self.pending(now)
        removed = tuple(c for c in pending if effective_from is None or c["from_epoch"] == effective_from)
        if not removed:
            listed = ", ".join(f"every {c['interval_ms']} ms from {_when(c['from_epoch'])}" for c in pending)
            raise EpochOrderError(
                (f"no pending interval change at {effective_from}: the pending ones are {listed}" if pending else
                 "no interval change is pending") + "; a change already in force is undone by a new change "
                "(`tidemark barriers --set-interval MS --from T`)")
        close = [c for c in removed if c["from_epoch"] < now + CHANGE_LEAD_MS]
        if close:
            raise EpochOrderError(
                f"the change at {_when(close[0]['from_epoch'])} takes effect in less than {CHANGE_LEAD_MS // 1000} s, "
                "so some driver may have begun an epoch on it: let it take effect, then set the interval back with "
                "a new change (`tidemark barriers --set-interval MS --from T`)")
        return replace(self, changes=tuple(c for c in self.changes if c not in removed)), removed


def check_interval(interval_ms: object) -> int:
    """``interval_ms`` if it is a grid interval Tidemark accepts (1 ms to ``MAX_INTERVAL_MS``), else
    ``ConfigurationError`` saying what to use instead."""
    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or not 0 < interval_ms <= MAX_INTERVAL_MS:
        raise ConfigurationError(f"a barrier interval is 1 to {MAX_INTERVAL_MS} ms (a day), got {interval_ms!r}: "
                                 "for a job that runs hourly or daily, keep a short grid and give the job a "
                                 "cadence (every='1h')")
    return interval_ms


def _when(t: int) -> str:
    """``t`` and its UTC time, for messages (a time past year 9999 stays a number)."""
    try:
        return f"{t} ({datetime.fromtimestamp(t / 1000, timezone.utc):%Y-%m-%dT%H:%M:%SZ})"
    except (OverflowError, ValueError, OSError):
        return str(t)


def grid_from(found: Optional[tuple[bytes, Any]], path: str) -> BarrierGrid:
    """The grid in ``/barriers``' data as read (``ConfigurationError`` while none is defined)."""
    if found is None or not found[0]:
        raise ConfigurationError("no barrier grid is defined yet: a job must call "
                                 "tm.barriers.ensure_grid(interval_ms=...) (EpochWriter does)")
    return BarrierGrid.from_json(found[0], path)


class Barriers:
    """The barrier grid every job shares, in ``/barriers``: defined once, read by every leader, and changed
    (for every job at once) only at a future grid point.

        barriers = tm.barriers
        grid = barriers.ensure_grid(interval_ms=5000)        # define it, or check it is the one defined
        barriers.change_interval(10_000, effective_from=T)   # from T, a future point (``BarrierGrid.with_change``)
        barriers.revert_changes()                            # cancel the changes not in force yet

    Znodes: ``/barriers`` (a ``BarrierGrid``), written only by a set conditional on its version; a write that
    lost a race with another writer is decided again on what is there now, until the session's
    ``operation_timeout``. A change also reads every registered job's ``/jobs/<job>/pacing``.

    Failure behaviour: ``ConfigurationError`` while no grid is defined, for an interval out of range, a grid
    other than the one asked for, or a change a job's cadence would not follow; ``EpochOrderError`` for a change
    or a cancellation at a time that is not allowed; ``ZooKeeperUnavailable`` when the write kept losing races
    until the deadline, or ZooKeeper did not answer in time. It keeps no state of its own in the session (nothing
    ephemeral, no watch): on a session loss the operation in flight is retried until its deadline like any other.
    """

    def __init__(self, tm: ZooKeeperSession) -> None:
        self.tm = tm

    def _read(self) -> tuple[BarrierGrid, Any]:
        found = self.tm.get(self.tm.paths.barriers)
        return grid_from(found, self.tm.paths.barriers), found[1] if found else None

    def grid(self) -> BarrierGrid:
        """The grid as ``/barriers`` holds it now (one read).

        :raises ConfigurationError: no grid is defined yet.
        """
        return self._read()[0]

    def _conditionally(self, what: str, attempt: Callable[[], T]) -> T:
        """``attempt`` again each time its write lost a race (``tm.retry_races``, counted as ``barriers``)."""
        return self.tm.retry_races(f"{what} kept racing with other writers of /barriers for "
                                   f"{self.tm.operation_timeout:.0f}s; try again", attempt, counter="barriers")

    def _write(self, ops: list[Op], expected_version: int) -> None:
        try:
            self.tm.multi(ops)
        except MultiFailed as failed:
            if isinstance(failed.error, BadVersionError) and isinstance(failed.op, SetData) \
                    and failed.op.version == expected_version:
                raise Raced() from None  # /barriers changed since our read
            raise

    def ensure_grid(self, interval_ms: int, mode: BarrierMode = BarrierMode.PROCESSING_TIME) -> BarrierGrid:
        """Define the grid if nobody has; otherwise check it matches (every job shares one grid).

        :param interval_ms: the interval this job asks for, 1 ms to ``MAX_INTERVAL_MS``.
        :raises ConfigurationError: the interval or mode is invalid, ``/barriers`` does not exist, or the grid
            defined has another interval or mode and records no interval change (one that does is returned as is).
        :raises ZooKeeperUnavailable: the write kept losing races with other writers until the deadline.
        """
        try:
            wanted = BarrierGrid(check_interval(interval_ms), mode)
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

    def check_cadences(self, changed: BarrierGrid, effective_from: int) -> None:
        """``ConfigurationError`` when a registered job's cadence (its ``/jobs/<job>/pacing``) would not be a
        multiple of the interval ``changed`` has in force at ``effective_from``: its drivers would refuse to run
        from then on (``Pacing.check``)."""
        jobs = self.tm.children(self.tm.paths.jobs)
        paths = [self.tm.paths.pacing(job) for job in jobs]
        for job, path, raw in zip(jobs, paths, self.tm.get_many(paths)):
            if raw is None or not raw[0]:
                continue  # its leader has not run this release yet: it takes every grid point
            try:
                Pacing.from_json(raw[0], path).check(changed, effective_from)
            except ConfigurationError as exc:
                before, after = self.grid().interval_at(now_ms()), changed.interval_at(effective_from)
                raise ConfigurationError(
                    f"nothing changed: with that interval, job {job} could not run: {exc}. Give it a cadence "
                    f"(every=) that is a multiple of both {before} and {after} ms first") from None

    def changed(self, current: BarrierGrid, interval_ms: int, effective_from: int, now: int) -> BarrierGrid:
        """``current`` with the interval switched to ``interval_ms`` at ``effective_from``, refused as
        ``change_interval`` refuses it (``BarrierGrid.with_change``, ``check_cadences``); nothing is written.

        :raises EpochOrderError: ``effective_from`` is not a time the change may take effect at.
        :raises ConfigurationError: the interval is out of range, or a registered job's cadence would not be a
            multiple of it.
        """
        changed = current.with_change(interval_ms, effective_from, now)
        self.check_cadences(changed, effective_from)
        return changed

    def change_interval(self, interval_ms: int, effective_from: int) -> BarrierGrid:
        """Switch to ``interval_ms`` at ``effective_from``, a future barrier of the grid (``BarrierGrid.with_change``
        says which times are allowed), unless a job's cadence would stop being a multiple of it
        (``check_cadences``).

        :raises EpochOrderError: ``effective_from`` is not a time the change may take effect at.
        :raises InvalidName: ``effective_from`` is not an epoch.
        :raises ConfigurationError: the interval is out of range, no grid is defined, or a registered job's cadence
            would not be a multiple of the new interval.
        :raises ZooKeeperUnavailable: the write kept losing races with other writers until the deadline.
        """
        def attempt() -> BarrierGrid:
            current, stat = self._read()
            changed = self.changed(current, interval_ms, effective_from, now_ms())
            self._write([SetData(self.tm.paths.barriers, changed.to_json(), stat.version)], stat.version)
            return changed
        return self._conditionally("changing the interval", attempt)

    def revert_changes(self, effective_from: Optional[int] = None) -> tuple[BarrierGrid, tuple[Any, ...]]:
        """Cancel the interval changes that have not taken effect yet (only the one at ``effective_from`` when
        given); returns the grid and the changes cancelled (``BarrierGrid.without_pending``).

        :raises EpochOrderError: no such change is pending, or one takes effect within ``CHANGE_LEAD_MS``.
        :raises ConfigurationError: no grid is defined.
        :raises ZooKeeperUnavailable: the write kept losing races with other writers until the deadline.
        """
        def attempt() -> tuple[BarrierGrid, tuple[Any, ...]]:
            current, stat = self._read()
            changed, removed = current.without_pending(now_ms(), effective_from)
            self._write([SetData(self.tm.paths.barriers, changed.to_json(), stat.version)], stat.version)
            return changed, removed
        return self._conditionally("cancelling interval changes", attempt)

def check_grid_request(interval_ms: Optional[int] = None, effective_from: Optional[int] = None,
                       revert: bool = False) -> bool:
    """Whether a request of the grid changes it, its parts checked before anything is read: a change of the
    interval to ``interval_ms`` from ``effective_from`` (``Barriers.change_interval``), or the cancellation of the
    pending changes (``revert``, ``Barriers.revert_changes``); neither only reads the grid. The messages name the
    options of ``tidemark barriers``, which checks its command line with it.

    :param interval_ms: the new interval, or None.
    :param effective_from: with ``interval_ms``, when it takes effect; with ``revert``, which pending change to
        cancel (None: every one).
    :param revert: cancel the pending changes.
    :raises InvalidArgument: ``interval_ms`` and ``revert`` together, or ``effective_from`` with neither.
    """
    if interval_ms is not None and revert:
        raise InvalidArgument("--set-interval and --revert do not go together: cancel the pending change first, "
                              "then set the interval you want")
    if effective_from is not None and interval_ms is None and not revert:
        raise InvalidArgument("--from T goes with --set-interval MS (when it takes effect) or --revert (which "
                              "pending change to cancel)")
    return interval_ms is not None or revert


def preview_grid_request(barriers: Barriers, grid: BarrierGrid, now: int, interval_ms: Optional[int] = None,
                         effective_from: Optional[int] = None, revert: bool = False) -> tuple[Any, ...]:
    """The interval changes a request (``check_grid_request``) would add to ``grid`` or cancel in it at ``now``,
    refused as ``Barriers.change_interval`` or ``Barriers.revert_changes`` would refuse it, with nothing written:
    what to show before asking whether to go ahead; ``()`` for a request that only reads.

    :param barriers: the barriers of the session, whose registered jobs' cadences a change must suit.
    :param grid: the grid as read (``Barriers.grid``).
    :param now: the wall clock, in ms since 1970.
    :param interval_ms: the new interval, or None.
    :param effective_from: when the change takes effect, or which pending change to cancel (None: every one).
    :param revert: cancel the pending changes.
    :raises InvalidArgument: the request's parts do not go together, or a change has no ``effective_from`` (the
        message names the earliest allowed).
    :raises EpochOrderError: the change or the cancellation is not allowed at ``now`` (``BarrierGrid.with_change``,
        ``BarrierGrid.without_pending``).
    :raises InvalidName: ``effective_from`` is not an epoch.
    :raises ConfigurationError: the interval is out of range, or a registered job's cadence would not be a multiple
        of it (``Barriers.changed``).
    """
    if not check_grid_request(interval_ms, effective_from, revert):
        return ()
    if interval_ms is None:
        return grid.without_pending(now, effective_from)[1]
    if effective_from is None:
        raise InvalidArgument(f"--set-interval needs --from T, when the change takes effect: the earliest allowed is "
                              f"{fmt_epoch(grid.earliest_change(check_interval(interval_ms), now))}")
    barriers.changed(grid, interval_ms, effective_from, now)
    return ({"from_epoch": effective_from, "interval_ms": interval_ms},)


__all__ = ["CHANGE_LEAD_MS", "MAX_INTERVAL_MS", "BarrierGrid", "BarrierMode", "Barriers", "check_grid_request",
           "check_interval", "grid_from", "preview_grid_request"]
