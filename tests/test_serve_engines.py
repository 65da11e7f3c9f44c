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
from coordinator.serving.hold import DEFAULT_QUERY_GAP_MS
from coordinator.serving.server import is_credential
from coordinator.tidemark import Tidemark
from tests.helpers.mixed_lake import MixedLake, MovingPipeline
from tests.helpers.served import ServeProcess, as_pairs, duckdb_read, own_storage, pyiceberg_read, two_table_sql
from tests.helpers.trino import S3_PROPERTIES, TrinoQueryError, served_catalog
from tests.helpers.wait import wait_for

READS = 12  # reads per engine while the pipeline commits
TOKEN = "t0ken"  # the secured endpoint's (TIDEMARK_SERVE_TOKENS): a client with it is vended the store's credentials
SESSIONS, SESSION_READS = 4, 4  # concurrent Trino sessions, and the refreshes (a panel, then a join) each runs
QUERY_GAP_S = DEFAULT_QUERY_GAP_MS / 1000  # the endpoint's: a client quiet for longer starts its next query
MOVE_DEADLINE_S = 60.0  # reads go on until they saw the pipeline move
PIPELINE_PAUSE_S = 0.4  # between epochs: with an epoch's own commits, one about every 500 ms (the tables stay small)


@pytest.fixture(scope="module")
def lakehouse(trino_lakehouse):
    """The lakehouse the run's one Trino reads, whose variables its catalog files read."""
    return trino_lakehouse


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


@pytest.fixture(scope="module")
def secured(lakehouse, zk_chroot, tmp_path_factory):
    """The endpoint with a token: engines that authenticate and ask read with the credentials it vends, none of their
    own (docs/reading.md's "with a token" column)."""
    with ServeProcess(lakehouse.catalog_settings(), zk_chroot, tmp_path_factory.mktemp("secured"),
                      env={"TIDEMARK_SERVE_TOKENS": TOKEN}) as served:
        yield served


def vended_trino_catalog(url: str) -> str:
    """docs/reading.md's Trino catalog file with a token: the object store's endpoint and region, no keys."""
    keyless = [line for line in S3_PROPERTIES if not line.startswith(("s3.aws-access-key", "s3.aws-secret-key"))]
    return "\n".join(["connector.name=iceberg", "iceberg.catalog.type=rest", f"iceberg.rest-catalog.uri={url}",
                      "iceberg.rest-catalog.security=OAUTH2", f"iceberg.rest-catalog.oauth2.token={TOKEN}",
                      "iceberg.rest-catalog.vended-credentials-enabled=true", *keyless, ""])


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
        pipeline, endpoint, secured, trino):
    """Trino's sessions share one coordinator, so one client to the endpoint: ``SESSIONS`` sessions at once, each
    running a dashboard's two panels in turn (``down`` alone, then the join of ``up`` and ``down``), refreshed
    ``SESSION_READS`` times; between refreshes the client is quiet for more than a query gap while the pipeline
    moves. (A client that is never quiet may switch inside a query after ``--max-hold``: "The switch race" in
    docs/design.md; a refresh here is far shorter.) Then the same server reads through the secured endpoint with a
    token and no keys of its own (credentials vended)."""
    join = two_table_sql("served", pipeline.lake.up, pipeline.lake.down)
    panel = f"SELECT count(*) FROM served.{pipeline.lake.down}"
    catalogs = {"served": served_catalog(endpoint.url), "vended": vended_trino_catalog(secured.url)}
    with trino.added_catalogs(catalogs):
        def quiet_until_the_pipeline_moved() -> None:
            quiet_since, epoch = time.monotonic(), pipeline.epoch
            wait_for(lambda: pipeline.epoch > epoch and time.monotonic() - quiet_since > QUERY_GAP_S,
                     "the pipeline to move between two refreshes")
        refresh = threading.Barrier(SESSIONS, action=quiet_until_the_pipeline_moved, timeout=600)

        def session(joined: list, errors: list) -> None:
            try:
                for _ in range(SESSION_READS):
                    refresh.wait()
                    trino.query(panel)
                    joined.append(as_pairs(trino.query(join)[0]))
            except (TrinoQueryError, threading.BrokenBarrierError) as error:  # the assertion below names it
                errors.append(repr(error))
                refresh.abort()
        results: list[list] = [[] for _ in range(SESSIONS)]
        failures: list[list] = [[] for _ in range(SESSIONS)]
        threads = [threading.Thread(target=session, args=pair) for pair in zip(results, failures)]
        with pipeline.running():
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(900)
        with pipeline.running():
            check_reads(lambda: as_pairs(trino.query(two_table_sql("vended", pipeline.lake.up,
                                                                   pipeline.lake.down))[0]),
                        "Trino with a token (credentials vended)", reads=READS // 2)
    for i, joined in enumerate(results):
        assert len(joined) == SESSION_READS, f"session {i} ran {len(joined)} joins of {SESSION_READS}: {failures[i]}"
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


def test_duckdb_with_a_token_reads_with_its_own_storage_secret(lakehouse, pipeline, secured):
    """docs/reading.md's DuckDB with a token: an iceberg secret holding the token, and DuckDB's own S3 secret
    (DuckDB 1.5.5 reads a table's metadata file before it applies vended credentials when the catalog's answer is
    not immediate, so it is not asked for them)."""
    storage = _s3_secret("lake", lakehouse.python_properties())
    assert storage is not None
    sql = two_table_sql("served", pipeline.lake.up, pipeline.lake.down)
    with pipeline.running():
        check_reads(lambda: duckdb_read(secured.url, "", f"{storage}; CREATE SECRET tm (TYPE iceberg, TOKEN '{TOKEN}')",
                                        sql, attach_options="SECRET tm, ACCESS_DELEGATION_MODE 'none'"),
                    "DuckDB with a token", reads=READS // 2)


def test_pyiceberg_reads_one_version_with_the_uri_and_its_own_storage_settings(lakehouse, pipeline, endpoint):
    """pyiceberg's guarantee (docs/reading.md): a query's tables loaded back to back, then read, come at one
    version; each read here is such a query, right after the previous one (a client's next query may also be taken
    for the previous one: never two versions in one)."""
    catalog = RestCatalog("served", uri=endpoint.url, **own_storage(lakehouse.catalog_settings()))
    with pipeline.running():
        check_reads(lambda: pyiceberg_read(catalog, [pipeline.lake.up, pipeline.lake.down]), "pyiceberg")


@pytest.mark.spark
def test_spark_sql_reads_one_version_through_the_endpoint(spark, lakehouse, pipeline, endpoint, secured):
    """Spark SQL with its own storage credentials, unpinned and pinned; then with a token and none of its own (the
    endpoint vends them: docs/reading.md)."""
    up, down = pipeline.lake.up, pipeline.lake.down
    keyless = {k: v for k, v in own_storage(lakehouse.catalog_settings()).items() if not is_credential(k)}
    for catalog, warehouse in (("served", "pipeline"), ("served_pinned", "pipeline@pinned"), ("vended", "pipeline")):
        storage = own_storage(lakehouse.catalog_settings()) if catalog != "vended" else {
            **keyless, "token": TOKEN, "header.X-Iceberg-Access-Delegation": "vended-credentials"}
        for key, value in {"": "org.apache.iceberg.spark.SparkCatalog", ".type": "rest",
                           ".uri": secured.url if catalog == "vended" else endpoint.url,
                           ".warehouse": warehouse, ".cache-enabled": "false",
                           **{f".{k}": v for k, v in storage.items()}}.items():
            spark.conf.set(f"spark.sql.catalog.{catalog}{key}", value)

        def read(catalog=catalog):  # a dashboard's two panels: down alone, then the join
            spark.sql(f"SELECT count(*) FROM {catalog}.{down}").collect()
            return as_pairs(spark.sql(two_table_sql(catalog, up, down)).collect()[0])
        with pipeline.running():
            if warehouse == "pipeline":  # the vended credentials' reads are the same reads, half as many
                check_reads(read, f"Spark SQL ({catalog})", reads=READS if catalog == "served" else READS // 2)
            else:  # the session's catalog keeps one version for its life
                assert len({read() for _ in range(3)}) == 1


def test_storage_credentials_go_only_to_clients_that_authenticate_and_ask(lakehouse, pipeline, zk_chroot, endpoint,
                                                                          secured, tmp_path_factory):
    """The endpoint's default hands every client the object store's settings and nobody credentials; with tokens, a
    client that authenticates and asks (pyiceberg asks by default) gets short-lived STS credentials that read that
    table's files and nothing else, and reads with the URI and its token alone; ``--vend-credentials static`` vends
    the catalog's own keys; ``--unsafe-vend-credentials-to-anyone`` hands credentials to anyone."""
    settings = lakehouse.catalog_settings()
    secret = own_storage(settings)["s3.secret-access-key"]
    namespace, name = pipeline.lake.up.split(".")

    def loaded(url: str, headers: dict[str, str]) -> dict:
        request = urllib.request.Request(f"{url}/v1/pipeline/namespaces/{namespace}/tables/{name}", headers=headers)
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())
    asks = {"X-Iceberg-Access-Delegation": "vended-credentials"}
    anonymous = loaded(endpoint.url, asks)["config"]
    assert "s3.endpoint" in anonymous and not [k for k in anonymous if is_credential(k)]
    assert secret not in json.dumps(anonymous)
    with pytest.raises(urllib.error.HTTPError) as refused:
        loaded(secured.url, asks)
    assert refused.value.code == 401
    assert secret not in json.dumps(loaded(secured.url, {"Authorization": f"Bearer {TOKEN}"}))  # did not ask
    table = loaded(secured.url, {"Authorization": f"Bearer {TOKEN}", **asks})
    vended = table["config"]
    assert vended["s3.session-token"] and secret not in json.dumps(table)  # STS's, not the catalog's own keys
    check_read_only_for(vended, table["metadata"]["location"])
    read = RestCatalog("vended", uri=secured.url, token=TOKEN).load_table(pipeline.lake.up)
    assert read.scan().to_arrow().num_rows > 0  # read from the object store with what the endpoint vended
    with ServeProcess(settings, zk_chroot, tmp_path_factory.mktemp("static"), "--vend-credentials", "static",
                      env={"TIDEMARK_SERVE_TOKENS": TOKEN}) as static:
        assert loaded(static.url, {"Authorization": f"Bearer {TOKEN}", **asks})["config"][
            "s3.secret-access-key"] == secret
    with ServeProcess(settings, zk_chroot, tmp_path_factory.mktemp("unsafe"),
                      "--unsafe-vend-credentials-to-anyone") as unsafe:
        assert loaded(unsafe.url, {})["config"]["s3.session-token"]
    with ServeProcess(settings, zk_chroot, tmp_path_factory.mktemp("no-role"), "--sts-role-arn",
                      "arn:aws:iam::000000000000:role/nobody", env={"TIDEMARK_SERVE_TOKENS": TOKEN}) as no_role:
        with pytest.raises(urllib.error.HTTPError) as unavailable:  # a role the store refuses: no static keys instead
            loaded(no_role.url, {"Authorization": f"Bearer {TOKEN}", **asks})
        assert unavailable.value.code == 503 and "--sts-role-arn" in unavailable.value.read().decode()


def check_read_only_for(vended: dict[str, str], location: str) -> None:
    """``vended`` credentials read and list the files under ``location`` on the object store, and may neither write
    there nor read beside it."""
    from urllib.parse import urlsplit

    import botocore.session
    from botocore.config import Config
    from botocore.exceptions import ClientError
    where = urlsplit(location)
    bucket, prefix = where.netloc, where.path.strip("/")
    s3 = botocore.session.get_session().create_client(
        "s3", endpoint_url=vended["s3.endpoint"], region_name=vended.get("s3.region", "us-east-1"),
        aws_access_key_id=vended["s3.access-key-id"], aws_secret_access_key=vended["s3.secret-access-key"],
        aws_session_token=vended["s3.session-token"], config=Config(s3={"addressing_style": "path"}))
    files = s3.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/")["Contents"]
    s3.get_object(Bucket=bucket, Key=files[0]["Key"])["Body"].read()
    for denied in (lambda: s3.put_object(Bucket=bucket, Key=f"{prefix}/data/written-with-vended-keys", Body=b"x"),
                   lambda: s3.list_objects_v2(Bucket=bucket, Prefix=""),
                   lambda: s3.get_object(Bucket=bucket, Key=f"{prefix}-beside/x")):
        with pytest.raises(ClientError) as refused:
            denied()
        assert refused.value.response["Error"]["Code"] == "AccessDenied", refused.value.response
