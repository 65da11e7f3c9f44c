"""Catching up together: whether a job far behind the clock waits for a source's writer before taking an epoch.

    catch_up = CatchUp(tm, "word_counts", pacing)        # one per leadership: made when the replica takes over
    why = catch_up.reason_to_wait(grid, after=last, available=choice.epoch, sources={table: (writer, mark)})
    # None: take ``available`` now; otherwise wait (the reason is what the job's log says), and ask again

The rule is ``pacing.Pacing``'s (``catching_up``, ``worth_waiting``; ``coordinator.protocol.pacing``
says why): a job more than ``CATCH_UP_BEHIND`` cadences and ``CATCH_UP_TAKEOVERS`` session
timeouts behind, whose source writer is that far behind its own cadence too, waits for that
writer's epoch in flight if it covers ``CATCH_UP_FACTOR`` times what is available, and, for its
first ``CATCH_UP_NEW_LEADER_S`` as leader, for a writer that took over about when it did (or has no
leader yet). The waits for one epoch last at most ``CATCH_UP_WAIT_S``.

What it reads of the other jobs, each through the recipe that owns it, and only while this job is
that far behind (a job keeping up makes no request for it): the newest epoch znode of the source's
writer (``epochs.newest_epoch``), its leader znode's creation time (``leadership.leader_since_ms``,
ZooKeeper's clock for both jobs) and its pacing (``job_run.read_pacing``).

Failure behaviour: ZooKeeper errors propagate (the caller's loop rides them out as for any read);
an unreadable pacing record counts as the grid's own cadence, which its leader rewrites.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Optional

from coordinator.errors import CorruptState
from coordinator.protocol.epochs import newest_epoch
from coordinator.protocol.job_run import read_pacing
from coordinator.protocol.leadership import leader_since_ms
from coordinator.protocol.pacing import CATCH_UP_NEW_LEADER_S, CATCH_UP_WAIT_S, Pacing
from coordinator.records import TableTidemark
from coordinator.zookeeper.session import ZooKeeperSession

if TYPE_CHECKING:
    from coordinator.protocol.barriers import BarrierGrid


class CatchUp:
    """One leadership's catch-up decisions for ``job`` (see the module docstring)."""

    def __init__(self, tm: ZooKeeperSession, job: str, pacing: Pacing) -> None:
        self.tm, self.job, self.pacing = tm, job, pacing
        self.leading_since = time.monotonic()
        self._waiting: Optional[tuple[int, float]] = None  # waiting on an upstream for an epoch after: (after, since)
        self._led_since_ms: Optional[int] = None            # this job's leader znode's creation time, read once

    @property
    def _session_timeout_ms(self) -> int:
        return int(self.tm.session_timeout * 1000)

    def reason_to_wait(self, grid: BarrierGrid, *, after: Optional[int], available: int,
                       sources: Mapping[str, tuple[Optional[str], Optional[TableTidemark]]],
                       until: Optional[int] = None) -> Optional[str]:
        """Why to wait for a managed source's writer rather than take ``available`` (``sources``: per managed
        source, its writer job and its tidemark), or None."""
        if after is None or not self.pacing.catching_up(grid, available, self.tm.server_clock.now_ms(),
                                                        self._session_timeout_ms):
            return None
        if self._waiting is None or self._waiting[0] != after:
            self._waiting = (after, time.monotonic())
        elif time.monotonic() - self._waiting[1] > CATCH_UP_WAIT_S:
            return None  # waited long enough: the upstream may be down
        for source, (writer, mark) in sources.items():
            if writer is None:
                continue
            newest = newest_epoch(self.tm, writer)
            in_flight = newest if newest is not None and (mark is None or mark.epoch is None or newest > mark.epoch) \
                else None
            if until is not None and in_flight is not None and in_flight > until:
                continue
            if not self._behind_its_cadence(writer, mark, grid):
                continue  # an upstream on time (an hourly one, say) has no catch-up epoch to come
            if self.pacing.worth_waiting(grid, after=after, available=available, in_flight=in_flight,
                                         upstream_restarted=self._took_over_with_this_job(writer),
                                         leading_for_s=time.monotonic() - self.leading_since):
                return f"source {source}'s writer {writer} is catching up: " + (
                    f"its epoch {in_flight} is in flight" if in_flight is not None and in_flight > available else
                    "it took over about when this job did and has not begun its catch-up epoch yet")
        return None

    def _took_over_with_this_job(self, writer: str) -> bool:
        """Whether ``writer``'s leader took over within ``CATCH_UP_NEW_LEADER_S`` of this job's, or it has no leader
        yet: it restarted with this job."""
        theirs = leader_since_ms(self.tm, writer)
        if theirs is None:
            return True
        if self._led_since_ms is None:
            self._led_since_ms = leader_since_ms(self.tm, self.job)
        return self._led_since_ms is not None and abs(theirs - self._led_since_ms) <= CATCH_UP_NEW_LEADER_S * 1000

    def _behind_its_cadence(self, writer: str, mark: Optional[TableTidemark], grid: BarrierGrid) -> bool:
        if mark is None or mark.epoch is None:
            return True
        try:
            pacing = read_pacing(self.tm, writer)
        except CorruptState:
            pacing = None  # its leader rewrites it; judge by the grid's interval meanwhile
        return (pacing or Pacing()).catching_up(grid, mark.epoch, self.tm.server_clock.now_ms(),
                                                self._session_timeout_ms)


__all__ = ["CatchUp"]
