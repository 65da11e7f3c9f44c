"""Spark: the wall time of an epoch with Tidemark vs the same write as a plain Iceberg append (10k and 1M
rows), and the freshness of the demo cascade (how far the consistent epoch trails the newest barrier,
p50 and p95) at two barrier intervals.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from coordinator import CatalogSettings, Tidemark
from spark_hooks import EpochJob, build_spark_session
from spark_hooks.demo import percentile, run_demo

from .common import header, zookeeper

EPOCHS = 4


def epoch_overhead(spark, tm, settings: CatalogSettings, rows: int) -> tuple[float, float]:
    table_job, table_plain = f"lake.b.job{rows}", f"lake.b.plain{rows}"
    for table in (table_job, table_plain):
        spark.sql(f"CREATE TABLE {table} (id bigint, word string) USING iceberg")
    data = spark.range(rows).selectExpr("id", "cast(id % 1000 as string) AS word").cache()
    data.count()
    job = EpochJob(spark, tm, f"bench{rows}", sources=[], sinks=[table_job], catalog=settings, interval_ms=1000,
                   grace_ms=0)
    job.epoch(lambda ctx: ctx.append(table_job, data))
    job.run(max_epochs=1)
    time.sleep(EPOCHS + 1.5)  # the next EPOCHS barriers are then in the past: no waiting, pure epoch cost
    start = time.perf_counter()
    job.run(max_epochs=EPOCHS)
    with_tidemark = (time.perf_counter() - start) / EPOCHS
    plain = []
    for _ in range(EPOCHS):
        start = time.perf_counter()
        data.writeTo(table_plain).append()
        plain.append(time.perf_counter() - start)
    data.unpersist()
    return with_tidemark, statistics.median(plain)


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-spark-") as home, zookeeper() as server:
        settings = CatalogSettings.embedded(Path(home))
        spark = build_spark_session(settings, app_name="tidemark-bench", extra_conf={"spark.ui.enabled": "false"})
        spark.sql("CREATE NAMESPACE lake.b")
        tm = Tidemark.connect(server.connect_string)
        header("epoch wall time: Tidemark epoch (stage, precommit, publish, commit) vs plain Iceberg append")
        print(f"{'rows':>9} {'Tidemark epoch':>15} {'plain append':>13} {'ratio':>6}")
        for rows in (10_000, 1_000_000):
            tidemark_s, plain_s = epoch_overhead(spark, tm, settings, rows)
            print(f"{rows:>9} {tidemark_s * 1000:>12.0f} ms {plain_s * 1000:>10.0f} ms {tidemark_s / plain_s:>6.2f}")
        tm.close()
        spark.stop()
    header("freshness of the demo cascade (producer -> word_counts -> count_histogram, separate drivers)")
    for interval in (2000, 5000):
        report = run_demo(seconds=40, interval_ms=interval)
        print(f"barrier interval {interval} ms: freshness p50 {percentile(report.freshness_ms, 0.5)} ms, "
              f"p95 {percentile(report.freshness_ms, 0.95)} ms over {len(report.freshness_ms)} samples; "
              f"{report.checked} consistent versions checked, {len(report.failures)} inconsistent; "
              f"{'PASS' if report.passed else 'FAIL'}")


if __name__ == "__main__":
    main()
