"""The ZooKeeper requests a real ``EpochWriter`` epoch sends, counted per session at a real ZooKeeper server,
are the protocol's and nothing else (docs/design.md, "Requests per epoch"):

- a computed epoch: ``begin``, ``precommit`` and ``commit``, one multi each, whatever the number of sinks;
- an idle epoch (no source changed): the one ``commit_idle`` multi;
- with a root source: one read of ``/topology`` after the source's metadata was loaded;
- with a managed source: the re-read that re-arms the watch on its tidemark after each upstream commit (for a
  job keeping up with the clock; one far behind it also reads its upstream's epochs, to wait for a catch-up).

The writers' sessions have a 30 s timeout, so kazoo sends no ping inside the counted windows (it pings after
a third of the timeout without a request). A request that crept into the loop (a re-read of the grid or the
topology a watch answers, a watch on the job's own sinks) makes the count exact no more.
"""
from __future__ import annotations

import time
from typing import Any

from coordinator import EpochWriter
from tests.helpers.lake import create_table
from tests.helpers.requests import received

COUNTED = 10  # epochs in each counted window
WARM_UP = 3   # epochs before it: the first one marks the sinks in Iceberg, the watches settle


def writer_for(connect, settings, job: str, sinks: list[str], sources: tuple[str, ...] = (),
               always_run: bool = True) -> EpochWriter:
    """A writer on its own session and a 1 ms grid (a root job never waits long for the clock); the marker is
    set once a day, so no marker round (a catalog commit) falls inside a window."""
    return EpochWriter(connect(session_timeout=30.0), job, sources=sources, sinks=sinks, catalog=settings,
                       interval_ms=1, grace_ms=0, marker_every="1d", always_run=always_run)


def requests_per_epoch(zk_server, writer: EpochWriter) -> list[int]:
    """Run ``writer``'s loop for ``WARM_UP + COUNTED`` epochs (its function stages nothing) and return the
    requests its session sent in each counted epoch, counted between the ends of consecutive epochs."""
    counts: list[int] = []
    process = writer.process

    def counted(*args: Any, **kwargs: Any) -> Any:
        record = process(*args, **kwargs)
        counts.append(received(zk_server, writer.tm))
        return record
    writer.process = counted  # type: ignore[method-assign]
    writer.run(lambda ctx: None, max_epochs=WARM_UP + COUNTED, stop_on_sigterm=False, leader_timeout=30)
    return [b - a for a, b in zip(counts[WARM_UP - 1:], counts[WARM_UP:])]


def test_a_computed_epoch_sends_begin_precommit_and_commit_only(zk_server, connect, catalog, catalog_settings,
                                                                 namespace):
    one, many = [f"{namespace}.one"], [f"{namespace}.many{i}" for i in range(5)]
    for name in one + many:
        create_table(catalog, name)
    assert requests_per_epoch(zk_server, writer_for(connect, catalog_settings, "one", one)) == [3] * COUNTED
    assert requests_per_epoch(zk_server, writer_for(connect, catalog_settings, "many", many)) == [3] * COUNTED, \
        "every sink's tidemark moves in the one commit multi"


def test_a_root_source_adds_one_topology_read(zk_server, connect, catalog, catalog_settings, namespace):
    """Computed: the three multis and the read; idle (the root source did not change): ``commit_idle`` and the
    read."""
    raw, out, quiet = f"{namespace}.raw", f"{namespace}.out", f"{namespace}.quiet"
    for name in (raw, out, quiet):
        create_table(catalog, name)
    computed = writer_for(connect, catalog_settings, "reader", [out], sources=(raw,))
    assert requests_per_epoch(zk_server, computed) == [4] * COUNTED
    idle = writer_for(connect, catalog_settings, "idle", [quiet], sources=(raw,), always_run=False)
    assert requests_per_epoch(zk_server, idle) == [2] * COUNTED


def test_a_managed_source_adds_the_watch_re_read_of_each_upstream_commit(zk_server, connect, catalog,
                                                                        catalog_settings, namespace):
    """``down`` waits for each epoch of ``up`` the way its loop does (``next_barrier``, on the watch of up's
    tidemark), then processes it: the watch's re-read and the three multis, on down's session."""
    up_table, down_table = f"{namespace}.up", f"{namespace}.down"
    for name in (up_table, down_table):
        create_table(catalog, name)
    up = writer_for(connect, catalog_settings, "up", [up_table])
    down = writer_for(connect, catalog_settings, "down", [down_table], sources=(up_table,))
    up.open(leader_timeout=30)
    down.open(leader_timeout=30)
    try:
        # After down opened (a job's first epoch is after then), and ahead of the clock: a job keeping up. One
        # far behind it (3 cadences) also looks up whether its upstream is catching up (``Pacing.worth_waiting``).
        epoch = int(time.time() * 1000) + 3_600_000
        counts = []
        for _ in range(WARM_UP + COUNTED):
            before = received(zk_server, down.tm)
            up.process(epoch, lambda ctx: None, inputs=up.inputs_for(epoch))
            taken = down.next_barrier()
            assert taken == epoch
            down.process(taken, lambda ctx: None, inputs=down.inputs_for(taken))
            counts.append(received(zk_server, down.tm) - before)
            epoch += 1
        assert counts[WARM_UP:] == [4] * COUNTED
    finally:
        up.close()
        down.close()
