"""The next epoch a leader takes, and its wait for it: the pacing rule (``pacing.Pacing``) and the catch-up
heuristic (``catch_up.CatchUp``) over state kept by watches, so a pass of a leader's loop that keeps up makes
no request (one far behind reads its sources' writers' records: ``catch_up``).

    next_epoch = NextEpoch(tm, "counts", sources, pacing)   # made when a replica takes over; close() on step-down
    epoch = next_epoch.wait(after=last, stopped=stop.is_set, on_wait=note)   # blocks; None: stopped or done
    next_epoch.grid()                  # the barrier grid, from the watched copy
    next_epoch.managed                 # the sources a Tidemark job writes (the rest are root tables)
    next_epoch.cache.get(next_epoch.managed)   # their tidemarks, kept by watches

It watches, and writes nothing: the grid (``/barriers``), the topology's version (``/topology``, read
again only when it moved) and the managed sources' tidemarks (``TidemarkCache``). Each pass asks the
pacing for the newest barrier on the job's cadence after ``after`` that every managed source holds
(and, with a root source, that the clock has passed by the grace), then asks the catch-up heuristic
whether to wait for a source's writer first; otherwise it sleeps until a source's tidemark changes or
the clock reaches the next barrier, at most ``WAIT_SLICE_S`` (so ``stopped`` is looked at that often).
The clock is ZooKeeper's (``ZooKeeperSession.server_clock``), not this host's: every driver paces
on the same clock, whatever its own says (``docs/design.md``, "Clocks"). The ``EpochWriter`` waits
with it, and so does ``bench/scale.py``'s simulated job: one loop.

A source counts as managed when the topology names its writer, or when ``claimed(source)`` says its
Iceberg metadata names one (a writer not registered again yet after a ZooKeeper wipe): reading such a
table by commit time would break the epochs' consistency, so the job waits for its tidemark instead.

Failure behaviour: ZooKeeper errors propagate from the reads (the caller's loop steps down and
contends again, as for any read); the watches re-arm when the session reconnects.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Optional

from coordinator.protocol.barriers import BarrierGrid, grid_from
from coordinator.protocol.catch_up import CatchUp
from coordinator.protocol.pacing import Choice, Pacing
from coordinator.protocol.tidemarks import TidemarkCache
from coordinator.protocol.topology import read_topology
from coordinator.zookeeper.session import ZooKeeperSession
from coordinator.zookeeper.watched import WatchedNode

WAIT_SLICE_S = 0.5  # how often a waiting leader looks at ``stopped`` and the clock


class NextEpoch:
    """One leadership's view of what its job may take next (module docstring)."""

    def __init__(self, tm: ZooKeeperSession, job: str, sources: Iterable[str], pacing: Pacing,
                 claimed: Callable[[str], bool] = lambda source: False) -> None:
        self.tm, self.job, self.sources, self.pacing = tm, job, tuple(sources), pacing
        self.claimed = claimed
        self.catch_up = CatchUp(tm, job, pacing)
        self.cache = TidemarkCache(tm)
        self.managed: tuple[str, ...] = ()
        self.writers: dict[str, str] = {}  # each table's writer job, as the topology last read says
        self._grid_node = WatchedNode(tm, tm.paths.barriers)
        self._topology_node = WatchedNode(tm, tm.paths.topology)
        self._grid: Optional[tuple[int, BarrierGrid]] = None  # parsed, with the znode's mzxid
        self._topology_seen = -2  # the /topology version last read
        self.read_sources()

    @property
    def has_root_source(self) -> bool:
        """A source no Tidemark job writes: read by commit time, so the job's epochs also follow the clock."""
        return len(self.managed) < len(self.sources)

    def grid(self) -> BarrierGrid:
        """The barrier grid, from the watched copy (no request): an interval change takes effect at once."""
        found = self._grid_node.current()
        stamp = found[1].mzxid if found is not None else -1
        if self._grid is None or self._grid[0] != stamp:
            self._grid = (stamp, grid_from(found, self.tm.paths.barriers))
        return self._grid[1]

    def read_sources(self, fresh: bool = True) -> None:
        """Which sources are managed. ``fresh``: read now (one versioned read of a cached topology), as after
        reading a root source, so a source whose writer registered meanwhile stops being a root table; otherwise
        only when the watched ``/topology`` version moved."""
        if not fresh:
            found = self._topology_node.current()
            if found is not None and found[1].version == self._topology_seen:
                return
        topo = read_topology(self.tm)
        self._topology_seen = topo.znode_version
        self.writers = topo.writers
        self.managed = tuple(s for s in self.sources if s in self.writers or self.claimed(s))

    def wait(self, after: Optional[int], until: Optional[int] = None, wait: bool = True,
             stopped: Callable[[], bool] = lambda: False,
             on_wait: Callable[[Choice], None] = lambda choice: None, covering: Optional[int] = None) -> Optional[int]:
        """Block until the pacing gives the epoch after ``after`` and return it; None once ``stopped()``, when a
        run bounded by ``until`` is complete, or (``wait`` False) when no epoch is available now. ``on_wait``
        hears why it waits, at every pass. ``covering``: the wall clock a batch run was called at; with a root
        source, it takes no epoch before ``Pacing.covering`` (waiting out the grace for it), and None when the job
        has one already, so rows committed just before the call are never left for the next run."""
        while not stopped():
            generation = self.cache.generation
            grid = self.grid()
            self.read_sources(fresh=False)
            marks = self.cache.get(self.managed)
            final = None if until is None else self.pacing.at_or_before(grid, until)
            if final is not None and after is not None and after >= final:
                return None
            floor = None if covering is None or not self.has_root_source else self.pacing.covering(grid, covering)
            if floor is not None and after is not None and after >= floor:
                return None
            now = self.tm.server_clock.now_ms()
            choice = self.pacing.choose(grid, after=after, sources=marks, has_root_source=self.has_root_source,
                                        now=now, until=until)
            if choice.epoch is not None and floor is not None and choice.epoch < floor:
                choice = Choice(None, f"a batch run covers the rows committed before it: waiting for barrier {floor} "
                                      f"plus {self.pacing.grace_ms} ms grace",
                                max(0.0, (floor + self.pacing.grace_ms - now) / 1000))
            if choice.epoch is not None:
                upstream = self.catch_up.reason_to_wait(
                    grid, after=after, available=choice.epoch, until=until,
                    sources={s: (self.writers.get(s), marks[s]) for s in self.managed}) if wait else None
                if upstream is None:
                    return choice.epoch
                choice = Choice(None, f"{upstream}: waiting for it rather than taking {choice.epoch} first",
                                WAIT_SLICE_S)
            elif (not wait and floor is None) or (final is not None and marks and all(
                    m is not None and m.epoch is not None and m.epoch >= final for m in marks.values())):
                return None  # nothing newer now; or the sources moved past ``until`` without holding a barrier
            on_wait(choice)
            self.cache.wait_changed(generation, min(choice.wake_in_s, WAIT_SLICE_S))
        return None

    def close(self) -> None:
        """Stop watching the sources' tidemarks, the grid and the topology (on step-down); their watches are not set
        again."""
        for watched in (self.cache, self._grid_node, self._topology_node):
            watched.close()


__all__ = ["WAIT_SLICE_S", "NextEpoch"]
