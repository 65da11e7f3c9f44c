"""Foundation on real components: the ZooKeeper launcher, catalogs from Spark and Python, clear set-up errors."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from coordinator import CatalogSettings, ConfigurationError, EmbeddedZooKeeper
from coordinator.operations import zookeeper_server
from coordinator.operations.zookeeper_server import ZooKeeperEnsemble, four_letter_word, free_port
from tests.helpers.cli import tidemark
from tests.helpers.present import present


def test_zk_start_status_stop_end_a_real_server(tmp_path):
    port = free_port()
    started = tidemark("zk", "start", "--port", str(port), "--data-dir", str(tmp_path))
    assert started.returncode == 0, started.stderr
    assert started.stdout.strip() == f"127.0.0.1:{port}"
    pid = present(EmbeddedZooKeeper(port, tmp_path).recorded_state()).pid
    assert four_letter_word("127.0.0.1", port) == b"imok"
    again = tidemark("zk", "start", "--data-dir", str(tmp_path))  # already running: where it runs, not an error
    assert again.returncode == 0 and again.stdout == started.stdout, again.stderr
    assert f"(pid {pid}) already runs" in again.stderr and again.stderr.count("\n") == 1
    assert "usage: tidemark zk start" in tidemark("zk", "start", "--help").stdout
    status = tidemark("zk", "status", "--port", str(port), "--data-dir", str(tmp_path))
    assert status.returncode == 0 and "standalone" in status.stdout
    stopped = tidemark("zk", "stop", "--data-dir", str(tmp_path))
    assert stopped.returncode == 0 and "stopped" in stopped.stdout
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    assert four_letter_word("127.0.0.1", port) is None
    assert tidemark("zk", "status", "--data-dir", str(tmp_path)).returncode == 3


def test_zk_start_on_a_port_in_use_is_a_one_line_error(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = tidemark("zk", "start", "--port", str(busy.getsockname()[1]), "--data-dir", str(tmp_path))
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "already in use" in result.stderr and "--port" in result.stderr


def test_missing_java_is_a_one_line_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"}
    env["PATH"] = str(Path(sys.executable).parent)  # python, but no java
    result = tidemark("zk", "start", "--port", str(free_port()), "--data-dir", str(tmp_path), env=env)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Java not found" in result.stderr and "openjdk-17" in result.stderr


@pytest.mark.parametrize("uri", ["mysql://h/db", "sqlite:///", "sqlite://relative.db", "postgresql://host",
                                 "postgresql://h:notaport/db"])
def test_bad_catalog_uri_says_what_to_use(uri):
    with pytest.raises(ConfigurationError) as err:
        CatalogSettings(uri=uri)
    assert "sqlite:///absolute/path/catalog.db" in str(err.value) and "\n" not in str(err.value)


def test_unreachable_catalog_database_is_a_clear_error():
    settings = CatalogSettings(name="pg", uri=f"postgresql://nobody@127.0.0.1:{free_port()}/nowhere")
    with pytest.raises(ConfigurationError) as err:
        settings.load()
    assert "cannot open Iceberg catalog 'pg'" in str(err.value)
    assert "server (database or REST) is running" in str(err.value)


def test_coordinator_does_not_import_pyspark():
    code = ("import sys, coordinator, coordinator.operations.cli, coordinator.history.resolve; "
            "print('pyspark' in sys.modules)")
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "False"


@pytest.mark.spark
def test_spark_stages_wap_snapshot_that_pyiceberg_publishes(spark, catalog_settings, namespace):
    table = f"lake.{namespace}.events"
    spark.sql(f"CREATE NAMESPACE lake.{namespace}")
    spark.sql(f"CREATE TABLE {table} (id bigint, word string) USING iceberg "
              "TBLPROPERTIES ('write.wap.enabled'='true', 'format-version'='2')")
    spark.sql(f"INSERT INTO {table} VALUES (1, 'a')")
    spark.conf.set("spark.wap.id", "tidemark-1000")
    try:
        spark.createDataFrame([(2, "b")], "id bigint, word string").writeTo(table) \
            .option("snapshot-property.tidemark.epoch", "1000").option("snapshot-property.tidemark.job", "j").append()
    finally:
        spark.conf.unset("spark.wap.id")
    assert [r.id for r in spark.table(table).collect()] == [1], "a staged snapshot must stay invisible"

    py_table = catalog_settings.load().load_table(f"{namespace}.events")
    staged = [s for s in py_table.snapshots() if s.summary.get("tidemark.epoch") == "1000"]
    assert len(staged) == 1 and staged[0].summary.get("tidemark.job") == "j"
    assert staged[0].parent_snapshot_id == py_table.current_snapshot().snapshot_id
    py_table.manage_snapshots().set_current_snapshot(staged[0].snapshot_id).commit()

    assert sorted(r.id for r in spark.table(table).collect()) == [1, 2]


@pytest.mark.spark
def test_postgresql_catalog_works_from_spark_and_python(spark, pg_catalog_settings, namespace):
    spark.sql(f"CREATE NAMESPACE pg.{namespace}")
    spark.sql(f"CREATE TABLE pg.{namespace}.t (id bigint) USING iceberg")
    spark.sql(f"INSERT INTO pg.{namespace}.t VALUES (1), (2)")
    table = pg_catalog_settings.load().load_table(f"{namespace}.t")
    assert sorted(table.scan().to_arrow()["id"].to_pylist()) == [1, 2]
    table.append(pa.table({"id": pa.array([3], pa.int64())}))
    assert sorted(r.id for r in spark.table(f"pg.{namespace}.t").collect()) == [1, 2, 3]


@pytest.mark.parametrize("taken", ["a client port, before the start", "an election port, as its peer binds it"])
def test_an_ensemble_whose_port_another_process_took_starts_on_new_ports(tmp_path, taken, monkeypatch):
    """Its ports are free when chosen; another process binding one before its server does (a busy machine) makes
    the first start choose new ports and serve: found before the start, or from the peer's ``BindException``
    (the port taken after the ensemble looked: its look is made to miss it)."""
    ensemble = ZooKeeperEnsemble(tmp_path / "ensemble")
    second = ensemble.members[1]
    if taken.startswith("a client"):
        port = second.port
    else:
        port = second.quorum[1].election_port
        monkeypatch.setattr(zookeeper_server, "_port_in_use", lambda port: False)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with ensemble:
            assert port not in [p for peer in ensemble.members[0].quorum
                                for p in (peer.client_port, peer.quorum_port, peer.election_port)]
            assert sorted(str(m.mode()) for m in ensemble.members) == ["follower", "follower", "leader"]
        if not taken.startswith("a client"):
            assert "java.net.BindException" in (tmp_path / "ensemble" / "server-2" / "zookeeper.log").read_text()


def test_a_server_whose_free_port_another_process_took_starts_on_a_new_one(tmp_path, monkeypatch):
    """The port is free when chosen; another process binding it before the server does (a busy machine) makes the
    start choose a new port and serve: the look before the start is made to miss the squatter, so the server's
    JVM meets it (``BindException``)."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        chosen = iter([taken])
        monkeypatch.setattr(zookeeper_server, "free_port", lambda: next(chosen, None) or free_port())
        monkeypatch.setattr(zookeeper_server, "_port_in_use", lambda port: False)
        server = EmbeddedZooKeeper.on_free_port(tmp_path / "zookeeper")
        try:
            assert server.port != taken and server.mode() == "standalone"
            assert "java.net.BindException" in server.log_path.read_text()
        finally:
            server.stop()
