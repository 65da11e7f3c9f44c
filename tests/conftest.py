"""Fixtures on real components: a ZooKeeper server, a PostgreSQL server, a SparkSession.

The suite never reads or writes the real home: before any test runs, HOME, the XDG directories and
TIDEMARK_HOME point into a temporary directory (subprocesses inherit them), and the session fails if
anything in the real home was created, changed or deleted by the end (``_real_home_untouched``).
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from coordinator import CatalogSettings, EmbeddedZooKeeper, Tidemark
from coordinator.history import resolve as resolve_module
from coordinator.operations.lakehouse_server import EmbeddedLakehouse
from coordinator.settings import Settings
from tests.helpers.home import changes, snapshot
from tests.helpers.lakehouse_data import lakehouse_data_dir
from tests.helpers.postgres import PostgresServer
from tests.helpers.trino import NO_RETENTION_FLOOR, TrinoServer, readme_trino_catalog

SESSION_TIMEOUT = 4.0
REAL_HOME_VARIABLE = "TIDEMARK_TESTS_REAL_HOME"
SANDBOX_WORKER_VARIABLE = "TIDEMARK_TESTS_SANDBOX_WORKER"  # the pytest-xdist worker whose sandbox HOME is ("": none)


def _isolate_home() -> tuple[Path, tuple[Path, ...]]:
    """Point HOME, the XDG directories and TIDEMARK_HOME into one fresh temporary directory (removed at exit), so
    that a default location (the embedded catalog, ZooKeeper's data, a tool's cache or settings) is never the
    user's. Returns the real home and the caches the suite shares with it."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if REAL_HOME_VARIABLE in os.environ and os.environ.get(SANDBOX_WORKER_VARIABLE) == worker:
        # Done already: this module imported again (as tests.conftest, for its constants), or a suite that the suite
        # started (it inherits the environment). The real home is the one found first.
        return Path(os.environ[REAL_HOME_VARIABLE]), (Settings.from_env().cache, Path(os.environ["PIP_CACHE_DIR"]))
    # Otherwise this is the first process of the run, or one of its pytest-xdist workers, which inherit the first
    # process's sandbox and the caches it resolved (set below), and take a sandbox of their own, so that two tests
    # that use a default location at once never share it.
    # The two things the suite shares with the user, both resolved here from the real environment and set
    # explicitly, as the swapped XDG_CACHE_HOME would otherwise hide them:
    # - the jar cache `make setup` fills from Maven Central (Iceberg's Spark runtime, iceberg-aws-bundle and the
    #   JDBC drivers, about 130 MB) and the test servers (Trino, unpacked, and Iceberg's REST catalog server, about
    #   1 GB), which Spark tests, drivers and the servers only read;
    # - pip's cache, which `make setup` filled with the wheels of the venv: the quickstart test installs the
    #   package into a fresh venv as a user does, and would otherwise download some 700 MB of wheels every run.
    jar_cache = Settings.from_env().cache
    pip_cache = Path(os.environ.get("PIP_CACHE_DIR") or
                     Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")) / "pip")
    real_home = Path(os.environ.get(REAL_HOME_VARIABLE) or os.path.expanduser("~"))
    sandbox = Path(tempfile.mkdtemp(prefix="tidemark-tests-home-"))
    atexit.register(shutil.rmtree, sandbox, True)
    for variable, name in (("HOME", "home"), ("XDG_DATA_HOME", "data"), ("XDG_CACHE_HOME", "cache"),
                           ("XDG_CONFIG_HOME", "config"), ("TIDEMARK_HOME", "tidemark")):
        (sandbox / name).mkdir()
        os.environ[variable] = str(sandbox / name)
    os.environ["TIDEMARK_CACHE"] = str(jar_cache)
    os.environ["PIP_CACHE_DIR"] = str(pip_cache)
    os.environ[REAL_HOME_VARIABLE] = str(real_home)
    os.environ[SANDBOX_WORKER_VARIABLE] = worker
    return real_home, (jar_cache, pip_cache)


REAL_HOME, SHARED_CACHES = _isolate_home()  # at import: before any fixture or test reads the settings


@pytest.fixture(scope="session", autouse=True)
def _real_home_untouched():
    """Fail the session if it created, changed or deleted anything in the real home (the shared caches aside, and
    the temporary directory and this checkout, should they lie under the home: the suite writes its own caches,
    .hypothesis and __pycache__, into the checkout)."""
    if REAL_HOME.parent == REAL_HOME:
        yield  # a home that is the file system's root (some containers): the whole machine, not ours to judge
        return
    skip = [*SHARED_CACHES, Path(tempfile.gettempdir()), Path(__file__).resolve().parent.parent]
    before = snapshot(REAL_HOME, skip)
    yield
    touched = changes(before, snapshot(REAL_HOME, skip))
    if touched:
        pytest.fail(f"the suite changed the real home {REAL_HOME} (tests run with HOME={os.environ['HOME']}): "
                    + "; ".join(touched[:20]) + (f"; and {len(touched) - 20} more" if len(touched) > 20 else ""),
                    pytrace=False)


@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    server = EmbeddedZooKeeper.on_free_port(tmp_path_factory.mktemp("zookeeper"))
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


@pytest.fixture
def catalog_env(catalog_settings, monkeypatch) -> dict[str, str]:
    """The catalog for ``tidemark`` commands, in-process (set here) and in subprocesses (the returned variables)."""
    env = {"TIDEMARK_CATALOG_URI": catalog_settings.uri, "TIDEMARK_WAREHOUSE": catalog_settings.warehouse,
           "TIDEMARK_CATALOG_NAME": catalog_settings.name}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


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


@pytest.fixture(scope="session")
def trino_lakehouse(tmp_path_factory):
    """The lakehouse (SeaweedFS's S3 store and REST catalog) that ``trino`` reads."""
    with lakehouse_data_dir(tmp_path_factory.mktemp("trino-lakehouse")) as data, EmbeddedLakehouse(data) as running:
        yield running


@pytest.fixture(scope="session")
def trino(trino_lakehouse, tmp_path_factory):
    """One real Trino for the run (a start is 20 s of the machine's two cores, more on a loaded one): catalog
    ``lake`` is docs/reading.md's file as written, ``maintained`` the same with Trino's retention floors off, for a
    catalog's most aggressive maintenance. Under pytest-xdist one worker runs every test that takes it
    (``pytest_collection_modifyitems``), so that a run starts it once."""
    catalogs = {"lake": readme_trino_catalog(), "maintained": readme_trino_catalog() + NO_RETENTION_FLOOR}
    with TrinoServer(tmp_path_factory.mktemp("trino"), catalogs=catalogs,
                     env=trino_lakehouse.pyiceberg_environment()) as server:
        yield server


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


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups
def pytest_collection_modifyitems(config, items):
    """A test that starts Spark says so with ``@pytest.mark.spark`` (``make test-fast`` deselects those);
    one that takes the ``spark`` fixture without the mark would run Spark in the fast suite: refuse it.

    Under pytest-xdist (``make test`` runs three workers, ``--dist loadgroup``) every Spark test goes to one worker,
    one after another: two Spark JVMs at once would compete for the machine's two cores, and each worker would
    start a SparkSession of its own. The other workers run the rest meanwhile. The tests that take ``trino`` (but
    for a Spark one) go to one worker too, so that a run starts one Trino."""
    unmarked = [item.nodeid for item in items
                if "spark" in item.fixturenames and item.get_closest_marker("spark") is None]
    if unmarked:
        raise pytest.UsageError(f"these tests start Spark but are not marked @pytest.mark.spark: {unmarked}")
    if config.pluginmanager.hasplugin("xdist"):  # its marker is unknown without it (-p no:xdist)
        for item in items:
            if item.get_closest_marker("spark") is not None:
                item.add_marker(pytest.mark.xdist_group("spark"))
            elif "trino" in item.fixturenames:
                item.add_marker(pytest.mark.xdist_group("trino"))


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
