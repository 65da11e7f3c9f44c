"""Unmodified engines read through ``tidemark serve`` while a pipeline commits, on the lakehouse (SeaweedFS's S3
endpoint and REST catalog), each configured with the endpoint alone, and every result is checked by the tables' own
rule: ``down`` is a copy of ``up``, so one consistent version of both holds the same rows (count and epoch sum).

Trino (the Iceberg connector's REST catalog, a real Trino 476), DuckDB's iceberg extension (``ATTACH ... (TYPE
iceberg)``) and pyiceberg's ``RestCatalog``; Spark SQL in tests/test_serve_spark.py. Each engine must also see the
pipeline move (its reads are not frozen), and an unpinned engine must get the same version for the tables of one
query (the switch rule).
"""
from __future__ import annotations

import threading
import uuid

import duckdb
import pytest
from pyiceberg.catalog.rest import RestCatalog

from coordinator.history.readers import DUCKDB_EXTENSIONS, _extension_file, _s3_secret
from coordinator.tidemark import Tidemark
from tests.helpers.mixed_lake import MixedLake
from tests.helpers.served import ServeProcess
from tests.helpers.trino import TrinoServer, served_catalog
from tests.test_lakehouse import lakehouse as lakehouse  # the fixture: this module's own

READS = 12  # reads per engine while the pipeline commits


class MovingPipeline:
    """``MixedLake``'s ``up`` and ``down`` on the lakehouse, both taking one more epoch, again and again, in a
    thread: the served version moves all the time."""

    def __init__(self, tm: Tidemark, settings, namespace: str) -> None:
        self.lake = MixedLake(settings.load(), settings, namespace)
        self.lake.open(tm)
        self.epoch = 1000
        self._stop = threading.Event()
        self.step()
        self._thread = threading.Thread(target=self._run, name="moving-pipeline", daemon=True)

    def step(self) -> None:
        self.lake.root_epoch(self.lake.up, self.epoch)
        self.lake.copy_epoch(self.epoch)
        self.epoch += 1000

    def _run(self) -> None:
        while not self._stop.is_set():
            self.step()

    def start(self) -> MovingPipeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        self.lake.close()


@pytest.fixture(scope="module")
def zk_chroot(zk_server) -> str:
    return f"{zk_server.connect_string}/serve-engines-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def pipeline(lakehouse, zk_chroot):
    tm = Tidemark.connect(zk_chroot, session_timeout=10, operation_timeout=20)
    moving = MovingPipeline(tm, lakehouse.catalog_settings(), "served_" + uuid.uuid4().hex[:6]).start()
    yield moving
    moving.stop()
    tm.close()


@pytest.fixture(scope="module")
def endpoint(lakehouse, zk_chroot, tmp_path_factory):
    with ServeProcess(lakehouse.catalog_settings(), zk_chroot, tmp_path_factory.mktemp("serve")) as served:
        yield served


def check_reads(read, what: str, reads: int = READS) -> None:
    """``reads`` reads by ``read() -> ((up count, up epoch sum), (down count, down epoch sum))``: each holds the same
    rows in both tables, and the reads move with the pipeline."""
    seen = []
    for _ in range(reads):
        up, down = read()
        assert up == down, f"{what} read up as {up} and down as {down}: two versions in one query"
        seen.append(up)
    assert len(set(seen)) >= 2, f"{what}'s reads never moved: {seen}"


def test_trino_joins_tables_through_the_endpoint_at_one_version_while_the_pipeline_commits(
        lakehouse, pipeline, endpoint, tmp_path_factory):
    up, down = pipeline.lake.up, pipeline.lake.down
    with TrinoServer(tmp_path_factory.mktemp("trino"), catalogs={"served": served_catalog(endpoint.url)},
                     env=lakehouse.pyiceberg_environment()) as trino:
        def read():
            row = trino.query(f"SELECT u.n, u.s, d.n, d.s FROM (SELECT count(*) n, sum(epoch) s FROM served.{up}) u "
                              f"CROSS JOIN (SELECT count(*) n, sum(epoch) s FROM served.{down}) d")[0]
            return (row[0], row[1]), (row[2], row[3])
        check_reads(read, "Trino")


def test_duckdb_attaches_the_endpoint_and_reads_one_version(lakehouse, pipeline, endpoint):
    """DuckDB keeps the tables an attachment loaded for the attachment's life: a session attaches, queries, and is
    closed (a notebook's cell, a job); each read here is one such session, unpinned and pinned."""
    up, down = pipeline.lake.up, pipeline.lake.down
    secret = _s3_secret("lake", lakehouse.python_properties())  # DuckDB's own S3 settings (the README's)
    assert secret is not None
    query = (f"SELECT u.n, u.s, d.n, d.s FROM (SELECT count(*) n, sum(epoch) s FROM served.{up}) u "
             f"CROSS JOIN (SELECT count(*) n, sum(epoch) s FROM served.{down}) d")
    for warehouse in ("", "pipeline@pinned"):
        def read(warehouse=warehouse):
            with duckdb.connect(config={"autoinstall_known_extensions": False}) as con:
                for name in DUCKDB_EXTENSIONS:
                    con.execute(f"LOAD '{_extension_file(name, duckdb.__version__)}'")
                con.execute(secret)
                con.execute(f"ATTACH '{warehouse}' AS served (TYPE iceberg, ENDPOINT '{endpoint.url}', "
                            "AUTHORIZATION_TYPE 'none')")
                row = con.sql(query).fetchone()
            assert row is not None
            return (row[0], row[1]), (row[2], row[3])
        check_reads(read, f"DuckDB (warehouse {warehouse!r})", reads=READS // 2)  # each read a new DuckDB session


def test_pyiceberg_reads_one_version_with_the_uri_alone(pipeline, endpoint):
    catalog = RestCatalog("served", uri=endpoint.url)

    def read():  # each table loaded, then read, before the next is loaded: the reads take their time
        frames = [catalog.load_table(t).scan().to_arrow() for t in (pipeline.lake.up, pipeline.lake.down)]
        return [(f.num_rows, sum(f.column("epoch").to_pylist())) for f in frames]
    check_reads(read, "pyiceberg")


@pytest.mark.spark
def test_spark_sql_reads_one_version_through_the_endpoint(spark, pipeline, endpoint):
    up, down = pipeline.lake.up, pipeline.lake.down
    for catalog, warehouse in (("served", "pipeline"), ("served_pinned", "pipeline@pinned")):
        for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest", ".uri": endpoint.url,
                           ".warehouse": warehouse, ".cache-enabled": "false"}.items():
            spark.conf.set(f"spark.sql.catalog.{catalog}{key}", value)

        def read(catalog=catalog):
            row = spark.sql(f"SELECT u.n, u.s, d.n, d.s FROM (SELECT count(*) n, sum(epoch) s FROM {catalog}.{up}) u "
                            f"CROSS JOIN (SELECT count(*) n, sum(epoch) s FROM {catalog}.{down}) d").collect()[0]
            return (row[0], row[1]), (row[2], row[3])
        if warehouse == "pipeline":
            check_reads(read, "Spark SQL")
        else:  # the session's catalog keeps one version for its life
            assert len({read() for _ in range(3)}) == 1
