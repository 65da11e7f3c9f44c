"""Coordination only (no Iceberg, no Spark): ZooKeeper round trips to agree a barrier and per committed
epoch, epoch commits per second for N sink tables, and ``tidemark status`` over 1,000 registered jobs.

Baselines measured in the same run: one bare ZooKeeper round trip (kazoo ``exists``), and
reading the status znodes one by one instead of pipelined.
"""
from __future__ import annotations

import time

from coordinator import EpochCoordinator, EpochInputs, SourceRange, Tidemark
from coordinator.records import LeaderRecord, TableTidemark, TermRecord

from .common import RoundTrips, header, ms, timed, zookeeper

EPOCHS = 200


def epochs_per_sink_count(server, sinks: int) -> tuple[float, float, float]:
    """Round trips to agree one barrier, round trips per epoch (begin + precommit + commit), and epochs/s
    (agreement included), for a job with ``sinks`` sink tables."""
    tm = Tidemark.connect(server.connect_string + f"/bench-sinks-{sinks}")
    try:
        tables = [f"lake.bench.t{i}" for i in range(sinks)]
        tm.register_job("bench", sources=["raw.source"], sinks=tables)
        tm.barriers.ensure_grid(1000)
        leadership = tm.leadership("bench")
        leadership.acquire()
        epochs = EpochCoordinator(leadership, tables, history=100)
        epochs.recover()
        agree_trips = epoch_trips = 0
        elapsed = 0.0  # the protocol's own time: the request counter is read outside the timed steps
        trips = RoundTrips(server)
        for k in range(1, EPOCHS + 1):
            t = k * 1000
            start = time.perf_counter()
            if not tm.barriers.agree(t, proposed_by="bench"):
                raise RuntimeError(f"barrier {t} was already agreed")
            elapsed += time.perf_counter() - start
            agree_trips += trips.take()
            start = time.perf_counter()
            epochs.begin(t, EpochInputs({"raw.source": SourceRange(t - 1000 if k > 1 else None, t)}))
            epochs.precommit(t, {name: t for name in tables})
            epochs.commit(t, {name: t for name in tables})
            elapsed += time.perf_counter() - start
            epoch_trips += trips.take()
        leadership.release()
        return agree_trips / EPOCHS, epoch_trips / EPOCHS, EPOCHS / elapsed
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


def main() -> None:
    with zookeeper() as server:
        header("coordination: ZooKeeper round trips to agree a barrier and per epoch (begin + precommit + commit)")
        probe = Tidemark.connect(server.connect_string)
        print(f"baseline: one bare ZooKeeper round trip:   {ms(timed(lambda: probe.client.exists('/'), 500))}")
        probe.close()
        print("(epochs/s includes agreeing each barrier, as a root job does)")
        print(f"{'sinks':>6} {'trips/agreement':>16} {'trips/epoch':>12} {'epochs/s':>10}")
        for sinks in (1, 10, 50):
            agreement, trips, rate = epochs_per_sink_count(server, sinks)
            print(f"{sinks:>6} {agreement:>16.2f} {trips:>12.2f} {rate:>10.1f}")
        header("tidemark status on 1,000 registered jobs")
        status_of_many_jobs(server, 1000)


if __name__ == "__main__":
    main()
