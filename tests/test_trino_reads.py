"""Trino, a reader that knows nothing of Tidemark, reads a consistent version of two tables on the REST catalog
and S3 (real servers: SeaweedFS's ``weed mini`` and Trino 476 from Maven Central, ``tests/helpers/trino.py``),
configured with docs/reading.md's catalog file, and gets exactly what Tidemark reads."""
from __future__ import annotations

import os
import subprocess
from collections import Counter

import pytest

from coordinator import VersionReader
from coordinator.history.gc import GarbageCollector
from coordinator.history.readers import version_sql
from coordinator.history.versions import tag_name
from tests.helpers.cli import TIDEMARK
from tests.helpers.present import present
from tests.test_lakehouse import CopyPipeline
from tests.test_writer_flow import Fleet


@pytest.fixture
def lakehouse(trino_lakehouse):
    """The lakehouse the run's one Trino reads."""
    return trino_lakehouse


def test_trino_joins_two_tables_at_a_consistent_version_by_tag_and_by_snapshot_id_as_tidemark_reads_them(
        lakehouse, connect, zk_connect, trino, namespace):
    settings = lakehouse.catalog_settings()
    pipeline = CopyPipeline(settings.load(), namespace)
    fleet = Fleet(connect, settings, interval_ms=1000, grace_ms=200)
    tm = connect()
    try:
        runner = pipeline.start(fleet)
        fleet.wait(lambda: len(runner.writer.committed) >= 1, "the job's first epoch")
        for word in ("a", "b", "a", "c"):
            pipeline.append(word)
        fleet.wait(lambda: pipeline.consistent_copies(tm, settings) == sorted(pipeline.appended), "every word copied")
    finally:
        fleet.stop_all()
    pipeline.append("late")  # the job has stopped: no consistent version holds it
    GarbageCollector(tm, settings).run()  # retains the newest version: its tables carry its tag

    reader = VersionReader.resolve([pipeline.source, pipeline.sink], tm, settings=settings)
    expected = {t: sorted(reader.arrow(t).column("word").to_pylist()) for t in reader.tables}
    assert expected[pipeline.source] == expected[pipeline.sink] == sorted(["a", "a", "b", "c"])

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYICEBERG_", "TIDEMARK_CATALOG"))}
    resolved = subprocess.run([*TIDEMARK, "--zk", zk_connect, "resolve",
                               pipeline.source, pipeline.sink, "--format", "sql"],
                              capture_output=True, text=True, timeout=120,
                              env={**env, **lakehouse.pyiceberg_environment()})
    assert resolved.returncode == 0, resolved.stderr
    by_tag = {table: next(line.rstrip(";") for line in resolved.stdout.splitlines() if f"lake.{table} " in line)
              for table in reader.tables}
    assert f"'{tag_name(present(reader.version.epoch), 'copy')}'" in by_tag[pipeline.sink], resolved.stdout
    by_id = version_sql(reader.resolver, reader.version, by_tag=False)
    assert all(f"FOR VERSION AS OF {reader.version.snapshots[t]}" in by_id[t] for t in reader.tables), by_id

    joined = Counter(word for word in expected[pipeline.source] for other in expected[pipeline.sink] if word == other)
    for statements in (by_tag, by_id):
        for table, statement in statements.items():
            assert sorted(row[0] for row in trino.query(f"SELECT word FROM ({statement})")) == expected[table]
        rows = trino.query(f"SELECT word, count(*) FROM ({statements[pipeline.source]}) w "
                           f"JOIN ({statements[pipeline.sink]}) c USING (word) GROUP BY word")
        assert dict(map(tuple, rows)) == joined, statements
    latest = trino.query(f"SELECT word FROM lake.{pipeline.source}")
    assert "late" in [row[0] for row in latest], "Trino reads the source's newest snapshot without a version"
