"""Unmodified engines read through ``tidemark serve`` while a pipeline commits, on the lakehouse (SeaweedFS's S3
endpoint and REST catalog), each configured with the endpoint alone, and every result is checked by the tables' own
rule: ``down`` is a copy of ``up``, so one consistent version of both holds the same rows (count and epoch sum).

Trino (the Iceberg connector's REST catalog, a real Trino 476), DuckDB's iceberg extension (``ATTACH ... (TYPE
iceberg)``) and pyiceberg's ``RestCatalog``, and Spark SQL. Each engine must also see the
pipeline move (its reads are not frozen), and an unpinned engine must get the same version for the tables of one
query (the switch rule).
"""
from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
import uuid

import pytest
from pyiceberg.catalog.rest import RestCatalog

from coordinator.history.readers import _s3_secret
from coordinator.serving.server import is_credential
from coordinator.tidemark import Tidemark
from tests.helpers.mixed_lake import MixedLake, MovingPipeline
from tests.helpers.served import ServeProcess, as_pairs, duckdb_read, own_storage, pyiceberg_read, two_table_sql
from tests.helpers.trino import TrinoServer, served_catalog
from tests.test_lakehouse import lakehouse as lakehouse  # the fixture: this module's own

READS = 12  # reads per engine while the pipeline commits
SESSIONS, SESSION_READS = 4, 6  # concurrent Trino sessions, and the joins each runs
MOVE_DEADLINE_S = 60.0  # reads go on until they saw the pipeline move
PIPELINE_PAUSE_S = 0.4  # between epochs: with an epoch's own commits, one about every 500 ms (the tables stay small)


@pytest.fixture(scope="module")
def zk_chroot(zk_server) -> str:
    return f"{zk_server.connect_string}/serve-engines-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def pipeline(lakehouse, zk_chroot):
    tm = Tidemark.connect(zk_chroot, session_timeout=10, operation_timeout=20)
    settings = lakehouse.catalog_settings()
    lake = MixedLake(settings.load(), settings, "served_" + uuid.uuid4().hex[:6])
    lake.open(tm)
    yield MovingPipeline(lake, pause_s=PIPELINE_PAUSE_S)  # each test runs it while it reads
    lake.close()
    tm.close()


@pytest.fixture(scope="module")
def endpoint(lakehouse, zk_chroot, tmp_path_factory):
    with ServeProcess(lakehouse.catalog_settings(), zk_chroot, tmp_path_factory.mktemp("serve")) as served:
        yield served


def check_reads(read, what: str, reads: int = READS) -> None:
    """``reads`` reads by ``read() -> ((up count, up epoch sum), (down count, down epoch sum))``, and more until they
    moved with the pipeline (``MOVE_DEADLINE_S``): each holds the same rows in both tables."""
    seen: list = []
    deadline = time.monotonic() + MOVE_DEADLINE_S
    while len(seen) < reads or (len(set(seen)) < 2 and time.monotonic() < deadline):
        up, down = read()
        assert up == down, f"{what} read up as {up} and down as {down}: two versions in one query"
        seen.append(up)
    assert len(set(seen)) >= 2, f"{what}'s reads never moved: {seen}"


def test_concurrent_trino_sessions_join_tables_through_the_endpoint_at_one_version_while_the_pipeline_commits(
        lakehouse, pipeline, endpoint, tmp_path_factory):
    """Trino's sessions share one coordinator, so one client to the endpoint: ``SESSIONS`` sessions at once, each
    running a dashboard's two panels in turn (``down`` alone, then the join of ``up`` and ``down``)."""
    join = two_table_sql("served", pipeline.lake.up, pipeline.lake.down)
    panel = f"SELECT count(*) FROM served.{pipeline.lake.down}"
    with TrinoServer(tmp_path_factory.mktemp("trino"), catalogs={"served": served_catalog(endpoint.url)},
                     env=lakehouse.pyiceberg_environment()) as trino:
        def session(joined: list) -> None:
            for _ in range(SESSION_READS):
                trino.query(panel)
                joined.append(as_pairs(trino.query(join)[0]))
        results: list[list] = [[] for _ in range(SESSIONS)]
        threads = [threading.Thread(target=session, args=(joined,)) for joined in results]
        with pipeline.running():
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(600)
    for i, joined in enumerate(results):
        assert len(joined) == SESSION_READS, f"session {i} ran {len(joined)} joins of {SESSION_READS} (see the log)"
        straddled = [(up, down) for up, down in joined if up != down]
        assert straddled == [], f"Trino session {i} read two versions in one query: {straddled}"
    assert len({up for joined in results for up, _ in joined}) >= 2, "Trino's reads never moved"


def test_duckdb_attaches_the_endpoint_and_reads_one_version(lakehouse, pipeline, endpoint):
    """DuckDB keeps the tables an attachment loaded for the attachment's life: a session attaches, queries, and is
    closed (a notebook's cell, a job); each read here is one such session, unpinned and pinned."""
    secret = _s3_secret("lake", lakehouse.python_properties())  # DuckDB's own S3 settings (the README's)
    assert secret is not None
    sql = two_table_sql("served", pipeline.lake.up, pipeline.lake.down)
    for warehouse in ("", "pipeline@pinned"):
        with pipeline.running():
            check_reads(lambda warehouse=warehouse: duckdb_read(endpoint.url, warehouse, secret, sql),
                        f"DuckDB (warehouse {warehouse!r})", reads=READS // 2)  # each read a new DuckDB session


def test_pyiceberg_reads_one_version_with_the_uri_and_its_own_storage_settings(lakehouse, pipeline, endpoint):
    """pyiceberg's guarantee (docs/reading.md): a query's tables loaded back to back, then read, come at one
    version; each read here is such a query, right after the previous one (a client's next query may also be taken
    for the previous one: never two versions in one)."""
    catalog = RestCatalog("served", uri=endpoint.url, **own_storage(lakehouse.catalog_settings()))
    with pipeline.running():
        check_reads(lambda: pyiceberg_read(catalog, [pipeline.lake.up, pipeline.lake.down]), "pyiceberg")


@pytest.mark.spark
def test_spark_sql_reads_one_version_through_the_endpoint(spark, lakehouse, pipeline, endpoint):
    up, down = pipeline.lake.up, pipeline.lake.down
    for catalog, warehouse in (("served", "pipeline"), ("served_pinned", "pipeline@pinned")):
        for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest", ".uri": endpoint.url,
                           ".warehouse": warehouse, ".cache-enabled": "false",
                           **{f".{k}": v for k, v in own_storage(lakehouse.catalog_settings()).items()}}.items():
            spark.conf.set(f"spark.sql.catalog.{catalog}{key}", value)

        def read(catalog=catalog):  # a dashboard's two panels: down alone, then the join
            spark.sql(f"SELECT count(*) FROM {catalog}.{down}").collect()
            return as_pairs(spark.sql(two_table_sql(catalog, up, down)).collect()[0])
        with pipeline.running():
            if warehouse == "pipeline":
                check_reads(read, "Spark SQL")
            else:  # the session's catalog keeps one version for its life
                assert len({read() for _ in range(3)}) == 1


def test_storage_credentials_go_only_to_clients_that_authenticate_and_ask(lakehouse, pipeline, zk_chroot, endpoint,
                                                                          tmp_path_factory):
    """The endpoint's default hands every client the object store's settings and nobody its credentials; with tokens,
    a client that authenticates and asks (pyiceberg asks by default) gets them and reads with the URI and its token
    alone; ``--unsafe-vend-credentials-to-anyone`` hands them to anyone."""
    settings = lakehouse.catalog_settings()
    secret = own_storage(settings)["s3.secret-access-key"]
    namespace, name = pipeline.lake.up.split(".")

    def config(url: str, headers: dict[str, str]) -> dict[str, str]:
        request = urllib.request.Request(f"{url}/v1/pipeline/namespaces/{namespace}/tables/{name}", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())["config"]
    asks = {"X-Iceberg-Access-Delegation": "vended-credentials"}
    anonymous = config(endpoint.url, asks)
    assert "s3.endpoint" in anonymous and not [k for k in anonymous if is_credential(k)]
    assert secret not in json.dumps(anonymous)
    with ServeProcess(settings, zk_chroot, tmp_path_factory.mktemp("secured"),
                      env={"TIDEMARK_SERVE_TOKENS": "t0ken"}) as secured:
        with pytest.raises(urllib.error.HTTPError) as refused:
            config(secured.url, asks)
        assert refused.value.code == 401
        assert secret not in json.dumps(config(secured.url, {"Authorization": "Bearer t0ken"}))  # did not ask
        assert config(secured.url, {"Authorization": "Bearer t0ken", **asks})["s3.secret-access-key"] == secret
        vended = RestCatalog("vended", uri=secured.url, token="t0ken").load_table(pipeline.lake.up)
        assert vended.scan().to_arrow().num_rows > 0  # read from the object store with what the endpoint vended
    with ServeProcess(settings, zk_chroot, tmp_path_factory.mktemp("unsafe"),
                      "--unsafe-vend-credentials-to-anyone") as unsafe:
        assert config(unsafe.url, {})["s3.secret-access-key"] == secret
