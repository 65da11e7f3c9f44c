"""Readers for every engine: pandas, polars and DuckDB by snapshot id, Spark SQL and Trino by tag or snapshot id.

A real pipeline on real ZooKeeper and the real SQLite catalog: the test appends orders to the root table
``orders`` and the job ``big`` (an ``EpochWriter``) copies each epoch's orders over 1000 to ``big_orders``.
Orders appended after the job's epoch are newer than the consistent version, so a reader that saw them
would have read past it. pandas, polars and DuckDB are the real libraries (the ``readers`` extra).
"""
from __future__ import annotations

import duckdb
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyiceberg.expressions.parser import parse

from coordinator import (
    CatalogSettings,
    ConsistencyLevel,
    ConsistentVersion,
    EpochWriter,
    VersionReader,
    duckdb_iceberg_connection,
    duckdb_iceberg_sql,
    version_sql,
)
from coordinator.errors import ConfigurationError, InvalidArgument, TidemarkError
from coordinator.history.readers import DUCKDB_EXTENSIONS, _extension_file, _s3_secret, _sql_identifier, _sql_string
from coordinator.history.resolve import Resolver
from coordinator.history.versions import tag_name
from coordinator.operations.cli import main as cli
from tests.helpers.present import present

SCHEMA = pa.schema([("id", pa.int64()), ("amount", pa.int64()), ("note", pa.string())])


def orders(ids: range, amounts: list[int]) -> pa.Table:
    return pa.table({"id": list(ids), "amount": amounts, "note": [f"order {i}" for i in ids]}, schema=SCHEMA)


@pytest.fixture
def lake(tm, catalog_settings, namespace):
    """``(orders, big_orders, epoch)``: the job's one epoch over orders 1-6; orders 7-8 came after it."""
    catalog = catalog_settings.load()
    catalog.create_namespace(namespace)
    source, sink = f"lake.{namespace}.orders", f"lake.{namespace}.big_orders"
    root = catalog.create_table(f"{namespace}.orders", SCHEMA)
    catalog.create_table(f"{namespace}.big_orders", SCHEMA)
    root.append(orders(range(1, 7), [500, 1500, 2500, 800, 3000, 1200]))

    def step(ctx):
        new = ctx.changes(source)
        ctx.append(sink, new.filter(pc.greater(new["amount"], 1000)))

    writer = EpochWriter(tm, "big", sources=[source], sinks=[sink], catalog=catalog_settings, interval_ms=1000)
    (epoch,) = writer.run(step, once=True)
    root.append(orders(range(7, 9), [9000, 100]))  # after the epoch: in no version yet
    return source, sink, epoch


@pytest.fixture
def tables(catalog_settings, namespace):
    """``(resolver, orders, big_orders)`` without ZooKeeper: orders 1-8 in one snapshot, big_orders empty."""
    catalog = catalog_settings.load()
    catalog.create_namespace(namespace)
    catalog.create_table(f"{namespace}.orders", SCHEMA).append(
        orders(range(1, 9), [500, 1500, 2500, 800, 3000, 1200, 9000, 100]))
    catalog.create_table(f"{namespace}.big_orders", SCHEMA)
    return Resolver(catalog, catalog_settings), f"lake.{namespace}.orders", f"lake.{namespace}.big_orders"


def test_pandas_polars_and_duckdb_read_a_consistent_version_with_a_column_and_a_filter(tm, catalog_settings, lake):
    source, sink, epoch = lake
    reader = VersionReader.resolve([source, sink], tm, settings=catalog_settings)
    assert reader.version.epoch == epoch and reader.version.level == ConsistencyLevel.CONSISTENT

    frame = reader.pandas(sink, columns=["id"], row_filter="amount > 2000")
    assert list(frame.columns) == ["id"] and sorted(frame["id"]) == [3, 5]

    polars_frame = reader.polars(source, columns=["id", "amount"], row_filter="amount < 1000")
    assert polars_frame.columns == ["id", "amount"]
    assert sorted(polars_frame["id"].to_list()) == [1, 4], "order 8 (amount 100) came after the version"

    con = reader.duckdb(columns={sink: ["id", "amount"]}, row_filters={source: "id >= 2"})
    assert [c[0] for c in con.sql("SELECT * FROM big_orders").description] == ["id", "amount"]
    assert con.sql("SELECT count(*), sum(o.amount) FROM orders o JOIN big_orders USING (id)").fetchall() == \
        [(4, 8200)]
    assert con.sql("SELECT max(id) FROM orders").fetchall() == [(6,)], "the root table read past the version"

    # The same version from Iceberg alone (no ZooKeeper): the job's first epoch carries its marker.
    without_zk = VersionReader.resolve([source, sink], None, settings=catalog_settings)
    assert without_zk.version == reader.version
    assert sorted(without_zk.pandas(sink, row_filter="amount > 2000")["note"]) == ["order 3", "order 5"]


def test_readers_pass_a_pyiceberg_expression_and_read_an_empty_table_with_its_columns(tables):
    resolver, source, sink = tables
    snapshot = resolver.table(source).current_snapshot()
    assert snapshot is not None
    version = ConsistentVersion(None, {source: snapshot.snapshot_id, sink: None}, ConsistencyLevel.LATEST)
    reader = VersionReader(resolver, version)
    expression = parse("amount >= 3000 and note is not null")  # a BooleanExpression, as pyiceberg users build them
    assert sorted(reader.arrow(source, columns=["id"], row_filter=expression)["id"].to_pylist()) == [5, 7]
    empty = reader.pandas(sink, columns=["id", "note"])
    assert list(empty.columns) == ["id", "note"] and len(empty) == 0
    assert reader.polars(sink).columns == ["id", "amount", "note"]
    assert reader.duckdb().sql("SELECT count(*) FROM big_orders").fetchall() == [(0,)]
    assert reader.sql()[sink].endswith("big_orders WHERE false")


def test_bad_reads_are_one_line_errors_naming_what_is_wrong(tables):
    resolver, source, sink = tables
    snapshot = resolver.table(source).current_snapshot()
    assert snapshot is not None
    reader = VersionReader(resolver, ConsistentVersion(None, {source: snapshot.snapshot_id}, ConsistencyLevel.LATEST))
    cases = [
        (dict(table=source, columns=["nope"]), "Could not find column: 'nope'"),
        (dict(table=source, row_filter="nope > 1"), "Could not find field with name nope"),
        (dict(table=source, row_filter="amount >>> 1"), "is not a pyiceberg expression (at character"),
        (dict(table=source, columns="id"), "columns must be a list of column names"),
        (dict(table=source, columns=[]), "columns is empty"),
        (dict(table=sink), f"table '{sink}' is not in this version; it has {source}"),
    ]
    for kwargs, message in cases:
        with pytest.raises(InvalidArgument, match=message.replace("(", r"\(")) as raised:
            reader.arrow(**kwargs)
        assert "\n" not in str(raised.value)
    # The table named without the catalog is the same table.
    assert reader.arrow(source.removeprefix("lake."), columns=["id"]).num_rows == 8
    other = f"{sink.rsplit('.', 2)[0]}.other.orders"
    clash = VersionReader(resolver, ConsistentVersion(None, {source: None, other: None}, ConsistencyLevel.LATEST))
    with pytest.raises(TidemarkError, match="would both be the view 'orders'"):
        clash.duckdb()


def test_spark_sql_and_trino_read_by_tag_when_retained_else_by_snapshot_id(tm, zk_connect, catalog_settings, lake,
                                                                           monkeypatch, capsys):
    source, sink, epoch = lake
    reader = VersionReader.resolve([source, sink], tm, settings=catalog_settings)
    snapshots = reader.version.snapshots
    assert reader.sql() == {table: f"SELECT * FROM {table} FOR VERSION AS OF {snapshots[table]}"
                            for table in (source, sink)}

    # A retained version carries the tag tidemark-<T> on every table (GC creates it; here, by hand).
    for table in (source, sink):
        snapshot_id = present(snapshots[table])
        reader.resolver.table(table).manage_snapshots().create_tag(snapshot_id, tag_name(epoch)).commit()
    tagged = version_sql(Resolver(catalog_settings.load(), catalog_settings), reader.version)
    assert tagged == {t: f"SELECT * FROM {t} FOR VERSION AS OF '{tag_name(epoch)}'" for t in (source, sink)}

    monkeypatch.setenv("TIDEMARK_CATALOG_URI", catalog_settings.uri)
    assert cli(["--zk", zk_connect, "resolve", source, sink, "--format", "sql"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"-- consistent version, epoch {epoch} (")
    assert out[1:] == [f"{tagged[sink]};", f"{tagged[source]};"]


def test_duckdbs_iceberg_extension_reads_local_tables_at_a_snapshot_with_a_quote_in_their_path(tmp_path):
    """DuckDB's own Iceberg extension, from its PyPI package: a table at an older snapshot by id and an empty one,
    on the local file system (no S3 secret), their metadata files under a directory named with a quote."""
    settings = CatalogSettings.embedded(tmp_path / "it's a \"lake\"")
    catalog = settings.load()
    catalog.create_namespace("db")
    table = catalog.create_table("db.orders", SCHEMA)
    table.append(orders(range(1, 3), [500, 1500]))
    first = present(table.current_snapshot()).snapshot_id
    table.append(orders(range(3, 4), [2500]))
    catalog.create_table("db.empty", SCHEMA)
    resolver = Resolver(catalog, settings)
    version = ConsistentVersion(None, {"db.orders": first, "db.empty": None}, ConsistencyLevel.LATEST)
    by_id = duckdb_iceberg_sql(resolver, version)
    assert "it''s a" in by_id["db.orders"] and by_id["db.orders"].endswith(f", snapshot_from_id => {first})")
    con = duckdb_iceberg_connection(resolver)
    assert con.sql("SELECT count(*) FROM duckdb_secrets()").fetchall() == [(0,)]
    assert con.sql("SELECT current_setting('autoinstall_known_extensions')").fetchall() == [(False,)]
    assert sorted(con.sql(by_id["db.orders"]).fetchall()) == [(1, 500, "order 1"), (2, 1500, "order 2")]
    empty = con.sql(by_id["db.empty"])
    assert empty.columns == ["id", "amount", "note"] and empty.fetchall() == []
    with pytest.raises(InvalidArgument, match="snapshot id -5 is negative"):
        duckdb_iceberg_sql(resolver, ConsistentVersion(None, {"db.orders": -5}, ConsistencyLevel.LATEST))


def test_duckdb_literals_and_s3_secrets_quote_what_they_are_given():
    con = duckdb.connect(config={"autoinstall_known_extensions": False})
    for value in ["it's", 'a "b"', "back\\slash", "two\nlines", "'); DROP TABLE x; --"]:
        relation = con.sql(f"SELECT {_sql_string(value)} AS {_sql_identifier(value)}")
        assert relation.columns == [value] and relation.fetchall() == [(value,)]

    assert _s3_secret("lake", {"warehouse": "file:///lake", "type": "sql"}) is None
    for name in DUCKDB_EXTENSIONS:
        con.execute(f"LOAD {_sql_string(str(_extension_file(name, duckdb.__version__)))}")
    con.execute(present(_s3_secret("my lake", {
        "s3.endpoint": "https://s3.example:9000/", "client.access-key-id": "key", "s3.secret-access-key": "it's",
        "client.region": "eu-west-1", "s3.force-virtual-addressing": "true"})))
    ((name, secret),) = con.sql("SELECT name, secret_string FROM duckdb_secrets()").fetchall()
    assert name == "tidemark_my lake"
    for field in ("endpoint=s3.example:9000", "key_id=key", "region=eu-west-1", "url_style=vhost", "use_ssl=true"):
        assert f";{field};" in f";{secret};", secret
    assert "URL_STYLE 'path', USE_SSL false)" in present(_s3_secret("lake", {"s3.endpoint": "http://127.0.0.1:1"}))


def test_duckdbs_missing_extension_packages_are_one_line_errors_naming_the_pip_line():
    with pytest.raises(ConfigurationError, match="pip install duckdb-extension-iceberg duckdb-extension-httpfs "
                                                 "duckdb-extension-avro"):
        _extension_file("nosuch", duckdb.__version__)
    with pytest.raises(ConfigurationError, match=f"no extension for duckdb 9.9.9 \\(it has v{duckdb.__version__}\\): "
                                                 "pip install duckdb-extension-iceberg==9.9.9"):
        _extension_file("iceberg", "9.9.9")
