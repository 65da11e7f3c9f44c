"""Consistent reads from Spark: every table at one ``ConsistentVersion``.

    frames = read_consistent(spark, tm, ["lake.db.words", "lake.db.word_counts"])
    frames["lake.db.word_counts"].join(frames["lake.db.words"], "word")

    frames = read_consistent(spark, tm, tables, register_views=True)   # views words, word_counts
    spark.sql(frames.sql["lake.db.words"])    # SELECT * FROM lake.db.words FOR VERSION AS OF <tag or snapshot id>
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Optional, Union

from coordinator.history.readers import version_sql
from coordinator.history.resolve import Resolver
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.protocol.pipelines import Group
from coordinator.records import ConsistencyLevel, ConsistentVersion


class ConsistentFrames(dict):
    """``{table: DataFrame}`` plus the ``version`` they were read at, and ``sql``: a statement per table reading
    it there (``coordinator.history.readers.version_sql``)."""

    version: ConsistentVersion
    sql: Mapping[str, str]


def snapshot_frame(spark, table: str, snapshot_id: Optional[int]):
    """``table`` as of ``snapshot_id`` (empty when None: the table had no snapshot then). Spark's own time travel
    option ``versionAsOf``: Iceberg's runtimes for Spark 4 refuse their older ``snapshot-id`` read option."""
    if snapshot_id is None:
        return spark.table(table).limit(0)
    return spark.read.format("iceberg").option("versionAsOf", snapshot_id).load(table)


def frames_at(spark, version: ConsistentVersion) -> dict:
    """One DataFrame per table of ``version``, each at its snapshot (empty when the table had none)."""
    return {table: snapshot_frame(spark, table, snapshot_id) for table, snapshot_id in version.snapshots.items()}


def read_consistent(spark, tm, tables: Iterable[str], level: Union[str, ConsistencyLevel] = "consistent",
                    as_of: Optional[int] = None, catalog: Optional[CatalogSettings] = None,
                    register_views: bool = False, scope: str = Group.PIPELINE.value) -> ConsistentFrames:
    """Resolve ``tables`` at ``level`` across ``scope`` (``Resolver.resolve``: their pipelines by default; ZooKeeper
    when ``tm`` is given, else Iceberg metadata) and read them.

    With ``register_views``, each table is also a temporary view named after its last
    identifier part (``lake.db.word_counts`` -> ``word_counts``) for SQL at that version.
    """
    settings = catalog or CatalogSettings.from_env()
    resolver = Resolver(settings.load(), settings, tm)
    version = resolver.resolve(list(tables), level, as_of, scope=scope)
    result = ConsistentFrames(frames_at(spark, version))
    result.version, result.sql = version, version_sql(resolver, version)
    if register_views:
        for table, frame in result.items():
            frame.createOrReplaceTempView(table.rsplit(".", 1)[-1])
    return result

