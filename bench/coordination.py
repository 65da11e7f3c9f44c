"""Coordination only (no Iceberg, no Spark): ZooKeeper round trips per committed epoch, epoch commits per
second for N sink tables, and ``tidemark status`` over 1,000 registered jobs.

Baselines measured in the same run: one bare ZooKeeper round trip (kazoo ``exists``), and
reading the status znodes one by one instead of pipelined.
"""
from __future__ import annotations

import time

from coordinator import EpochCoordinator, Tidemark
from coordinator.records import LeaderRecord, TableTidemark, TermRecord

from .common import header, ms, packets_received, timed, zookeeper

EPOCHS = 200


def epochs_per_sink_count(server, sinks: int) -> tuple[float, float]:
    tm = Tidemark.connect(server.connect_string + f"/bench-sinks-{sinks}")
    try:
        tables = [f"lake.bench.t{i}" for i in range(sinks)]
        tm.register_job("bench", sources=[], sinks=tables)
        leadership = tm.leadership("bench")
        leadership.acquire()
        epochs = EpochCoordinator(leadership, tables, tm.barriers.ensure_grid(1000), history=100)
        epochs.recover()
        before = packets_received(server)
        start = time.perf_counter()
        for k in range(1, EPOCHS + 1):
            t = k * 1000
            epochs.begin(t, {"source": [t]})
            epochs.precommit(t, {name: t for name in tables})
            epochs.commit(t, {name: t for name in tables})
        elapsed = time.perf_counter() - start
        trips = (packets_received(server) - before) / EPOCHS
        leadership.release()
        return trips, EPOCHS / elapsed
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
                for path, record in ((p.job(name), None), (p.term(name), TermRecord), (p.leader(name), LeaderRecord)):
                    tm.get(path)
            for table in tm.children(p.tables):
                tm.read(p.tidemark(table), TableTidemark)
        print(f"baseline: the same reads one by one:       {ms(timed(sequential, 3))}")
    finally:
        tm.close()


def main() -> None:
    with zookeeper() as server:
        header("coordination: ZooKeeper round trips and epoch commits (begin + precommit + commit)")
        probe = Tidemark.connect(server.connect_string)
        print(f"baseline: one bare ZooKeeper round trip:   {ms(timed(lambda: probe.client.exists('/'), 500))}")
        probe.close()
        print(f"{'sinks':>6} {'round trips/epoch':>18} {'epochs/s':>10}")
        for sinks in (1, 10, 50):
            trips, rate = epochs_per_sink_count(server, sinks)
            print(f"{sinks:>6} {trips:>18.2f} {rate:>10.1f}")
        header("tidemark status on 1,000 registered jobs")
        status_of_many_jobs(server, 1000)


if __name__ == "__main__":
    main()
