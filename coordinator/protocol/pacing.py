"""Pacing: which barrier a job takes as its next epoch, and the cadence it keeps. The one rule, used by
the writer, ``tidemark status`` and the exporter; docs/design.md ("Pacing: which barriers a job takes") says
why reads at those epochs are consistent, and where a new job starts.

    pacing = Pacing(every_ms=parse_every("1h"), grace_ms=1000)      # stored at /jobs/<job>/pacing
    choice = pacing.choose(grid, after=last_committed, sources={table: tidemark, ...}, has_root_source=False,
                           now=now_ms())
    choice.epoch         # the barrier to process next, or None (then choice.reason says why)

**The invariant.** A job's epochs are a subset of the barriers that every one of its managed
sources has committed (a root source, which no Tidemark job writes, is cut by commit time at
any barrier). The next epoch is the *newest* such barrier after the job's last epoch that its
cadence allows (``Pacing.choose``): one epoch covers every change since the previous one, so a job back from
downtime, or a batch job over a streaming upstream, catches up in one epoch, and a slow job slows nobody.

**Cadence.** ``every`` is a multiple of the grid interval, and a job's epochs are multiples of
it, so an hourly job's epochs are barriers of every 5-second job as well and reads across
cadences always have common versions. A job downstream of a slower-cadence job can only take
that job's epochs: it follows the slower cadence (``effective_cadences``).

**Catching up after downtime**: ``Pacing.catching_up`` and ``Pacing.worth_waiting`` (``catch_up.CatchUp``
applies them).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Union

from coordinator.errors import ConfigurationError, InvalidArgument
from coordinator.formatting import UNITS_MS, fmt_every
from coordinator.protocol.held_epochs import common_epochs
from coordinator.protocol.topology import Topology
from coordinator.records import JsonRecord, TableTidemark, int_field, opt_int_field

if TYPE_CHECKING:  # barriers.py checks every job's cadence against a grid change with ``Pacing.check``
    from coordinator.protocol.barriers import BarrierGrid

DEFAULT_GRACE_MS = 1000
CATCH_UP_BEHIND = 3     # cadences behind the clock from which a job looks for an upstream catching up
# ... and session timeouts behind: a takeover (kill -9, an expired session) leaves a job about one session
# timeout behind, and its upstream too when both were hit; that is no downtime worth waiting on (the fault
# suite's kill-9 runs, where takeovers come every few seconds, had totals wait up to 21 s on counter).
CATCH_UP_TAKEOVERS = 3
CATCH_UP_FACTOR = 4     # an upstream epoch in flight covering this many times more is worth waiting for
CATCH_UP_NEW_LEADER_S = 30.0  # ... or, this long after taking over, for a source writer to begin one
CATCH_UP_WAIT_S = 120.0  # each such wait lasts at most this long (the upstream may have died)
_EVERY = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)\s*$")


def parse_every(value: Union[str, int, None]) -> Optional[int]:
    """A cadence in milliseconds from ``"30s"``, ``"5m"``, ``"1h"``, ``"1d"`` or a number of milliseconds
    (None: every grid point)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigurationError(f"every must be a duration such as '1h' or milliseconds, got {value!r}")
    if isinstance(value, int):
        every = value
    else:
        found = _EVERY.match(str(value))
        if not found:
            raise ConfigurationError(f"every must be a duration such as '30s', '5m', '1h' or '1d', got {value!r}")
        every = int(found.group(1)) * UNITS_MS[found.group(2)]
    if every <= 0:
        raise ConfigurationError(f"every must be positive, got {value!r}")
    return every


@dataclass(frozen=True)
class Choice:
    """A pacing decision: the barrier to process next, or why there is none and when to look again."""

    epoch: Optional[int]
    reason: str = ""
    wake_in_s: float = 0.0
    behind: tuple[str, ...] = ()   # managed sources that hold no epoch after the job's last one


@dataclass(frozen=True)
class Pacing(JsonRecord):
    """``/jobs/<job>/pacing``: the cadence (None: every grid point) and grace its leader runs with."""

    every_ms: Optional[int] = None
    grace_ms: int = DEFAULT_GRACE_MS

    def __post_init__(self) -> None:
        every = opt_int_field(self.every_ms, "every_ms")
        if every is not None and every <= 0:
            raise InvalidArgument(f"every_ms must be positive, got {self.every_ms}")
        if int_field(self.grace_ms, "grace_ms") < 0:
            raise InvalidArgument(f"grace_ms must not be negative, got {self.grace_ms}")

    def check(self, grid: BarrierGrid, now: int) -> None:
        """``ConfigurationError`` unless the cadence is a multiple of the grid interval in force."""
        interval = grid.interval_at(now)
        if self.every_ms is not None and self.every_ms % interval:
            raise ConfigurationError(f"every={fmt_every(self.every_ms)} is not a multiple of the barrier grid's "
                                     f"interval ({interval} ms): choose a multiple, so the job's epochs are barriers "
                                     "every job on the grid can share")

    def on_cadence(self, grid: BarrierGrid, t: int) -> bool:
        """Whether ``t`` is a barrier of ``grid`` that this job's cadence takes (a multiple of ``every_ms``)."""
        return grid.is_barrier(t) and (self.every_ms is None or t % self.every_ms == 0)

    def newest_by_clock(self, grid: BarrierGrid, now: int, until: Optional[int] = None) -> int:
        """The newest barrier on the cadence that the clock has passed by the grace (and not after ``until``)."""
        return self.at_or_before(grid, now - self.grace_ms if until is None else min(now - self.grace_ms, until))

    def at_or_before(self, grid: BarrierGrid, bound: int) -> int:
        """The newest barrier on the cadence at or before ``bound``."""
        t = grid.floor(bound)
        if self.every_ms is not None:
            t = t // self.every_ms * self.every_ms
            while not grid.is_barrier(t):  # a grid changed to an interval that does not divide the cadence
                t -= self.every_ms
        return t

    def covering(self, grid: BarrierGrid, called_at: int) -> int:
        """The first epoch a batch run called at ``called_at`` may take: the newest barrier on the cadence at or
        before the first grid point at or after the call. On every grid point, that covers every root commit made
        before the call; with a cadence (``every``), the last whole period before it."""
        point = called_at if grid.is_barrier(called_at) else grid.next_candidate(called_at)
        return self.at_or_before(grid, point)

    def next_by_clock(self, grid: BarrierGrid, after: int) -> int:
        """The first barrier on the cadence after ``after``."""
        t = grid.next_candidate(after)
        while not self.on_cadence(grid, t):
            t = grid.next_candidate(t)
        return t

    def catching_up(self, grid: BarrierGrid, available: int, now: int, session_timeout_ms: int = 0) -> bool:
        """Whether ``available`` is so far behind the clock that the job is catching up after downtime: more
        than ``CATCH_UP_BEHIND`` cadences, and more than ``CATCH_UP_TAKEOVERS`` session timeouts (a takeover
        alone costs about one).

        Why wait at all: when a job and its upstream restart together, the upstream's first epoch covers the
        whole downtime, but until it commits, its tidemark still offers the barrier or two it had before the
        stop; a downstream job that took those first would then need a second epoch for the backlog. A job that
        keeps up never checks (it is not behind), and a downstream of a slow job does not wait (a slow job's next
        epoch covers about as much as its last one did). Each wait for one epoch lasts at most
        ``CATCH_UP_WAIT_S``: the upstream may be down.
        """
        cadence = self.every_ms if self.every_ms is not None else grid.interval_at(now)
        behind = now - self.grace_ms - available
        return behind > max(CATCH_UP_BEHIND * cadence, CATCH_UP_TAKEOVERS * session_timeout_ms)

    def worth_waiting(self, grid: BarrierGrid, *, after: int, available: int, in_flight: Optional[int],
                      upstream_restarted: bool, leading_for_s: float) -> bool:
        """Whether to wait for a source writer rather than take ``available`` now, while catching up: for its
        epoch ``in_flight`` if that is on this job's cadence and covers ``CATCH_UP_FACTOR`` times as much since
        ``after``; else, while this job has led for less than ``CATCH_UP_NEW_LEADER_S``, for a writer that took
        over about when this job did (``upstream_restarted``: it will begin its catch-up epoch shortly, perhaps
        after recovering the epoch it had in flight when it stopped)."""
        if (in_flight is not None and in_flight > available and self.on_cadence(grid, in_flight)
                and in_flight - after >= CATCH_UP_FACTOR * (available - after)):
            return True
        return upstream_restarted and leading_for_s < CATCH_UP_NEW_LEADER_S

    def choose(self, grid: BarrierGrid, *, after: Optional[int], sources: Mapping[str, Optional[TableTidemark]],
               has_root_source: bool, now: int, until: Optional[int] = None) -> Choice:
        """The job's next epoch: the newest barrier after ``after`` that every managed source (``sources``: each
        one's tidemark) holds, on the cadence, not after ``until``; for a job with no managed source, or with a
        root source too, one the clock has passed by the grace."""
        clock = self.newest_by_clock(grid, now, until) if has_root_source or not sources else None
        if not sources:
            assert clock is not None
            if after is None or clock > after:
                return Choice(clock)
            wake_at = self.next_by_clock(grid, after) + self.grace_ms
            return Choice(None, f"the clock has not passed the next barrier on the cadence plus {self.grace_ms} ms "
                                "grace", max(0.0, (wake_at - now) / 1000))
        lists = {table: mark.epochs if mark is not None else () for table, mark in sorted(sources.items())}
        behind = [table for table, epochs in lists.items() if not any(after is None or e > after for e in epochs)]
        eligible = [t for t in common_epochs(lists.values())
                    if (after is None or t > after) and self.on_cadence(grid, t)
                    and (until is None or t <= until) and (clock is None or t <= clock)]
        if eligible:
            return Choice(max(eligible))
        if behind:
            states = "; ".join(f"source {t} is at epoch {_newest(sources[t])}" for t in behind)
            return Choice(None, states, 0.5, tuple(behind))
        return Choice(None, f"its sources hold no common epoch after {after} on the job's cadence yet "
                            f"({', '.join(f'{t} at {_newest(m)}' for t, m in sorted(sources.items()))})", 0.5)


def _newest(mark: Optional[TableTidemark]) -> Optional[int]:
    return mark.epoch if mark is not None else None


def effective_cadences(topo: Topology, pacings: Mapping[str, Optional[Pacing]],
                       interval_ms: Optional[int]) -> dict[str, tuple[Optional[int], Optional[str]]]:
    """Per job, the cadence its epochs actually follow and the job that sets it (None: its own).

    A job can only take epochs its managed sources hold, so it follows the slowest cadence upstream of
    it when that is slower than its own (``interval_ms``, the grid's, stands for a job with none set).
    """
    writers = topo.writers
    result: dict[str, tuple[Optional[int], Optional[str]]] = {}
    for job in topo.upstream_first():
        pacing = pacings.get(job)
        best: tuple[Optional[int], Optional[str]] = (
            pacing.every_ms if pacing is not None and pacing.every_ms is not None else interval_ms, None)
        for source in topo.jobs[job].sources:
            upstream = writers.get(source)
            if upstream is None or upstream not in result:
                continue
            every, by = result[upstream]
            if every is not None and (best[0] is None or every > best[0]):
                best = (every, by or upstream)
        result[job] = best
    return result


__all__ = ["CATCH_UP_NEW_LEADER_S", "CATCH_UP_TAKEOVERS", "CATCH_UP_WAIT_S", "DEFAULT_GRACE_MS", "Choice", "Pacing",
           "effective_cadences", "parse_every"]
