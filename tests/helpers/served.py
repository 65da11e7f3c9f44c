"""``tidemark serve`` as a real process for the tests, and a reader that knows nothing of Tidemark reading through it.

    with ServeProcess(settings, zk_connect, work_dir) as served:        # `tidemark serve --port P`, until stopped
        reader = ServedReader(served.url, tables, invariant)              # pyiceberg's RestCatalog, URI only
        reader.observe()                                                 # load every table, read, check the rule
        reader.reading.wait()                                            # a read under way
        reader.reads, reader.failures, reader.mixed, reader.stepped_back
        served.kill(); served.start()                                    # the endpoint killed mid-query, restarted

``ServedReader`` reads each table's ``Tidemark-Epoch`` header too: the tables of one read must have one epoch (the
switch race) and a read's epoch must never be below an earlier one's (served versions never step back).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Callable, Optional

from coordinator.iceberg.catalog import CatalogSettings
from coordinator.operations.zookeeper_server import free_port
from tests.helpers.cli import TIDEMARK

START_TIMEOUT_S = 60.0


def serve_environment(settings: CatalogSettings) -> dict[str, str]:
    """The variables that make ``CatalogSettings.from_env()`` open ``settings``' catalog in another process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYICEBERG_CATALOG__", "TIDEMARK_CATALOG"))}
    return {**env, **settings.environment()}


def wait_healthy(process: subprocess.Popen, url: str, what: str, log_tail: Callable[[], str],
                 timeout: float = START_TIMEOUT_S) -> None:
    """Wait until ``url`` answers (a started server's health route); ``RuntimeError`` with ``log_tail()`` when
    ``process`` exits first or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}: {log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not answer within {timeout:.0f}s: {log_tail()}")


class ServeProcess:
    """``tidemark serve`` on a free loopback port, its output in ``work_dir/serve.log``."""

    def __init__(self, settings: CatalogSettings, zk_connect: str, work_dir: Path, *args: str,
                 env: Optional[Mapping[str, str]] = None) -> None:
        """``args``: ``tidemark serve``'s options; ``env``: variables beside the catalog's (``TIDEMARK_SERVE_*``)."""
        self.settings, self.zk_connect, self.work_dir, self.args = settings, zk_connect, Path(work_dir), args
        self.env = dict(env or {})
        self.port = free_port()
        self.process: Optional[subprocess.Popen] = None
        self.log_path = self.work_dir / "serve.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServeProcess:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [*TIDEMARK, "--zk", self.zk_connect, "--timeout", "5", "serve", "--port", str(self.port), *self.args],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**serve_environment(self.settings), **self.env})
        wait_healthy(self.process, f"{self.url}/healthz", "tidemark serve", self.log_tail)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> ServeProcess:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def own_storage(settings: CatalogSettings) -> dict[str, str]:
    """The object-store settings and credentials of ``settings``' catalog, as a client configured with its own
    access to the store has them (``tidemark serve`` hands no credentials to a client that did not authenticate)."""
    from coordinator.serving.server import storage_config
    return storage_config(settings.python_catalog_properties(), with_credentials=True)


class ServedReader:
    """Reads ``tables`` (``catalog.namespace.table`` names) through the endpoint with pyiceberg's ``RestCatalog``
    configured with the URI and the client's own ``storage`` settings (``own_storage``), and checks every read with
    ``invariant`` (frames by those names)."""

    def __init__(self, url: str, tables: list[str], invariant: Callable[[Mapping], Optional[str]],
                 warehouse: Optional[str] = None, storage: Optional[Mapping[str, str]] = None) -> None:
        self.url, self.tables, self.invariant, self.warehouse = url, list(tables), invariant, warehouse
        self.storage = dict(storage or {})
        self.reads = 0
        self.failures: list[str] = []       # reads that broke the tables' rule
        self.mixed: list[str] = []          # reads whose tables came at different epochs (the switch race)
        self.stepped_back: list[str] = []   # reads whose epoch was below an earlier read's
        self.errors: list[str] = []         # reads that could not be made (an outage)
        self.epochs: list[int] = []
        self.reading = threading.Event()    # set while a read is under way (a fault may wait for it)
        self._catalog: Optional[Any] = None  # pyiceberg's RestCatalog, made on first use and again after an error
        self._local = threading.local()
        self._lock = threading.Lock()  # reads may run in several threads through one client
        self._loaded: list[tuple[float, int]] = []  # (when a read's loads were answered, its epoch)

    def catalog(self):
        if self._catalog is None:
            from pyiceberg.catalog.rest import RestCatalog
            properties = {**self.storage, "uri": self.url, **({"warehouse": self.warehouse} if self.warehouse else {})}
            catalog = RestCatalog("served", **properties)
            catalog._session.hooks["response"].append(self._record)  # the epoch each table came at
            self._catalog = catalog
        return self._catalog

    def _record(self, response, *args, **kwargs):
        epoch = response.headers.get("Tidemark-Epoch")
        if epoch is not None and getattr(self._local, "epochs", None) is not None:
            self._local.epochs.append(int(epoch))
            self._local.seen.append(f"{response.url.rsplit('/', 1)[-1]}@{epoch} {time.monotonic():.3f}")
        return response

    def panel(self) -> None:
        """One table alone (a dashboard's other panel): loaded and read, not checked; an error is counted."""
        try:
            self.catalog().load_table(self.tables[-1].split(".", 1)[1]).scan().to_arrow()
        except Exception as exc:  # noqa: BLE001 - an outage the caller injected; counted, never a pass
            self._catalog = None
            self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    def observe(self) -> Optional[int]:
        """One read of every table, checked; its epoch (None when the endpoint served no version)."""
        self._local.epochs, self._local.seen = [], []
        self.reading.set()
        started = time.monotonic()
        try:
            catalog = self.catalog()
            loaded = {t: catalog.load_table(t.split(".", 1)[1]) for t in self.tables}
            epochs = list(self._local.epochs)
            loaded_at = time.monotonic()
            frames = {t: table.scan().to_arrow() for t, table in loaded.items()}
        except Exception as exc:  # noqa: BLE001 - an outage the caller injected; counted, never a pass
            self._catalog = None
            self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            return None
        finally:
            self._local.epochs = None
            self.reading.clear()
        self.reads += 1
        self._local.epochs = None
        problem = self.invariant(frames)
        epoch = epochs[0] if epochs else None
        if problem is not None:
            self.failures.append(f"epoch {epoch}: {problem}")
        if len(set(epochs)) > 1:
            self.mixed.append(f"one read got the epochs {sorted(set(epochs))}: {self._local.seen}")
        if epoch is not None:
            with self._lock:  # back: below a read whose loads were answered before this read's began
                before = [e for at, e in self._loaded if at < started]
                if before and epoch < max(before):
                    self.stepped_back.append(f"from {max(before)} to {epoch}")
                self._loaded.append((loaded_at, epoch))
                self.epochs.append(epoch)
        return epoch


# -- the engines' reads of two tables in one query (tests/test_serve_engines.py and `python -m bench serve --race`) --

def two_table_sql(catalog: str, up: str, down: str) -> str:
    """One query over both tables: each one's row count and epoch sum (equal at one version of a copy)."""
    return (f"SELECT u.n, u.s, d.n, d.s FROM (SELECT count(*) n, sum(epoch) s FROM {catalog}.{up}) u "
            f"CROSS JOIN (SELECT count(*) n, sum(epoch) s FROM {catalog}.{down}) d")


def as_pairs(row: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    """``two_table_sql``'s row as ((up count, up epoch sum), (down count, down epoch sum))."""
    return (row[0], row[1]), (row[2], row[3])


def duckdb_read(url: str, warehouse: str, secret: str, sql: str,
                attach_options: str = "AUTHORIZATION_TYPE 'none', ACCESS_DELEGATION_MODE 'none'",
                ) -> tuple[tuple[int, int], tuple[int, int]]:
    """``sql`` (over the attachment ``served``) in a new DuckDB session that makes ``secret`` and attaches the
    endpoint with ``attach_options`` (by default: anonymous, with its own S3 secret, for the endpoint vends no
    credentials to anonymous clients). DuckDB keeps the tables an attachment loaded for the attachment's life, so a
    session is one notebook cell or one job."""
    from coordinator import duckdb_extensions
    with duckdb_extensions() as con:  # offline: the extensions from their pip packages
        con.execute(secret)
        con.execute(f"ATTACH '{warehouse}' AS served (TYPE iceberg, ENDPOINT '{url}', {attach_options})")
        row = con.sql(sql).fetchone()
    assert row is not None
    return as_pairs(row)


def pyiceberg_read(catalog: Any, tables: list[str]) -> list[tuple[int, int]]:
    """A query as pyiceberg's guarantee asks (docs/reading.md): its tables loaded back to back, then each read: each
    table's count and epoch sum."""
    loaded = [catalog.load_table(t) for t in tables]
    frames = [table.scan().to_arrow() for table in loaded]
    return [(f.num_rows, sum(f.column("epoch").to_pylist())) for f in frames]


class EpochRecordingClient:
    """A client as dashboards and reader threads are: one long-lived pyiceberg ``RestCatalog`` (URI alone) running
    ``shapes`` in turn (a dashboard's panels: each query a list of tables, each loaded, then read), ``pause_s``
    between queries (the client's own pace, not a wait for the server). Each query's epochs, one per table
    (``Tidemark-Epoch``), go to ``queries``; a query that failed (a replica killed under it) to ``errors`` and is
    made again."""

    def __init__(self, url: str, shapes: list[list[str]], pause_s: float) -> None:
        from pyiceberg.catalog.rest import RestCatalog
        self.shapes, self.pause_s = shapes, pause_s
        self.catalog = RestCatalog("served", uri=url)
        self.catalog._session.hooks["response"].append(self._record)
        self.queries: list[list[int]] = []
        self.errors: list[str] = []
        self._epochs: list[int] = []
        self.trace: list[str] = []

    def _record(self, response, *args, **kwargs):
        epoch = response.headers.get("Tidemark-Epoch")
        if epoch is not None:
            self._epochs.append(int(epoch))
            self.trace.append(f"{time.time():.3f} {response.url.rsplit('/', 1)[-1]}@{epoch} "
                              f"sent {response.request.headers.get('Cookie')} got {response.headers.get('Set-Cookie')}")
        return response

    def run(self, queries: int, attempts: int = 5) -> None:
        """``queries`` queries, the shapes in turn; a failed query is made again, up to ``attempts`` times."""
        for i in range(queries):
            for _ in range(attempts):
                self._epochs = []
                try:
                    pyiceberg_read(self.catalog, self.shapes[i % len(self.shapes)])
                except Exception as exc:  # noqa: BLE001 - a fault the test injected: counted, made again
                    self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                    continue
                self.queries.append(self._epochs)
                break
            time.sleep(self.pause_s)

    def straddled(self) -> list[list[int]]:
        """The queries whose tables came at more than one epoch."""
        return [q for q in self.queries if len(set(q)) > 1]

    def stepped_back(self) -> list[tuple[int, int]]:
        """(newest before, epoch) for each query whose epoch was below an earlier query's."""
        found, newest = [], 0
        for query in self.queries:
            if query and min(query) < newest:
                found.append((newest, min(query)))
            newest = max([newest, *query])
        return found
