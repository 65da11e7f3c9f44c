"""Fixtures on real components: a ZooKeeper server, a PostgreSQL server, a SparkSession."""
from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from coordinator import CatalogSettings, EmbeddedZooKeeper, Tidemark
from coordinator.history import resolve as resolve_module
from coordinator.operations.zookeeper_server import free_port
from tests.helpers.postgres import PostgresServer

SESSION_TIMEOUT = 4.0


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    server = EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path_factory.mktemp("zookeeper")).start()
    yield server
    server.stop()


@pytest.fixture
def zk_connect(zk_server, request) -> str:
    """A connect string with a fresh chroot for this test."""
    test = request.node.name[:40].replace('[', '-').replace(']', '')
    return f"{zk_server.connect_string}/t-{test}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def tm(zk_connect):
    client = Tidemark.connect(zk_connect, session_timeout=SESSION_TIMEOUT, operation_timeout=20)
    yield client
    client.close()


@pytest.fixture
def connect(zk_connect):
    """Open more sessions on this test's chroot (other 'drivers')."""
    opened = []

    def open_one(**kwargs) -> Tidemark:
        kwargs.setdefault("session_timeout", SESSION_TIMEOUT)
        kwargs.setdefault("operation_timeout", 20)
        client = Tidemark.connect(zk_connect, **kwargs)
        opened.append(client)
        return client
    yield open_one
    for client in opened:
        client.close()


@pytest.fixture(scope="session")
def postgres_uri():
    """A real PostgreSQL server on a loopback port, in a temporary data directory."""
    try:
        server = PostgresServer().start()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    yield server.uri
    server.close()


@pytest.fixture(scope="session")
def lake_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("lake")


@pytest.fixture(scope="session")
def catalog_settings(lake_home) -> CatalogSettings:
    return CatalogSettings.embedded(lake_home)


@pytest.fixture(scope="session")
def pg_catalog_settings(postgres_uri, lake_home) -> CatalogSettings:
    return CatalogSettings(name="pg", uri=postgres_uri, warehouse=f"file://{lake_home / 'pg-warehouse'}")


@pytest.fixture(scope="session")
def spark(catalog_settings, pg_catalog_settings):
    """One local SparkSession for the whole run, with the SQLite catalog ``lake`` and the PostgreSQL one ``pg``."""
    from spark_hooks.session import build_spark_session
    pg_catalog_settings.load()
    session = build_spark_session(catalog_settings, app_name="tidemark-tests", master="local[2]",
                                  extra_conf={"spark.ui.enabled": "false", **pg_catalog_settings.spark_conf()})
    yield session
    session.stop()


@pytest.fixture
def catalog(catalog_settings):
    """The SQLite catalog, loaded (pyiceberg)."""
    return catalog_settings.load()


@pytest.fixture
def loaded(monkeypatch) -> list[str]:
    """The tables whose Iceberg metadata a ``Resolver`` loads (from the real catalog), in order."""
    names: list[str] = []
    load = resolve_module.load_table

    def counted(catalog, settings, name: str):
        names.append(name)
        return load(catalog, settings, name)
    monkeypatch.setattr(resolve_module, "load_table", counted)
    return names


@pytest.fixture
def namespace(request) -> str:
    """A fresh namespace name per test, so tests never share tables."""
    return "ns_" + uuid.uuid4().hex[:8]


def pytest_collection_modifyitems(items):
    """A test that starts Spark says so with ``@pytest.mark.spark`` (``make test-fast`` deselects those);
    one that takes the ``spark`` fixture without the mark would run Spark in the fast suite: refuse it."""
    unmarked = [item.nodeid for item in items
                if "spark" in item.fixturenames and item.get_closest_marker("spark") is None]
    if unmarked:
        raise pytest.UsageError(f"these tests start Spark but are not marked @pytest.mark.spark: {unmarked}")


@pytest.fixture(scope="session")
def spark_launch_trap(tmp_path_factory) -> Path:
    """A SPARK_HOME whose spark-submit records the launch and fails: pyspark starts every JVM through it."""
    home = tmp_path_factory.mktemp("no-spark")
    (home / "bin").mkdir()
    launcher = home / "bin" / "spark-submit"
    launcher.write_text(f"#!/bin/sh\necho launched >> '{home / 'launches'}'\n"
                        "echo 'a test not marked spark started Spark: mark it @pytest.mark.spark' >&2\nexit 1\n")
    launcher.chmod(0o755)
    return home


@pytest.fixture(autouse=True)
def _no_spark_unless_marked(request, monkeypatch):
    """Keeps ``make test-fast`` (``-m "not spark"``) free of Spark at run time, not only by the fixture check
    above: a test not marked ``spark`` that starts Spark, in this process or in a driver subprocess (which
    inherits SPARK_HOME, so its JVM launch fails at once), fails by name."""
    if request.node.get_closest_marker("spark"):
        yield
        return
    trap = request.getfixturevalue("spark_launch_trap")
    monkeypatch.setenv("SPARK_HOME", str(trap))
    launches = trap / "launches"
    before = launches.read_text() if launches.exists() else ""
    running = _active_spark_context()
    yield
    if (launches.read_text() if launches.exists() else "") != before or (
            running is None and _active_spark_context() is not None):
        pytest.fail("this test started Spark but is not marked @pytest.mark.spark", pytrace=False)


def _active_spark_context() -> object:
    context = sys.modules.get("pyspark.context")  # only a test that imported pyspark can have started it
    return None if context is None else context.SparkContext._active_spark_context
