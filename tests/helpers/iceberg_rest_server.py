"""Iceberg's own REST catalog server, backed by PostgreSQL, with its files on an S3 endpoint: the second REST
catalog implementation the tests run Tidemark on (SeaweedFS's, ``coordinator.operations.lakehouse_server``, is the
first), so that Tidemark is not tuned to one server's quirks.

    with IcebergRestServer(work_dir, postgres_uri=uri, s3_endpoint=lakehouse.s3_endpoint) as server:
        settings = server.catalog_settings()     # pyiceberg's REST catalog with S3 FileIO (Spark's derived from it)
        server.pyiceberg_environment()           # PYICEBERG_CATALOG__LAKE__*: what a user exports
        server.kill(); server.start()            # fault tests: kill -9, then restart on the same database and port

The server is Maven Central's ``org.apache.iceberg:iceberg-open-api`` jar (its main class
``org.apache.iceberg.rest.RESTCatalogServer``: a JdbcCatalog served over HTTP by Jetty), which ``python -m tools.jars
test-servers`` (``make setup``) puts in the cache with PostgreSQL's JDBC driver; the jar carries SQLite's driver but
not PostgreSQL's, so both go on the class path. It runs on the ``java`` of ``JAVA_HOME``, else the one on PATH (it
needs Java 11 or later). It is configured by ``CATALOG_*`` variables, the catalog's properties spelt as
``RCKUtils.environmentCatalogConfig`` reads them (``s3.path-style-access`` is ``CATALOG_S3_PATH__STYLE__ACCESS``),
its port included (``rest.port``). Its catalog tables are in their own database, ``database`` (created on the
PostgreSQL server of ``postgres_uri`` when missing), so they never meet another test's SQL catalog; a restart on
the same database brings back every table. Its warehouse is ``s3://<bucket>/warehouse`` on the S3 endpoint given
(SeaweedFS's gateway in the tests), in an ordinary bucket created when missing (SeaweedFS's own ``lakehouse`` bucket
is an S3 Tables bucket, its catalog's).

What it answers differently from SeaweedFS's catalog (Tidemark's code meets none of it; a test may):

- no authentication at all: no OAuth2 token endpoint is needed, and an anonymous request is served (SeaweedFS
  answers it 403), so its properties carry no ``credential``;
- Jetty listens on every interface, not only loopback: the server has no setting for the address (its port is
  free and chosen at random; do not run it on a machine others can reach); and with ``SO_REUSEPORT``, so a second
  server on the same port starts without an error and the two share its connections (``start()`` refuses while
  this one's server runs);
- ``GET /v1/config`` lists the endpoints it serves (SeaweedFS lists none: pyiceberg assumes the default ones);
- a ``create_table`` of a table that exists is refused, 409 (``TableAlreadyExistsError``): SeaweedFS answers with
  the existing table; listing the tables of a namespace that does not exist is a 404 (``NoSuchNamespaceError``):
  SeaweedFS answers an empty list;
- an error's JSON carries the Java stack (``stack``), and its log holds a stack trace for every 4xx it answers;
- metadata files are named ``<n>-<uuid>.metadata.json`` (SeaweedFS: ``v<n>.metadata.json``);
- a requirement that failed is a 409 in Java's words (``branch main has changed: expected id A != B``); an update
  that no longer applies to the table's newer metadata is a 400 ``ValidationException`` (``Cannot add snapshot
  with sequence number N older than last sequence number M``, ``Cannot set main to unknown snapshot: ID``), as on
  SeaweedFS in words of its own: Tidemark retries neither 400 (``REST_ANSWERS_400`` in the tests of this server);
- it logs its catalog properties at start, the S3 secret key of these loopback tests included.

Failure behaviour: ``start()`` raises ``ConfigurationError`` naming what to do when no ``java`` is found, when the
jars are not in the cache, or when the PostgreSQL database or the S3 bucket cannot be created; and with the last
lines of its log when the server exits, or does not answer ``GET /v1/config`` and list its namespaces within
``start_timeout`` (it is killed then).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Optional
from urllib.parse import unquote, urlsplit

from coordinator.errors import ConfigurationError
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.iceberg.catalog_properties import S3_FILE_IO, pyiceberg_variables
from coordinator.operations.lakehouse_server import ACCESS_KEY, REGION, SECRET_KEY
from coordinator.operations.zookeeper_server import free_port
from coordinator.settings import Settings
from spark_hooks.classpath import JDBC_DRIVERS, cached_jar
from tools.jars import ICEBERG_REST_SERVER

MAIN_CLASS = "org.apache.iceberg.rest.RESTCatalogServer"
START_TIMEOUT_S = 90.0  # about 3 s alone; a loaded 2-core machine takes many times that
# A small heap and the quick JIT: a test server on a shared 2-core machine
JVM_OPTIONS = ("-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")


def java_executable() -> str:
    """``$JAVA_HOME/bin/java``, else ``java`` on PATH."""
    home = Path(os.environ.get("JAVA_HOME") or "/nonexistent") / "bin" / "java"
    found = str(home) if home.is_file() else shutil.which("java")
    if not found:
        raise ConfigurationError("no java found for Iceberg's REST catalog server: install a JDK 11 or later "
                                 "(make setup installs Java 17), or set JAVA_HOME")
    return found


def server_classpath(settings: Optional[Settings] = None) -> str:
    """The server's jar and PostgreSQL's JDBC driver, from the cache ``make setup`` fills."""
    jars = [cached_jar(settings or Settings.from_env(), a) for a in (ICEBERG_REST_SERVER, JDBC_DRIVERS["postgresql"])]
    missing = [str(jar) for jar in jars if not jar.is_file()]
    if missing:
        raise ConfigurationError(f"{', '.join(missing)} missing: run `make setup` (python -m tools.jars test-servers)")
    return ":".join(str(jar) for jar in jars)


def catalog_environment(properties: dict[str, str]) -> dict[str, str]:
    """The server's ``CATALOG_*`` variables of catalog ``properties``: the inverse of its
    ``RCKUtils.environmentCatalogConfig`` (prefix dropped, lower case, ``__`` is ``-``, ``_`` is ``.``)."""
    assert not any("_" in key for key in properties), "a property with _ cannot be given as a variable"
    return {"CATALOG_" + key.upper().replace("-", "__").replace(".", "_"): value for key, value in properties.items()}


class IcebergRestServer:
    """One ``RESTCatalogServer`` JVM on a free port, its catalog in PostgreSQL database ``database``, its files in
    ``s3://<bucket>/warehouse`` on ``s3_endpoint`` (with the lakehouse's keys)."""

    def __init__(self, work_dir: os.PathLike, *, postgres_uri: str, s3_endpoint: str, database: str = "iceberg_rest",
                 bucket: str = "iceberg-rest", catalog_name: str = "lake",
                 start_timeout: float = START_TIMEOUT_S) -> None:
        self.work_dir = Path(work_dir).absolute()
        self.postgres_uri, self.s3_endpoint = postgres_uri, s3_endpoint
        self.database, self.bucket, self.catalog_name = database, bucket, catalog_name
        self.start_timeout = start_timeout
        self.port = free_port()  # kept across restarts: clients keep their URI
        self._process: Optional[subprocess.Popen] = None

    @property
    def catalog_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/warehouse"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "iceberg-rest.log"

    def python_properties(self) -> dict[str, str]:
        """pyiceberg's properties of the catalog: REST (no credentials: the server has no authentication), its files
        on the S3 endpoint; the warehouse is the server's own."""
        return {"type": "rest", "uri": self.catalog_uri, "s3.endpoint": self.s3_endpoint,
                "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY, "s3.region": REGION}

    def catalog_settings(self) -> CatalogSettings:
        return CatalogSettings(name=self.catalog_name, python_properties=self.python_properties())

    def pyiceberg_environment(self) -> dict[str, str]:
        """``python_properties`` as a user exports them: ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables."""
        return pyiceberg_variables(self.catalog_name, self.python_properties())

    def server_properties(self) -> dict[str, str]:
        """The catalog properties the server is started with (Java's names)."""
        pg = urlsplit(self.postgres_uri)
        properties = {"uri": f"jdbc:postgresql://{pg.hostname}:{pg.port or 5432}/{self.database}",
                      "warehouse": self.warehouse, "io-impl": S3_FILE_IO, "s3.endpoint": self.s3_endpoint,
                      "s3.path-style-access": "true", "s3.access-key-id": ACCESS_KEY,
                      "s3.secret-access-key": SECRET_KEY, "client.region": REGION, "rest.port": str(self.port)}
        if pg.username:
            properties["jdbc.user"] = unquote(pg.username)
        if pg.password:
            properties["jdbc.password"] = unquote(pg.password)
        return properties

    def running_pid(self) -> Optional[int]:
        return self._process.pid if self._process is not None and self._process.poll() is None else None

    def start(self) -> IcebergRestServer:
        if self.running_pid() is not None:
            raise ConfigurationError(f"Iceberg's REST catalog server already runs (pid {self.running_pid()})")
        java, classpath = java_executable(), server_classpath()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._create_database()
        self._create_bucket()
        env = {**os.environ, **catalog_environment(self.server_properties()), "AWS_REGION": REGION}
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen([java, *JVM_OPTIONS, "-cp", classpath, MAIN_CLASS], stdout=log,
                                             stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             start_new_session=True, cwd=self.work_dir, env=env)
        deadline = time.monotonic() + self.start_timeout
        while not self.serving():
            if self._process.poll() is not None:
                raise ConfigurationError(f"Iceberg's REST catalog server exited ({self._process.returncode}): "
                                         f"{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise ConfigurationError(f"Iceberg's REST catalog server did not serve within "
                                         f"{self.start_timeout:.0f} s: {self.log_tail()}")
            time.sleep(0.2)
        return self

    def serving(self) -> bool:
        """True when ``GET /v1/config`` answers and the catalog lists its namespaces (its tables are in PostgreSQL)."""
        try:
            with urllib.request.urlopen(f"{self.catalog_uri}/v1/config", timeout=2):
                pass
            self.catalog_settings().load().list_namespaces()
        except Exception:  # noqa: BLE001 - no answer, or pyiceberg's to a server still starting: not yet
            return False
        return True

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM (Jetty and the JVM shut down), SIGKILL after ``timeout``; False when it was not running."""
        return self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """kill -9, for fault tests: the database keeps every table for ``start()``."""
        self._end(signal.SIGKILL, 10.0)

    def _end(self, signum: int, timeout: float) -> bool:
        process = self._process
        if process is None or process.poll() is not None:
            return False
        os.killpg(process.pid, signum)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            if signum == signal.SIGKILL:
                raise ConfigurationError(f"the REST catalog server (pid {process.pid}) outlived kill -9") from None
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10.0)
        return True

    def log_tail(self, lines: int = 6) -> str:
        """The log's last lines, stack frames left out (a Java error's cause is in its ``Caused by`` lines)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "no log"
        kept = [line for line in text.splitlines() if line.strip() and not line.startswith(("\tat ", "\t..."))]
        return " | ".join(kept[-lines:])

    def _create_database(self) -> None:
        from sqlalchemy import create_engine, text
        from sqlalchemy.exc import SQLAlchemyError
        driver = self.postgres_uri.replace("postgresql://", "postgresql+psycopg2://", 1)  # pyiceberg's driver
        engine = create_engine(driver, isolation_level="AUTOCOMMIT")  # CREATE DATABASE runs in no transaction
        try:
            with engine.connect() as connection:
                if connection.execute(text("SELECT 1 FROM pg_database WHERE datname = :name"),
                                      {"name": self.database}).first() is None:
                    connection.execute(text(f'CREATE DATABASE "{self.database}"'))
        except SQLAlchemyError as exc:
            raise ConfigurationError(f"cannot create the REST catalog's database {self.database!r} on "
                                     f"{self.postgres_uri}: {str(exc).splitlines()[0]}") from None
        finally:
            engine.dispose()

    def _create_bucket(self) -> None:
        from pyarrow.fs import S3FileSystem
        scheme, _, address = self.s3_endpoint.partition("://")
        store = S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION, endpoint_override=address,
                             scheme=scheme, allow_bucket_creation=True)
        try:
            store.create_dir(self.bucket)  # nothing when it exists
        except OSError as exc:
            raise ConfigurationError(f"cannot create bucket {self.bucket!r} on {self.s3_endpoint}: {exc}") from None

    def __enter__(self) -> IcebergRestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["IcebergRestServer", "catalog_environment", "java_executable", "server_classpath"]
