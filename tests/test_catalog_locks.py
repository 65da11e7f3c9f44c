"""A catalog commit never waits without a deadline on a row lock another writer holds (issue 22).

A pyiceberg SQL-catalog commit updates the table's row, then commits. A writer paused (a GC pause, SIGSTOP)
or cut off in between leaves its PostgreSQL session "idle in transaction", holding the row's lock; every
other commit to that table then waited, silently, until the paused writer came back. In the fault suite a
new leader claiming its sinks waited 95 s on a zombie that the harness held paused.

The holder here is a connection opened exactly as the catalog opens its own (``python_catalog_properties``):
what a paused writer's session looks like to the server. Real PostgreSQL, real pyiceberg.
"""
from __future__ import annotations

import threading
import time

import pyarrow as pa
import pytest
from sqlalchemy import create_engine, text

from coordinator.iceberg.catalog import PG_IDLE_IN_TRANSACTION_MS, PG_LOCK_TIMEOUT_MS, is_catalog_outage
from tests.helpers.lake import create_table

SCHEMA = pa.schema([pa.field("a", pa.int64())])


def _table(settings, name):
    return create_table(settings.load(), f"locks.{name}", SCHEMA, first_snapshot=False)


def _hold_row(uri: str, table: str):
    """A session in the middle of a commit of ``table``: its row updated, not committed yet."""
    holder = create_engine(uri).connect()
    holder.execute(text("UPDATE iceberg_tables SET table_name = table_name "
                        "WHERE table_namespace = 'locks' AND table_name = :t"), {"t": table})
    return holder


def _commit_in_background(table):
    outcome: dict[str, object] = {}

    def commit():
        try:
            table.append(pa.table({"a": [1]}, schema=SCHEMA))
            outcome["ok"] = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc
    thread = threading.Thread(target=commit, daemon=True)
    thread.start()
    return thread, outcome


def test_a_commit_waiting_on_a_paused_writers_row_lock_goes_through_once_the_server_ends_that_session(
        pg_catalog_settings):
    table = _table(pg_catalog_settings, "paused_holder")
    holder = _hold_row(pg_catalog_settings.python_catalog_properties()["uri"], "paused_holder")
    started = time.monotonic()
    thread, outcome = _commit_in_background(table)
    thread.join(PG_IDLE_IN_TRANSACTION_MS / 1000 + 15)
    assert "error" not in outcome, outcome
    assert "ok" in outcome, "the commit still waits on the paused writer's row lock"
    assert outcome["ok"] - started < PG_LOCK_TIMEOUT_MS / 1000
    # The paused writer's own commit was rolled back with its session: it never lands.
    with pytest.raises(Exception) as ended:
        holder.commit()
    assert is_catalog_outage(ended.value)
    table.refresh()
    assert len(table.scan().to_arrow()) == 1


def test_a_commit_waiting_on_any_other_row_lock_fails_as_an_outage_within_the_lock_timeout(
        postgres_uri, pg_catalog_settings):
    table = _table(pg_catalog_settings, "foreign_holder")
    # A session without Tidemark's options (another tool): the server never ends it, the waiter gives up.
    plain = pg_catalog_settings.python_catalog_properties()["uri"].split("?")[0]
    holder = _hold_row(plain, "foreign_holder")
    try:
        started = time.monotonic()
        thread, outcome = _commit_in_background(table)
        thread.join(PG_LOCK_TIMEOUT_MS / 1000 + 15)
        assert "ok" not in outcome
        assert "error" in outcome, "the commit waits on the lock with no deadline"
        assert is_catalog_outage(outcome["error"])
        assert time.monotonic() - started < PG_LOCK_TIMEOUT_MS / 1000 + 10
    finally:
        holder.rollback()
        holder.close()


@pytest.mark.spark
def test_a_spark_commit_waiting_on_a_row_lock_fails_within_the_lock_timeout(spark, pg_catalog_settings, namespace):
    """Spark's JDBC catalog gets the same session settings as Python's: its commit gives up on a held row lock."""
    table = f"{pg_catalog_settings.name}.{namespace}.spark_waiter"
    spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {pg_catalog_settings.name}.{namespace}")
    spark.sql(f"CREATE TABLE {table} (a bigint) USING iceberg")
    plain = pg_catalog_settings.python_catalog_properties()["uri"].split("?")[0]
    holder = create_engine(plain).connect()
    holder.execute(text("UPDATE iceberg_tables SET table_name = table_name "
                        "WHERE table_namespace = :n AND table_name = 'spark_waiter'"), {"n": namespace})
    outcome: dict[str, object] = {}

    def insert() -> None:
        try:
            spark.sql(f"INSERT INTO {table} VALUES (1)")
            outcome["ok"] = True
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            outcome["error"] = exc
    try:
        started = time.monotonic()
        thread = threading.Thread(target=insert, daemon=True)
        thread.start()
        thread.join(PG_LOCK_TIMEOUT_MS / 1000 + 60)
        assert "ok" not in outcome
        assert "error" in outcome, "the Spark commit waits on the lock with no deadline"
        assert "lock timeout" in str(outcome["error"])
        assert time.monotonic() - started < PG_LOCK_TIMEOUT_MS / 1000 + 60
    finally:
        holder.rollback()
        holder.close()
    spark.sql(f"INSERT INTO {table} VALUES (2)")  # the lock released, Spark commits again
    assert [row.a for row in spark.sql(f"SELECT a FROM {table}").collect()] == [2]


def test_a_reader_of_a_new_embedded_catalog_never_blocks_a_commit(tmp_path):
    """A reader in the middle of a read (``tidemark serve``, a resolver, a dashboard) holds SQLite's shared lock; with
    a rollback journal a commit then waited for it, up to the 30 s busy timeout. A new catalog writes ahead."""
    import sqlite3

    from coordinator import CatalogSettings
    settings = CatalogSettings.embedded(tmp_path)
    table = create_table(settings.load(), "locks.reader_held", SCHEMA, first_snapshot=False)
    reader = sqlite3.connect(tmp_path / "catalog.db", isolation_level=None)
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM iceberg_tables").fetchall()  # a read transaction, held open
    try:
        committed = threading.Event()

        def commit() -> None:
            table.append(pa.table({"a": [1]}, schema=SCHEMA))
            committed.set()
        threading.Thread(target=commit, daemon=True).start()
        assert committed.wait(10), "the commit waited on a reader's read transaction"
    finally:
        reader.execute("COMMIT")
        reader.close()
