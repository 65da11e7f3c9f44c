"""One Iceberg catalog, described once, opened from Python (pyiceberg) and from Spark alike.

    settings = CatalogSettings.from_env()             # TIDEMARK_CATALOG_URI, pyiceberg's configuration, or
                                                       # the embedded SQLite default
    catalog = settings.load()                          # the pyiceberg catalog
    CatalogSettings.embedded().load()                  # the embedded SQLite catalog, created the first time
    settings.spark_conf()                              # spark.sql.catalog.<name>.* for the session

``from_env`` reads, for the catalog named ``TIDEMARK_CATALOG_NAME`` (default ``lake``):

1. ``TIDEMARK_CATALOG_URI``: ``sqlite:///abs/path/catalog.db``, ``postgresql://user:password@host:port/db``
   (a SQL catalog: pyiceberg's SqlCatalog, Spark's JdbcCatalog on the same database) or ``http(s)://...``
   (a REST catalog), with ``TIDEMARK_WAREHOUSE``;
2. else pyiceberg's own configuration of that catalog (``.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__*``):
   a REST, Glue or Hive catalog, as pyiceberg opens it;
3. else the embedded SQLite catalog in ``TIDEMARK_HOME``.

In 1 and 3, the rest of pyiceberg's configuration of that catalog (object store settings such as
``s3.endpoint``, credentials) is kept, so a user who configured pyiceberg configures nothing twice. Spark's
properties are derived from the same settings (``catalog_properties.java_properties``). A catalog neither
describes is given with ``CatalogSettings.custom``.

Only code that asks for a new catalog gets one: ``CatalogSettings.embedded`` (or
``create_if_missing=True``) creates its SQLite database and directories when first loaded, and says
so in one warning. ``from_env`` never does, the embedded default included: a command that reads or
operates (``tidemark resolve``, ``gc``, ``unregister``), a reader or a writer run with ``TIDEMARK_HOME``
unset or mistyped gets a ``ConfigurationError`` naming the catalog it looked for, never a new empty
catalog that would answer "no such table" (or nothing) for tables that live elsewhere.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from contextlib import closing
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Optional
from urllib.parse import quote, unquote, urlsplit

from coordinator.errors import ConfigurationError, InvalidName, TableNotFound
from coordinator.iceberg.catalog_properties import (
    catalog_type,
    java_properties,
    pyiceberg_properties,
    pyiceberg_variables,
)
from coordinator.names import validate_name
from coordinator.settings import DEFAULT_CATALOG, Settings

if TYPE_CHECKING:  # pyiceberg's catalogs and tables are imported when first used (reading settings needs only its
    # small configuration module)
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table

SQLITE_BUSY_TIMEOUT_MS = 30_000
log = logging.getLogger(__name__)
# A catalog commit updates the table's row and then commits: a writer paused (GC, SIGSTOP) or cut off in
# between holds that row's lock, and every other commit to the table waited on it with no deadline and no
# log line (issue 22: a new leader claiming its sinks waited 95 s on a zombie held paused). PostgreSQL ends
# a session idle in a transaction this long (its commit is rolled back: it does not land), and a commit
# waits for a lock at most PG_LOCK_TIMEOUT_MS, then fails as an outage that the writer reports and rides out.
PG_IDLE_IN_TRANSACTION_MS = 10_000
PG_LOCK_TIMEOUT_MS = 20_000
# pyiceberg 0.12's REST client sets no timeout on its HTTP requests: a request sent into a connection that a
# partition, a load balancer or a NAT dropped silently waits for TCP to give up (about 15 minutes on Linux),
# and a leader waiting so keeps its leadership, its job stalled (the catalog-partition fault scenario). Every
# request of a REST catalog gets this deadline, in seconds, unless the catalog's properties set one under the
# key pyiceberg's next release reads for it (apache/iceberg-python#3418). A commit that times out may have
# landed: it is an outage with an unknown outcome, which the next leader reads back (``is_catalog_outage``).
REST_TIMEOUT_PROPERTY = "connection.timeout"
DEFAULT_REST_TIMEOUT_S = 60.0
# The AWS SDK's errors (as pyarrow's S3 file system words them) that pass: the store restarting, overloaded or
# out of reach.
AWS_TRANSIENT_ERRORS = ("NETWORK_CONNECTION", "SLOW_DOWN", "SERVICE_UNAVAILABLE", "INTERNAL_FAILURE",
                        "REQUEST_TIMEOUT", "THROTTLING")
PG_SESSION_OPTIONS = (f"-c lock_timeout={PG_LOCK_TIMEOUT_MS} "
                      f"-c idle_in_transaction_session_timeout={PG_IDLE_IN_TRANSACTION_MS}")


def is_catalog_outage(exc: BaseException) -> bool:
    """True when ``exc`` says the catalog or the object store under its warehouse could not be reached, or
    failed on the server's side (restarting, failing over, overloaded, or the network failed): a transient
    failure, worth trying again.

    - a SQL catalog's database: the connection failed or dropped;
    - a REST catalog: no connection or a timeout, or an answer of 5xx or 429 (pyiceberg's ``ServerError``,
      ``ServiceUnavailableError``, ``TooManyRequestsError``, and ``CommitStateUnknownException``: a commit
      answered 500, 502 or 504, which may have landed; whoever leads next reads the table back before it
      publishes, as ``publish.py`` does for every commit);
    - the object store (pyarrow's S3 file system): an ``OSError`` carrying one of the AWS SDK's transient
      errors (``AWS_TRANSIENT_ERRORS``, or an HTTP status of 5xx).
    A 409 is none of these: it is a commit that lost a race (``publish.lost_race``). Nor is a refused TLS
    handshake, a denied access or a missing bucket: a mistake to fix, not to wait out."""
    from pyiceberg.exceptions import (
        CommitStateUnknownException,
        ServerError,
        ServiceUnavailableError,
        TooManyRequestsError,
    )
    from requests import ConnectionError as RequestConnectionError
    from requests import Timeout
    from requests.exceptions import SSLError
    from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
    if isinstance(exc, (OperationalError, InterfaceError)) or (
            isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return True
    if isinstance(exc, SSLError):
        return False
    if isinstance(exc, (RequestConnectionError, Timeout, ServerError, ServiceUnavailableError, TooManyRequestsError,
                        CommitStateUnknownException)):
        return True
    message = str(exc)
    return isinstance(exc, OSError) and "AWS Error" in message and (
        any(error in message for error in AWS_TRANSIENT_ERRORS) or re.search(r"HTTP status 5\d\d", message) is not None)


def _give_rest_requests_a_deadline(catalog: Catalog) -> None:
    """Every HTTP request of a REST ``catalog`` from now on waits at most its ``connection.timeout`` (see
    ``REST_TIMEOUT_PROPERTY``). pyiceberg 0.12 has no hook for it: each of its session's transport adapters (its
    own, and SigV4's when signing is on) is given the deadline as its default. The requests that loading made
    (the server's configuration, the first token) had none."""
    from pyiceberg.catalog.rest import RestCatalog
    if not isinstance(catalog, RestCatalog):
        return
    raw = catalog.properties.get(REST_TIMEOUT_PROPERTY, DEFAULT_REST_TIMEOUT_S)
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = 0.0
    if not seconds > 0:
        raise ConfigurationError(f"the catalog's {REST_TIMEOUT_PROPERTY} is {raw!r}: give a number of seconds above "
                                 "0 (how long one request to the REST catalog may take)")
    session = catalog._session  # pyiceberg 0.12 gives no other way to reach its HTTP session
    for adapter in set(session.adapters.values()):
        send = adapter.send

        def send_by_deadline(request, *args, timeout=None, _send=send, **kwargs):  # type: ignore[no-untyped-def]
            return _send(request, *args, timeout=seconds if timeout is None else timeout, **kwargs)
        adapter.send = send_by_deadline  # type: ignore[method-assign]


@dataclass(frozen=True)
class CatalogSettings:
    """The catalog's name, its URI (SQL database or REST server) and warehouse, or properties for any catalog.

    ``python_properties`` are pyiceberg's (with a URI: added to those the URI gives, such as an object store's
    ``s3.*``); ``spark_properties`` are Spark's, derived from pyiceberg's when not given."""

    name: str = DEFAULT_CATALOG
    # repr=False: a URI may hold a password, the properties a client secret (describe() shows them safely)
    uri: Optional[str] = field(default=None, repr=False)
    warehouse: Optional[str] = None
    spark_properties: Mapping[str, str] = field(default_factory=dict, repr=False)
    python_properties: Mapping[str, str] = field(default_factory=dict, repr=False)
    create_if_missing: bool = False

    def __post_init__(self) -> None:
        validate_name(self.name, "catalog name")
        if self.uri is not None:
            _parse_uri(self.uri)  # fail at construction, with the message, not deep inside a driver

    @classmethod
    def embedded(cls, home: Optional[Path] = None, name: Optional[str] = None) -> CatalogSettings:
        """The embedded SQLite catalog in ``home`` (default ``TIDEMARK_HOME``), created when first loaded; its name
        is ``name``, else ``TIDEMARK_CATALOG_NAME``'s (as ``from_env`` names it), else ``lake``."""
        settings = Settings.from_env()
        home = Path(home or settings.home)
        return cls(name=name or settings.catalog_name, uri=f"sqlite:///{home / 'catalog.db'}",
                   warehouse=f"file://{home / 'warehouse'}", create_if_missing=True)

    @classmethod
    def from_env(cls, settings: Optional[Settings] = None, *, create_embedded: bool = False) -> CatalogSettings:
        """``TIDEMARK_CATALOG_URI`` / ``TIDEMARK_WAREHOUSE`` / ``TIDEMARK_CATALOG_NAME``, else pyiceberg's configuration
        of that catalog, else the embedded default in ``TIDEMARK_HOME`` (see the module docstring): the catalog the
        jobs, readers and commands use.

        :param create_embedded: the embedded default is created when first loaded (a script that sets up its
            tables); otherwise nothing is created, and loading a catalog that does not exist is a
            ``ConfigurationError``.
        :raises ConfigurationError: a malformed URI or pyiceberg configuration."""
        settings = settings or Settings.from_env()
        name = settings.catalog_name
        configured = pyiceberg_properties(name)
        uri = settings.catalog_uri
        if not uri and catalog_type(configured) == "sql" and "uri" in configured:
            # pyiceberg's SQL catalog is opened as Tidemark's own (with its session settings, and a JDBC form for
            # Spark): its SQLAlchemy URI without the driver (postgresql+psycopg2:// is postgresql://)
            uri = re.sub(r"^(\w+)\+\w+://", r"\1://", configured["uri"])
        if uri:
            kind, _ = _parse_uri(uri)
            warehouse = settings.warehouse or configured.get("warehouse") or (
                None if kind == "rest" else f"file://{settings.home / 'warehouse'}")  # a REST server has its own
            return cls(name=name, uri=uri, warehouse=warehouse,
                       python_properties=_without(configured, "type", "uri", "warehouse"))
        if "uri" in configured or "type" in configured:
            if settings.warehouse:
                configured["warehouse"] = settings.warehouse
            return cls(name=name, python_properties=configured)
        return replace(cls.embedded(settings.home, name=name), create_if_missing=create_embedded,
                       python_properties=_without(configured, "warehouse"))

    @classmethod
    def custom(cls, name: str, *, spark_properties: Mapping[str, str],
               python_properties: Mapping[str, str]) -> CatalogSettings:
        """Any Iceberg catalog: properties as Spark's SparkCatalog and pyiceberg's ``load_catalog`` expect them."""
        return cls(name=name, spark_properties=dict(spark_properties), python_properties=dict(python_properties))

    def environment(self) -> dict[str, str]:
        """The variables with which ``from_env`` in another process (``tidemark serve``, a driver) opens this catalog:
        ``TIDEMARK_CATALOG_NAME`` and pyiceberg's ``PYICEBERG_CATALOG__<NAME>__*``."""
        return {"TIDEMARK_CATALOG_NAME": self.name,
                **pyiceberg_variables(self.name, self.python_catalog_properties())}

    def spark_conf(self) -> dict[str, str]:
        """The ``spark.sql.catalog.<name>.*`` settings that open this catalog in a Spark session: Iceberg's
        ``SparkCatalog`` with its cache off (Spark must see refs Python moved); a SQL catalog as Iceberg's
        ``JdbcCatalog`` on the same database, others with ``spark_properties`` or those derived from pyiceberg's.

        :raises ConfigurationError: the SQLite database does not exist (and ``create_if_missing`` is not set), or
            Spark's properties cannot be derived from a pyiceberg catalog of this type.
        """
        prefix = f"spark.sql.catalog.{self.name}"
        kind, parts = _parse_uri(self.uri) if self.uri is not None else ("custom", {})
        if kind in ("custom", "rest"):
            java = dict(self.spark_properties) or java_properties(self.python_catalog_properties())
        else:  # a SQL catalog: what its URI does not say (s3.*, credentials), then the JDBC settings below
            java = java_properties({**self.python_properties, **({"warehouse": self.warehouse} if self.warehouse
                                                                 else {})})
        conf = {prefix: "org.apache.iceberg.spark.SparkCatalog", **{f"{prefix}.{k}": v for k, v in java.items()},
                f"{prefix}.cache-enabled": "false"}  # Spark must see refs that Python moved
        if kind in ("custom", "rest"):
            return conf
        conf[f"{prefix}.catalog-impl"] = "org.apache.iceberg.jdbc.JdbcCatalog"
        # pyiceberg creates the catalog tables (already in the V1 layout). Java must not probe them
        # itself: that probe leaves a read transaction open on its pooled connection, which pins a
        # stale SQLite snapshot and makes Python's commits fail with "database is locked".
        conf[f"{prefix}.jdbc.schema-version"] = "V1"
        conf[f"{prefix}.jdbc.init-catalog-tables"] = "false"
        if self.warehouse:
            conf[f"{prefix}.warehouse"] = self.warehouse
        if kind == "sqlite":
            self._require_database(parts["path"])
            conf[f"{prefix}.uri"] = f"jdbc:sqlite:{parts['path']}?journal_mode=WAL"
            conf[f"{prefix}.jdbc.busy_timeout"] = str(SQLITE_BUSY_TIMEOUT_MS)
        else:
            conf[f"{prefix}.uri"] = f"jdbc:postgresql://{parts['host']}:{parts['port']}/{parts['database']}"
            if parts["user"]:
                conf[f"{prefix}.jdbc.user"] = parts["user"]
            if parts["password"]:
                conf[f"{prefix}.jdbc.password"] = parts["password"]
            # The same session settings as Python's (the PostgreSQL driver's ``options`` property): a Spark
            # commit waits on a row lock no longer than Python's does.
            conf[f"{prefix}.jdbc.options"] = PG_SESSION_OPTIONS
        return conf

    def python_catalog_properties(self) -> dict[str, str]:
        """The properties pyiceberg's ``load_catalog`` opens this catalog with: ``python_properties``, and with a
        URI its ``type``, ``uri`` (SQLite with a busy timeout, PostgreSQL with Tidemark's session settings) and
        ``warehouse``.

        :raises ConfigurationError: the SQLite database does not exist (and ``create_if_missing`` is not set).
        """
        if self.uri is None:
            return dict(self.python_properties)
        kind, parts = _parse_uri(self.uri)
        props = {**self.python_properties, "type": "sql" if kind != "rest" else "rest"}
        if self.warehouse:
            props["warehouse"] = self.warehouse
        if kind == "rest":
            props["uri"] = self.uri
        elif kind == "sqlite":
            self._require_database(parts["path"])
            props["uri"] = f"sqlite:///{parts['path']}?timeout={SQLITE_BUSY_TIMEOUT_MS // 1000}"
        else:
            auth = parts["user"] + (f":{parts['password']}" if parts["password"] else "") + "@" if parts["user"] else ""
            props["uri"] = (f"postgresql+psycopg2://{auth}{parts['host']}:{parts['port']}/{parts['database']}"
                            f"?options={quote(PG_SESSION_OPTIONS)}")
        return props

    def describe(self) -> str:
        """The catalog, for messages: its name and URI, without a password."""
        uri = self.uri or self.python_properties.get("uri")
        if uri is None:
            return f"catalog {self.name!r} (custom properties)"
        parts = urlsplit(uri)
        shown = parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl() if parts.password \
            else uri
        return f"catalog {self.name!r} at {shown}"

    def _require_database(self, path: str) -> None:
        if not self.create_if_missing and not Path(path).is_file():
            raise ConfigurationError(
                f"Iceberg {self.describe()} does not exist: point TIDEMARK_CATALOG_URI (and TIDEMARK_CATALOG_NAME) "
                "at the catalog your jobs use, or TIDEMARK_HOME at the directory of its embedded one; the "
                "embedded catalog is created only by a program that asks for it (CatalogSettings.embedded())")

    def load(self) -> Catalog:
        """The pyiceberg catalog, or a ConfigurationError saying why the database cannot be opened."""
        from pyiceberg.catalog import load_catalog
        new = self._new_database()
        if new is not None:
            try:
                Path(new).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigurationError(f"cannot create the catalog's directory {Path(new).parent}: "
                                         f"{exc.strerror or exc}; set TIDEMARK_HOME to a writable directory") from None
        properties = self.python_catalog_properties()  # a missing database: its own ConfigurationError, not wrapped
        try:
            catalog = load_catalog(self.name, **properties)
        except Exception as exc:  # noqa: BLE001 - any driver error becomes one readable line
            raise ConfigurationError(
                f"cannot open Iceberg {self.describe()}: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}; check the URI, that the catalog's server "
                "(database or REST) is running and that the credentials are right") from None
        _give_rest_requests_a_deadline(catalog)
        if new is not None and Path(new).is_file():
            _write_ahead_log(new)
            log.warning("created a new, empty Iceberg catalog %r at %s: set TIDEMARK_HOME if your tables live "
                        "elsewhere", self.name, "/" + new.lstrip("/"))
        return catalog

    def _new_database(self) -> Optional[str]:
        """The SQLite file that loading this catalog is about to create, if any."""
        if not self.create_if_missing or self.uri is None:
            return None
        kind, parts = _parse_uri(self.uri)
        return parts["path"] if kind == "sqlite" and not Path(parts["path"]).exists() else None

    def identifier(self, table: str) -> str:
        """Strip the catalog name Spark uses (``lake.db.t``) to the identifier pyiceberg uses (``db.t``)."""
        prefix = self.name + "."
        return table[len(prefix):] if table.startswith(prefix) else table


def _write_ahead_log(path: str) -> None:
    """A new SQLite catalog journals to a write-ahead log (kept in the file: Spark's JDBC URL asks for it too), so
    its readers (``tidemark serve``, resolvers, dashboards) never block a commit, nor a commit them."""
    import sqlite3
    with closing(sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_MS / 1000)) as database:
        database.execute("PRAGMA journal_mode=WAL")


def load_table(catalog: Catalog, settings: CatalogSettings, table: str) -> Table:
    """The pyiceberg table; ``TableNotFound`` when it does not exist, ``InvalidName`` without a namespace."""
    from pyiceberg.exceptions import NoSuchIdentifierError, NoSuchNamespaceError, NoSuchTableError
    identifier = settings.identifier(validate_name(table, "table name"))
    if "." not in identifier:
        raise InvalidName(f"table {table!r} has no namespace: name it namespace.table "
                          f"(or {settings.name}.namespace.table)")
    try:
        return catalog.load_table(identifier)
    except (NoSuchTableError, NoSuchNamespaceError, NoSuchIdentifierError):
        raise TableNotFound(f"Iceberg table {table!r} does not exist in {settings.describe()}: create it there "
                            "(CatalogSettings.from_env() opens the catalog the jobs use), or check its name") from None


def _without(properties: Mapping[str, str], *keys: str) -> dict[str, str]:
    return {k: v for k, v in properties.items() if k not in keys}


def _parse_uri(uri: str) -> tuple[str, dict[str, str]]:
    hint = ("use sqlite:///absolute/path/catalog.db, postgresql://user:password@host:port/database or a REST "
            "catalog's http(s)://host:port/path, or CatalogSettings.custom(...) for another catalog")
    try:
        parts = urlsplit(uri)
        port = parts.port
    except ValueError:
        raise ConfigurationError(f"catalog URI {uri!r} is malformed: {hint}") from None
    if parts.scheme == "sqlite":
        path = unquote(parts.path)
        if parts.netloc or not path.startswith("/") or path == "/":
            raise ConfigurationError(f"catalog URI {uri!r} needs an absolute file path: {hint}")
        return "sqlite", {"path": path}
    if parts.scheme in ("postgresql", "postgres"):
        database = parts.path.lstrip("/")
        if not parts.hostname or not database:
            raise ConfigurationError(f"catalog URI {uri!r} needs a host and a database: {hint}")
        return "postgresql", {"host": parts.hostname, "port": str(port or 5432), "database": database,
                              "user": unquote(parts.username or ""), "password": unquote(parts.password or "")}
    if parts.scheme in ("http", "https"):
        if not parts.hostname:
            raise ConfigurationError(f"catalog URI {uri!r} needs a host: {hint}")
        return "rest", {}
    raise ConfigurationError(f"catalog URI {uri!r} has an unsupported scheme {parts.scheme!r}: {hint}")
