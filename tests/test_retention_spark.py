"""Retained versions read back from Spark after GC expired everything else: the tagged ones from Spark SQL by
their tag, every one by its snapshot ids (``read_consistent``)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest

from coordinator.history.gc import GarbageCollector
from coordinator.history.resolve import Resolver
from coordinator.history.retention import RetentionPolicy
from coordinator.history.versions import RetainedVersions, tag_name
from spark_hooks.reads import read_consistent
from tests.helpers.retention import INTERVAL_MS, Pipeline

pytestmark = pytest.mark.spark

START = int(datetime(2025, 1, 6, tzinfo=timezone.utc).timestamp() * 1000)


def test_kept_versions_read_back_in_spark_sql_version_as_of_their_tag(spark, tm, catalog_settings, namespace):
    pipeline = Pipeline(tm, catalog_settings, namespace, spark_names=True)
    try:
        epochs = [START + k * INTERVAL_MS for k in range(1, 13)]
        for k, epoch in enumerate(epochs):
            pipeline.epoch(epoch, rows=k + 1)
        now = epochs[-1] + 1
        report = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:10m,15m:1h,tags:15m"),
                                  clock=lambda: now).run()
        records = RetainedVersions(tm).all()
        kept = [r.epoch for r in records]
        assert report.expired_snapshots > 0 and 2 < len(kept) < len(epochs)
        assert {r.tagged for r in records} == {True, False}, "the 15m tier and the newest tagged, the all tier not"
        resolver = Resolver(pipeline.catalog, catalog_settings, tm)
        for record in records:
            epoch, tag = record.epoch, tag_name(record.epoch, pipeline.name)
            if record.tagged:
                events = spark.sql(f"SELECT count(*) AS n FROM {pipeline.events} VERSION AS OF '{tag}'").first()["n"]
                total = spark.sql(f"SELECT sum(rows) AS n FROM {pipeline.totals} VERSION AS OF '{tag}'").first()["n"]
                assert events == total == pipeline.rows_at[epoch], f"{tag}: events {events}, totals {total}"
            else:
                events_table = pipeline.catalog.load_table(catalog_settings.identifier(pipeline.events))
                assert tag not in events_table.metadata.refs
            frames = read_consistent(spark, tm, pipeline.tables, as_of=epoch, catalog=catalog_settings)
            assert frames[pipeline.events].count() == pipeline.rows_at[epoch]
            pipeline.check(resolver, resolver.resolve(pipeline.tables, as_of=epoch))  # the consistency checker
    finally:
        pipeline.close()
