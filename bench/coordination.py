"""Coordination: ZooKeeper requests per epoch, counted at the server, for the protocol alone and for the real
``EpochWriter`` loop; epochs per second with ZooKeeper alone; ``tidemark status`` over 1,000 registered jobs.

    python -m bench coordination [--epochs 200] [--status-jobs 1000]

**The protocol alone** (``EpochCoordinator``): ``begin``, ``precommit`` and ``commit`` of a job with 1, 10
and 50 sink tables and nothing else, the protocol's minimum: three multis an epoch, whatever the number of
sinks (every sink's tidemark moves in the commit multi). Counted with the server's ``zk_packets_received``
(``mntr``), less the ``mntr`` requests that read it.

**The real loop** (``EpochWriter.run``: pacing, watches, metrics, the committer, against a real SQLite
catalog): every request the writer's own session sends while it runs epochs back to back, counted per
session at the server (``stat`` lists each connection with the packets it received; the bench's reads of
the counter go over other connections). The grid is 1 ms, so the clock never holds a root job back and
the rate is the loop's own; a derived job runs on a 50 ms grid behind its upstream. Sinks are written
with ``always_run`` and a function that stages nothing, so no epoch makes a catalog commit (the
committed-epoch marker is set to one round a day so that none falls in the measured window): what is left
is ZooKeeper. Pings (kazoo sends one only after a third of the session timeout without a request) are
counted apart, by the client. Why each request is needed:

- ``begin`` (one multi): the epoch's inputs are durable before anything is computed, so a new leader
  recomputes from the same ranges;
- ``precommit`` (one multi): the staged snapshots are recorded before any is published, so a new leader
  rolls a half-published epoch forward;
- ``commit`` (one multi): every sink's tidemark and the epoch record move together;
- with a root source, one read of ``/topology`` after the source's metadata was loaded: a source that
  got a writer since must not be read by commit time any more (a watch event may still be in flight);
- with a managed source, the re-read that re-arms the watch on its tidemark after each upstream commit
  (a watch says that a znode changed, not what it holds);
- an idle epoch (no source changed): the one ``commit_idle`` multi;
- only while a job with managed sources is far behind the clock (3 cadences, catching up), a look at its
  upstream writers' epochs, to wait for their catch-up epoch rather than take a stale one first.

Nothing else: the grid and the topology version are watched, a job's sinks' tidemarks are the ones it
wrote, and its metrics read memory.
"""
from __future__ import annotations

import argparse
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pyarrow as pa

from coordinator import CatalogSettings, EpochCoordinator, EpochInputs, EpochWriter, SourceRange, Tidemark
from coordinator.operations.zookeeper_server import four_letter_word
from coordinator.records import LeaderRecord, TableTidemark, TermRecord

from .common import RoundTrips, header, ms, timed, verdict, zookeeper

EPOCHS = 200
WARM_UP = 20  # epochs before counting: the first epoch marks its sinks in Iceberg, the watches settle
REQUESTS_GOAL = 6
RATE_GOAL = 300.0
SCHEMA = pa.schema([pa.field("n", pa.int64(), nullable=False)])


def protocol_only(server, sinks: int, count: int = EPOCHS) -> tuple[float, float]:
    """Requests per epoch (begin + precommit + commit) and epochs/s, for a job with ``sinks`` sink tables."""
    tm = Tidemark.connect(server.connect_string + f"/bench-sinks-{sinks}")
    try:
        tables = [f"lake.bench.t{i}" for i in range(sinks)]
        tm.register_job("bench", sources=["raw.source"], sinks=tables)
        grid = tm.barriers.ensure_grid(1000)
        leadership = tm.leadership("bench")
        leadership.acquire()
        # The grid as a writer holds it (watched: no read per epoch).
        epochs = EpochCoordinator(leadership, tables, history=100, grid=lambda: grid)
        epochs.recover()
        requests = 0
        elapsed = 0.0  # the protocol's own time: the counter is read outside the timed steps
        trips = RoundTrips(server)
        for k in range(1, WARM_UP + count + 1):  # the first WARM_UP epochs warm the server up, uncounted
            t = k * 1000
            start = time.perf_counter()
            epochs.begin(t, EpochInputs({"raw.source": SourceRange(t - 1000 if k > 1 else None, t)}))
            epochs.precommit(t, {name: t for name in tables})
            epochs.commit(t, {name: t for name in tables})
            if k > WARM_UP:
                elapsed += time.perf_counter() - start
                requests += trips.take()
            else:
                trips.take()
        leadership.release()
        return requests / count, count / elapsed
    finally:
        tm.close()


def session_packets(server, port: int) -> int:
    """Packets the server received on the connection from local port ``port`` (``stat`` lists every client)."""
    reply = (four_letter_word("127.0.0.1", server.port, b"stat") or b"").decode(errors="replace")
    for line in reply.splitlines():
        if f":{port}[" in line and "recved=" in line:
            return int(line.split("recved=", 1)[1].split(",", 1)[0])
    raise RuntimeError(f"stat lists no connection from port {port}")


class CountedSession:
    """A writer's session whose requests the server counts (by the connection's port), and whose pings the
    client counts (kazoo's ``_send_ping``: a private hook, for this count only)."""

    def __init__(self, server, connect: str) -> None:
        self.server = server
        self.tm = Tidemark.connect(connect, session_timeout=10.0, operation_timeout=60)
        self.pings = 0
        connection = self.tm.client._connection
        send_ping = connection._send_ping

        def counted(*args: Any) -> Any:
            self.pings += 1
            return send_ping(*args)
        connection._send_ping = counted

    def packets(self) -> int:
        return session_packets(self.server, self.tm.client._connection._socket.getsockname()[1])

    def close(self) -> None:
        self.tm.close()


@dataclass(frozen=True)
class LoopFigures:
    requests: float   # per epoch, at the server, pings excluded
    pings: int        # over the measured epochs
    rate: float       # epochs per second
    idle: int         # epochs of the window that were idle


@dataclass
class _Mark:
    packets: int
    pings: int
    ran: int
    at: float


def measure_loop(session: CountedSession, writer: EpochWriter, count: int) -> LoopFigures:
    """Run ``writer`` for ``WARM_UP + count`` epochs; count the requests and time of the last ``count``."""
    marks: dict[int, _Mark] = {}
    done, ran = [0], [0]
    process = writer.process

    def function(ctx: Any) -> None:
        ran[0] += 1  # stages nothing: the epoch's sinks keep their snapshots, no catalog commit

    def counted(*args: Any, **kwargs: Any) -> Any:
        record = process(*args, **kwargs)
        done[0] += 1
        if done[0] in (WARM_UP, WARM_UP + count):  # read between epochs, over another connection
            marks[done[0]] = _Mark(session.packets(), session.pings, ran[0], time.perf_counter())
        return record
    writer.process = counted  # type: ignore[method-assign]
    writer.run(function, max_epochs=WARM_UP + count, stop_on_sigterm=False, leader_timeout=60)
    a, b = marks[WARM_UP], marks[WARM_UP + count]
    pings = b.pings - a.pings
    return LoopFigures((b.packets - a.packets - pings) / count, pings, count / (b.at - a.at),
                       count - (b.ran - a.ran))


def create_tables(settings: CatalogSettings, names: list[str]) -> None:
    catalog = settings.load()
    for name in names:
        catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
        catalog.create_table(name, schema=SCHEMA)


def real_loop(server, settings: CatalogSettings, shape: str, sinks: int, count: int) -> LoopFigures:
    """The real loop of one job shape: ``root`` (no source), ``root-source`` (one table no Tidemark job writes),
    ``derived`` (one source another job writes, that job running beside it) or ``idle`` (a root source that
    does not change: every epoch is idle); each with ``sinks`` sink tables."""
    tag = f"{shape}-{sinks}"
    chroot = f"{server.connect_string}/bench-loop-{tag}"
    namespace = f"loop_{tag.replace('-', '_')}"
    names = [f"{namespace}.t{i}" for i in range(sinks)]
    create_tables(settings, names)
    always_run = shape != "idle"
    upstream: Optional[EpochWriter] = None
    runner: Optional[threading.Thread] = None
    sources: list[str] = []
    interval = 1
    if shape in ("root-source", "idle"):
        sources = [f"{namespace}.raw"]
        create_tables(settings, sources)
        settings.load().load_table(sources[0]).append(pa.table({"n": pa.array([1], pa.int64())}, schema=SCHEMA))
    elif shape == "derived":
        interval = 50  # the job keeps up: one 3 intervals behind the clock looks for an upstream catching up
        sources = [f"{namespace}.up"]
        create_tables(settings, sources)
        up_session = Tidemark.connect(chroot, session_timeout=10.0, operation_timeout=60)
        upstream = EpochWriter(up_session, "up", sources=[], sinks=sources, catalog=settings, interval_ms=interval,
                               grace_ms=0, marker_every="1d", always_run=True)
        runner = threading.Thread(target=upstream.run, args=(lambda ctx: None,),
                                  kwargs={"stop_on_sigterm": False, "leader_timeout": 60}, daemon=True)
        runner.start()
        deadline = time.monotonic() + 60
        while not upstream.committed:  # registered and committing: the job below reads it as a managed source
            if time.monotonic() > deadline or not runner.is_alive():
                raise RuntimeError("the upstream job did not commit within 60 s")
            time.sleep(0.01)
    session = CountedSession(server, chroot)
    try:
        writer = EpochWriter(session.tm, "job", sources=sources, sinks=names, catalog=settings, interval_ms=interval,
                             grace_ms=0, marker_every="1d", always_run=always_run)
        return measure_loop(session, writer, count)
    finally:
        if upstream is not None and runner is not None:
            upstream.stop()
            runner.join(60)
            upstream.tm.close()
        session.close()


def status_of_many_jobs(server, jobs: int) -> None:
    tm = Tidemark.connect(server.connect_string + "/bench-status", operation_timeout=120)
    try:
        start = time.perf_counter()
        for i in range(jobs):
            tm.register_job(f"job{i:04d}", sources=[f"lake.s.t{i - 1:04d}"] if i else [], sinks=[f"lake.s.t{i:04d}"])
        print(f"registered {jobs} jobs in {time.perf_counter() - start:.1f} s "
              f"({jobs / (time.perf_counter() - start):.0f} registrations/s)")
        status = tm.status()
        assert len(status.jobs) == jobs
        print(f"tidemark status, {jobs} jobs (pipelined):      {ms(timed(tm.status, 5))}")

        def sequential() -> None:
            p = tm.paths
            for name in tm.children(p.jobs):
                for path, _record in ((p.job(name), None), (p.term(name), TermRecord), (p.leader(name), LeaderRecord)):
                    tm.get(path)
            for table in tm.children(p.tables):
                tm.read(p.tidemark(table), TableTidemark)
        print(f"baseline: the same reads one by one:       {ms(timed(sequential, 3))}")
    finally:
        tm.close()


# (shape, sinks, label, whether the loop is ZooKeeper alone: a root source's metadata is loaded every epoch,
# a derived job runs at its upstream's pace)
SHAPES = [("root", 1, "root job, no source", True), ("root", 10, "root job, no source", True),
          ("root", 50, "root job, no source", True), ("root-source", 1, "root job, one root source", False),
          ("idle", 1, "idle: the root source unchanged", False),
          ("derived", 1, "derived job, one managed source", False)]


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench coordination", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="epochs measured per case")
    parser.add_argument("--status-jobs", type=int, default=1000, help="jobs registered for the status read")
    opts = parser.parse_args(argv)
    with zookeeper() as server, tempfile.TemporaryDirectory(prefix="tidemark-bench-coord-") as home:
        settings = CatalogSettings.embedded(Path(home))
        header("ZooKeeper requests per epoch and epochs/s with ZooKeeper alone")
        probe = Tidemark.connect(server.connect_string)
        print(f"baseline: one bare ZooKeeper round trip:   {ms(timed(lambda: probe.client.exists('/'), 500))}")
        probe.close()
        print(f"goals: a real writer epoch <= {REQUESTS_GOAL} requests; >= {RATE_GOAL:.0f} ZooKeeper-only epochs/s")
        print("\nthe protocol alone (begin + precommit + commit), counted with mntr:")
        print(f"{'sinks':>6} {'requests/epoch':>15} {'epochs/s':>10}")
        for sinks in (1, 10, 50):
            requests, rate = protocol_only(server, sinks, opts.epochs)
            print(f"{sinks:>6} {requests:>15.2f} {rate:>10.1f}  {verdict(rate >= RATE_GOAL)}")
        print(f"\nthe real EpochWriter loop, {opts.epochs} epochs after {WARM_UP}, counted per session at the server:")
        print(f"{'job':<33} {'sinks':>5} {'requests/epoch':>15} {'pings':>6} {'epochs/s':>9} {'idle':>5}  "
              "requests, rate")
        for shape, sinks, label, zookeeper_only in SHAPES:
            loop = real_loop(server, settings, shape, sinks, opts.epochs)
            rate_met = verdict(loop.rate >= RATE_GOAL) if zookeeper_only else "(not ZooKeeper alone)"
            print(f"{label:<33} {sinks:>5} {loop.requests:>15.2f} {loop.pings:>6} {loop.rate:>9.1f} "
                  f"{loop.idle:>5}  {verdict(loop.requests <= REQUESTS_GOAL)}, {rate_met}", flush=True)
        header(f"tidemark status on {opts.status_jobs:,} registered jobs")
        status_of_many_jobs(server, opts.status_jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
