"""Spark: the wall time of one Tidemark epoch vs a plain Iceberg append of the same cached DataFrame
(10k and 1M rows).

Each epoch is the whole loop step of a root job (choose the next barrier, record the inputs,
run the function: a staged ``append``, then precommit, publish and commit). The grid is
1 ms with no grace, on the bench's own ZooKeeper, so every epoch finds a new barrier at
once: no waiting for the clock, pure epoch cost. Tidemark epochs and plain appends are
interleaved (the machine may be busy with other work) and the median of each is compared.

    python -m bench spark [--repeat 7] [--rows 10000 1000000] [--stack embedded|lakehouse]

Freshness of a cascade against the clock is measured by ``python -m bench pipeline``.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Optional

from coordinator import CatalogSettings, Tidemark
from spark_hooks import EpochJob, build_spark_session

from .common import (
    EPOCH_RATIO_GOALS,
    EPOCH_RATIO_HEADER,
    STACKS,
    bench_lake,
    epoch_ratio_line,
    header,
    interleaved,
    zookeeper,
)

WARMUP = 2  # epochs and appends not counted: the first writes of a table plan and load more


def epoch_overhead(spark, connect: str, settings: CatalogSettings, rows: int, repeat: int) -> dict[str, float]:
    table_job, table_plain = f"lake.b.job{rows}", f"lake.b.plain{rows}"
    for table in (table_job, table_plain):
        spark.sql(f"CREATE TABLE {table} (id bigint, word string) USING iceberg")
    data = spark.range(rows).selectExpr("id", "cast(id % 1000 as string) AS word").cache()
    data.count()
    tm = Tidemark.connect(f"{connect}/overhead-{rows}")  # a grid of its own: 1 ms, no grace
    job = EpochJob(spark, tm, f"bench{rows}", sources=[], sinks=[table_job], catalog=settings, interval_ms=1,
                   grace_ms=0)
    write_s: list[float] = []

    def append(ctx) -> None:
        start = time.perf_counter()
        ctx.append(table_job, data)
        write_s.append(time.perf_counter() - start)
    job.epoch(append)
    job.open()
    writer = job.writer

    def epoch() -> None:
        target = writer.next_barrier()  # at once: the clock passed a new 1 ms grid point
        assert target is not None  # None only once the writer is stopped
        writer.process(target, append, inputs=writer.inputs_for(target))
    try:
        epochs, plain = interleaved(epoch, lambda: data.writeTo(table_plain).append(), WARMUP, repeat)
    finally:
        job.close()
        tm.close()
        data.unpersist()
    committed = writer.committed
    assert len(committed) == WARMUP + repeat and committed == sorted(set(committed)), committed
    return {"epoch": statistics.median(epochs), "write": statistics.median(write_s[WARMUP:]),
            "plain": statistics.median(plain)}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench spark")
    parser.add_argument("--repeat", type=int, default=7, help="epochs (and plain appends) measured per size")
    parser.add_argument("--rows", type=int, nargs="+", default=list(EPOCH_RATIO_GOALS))
    parser.add_argument("--stack", choices=STACKS, default="embedded",
                        help="where the tables live: embedded (SQLite, local files) or lakehouse (S3 and a REST "
                             "catalog, SeaweedFS)")
    opts = parser.parse_args(argv or [])
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-spark-") as home, zookeeper() as server, \
            bench_lake(Path(home), opts.stack) as settings:
        spark = build_spark_session(settings, app_name="tidemark-bench", extra_conf={"spark.ui.enabled": "false"})
        spark.sql(f"CREATE NAMESPACE {settings.name}.b")
        header(f"epoch wall time ({opts.stack}): Tidemark epoch (choose barrier, stage, precommit, publish, commit) "
               "vs plain Iceberg append of the same cached DataFrame")
        print(f"median of {opts.repeat} each, interleaved, after {WARMUP} warm-up writes; "
              "'staged write' is the Spark append inside the epoch")
        print(EPOCH_RATIO_HEADER)
        for rows in opts.rows:
            r = epoch_overhead(spark, server.connect_string, settings, rows, opts.repeat)
            print(epoch_ratio_line(rows, r["epoch"], r["write"], r["plain"], EPOCH_RATIO_GOALS.get(rows)), flush=True)
        spark.stop()
    return 0

if __name__ == "__main__":
    main()
