"""Coordination only (no Iceberg, no Spark): ZooKeeper round trips for a root job to choose its next epoch
and per committed epoch, epoch commits per second for N sink tables, and ``tidemark status`` over 1,000
registered jobs.

    python -m bench coordination

Choosing an epoch is one pass of the writer's wait loop (``EpochWriter.next_barrier``): read the grid
and the topology, then ``Pacing.choose`` (a root job takes the newest grid point the clock passed).
There is no agreement step: each job picks its own epochs on the shared grid.

Baselines measured in the same run: one bare ZooKeeper round trip (kazoo ``exists``), and
reading the status znodes one by one instead of pipelined.
"""
from __future__ import annotations

import argparse
import time
from typing import Optional

from coordinator import EpochCoordinator, EpochInputs, SourceRange, Tidemark
from coordinator.protocol.pacing import Pacing
from coordinator.protocol.topology import read_topology
from coordinator.records import LeaderRecord, TableTidemark, TermRecord

from .common import RoundTrips, header, ms, timed, zookeeper

EPOCHS = 200


def epochs_per_sink_count(server, sinks: int, count: int = EPOCHS) -> tuple[float, float, float]:
    """Round trips to choose the next epoch, round trips per epoch (begin + precommit + commit), and epochs/s
    (choosing included), for a job reading a root table with ``sinks`` sink tables, 1 s grid, no grace."""
    tm = Tidemark.connect(server.connect_string + f"/bench-sinks-{sinks}")
    try:
        tables = [f"lake.bench.t{i}" for i in range(sinks)]
        tm.register_job("bench", sources=["raw.source"], sinks=tables)
        tm.barriers.ensure_grid(1000)
        leadership = tm.leadership("bench")
        leadership.acquire()
        epochs = EpochCoordinator(leadership, tables, history=100)
        epochs.recover()
        pacing = Pacing(None, grace_ms=0)
        choose_trips = epoch_trips = 0
        elapsed = 0.0  # the protocol's own time: the request counter is read outside the timed steps
        trips = RoundTrips(server)
        last = None
        for k in range(1, count + 1):
            now = k * 1000  # the clock just passed grid point k
            start = time.perf_counter()
            grid = tm.barriers.grid()
            read_topology(tm)
            t = pacing.choose(grid, after=last, sources={}, has_root_source=True, now=now).epoch
            elapsed += time.perf_counter() - start
            choose_trips += trips.take()
            if t != now:
                raise RuntimeError(f"pacing chose {t}, not the grid point {now} the clock just passed")
            start = time.perf_counter()
            epochs.begin(t, EpochInputs({"raw.source": SourceRange(t - 1000 if k > 1 else None, t)}))
            epochs.precommit(t, {name: t for name in tables})
            epochs.commit(t, {name: t for name in tables})
            elapsed += time.perf_counter() - start
            epoch_trips += trips.take()
            last = t
        leadership.release()
        return choose_trips / count, epoch_trips / count, count / elapsed
    finally:
        tm.close()


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


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench coordination", description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="epochs per sink count")
    parser.add_argument("--status-jobs", type=int, default=1000, help="jobs registered for the status read")
    opts = parser.parse_args(argv)
    with zookeeper() as server:
        header("coordination: ZooKeeper round trips to choose the next epoch and per epoch "
               "(begin + precommit + commit)")
        probe = Tidemark.connect(server.connect_string)
        print(f"baseline: one bare ZooKeeper round trip:   {ms(timed(lambda: probe.client.exists('/'), 500))}")
        probe.close()
        print("(choosing = one pass of the writer's wait loop: grid + topology read; epochs/s includes it)")
        print(f"{'sinks':>6} {'trips/choice':>13} {'trips/epoch':>12} {'epochs/s':>10}")
        for sinks in (1, 10, 50):
            choice, trips, rate = epochs_per_sink_count(server, sinks, opts.epochs)
            print(f"{sinks:>6} {choice:>13.2f} {trips:>12.2f} {rate:>10.1f}")
        header(f"tidemark status on {opts.status_jobs:,} registered jobs")
        status_of_many_jobs(server, opts.status_jobs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
