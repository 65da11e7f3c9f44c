"""Tidemark on the lakehouse users run: an S3 object store and an Iceberg REST catalog, real servers on loopback
(SeaweedFS's ``weed mini``, ``coordinator.operations.lakehouse_server``), configured once, the way a user
configures pyiceberg, and read by the library and the ``tidemark`` command alike."""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from coordinator import (
    CatalogSettings,
    ConfigurationError,
    VersionReader,
    duckdb_iceberg_connection,
    duckdb_iceberg_sql,
)
from coordinator.history.gc import GarbageCollector
from coordinator.history.readers import version_sql
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.history.versions import tag_name
from coordinator.iceberg.orphans import delete_orphan_files, find_orphan_files
from coordinator.operations.lakehouse_server import EmbeddedLakehouse
from coordinator.records import now_ms
from coordinator.settings import Settings
from spark_hooks import EpochJob
from tests.helpers.cli import tidemark
from tests.helpers.docs import page
from tests.helpers.lakehouse_data import lakehouse_data_dir
from tests.helpers.network import TestNetwork
from tests.helpers.present import present
from tests.helpers.rest_proxy import CommitOutcomeProxy
from tests.helpers.spark_cascade import WORD, Producer
from tests.test_writer_flow import Fleet, Runner

COUNTS = pa.schema([pa.field("word", pa.string()), pa.field("n", pa.int64())])
REPO = Path(__file__).resolve().parent.parent
READING = page("reading.md")


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory):
    with lakehouse_data_dir(tmp_path_factory.mktemp("lakehouse")) as data, EmbeddedLakehouse(data) as running:
        yield running


@pytest.fixture
def rest_settings(lakehouse) -> CatalogSettings:
    return lakehouse.catalog_settings()


def create(catalog, name: str, schema: pa.Schema):
    catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
    return catalog.create_table(name, schema=schema)


class CopyPipeline:
    """A table ``words`` and a job ``copy`` that appends each epoch's new words to ``copies``: the words appended,
    and those a consistent version of both tables holds in ``copies``."""

    def __init__(self, catalog, namespace: str) -> None:
        self.source, self.sink = f"{namespace}.words", f"{namespace}.copies"
        self.words = create(catalog, self.source, WORD)
        create(catalog, self.sink, WORD)
        self.appended: list[str] = []

    def start(self, fleet: Fleet) -> Runner:
        def copy(ctx) -> None:
            new = ctx.changes(self.source)
            if new.num_rows:
                ctx.append(self.sink, new)
        return fleet.start(fleet.writer("copy", [self.source], [self.sink]), copy)

    def append(self, word: str) -> None:
        self.words.append(pa.table({"word": [word]}, schema=WORD))
        self.appended.append(word)

    def consistent_copies(self, tm, settings: CatalogSettings) -> list[str]:
        reader = VersionReader.resolve([self.source, self.sink], tm, settings=settings)
        assert sorted(reader.arrow(self.sink).column("word").to_pylist()) == sorted(
            reader.arrow(self.source).column("word").to_pylist()), "a word was lost or copied twice"
        return sorted(reader.arrow(self.sink).column("word").to_pylist())


def test_pyicebergs_own_variables_are_the_whole_configuration(lakehouse, monkeypatch):
    for variable, value in lakehouse.pyiceberg_environment().items():
        monkeypatch.setenv(variable, value)
    settings = CatalogSettings.from_env(Settings.from_env({}))
    assert settings.python_catalog_properties() == lakehouse.python_properties()
    assert settings.describe() == f"catalog 'lake' at {lakehouse.catalog_uri}"
    conf = settings.spark_conf()
    assert conf["spark.sql.catalog.lake.type"] == "rest"
    assert conf["spark.sql.catalog.lake.s3.endpoint"] == lakehouse.s3_endpoint
    assert conf["spark.sql.catalog.lake.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    settings.load().list_namespaces()  # the catalog answers with these settings alone


def test_python_writers_run_a_cascade_on_s3_and_the_rest_catalog_exactly_once(lakehouse, rest_settings, connect,
                                                                                namespace):
    """A root job and a derived job, pure-Python writers, on the REST catalog with their files on S3; every
    consistent version, resolved with ZooKeeper and from Iceberg alone, holds each word exactly once."""
    catalog = rest_settings.load()
    words = create(catalog, f"{namespace}.words", WORD)
    counts, totals = f"{namespace}.counts", f"{namespace}.totals"
    create(catalog, counts, COUNTS)
    create(catalog, totals, COUNTS)

    def count(ctx) -> None:
        new = ctx.changes(f"{namespace}.words")
        tally = Counter(new.column("word").to_pylist())
        if tally:
            ctx.append(counts, pa.table({"word": list(tally), "n": list(tally.values())}, schema=COUNTS))

    def total(ctx) -> None:
        new = ctx.changes(counts)
        if new.num_rows:
            ctx.append(totals, pa.table({"word": ["*"], "n": [sum(new.column("n").to_pylist())]}, schema=COUNTS))

    fleet = Fleet(connect, rest_settings, interval_ms=1000, grace_ms=200)
    producer = Producer(words)
    try:
        counter = fleet.start(fleet.writer("count", [f"{namespace}.words"], [counts]), count)
        totaller = fleet.start(fleet.writer("total", [counts], [totals]), total)
        fleet.wait(lambda: len(totaller.writer.committed) >= 4 and len(counter.writer.committed) >= 4,
                   "both jobs to commit four epochs")
    finally:
        producer.stop()
        fleet.stop_all()

    tables = [f"{namespace}.words", counts, totals]
    with_zookeeper = VersionReader.resolve(tables, connect(), settings=rest_settings)
    from_iceberg = VersionReader.resolve(tables, None, settings=rest_settings)
    for reader in (with_zookeeper, from_iceberg):
        read_words = Counter(reader.arrow(f"{namespace}.words").column("word").to_pylist())
        read_counts = reader.arrow(counts)
        counted: Counter = Counter()
        for word, n in zip(read_counts.column("word").to_pylist(), read_counts.column("n").to_pylist()):
            counted[word] += n
        assert counted == read_words, "a word was lost or counted twice"
        assert sum(reader.arrow(totals).column("n").to_pylist()) == sum(read_words.values())
        assert sum(read_words.values()) > 0
        assert all(lakehouse.warehouse in reader.resolver.table(t, refresh=False).metadata_location for t in tables)
    assert present(from_iceberg.version.epoch) <= present(with_zookeeper.version.epoch)


def test_the_tidemark_command_operates_the_rest_catalog_from_pyicebergs_variables(lakehouse, rest_settings, connect,
                                                                                 zk_connect, namespace):
    """The issue's probe: `versions`, `gc --dry-run` and `gc --yes` against the REST catalog, configured only
    through pyiceberg's variables."""
    catalog = rest_settings.load()
    create(catalog, f"{namespace}.raw", WORD)
    agg = f"{namespace}.agg"
    create(catalog, agg, WORD)
    catalog.load_table(f"{namespace}.raw").append(pa.table({"word": ["a", "b"]}, schema=WORD))

    def copy(ctx) -> None:
        new = ctx.changes(f"{namespace}.raw")
        if new.num_rows:
            ctx.append(agg, new)
    fleet = Fleet(connect, rest_settings, interval_ms=1000, grace_ms=200)
    try:
        runner = fleet.start(fleet.writer("agg", [f"{namespace}.raw"], [agg]), copy)
        fleet.wait(lambda: len(runner.writer.committed) >= 3, "the job to commit three epochs")
    finally:
        fleet.stop_all()

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYICEBERG_", "TIDEMARK_CATALOG"))}
    env.update(lakehouse.pyiceberg_environment())

    def tidemark_zk(*argv: str) -> subprocess.CompletedProcess:
        return tidemark("--zk", zk_connect, *argv, env=env)
    dry = tidemark_zk("gc", "--dry-run")
    assert dry.returncode == 0 and agg in dry.stdout, dry.stdout + dry.stderr
    done = tidemark_zk("gc", "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    versions = tidemark_zk("versions", "--json")
    assert versions.returncode == 0, versions.stderr
    assert json.loads(versions.stdout), "gc tagged no version to retain: " + versions.stdout
    resolved = tidemark_zk("resolve", f"{namespace}.raw", agg, "--json")
    assert resolved.returncode == 0, resolved.stderr
    library = VersionReader.resolve([f"{namespace}.raw", agg], connect(), settings=rest_settings).version
    assert json.loads(resolved.stdout)["snapshots"] == library.snapshots, resolved.stdout


@pytest.mark.fault
def test_a_writer_rides_out_the_lakehouse_killed_and_restarted_and_loses_nothing(lakehouse, rest_settings, connect,
                                                                                  namespace, caplog):
    """kill -9 of the server that is both the REST catalog and the object store, while a job stages and commits
    every second; restarted on the same data once the job has said it cannot reach the catalog, the job goes on,
    with every row once."""
    caplog.set_level(logging.WARNING, logger="coordinator.job.writer")
    pipeline = CopyPipeline(rest_settings.load(), namespace)
    fleet = Fleet(connect, rest_settings, interval_ms=1000, grace_ms=200)
    tm = connect()
    try:
        runner = pipeline.start(fleet)
        for i in range(3):
            pipeline.append(f"before-{i}")
        fleet.wait(lambda: len(runner.writer.committed) >= 2, "the job to commit two epochs")
        lakehouse.kill()
        killed_at = len(runner.writer.committed)
        fleet.wait(lambda: any("the catalog is unreachable" in r.getMessage() for r in caplog.records),
                   "the writer to say the catalog is unreachable")  # and ride it out, rather than fail
        lakehouse.start()
        pipeline.words = rest_settings.load().load_table(pipeline.source)
        for i in range(3):
            pipeline.append(f"after-{i}")
        fleet.wait(lambda: pipeline.consistent_copies(tm, rest_settings) == sorted(pipeline.appended),
                   "every word in a consistent version of the copy", timeout=120)
        assert len(runner.writer.committed) > killed_at
        fleet.check()
    finally:
        fleet.stop_all()
        if lakehouse.running_pid() is None:  # the module's other tests need it
            lakehouse.start()


def test_duckdbs_own_iceberg_extension_reads_a_consistent_version_from_s3_by_snapshot_id(rest_settings, connect,
                                                                                          namespace):
    """docs/reading.md's lines for DuckDB's Iceberg extension, loaded from its PyPI package (nothing downloaded),
    with an S3 secret from the catalog's properties: both tables of a consistent version of a pure-Python job's
    epochs, read by snapshot id, are the rows Tidemark reads; a word appended later is not in them."""
    readme = ["con = duckdb_iceberg_connection(reader.resolver)",
              "by_id = duckdb_iceberg_sql(reader.resolver, reader.version)",
              'con.sql(by_id["lake.db.word_counts"]).df()',
              "con.sql(f\"SELECT count(*) FROM ({by_id['lake.db.words']}) JOIN ({by_id['lake.db.word_counts']}) "
              "USING (word)\")"]
    assert all(line in READING for line in readme), "the docs' DuckDB extension lines changed: change this test too"
    pipeline = CopyPipeline(rest_settings.load(), namespace)
    fleet = Fleet(connect, rest_settings, interval_ms=1000, grace_ms=200)
    tm = connect()
    try:
        runner = pipeline.start(fleet)
        fleet.wait(lambda: len(runner.writer.committed) >= 1, "the job's first epoch")
        for i in range(3):
            pipeline.append(f"w{i}")
            fleet.wait(lambda: pipeline.consistent_copies(tm, rest_settings) == sorted(pipeline.appended),
                       f"w{i} copied")
        assert len(runner.writer.committed) >= 3
        fleet.check()
    finally:
        fleet.stop_all()
    words, word_counts = pipeline.source, pipeline.sink
    reader = VersionReader.resolve([words, word_counts], tm, settings=rest_settings)

    con = duckdb_iceberg_connection(reader.resolver)
    by_id = duckdb_iceberg_sql(reader.resolver, reader.version)
    assert sorted(con.sql(by_id[word_counts]).df()["word"]) == sorted(pipeline.appended)
    assert con.sql(f"SELECT count(*) FROM ({by_id[words]}) JOIN ({by_id[word_counts]}) USING (word)"
                   ).fetchall() == [(len(pipeline.appended),)]
    for table in (words, word_counts):
        assert f"snapshot_from_id => {reader.version.snapshots[table]})" in by_id[table]
        assert sorted(con.sql(by_id[table]).fetchall()) == sorted(
            tuple(row.values()) for row in reader.arrow(table).to_pylist())
    assert con.sql("SELECT current_setting('autoinstall_known_extensions')").fetchall() == [(False,)]

    pipeline.append("later")  # after the version; the queries are made again from the newest metadata
    reader.resolver.table(words)
    pinned = duckdb_iceberg_sql(reader.resolver, reader.version)[words]
    newest = pinned.split(", snapshot_from_id")[0] + ")"
    assert pinned != by_id[words], "the metadata was not reloaded"
    assert "later" not in {w for (w,) in con.sql(pinned).fetchall()}
    assert "later" in {w for (w,) in con.sql(newest).fetchall()}


@pytest.mark.spark
def test_a_spark_epoch_job_on_the_rest_catalog_and_s3_merges_exactly_once_and_spark_sql_reads_it_by_tag(
        spark, lakehouse, tm, namespace):
    """Spark's REST catalog with S3FileIO (iceberg-aws-bundle), its properties derived from pyiceberg's: an
    EpochJob stages with WAP and publishes two MERGE epochs; GC tags the consistent version, and Spark SQL reads
    it by that tag and by snapshot id, equal to the version read through pyiceberg."""
    settings = CatalogSettings(name="rest", python_properties=lakehouse.python_properties())
    for key, value in settings.spark_conf().items():
        spark.conf.set(key, value)  # a catalog's properties are session settings: this one is added at run time
    catalog = settings.load()
    words = create(catalog, f"{namespace}.words", WORD)
    create(catalog, f"{namespace}.counts", COUNTS)
    src, dst = f"rest.{namespace}.words", f"rest.{namespace}.counts"
    job = EpochJob(spark, tm, "spark-rest", sources=[src], sinks=[dst], catalog=settings, interval_ms=1000,
                   grace_ms=100)

    @job.epoch
    def step(ctx) -> None:
        new = ctx.changes(src).groupBy("word").count().withColumnRenamed("count", "n")
        ctx.merge(dst, new, on=["word"], matched="t.n = t.n + s.n")

    words.append(pa.table({"word": ["a", "b", "a"]}, schema=WORD))
    job.run(max_epochs=1)
    words.append(pa.table({"word": ["b", "c"]}, schema=WORD))
    appended = present(words.refresh().current_snapshot()).timestamp_ms
    job.run(until=-(-appended // 1000) * 1000)

    GarbageCollector(tm, settings).run()
    resolver = Resolver(catalog, settings, tm)
    version = resolver.resolve([src, dst])
    expected = {"a": 2, "b": 2, "c": 1}
    through_python = read_arrow(resolver, version)[dst]
    assert dict(zip(through_python.column("word").to_pylist(), through_python.column("n").to_pylist())) == expected
    by_tag = version_sql(resolver, version)
    assert f"'{tag_name(present(version.epoch), 'spark-rest')}'" in by_tag[dst], by_tag  # its pipeline's tag
    by_id = version_sql(resolver, version, by_tag=False)
    assert f"FOR VERSION AS OF {version.snapshots[dst]}" in by_id[dst], by_id
    for query in (by_tag[dst], by_id[dst]):
        assert {r.word: r.n for r in spark.sql(query).collect()} == expected, query
    assert all(str(p).startswith(lakehouse.warehouse) for p in
               spark.sql(f"SELECT file_path FROM {dst}.files").toPandas()["file_path"])


def test_orphan_files_are_found_by_listing_s3_and_deleted_leaving_every_snapshot_readable(rest_settings, namespace):
    """A killed writer's data file on S3, which no metadata references: found by listing the bucket, deleted, and
    nothing a snapshot references is touched."""
    catalog = rest_settings.load()
    table = create(catalog, f"{namespace}.events", WORD)
    for batch in (["a"], ["b", "c"]):
        table.append(pa.table({"word": batch}, schema=WORD))
    stray = f"{table.metadata.location}/data/killed-writer-00000.parquet"
    with table.io.new_output(stray).create() as out:
        out.write(b"PAR1 a file no commit references")
    found = find_orphan_files(table, f"{namespace}.events", cutoff_ms=now_ms() + 60_000)
    assert found.paths == (stray,), found
    delete_orphan_files(table, found)
    assert not table.io.new_input(stray).exists()
    assert find_orphan_files(table, f"{namespace}.events", cutoff_ms=now_ms() + 60_000).paths == ()
    for snapshot in table.refresh().snapshots():
        assert table.scan(snapshot_id=snapshot.snapshot_id).to_arrow().num_rows in (1, 3)


@pytest.mark.fault
@pytest.mark.parametrize("status", [504, 502, None], ids=["504", "502", "no-answer"])
def test_commits_whose_outcome_is_unknown_are_read_back_and_never_made_twice(lakehouse, connect, namespace, status):
    """Table commits that land on the REST catalog but reach the writer as a 502, a 504 or no answer at all
    (a proxy in front of the real catalog): the writer cannot know whether they landed. It reads the tables
    back rather than committing again: every word is copied exactly once."""
    with CommitOutcomeProxy(lakehouse.catalog_uri) as proxy:
        settings = CatalogSettings(name="lake", python_properties={**lakehouse.python_properties(),
                                                                   "uri": proxy.uri})
        pipeline = CopyPipeline(lakehouse.catalog_settings().load(), namespace)  # appended and checked directly
        fleet = Fleet(connect, settings, interval_ms=1000, grace_ms=200)
        tm = connect()
        try:
            runner = pipeline.start(fleet)
            fleet.wait(lambda: len(runner.writer.committed) >= 1, "the job's first epoch")
            proxy.fail_commits(every=2, status=status, times=3)
            for i in range(6):
                pipeline.append(f"w{i}")
                fleet.wait(lambda: pipeline.consistent_copies(tm, lakehouse.catalog_settings()) ==
                           sorted(pipeline.appended), f"w{i} copied", timeout=120)
            assert len(proxy.failed) == 3, proxy.failed
            fleet.check()
        finally:
            fleet.stop_all()
    assert pipeline.consistent_copies(tm, lakehouse.catalog_settings()) == sorted(pipeline.appended)


@pytest.fixture
def home_of_a_lakehouse(tmp_path):
    """A ``TIDEMARK_HOME`` not yet made, where a test's ``tidemark lakehouse start`` keeps its server's data."""
    with lakehouse_data_dir(tmp_path) as data:
        yield data / "home"


def test_tidemark_lakehouse_start_prints_the_settings_that_reach_it_and_stop_ends_it(home_of_a_lakehouse,
                                                                                     monkeypatch):
    home = home_of_a_lakehouse
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYICEBERG_")}, "TIDEMARK_HOME": str(home)}

    def lakehouse(*argv: str) -> subprocess.CompletedProcess:
        return tidemark("lakehouse", *argv, env=env)
    idle = lakehouse("status")
    assert idle.returncode == 3 and "not running" in idle.stdout and not home.exists(), idle.stdout + idle.stderr
    started = lakehouse("start")
    try:
        assert started.returncode == 0, started.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in started.stdout.splitlines())
        assert exports["PYICEBERG_CATALOG__LAKE__TYPE"] == "rest" and "PYICEBERG_CATALOG__LAKE__S3__ENDPOINT" in exports
        status = lakehouse("status")
        assert status.returncode == 0 and "serving" in status.stdout, status.stdout
        assert 'eval "$(tidemark lakehouse env)"' in status.stdout
        # a second terminal or a notebook: a second start, and env, print the same settings again
        again, printed = lakehouse("start"), lakehouse("env")
        assert again.returncode == 0 and again.stdout == started.stdout, again.stdout + again.stderr
        assert "already runs" in again.stderr and again.stderr.count("\n") == 1
        assert printed.returncode == 0 and printed.stdout == started.stdout and not printed.stderr
        for variable, value in exports.items():  # what `eval "$(tidemark lakehouse start)"` does
            monkeypatch.setenv(variable, value)
        CatalogSettings.from_env(Settings.from_env({})).load().list_namespaces()
    finally:
        stopped = lakehouse("stop")
    assert stopped.returncode == 0 and stopped.stdout.strip() == "stopped", stopped.stdout + stopped.stderr
    gone, nothing = lakehouse("status"), lakehouse("env")
    assert gone.returncode == 3 and "not running" in gone.stdout
    assert nothing.returncode == 1 and not nothing.stdout and nothing.stderr.count("\n") == 1
    assert "no lakehouse server runs" in nothing.stderr and "tidemark lakehouse start" in nothing.stderr


def test_a_first_start_whose_port_was_taken_meanwhile_takes_other_ports(tmp_path):
    with lakehouse_data_dir(tmp_path) as data:
        server = EmbeddedLakehouse(data)
        chosen = server.ports["master"]
        with socket.socket() as taken:  # another process takes it between the choice and weed's bind
            taken.bind(("127.0.0.1", chosen))
            taken.listen()
            with server:
                assert server.ports["master"] != chosen and server.serving()
                recorded = server.recorded_state()
                assert recorded is not None and recorded.ports == server.ports


@pytest.fixture
def small_disk(tmp_path):
    """A real file system of 256 MiB (a tmpfs mounted here: the suite runs as root)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(mount)], capture_output=True,
                             text=True)
    assert mounted.returncode == 0, f"cannot mount a tmpfs (the suite runs as root): {mounted.stderr}"
    try:
        yield mount
    finally:
        subprocess.run(["umount", "--lazy", str(mount)], check=True)


def test_a_lakehouse_whose_disk_is_too_full_to_write_says_so_and_is_not_started(small_disk):
    def lakehouse(*argv: str, home: Path = small_disk / "home") -> subprocess.CompletedProcess:
        return tidemark("lakehouse", *argv, env={**os.environ, "TIDEMARK_HOME": str(home)})
    started = lakehouse("start")
    try:
        assert started.returncode == 0, started.stderr
        assert lakehouse("status").returncode == 0
        # fill the disk to 100 MiB free: under the 128 MiB volume SeaweedFS would need to write
        subprocess.run(["fallocate", "-l", str(shutil.disk_usage(small_disk).free - 100 * 2**20),
                        str(small_disk / "filler")], check=True)
        full = lakehouse("status")
        assert full.returncode == 3, full.stdout
        assert "serving, but NOT writing" in full.stdout and "has 100 MiB free" in full.stdout, full.stdout
    finally:
        assert lakehouse("stop").stdout.strip() == "stopped"
    for home in (small_disk / "home", small_disk / "new-home"):  # a restart, and a first start
        refused = lakehouse("start", home=home)
        assert refused.returncode == 1 and refused.stdout == "", refused.stdout
        assert refused.stderr.startswith("tidemark: error: cannot start the lakehouse: the disk of ")
        assert refused.stderr.count("\n") == 1 and "free some space" in refused.stderr, refused.stderr
    assert lakehouse("status").returncode == 3 and not (small_disk / "new-home").exists()


# Inside a network namespace: load the catalog over the test network, say so, wait for "go" (the test cuts the
# network meanwhile), then list the namespaces through the cut and say how that ended and after how long.
THROUGH_A_CUT = """
import json, sys, time
from coordinator import CatalogSettings
from coordinator.iceberg.catalog import is_catalog_outage
catalog = CatalogSettings(name="lake", python_properties=json.loads(sys.argv[1])).load()
catalog.list_namespaces()
print("loaded", flush=True)
sys.stdin.readline()
started = time.monotonic()
try:
    catalog.list_namespaces()
    print("answered", flush=True)
except Exception as exc:
    print(type(exc).__name__, is_catalog_outage(exc), round(time.monotonic() - started, 1), flush=True)
"""


def test_a_rest_request_sent_into_a_partition_fails_as_an_outage_at_its_deadline(lakehouse):
    """pyiceberg 0.12 sets no timeout: a request whose packets vanish waited for TCP to give up (about 15 min),
    a leader holding its leadership meanwhile. Every request now has a deadline, ``connection.timeout`` (60 s
    unless set), and meeting it is an outage (ridden out; a commit's outcome is read back by the next leader)."""
    with TestNetwork("rest-deadline") as network:
        host = network.host("client")
        properties = {k: network.reach(v, network.LAKEHOUSE) for k, v in lakehouse.python_properties().items()}
        properties["connection.timeout"] = "2"
        client = subprocess.Popen([*host.command, sys.executable, "-c", THROUGH_A_CUT, json.dumps(properties)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO,
                                  env={**os.environ, "PYTHONPATH": str(REPO)})
        try:
            assert client.stdout is not None and client.stdin is not None
            assert client.stdout.readline().strip() == "loaded"
            network.cut(host, network.LAKEHOUSE)
            # Without a deadline the request waits for TCP to give up (about 15 minutes): fail long before that.
            answer, _ = client.communicate("go\n", timeout=30)
            kind, outage, seconds = answer.split()
        finally:
            client.kill()
            client.wait()
        assert (kind, outage) == ("ReadTimeout", "True")
        assert 2 <= float(seconds) < 7


@pytest.mark.parametrize("timeout", ["0", "-1", "soon"])
def test_a_rest_catalogs_deadline_must_be_a_positive_number_of_seconds(rest_settings, timeout):
    settings = CatalogSettings(name=rest_settings.name,
                               python_properties={**rest_settings.python_properties, "connection.timeout": timeout})
    with pytest.raises(ConfigurationError, match=f"connection.timeout is '{timeout}': give a number of seconds"):
        settings.load()
