"""Reading a resolved version with pandas, polars, DuckDB, Spark SQL or Trino (docs/reading.md).

    reader = VersionReader.resolve(["lake.db.orders", "lake.db.big_orders"], tm)   # newest consistent version
    big = reader.pandas("lake.db.big_orders", columns=["id"], row_filter="amount > 5000")   # or .polars, .arrow
    con = reader.duckdb()                     # a DuckDB view per table: orders, big_orders
    con.sql("SELECT count(*) FROM orders JOIN big_orders USING (id)")
    version_sql(reader.resolver, reader.version)   # Spark SQL / Trino: {table: "SELECT ... FOR VERSION AS OF ..."}
    con = duckdb_iceberg_connection(reader.resolver)   # DuckDB's own Iceberg extension, from its PyPI package
    con = duckdb_extensions()                 # the same extensions alone: ATTACH tidemark serve, offline
    con.sql(duckdb_iceberg_sql(reader.resolver, reader.version)["lake.db.orders"])   # iceberg_scan by snapshot id

The parts: ``VersionReader`` (pyiceberg scans at the version's snapshot ids, as Arrow, pandas, polars or DuckDB
views), ``version_sql`` (Spark SQL and Trino read Iceberg by ref: a tag or a snapshot id), and
``duckdb_iceberg_sql`` with ``duckdb_iceberg_connection`` (DuckDB's own Iceberg extension, by snapshot id), and
``duckdb_extensions`` (those extensions from their PyPI packages, for an ``ATTACH`` of ``tidemark serve``).

pandas, polars and duckdb are the ``readers`` extra (``pip install '.[readers]'`` in a clone):
each is imported when first used, and a missing one is a ``ConfigurationError`` naming the extra.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Optional, Union

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.parser import parse as parse_filter
from pyiceberg.table import DataScan
from pyparsing import ParseException

from coordinator.errors import ConfigurationError, InvalidArgument
from coordinator.history.resolve import Resolver, scan_at, table_at
from coordinator.history.versions import tag_at
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.iceberg.catalog_properties import path_style_addressing, s3_setting
from coordinator.protocol.pipelines import Group
from coordinator.records import ConsistencyLevel, ConsistentVersion
from coordinator.zookeeper.session import ZooKeeperSession

if TYPE_CHECKING:
    import duckdb
    import pandas as pd
    import polars as pl
    import pyarrow as pa

RowFilter = Union[str, BooleanExpression]
# An identifier part Spark SQL and Trino both take unquoted; any other part is quoted.
_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# DuckDB's extensions an Iceberg read needs (Avro manifests; S3 through httpfs), loaded in this order, each from
# the file its PyPI package duckdb-extension-<name> ships for one duckdb release.
DUCKDB_EXTENSIONS = ("avro", "httpfs", "iceberg")
_EXTENSIONS_PIP = "pip install duckdb-extension-iceberg duckdb-extension-httpfs duckdb-extension-avro"


@dataclass(frozen=True)
class VersionReader:
    """The tables of one resolved version (``Resolver.resolve`` or ``ReaderSession.resolve``), read by snapshot id.

    Every DataFrame and view is a pyiceberg scan of one table at its snapshot of the version: ``columns``
    (pyiceberg's ``selected_fields``) and ``row_filter`` (a pyiceberg expression or its string form,
    ``"amount > 5000 and id < 10"``) are pushed into the scan, so Iceberg skips files by partition and column
    statistics and reads only the columns asked for. Delete files, schema evolution and the object store are
    pyiceberg's, so any table pyiceberg reads, these readers read.
    """

    resolver: Resolver
    version: ConsistentVersion

    @classmethod
    def resolve(cls, tables: Iterable[str], tm: Optional[ZooKeeperSession] = None, *,
                settings: Optional[CatalogSettings] = None,
                level: Union[str, ConsistencyLevel] = ConsistencyLevel.CONSISTENT,
                as_of: Optional[int] = None, scope: str = Group.PIPELINE.value) -> VersionReader:
        """Resolve ``tables`` at ``level`` (or ``as_of`` an epoch) across ``scope`` (``Resolver.resolve``: their
        pipelines by default): with ZooKeeper when ``tm`` is given, else from Iceberg metadata alone; the catalog
        is ``settings`` or the environment's (``CatalogSettings.from_env``)."""
        settings = settings or CatalogSettings.from_env()
        resolver = Resolver(settings.load(), settings, tm)
        return cls(resolver, resolver.resolve(tables, level, as_of, scope=scope))

    @property
    def tables(self) -> list[str]:
        """The version's table names, sorted, as the version names them."""
        return sorted(self.version.snapshots)

    def scan(self, table: str, *, columns: Optional[Sequence[str]] = None,
             row_filter: Optional[RowFilter] = None) -> Optional[DataScan]:
        """The pyiceberg scan of ``table`` at its snapshot, or None when the table had no snapshot then (empty)."""
        name = self._name(table)
        return scan_at(self.resolver, name, self.version.snapshots[name], row_filter=_row_filter(row_filter),
                       selected_fields=_columns(columns))

    def arrow(self, table: str, *, columns: Optional[Sequence[str]] = None,
              row_filter: Optional[RowFilter] = None) -> pa.Table:
        """``table`` at its snapshot as a ``pyarrow.Table`` (empty, with the schema asked for, when it had none)."""
        scan = self.scan(table, columns=columns, row_filter=row_filter)
        try:
            if scan is not None:
                return scan.to_arrow()
            schema = self.resolver.table(self._name(table), refresh=False).schema()
            return (schema if columns is None else schema.select(*_columns(columns))).as_arrow().empty_table()
        except ValueError as exc:  # a column or a filter that names no field of the table
            raise InvalidArgument(f"cannot read {self._name(table)}: {_first_line(exc)}") from None

    def pandas(self, table: str, *, columns: Optional[Sequence[str]] = None,
               row_filter: Optional[RowFilter] = None) -> pd.DataFrame:
        """``table`` at its snapshot as a pandas DataFrame (the ``readers`` extra)."""
        _optional("pandas")  # pyarrow converts, but needs pandas
        return self.arrow(table, columns=columns, row_filter=row_filter).to_pandas()

    def polars(self, table: str, *, columns: Optional[Sequence[str]] = None,
               row_filter: Optional[RowFilter] = None) -> pl.DataFrame:
        """``table`` at its snapshot as a polars DataFrame (the ``readers`` extra)."""
        polars = _optional("polars")
        frame: pl.DataFrame = polars.from_arrow(self.arrow(table, columns=columns, row_filter=row_filter))
        return frame

    def duckdb(self, connection: Optional[duckdb.DuckDBPyConnection] = None, *,
               columns: Optional[Mapping[str, Sequence[str]]] = None,
               row_filters: Optional[Mapping[str, RowFilter]] = None) -> duckdb.DuckDBPyConnection:
        """Register every table of the version as a view named after its last identifier part (``lake.db.orders``:
        ``orders``) on ``connection`` (a new in-memory one by default) and return it. ``columns`` and
        ``row_filters`` map table names to what to read of them. The scans are read into memory here (DuckDB
        queries the Arrow tables without copying them): ``columns`` and ``row_filters`` keep that to what the
        queries need."""
        duckdb_module = _optional("duckdb")
        chosen = {self._name(t): c for t, c in (columns or {}).items()}
        where = {self._name(t): f for t, f in (row_filters or {}).items()}
        views = _view_names(self.tables)
        con: duckdb.DuckDBPyConnection = connection if connection is not None else duckdb_module.connect()
        for name, view in views.items():
            con.register(view, self.arrow(name, columns=chosen.get(name), row_filter=where.get(name)))
        return con

    def sql(self) -> dict[str, str]:
        """``version_sql`` of this version: one Spark SQL / Trino statement per table."""
        return version_sql(self.resolver, self.version)

    def _name(self, table: str) -> str:
        """``table`` as the version names it (``lake.db.t`` and ``db.t`` are the same table)."""
        if table in self.version.snapshots:
            return table
        identifier = self.resolver.settings.identifier
        found = [n for n in self.version.snapshots if identifier(n) == identifier(str(table))]
        if not found:
            raise InvalidArgument(f"table {table!r} is not in this version; it has {', '.join(self.tables)}")
        return found[0]


def version_sql(resolver: Resolver, version: ConsistentVersion, by_tag: bool = True) -> dict[str, str]:
    """``{table: "SELECT * FROM <table> FOR VERSION AS OF <ref>"}`` for Spark SQL (3.3+) and Trino, the one place
    a version becomes SQL: the ref is a Tidemark tag at ``T`` (``'tidemark-<pipeline>-<T>'``) when the table carries
    one at its snapshot of the version (and ``by_tag``), else the snapshot id; a table empty at the version selects
    nothing. Table names start
    with the catalog's name as Spark knows it (``CatalogSettings.name``, ``lake``). A snapshot that is not a
    retained version may be expired by GC once newer versions exist: pin it (``ReaderSession.pin``) for long
    reads."""
    statements = {}
    for table, snapshot_id in sorted(version.snapshots.items()):
        quoted = _quoted(f"{resolver.settings.name}.{resolver.settings.identifier(table)}")
        if snapshot_id is None:
            statements[table] = f"SELECT * FROM {quoted} WHERE false"
            continue
        tag = None if version.epoch is None or not by_tag else \
            tag_at(resolver.table(table, refresh=False).metadata.refs, version.epoch, snapshot_id)
        by = f"'{tag}'" if tag is not None else str(snapshot_id)
        statements[table] = f"SELECT * FROM {quoted} FOR VERSION AS OF {by}"
    return statements


def duckdb_iceberg_sql(resolver: Resolver, version: ConsistentVersion) -> dict[str, str]:
    """``{table: "SELECT * FROM iceberg_scan('<metadata file>', snapshot_from_id => <id>)"}``: each table at its
    snapshot of the version, for DuckDB's own Iceberg extension, which reads the tables itself as the query runs
    (a ``duckdb_iceberg_connection``; by snapshot id: it cannot read tags, duckdb-iceberg #1252); a table empty
    at the version selects nothing, with its columns. The metadata file is the one ``resolver`` holds the table
    by (reloaded when it predates the snapshot). A snapshot that is not a retained version may be expired by GC
    once newer versions exist: pin it (``ReaderSession.pin``) for long reads."""
    statements = {}
    for table, snapshot_id in sorted(version.snapshots.items()):
        if snapshot_id is None:
            location = resolver.table(table, refresh=False).metadata_location
            statements[table] = f"SELECT * FROM iceberg_scan({_sql_string(location)}) WHERE false"
            continue
        if snapshot_id < 0:  # Iceberg's writers make positive ids; DuckDB takes no other (UBIGINT)
            raise InvalidArgument(f"{table}'s snapshot id {snapshot_id} is negative: DuckDB's iceberg_scan reads "
                                  "only positive ones; read this table with VersionReader.duckdb")
        location = table_at(resolver, table, snapshot_id).metadata_location
        statements[table] = f"SELECT * FROM iceberg_scan({_sql_string(location)}, snapshot_from_id => {snapshot_id})"
    return statements


def duckdb_extensions(connection: Optional[duckdb.DuckDBPyConnection] = None) -> duckdb.DuckDBPyConnection:
    """``connection`` (a new in-memory one by default, set never to install an extension by itself) with DuckDB's
    Avro, httpfs and Iceberg extensions loaded from their PyPI packages' files: what ``iceberg_scan`` and an
    ``ATTACH ... (TYPE iceberg, ENDPOINT ...)`` of ``tidemark serve`` need, with DuckDB downloading nothing (offline
    too). The extensions are the release of the installed duckdb, from ``pip install duckdb-extension-iceberg
    duckdb-extension-httpfs duckdb-extension-avro``.

    :param connection: the DuckDB connection to load them into; None makes a new in-memory one.
    :raises ConfigurationError: an extension package is missing (the message names the pip line), or DuckDB cannot
        load its file.
    """
    duckdb_module = _optional("duckdb")
    con: duckdb.DuckDBPyConnection = (connection if connection is not None else
                                      duckdb_module.connect(config={"autoinstall_known_extensions": False}))
    for name in DUCKDB_EXTENSIONS:
        path = _extension_file(name, duckdb_module.__version__)
        try:
            con.execute(f"LOAD {_sql_string(str(path))}")
        except duckdb_module.Error as exc:
            raise ConfigurationError(f"DuckDB {duckdb_module.__version__} cannot load its {name} extension from "
                                     f"{path}: {_first_line(exc)}") from None
    return con


def duckdb_iceberg_connection(resolver: Resolver, connection: Optional[duckdb.DuckDBPyConnection] = None
                              ) -> duckdb.DuckDBPyConnection:
    """``connection`` with DuckDB's extensions loaded from their PyPI packages (``duckdb_extensions``) and, when
    the catalog's pyiceberg properties name S3 settings, the S3 secret ``tidemark_<catalog name>`` made of them
    (replaced on each call): what ``duckdb_iceberg_sql``'s queries need.

    :raises ConfigurationError: an extension package is missing, or DuckDB cannot load it."""
    con = duckdb_extensions(connection)
    secret = _s3_secret(resolver.settings.name, resolver.catalog.properties)
    if secret is not None:
        con.execute(secret)
    return con


def _extension_file(name: str, duckdb_version: str) -> Path:
    """The file of DuckDB's extension ``name`` for this duckdb, as its PyPI package ships it."""
    package = f"duckdb_extension_{name}"
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(f"DuckDB's {name} extension is not installed: {_EXTENSIONS_PIP} (the release of "
                                 f"the installed duckdb, {duckdb_version})")
    shipped = Path(next(iter(spec.submodule_search_locations))) / "extensions"
    path = shipped / f"v{duckdb_version}" / f"{name}.duckdb_extension"
    if not path.is_file():
        built = sorted(p.name for p in shipped.glob("v*")) or ["none"]
        raise ConfigurationError(f"the package duckdb-extension-{name} has no extension for duckdb {duckdb_version} "
                                 f"(it has {', '.join(built)}): pip install duckdb-extension-{name}=={duckdb_version}")
    return path


def _s3_secret(catalog: str, properties: Mapping[str, str]) -> Optional[str]:
    """DuckDB's ``CREATE SECRET`` for the S3 settings of a catalog's pyiceberg properties (``s3.*``, else
    pyiceberg's ``client.*`` twins; buckets by path unless ``s3.force-virtual-addressing``; http when the
    endpoint is), or None when they name none."""
    given = {"KEY_ID": s3_setting(properties, "access-key-id"),
             "SECRET": s3_setting(properties, "secret-access-key"),
             "SESSION_TOKEN": s3_setting(properties, "session-token"),
             "REGION": s3_setting(properties, "region")}
    options = [f"{key} {_sql_string(value)}" for key, value in given.items() if value is not None]
    endpoint = str(properties["s3.endpoint"]) if properties.get("s3.endpoint") else None
    if endpoint is not None:
        scheme, _, address = endpoint.rpartition("://")
        options += [f"ENDPOINT {_sql_string(address.rstrip('/'))}",
                    f"URL_STYLE {_sql_string('path' if path_style_addressing(properties) else 'vhost')}",
                    f"USE_SSL {'false' if scheme.lower() == 'http' else 'true'}"]
    if not options:
        return None
    return f"CREATE OR REPLACE SECRET {_sql_identifier(f'tidemark_{catalog}')} (TYPE s3, {', '.join(options)})"


def _sql_string(value: str) -> str:
    """``value`` as a SQL string literal (DuckDB's: a quote doubled, nothing else escaped)."""
    return "'" + value.replace("'", "''") + "'"


def _sql_identifier(value: str) -> str:
    """``value`` as a double-quoted SQL identifier."""
    return '"' + value.replace('"', '""') + '"'


def _quoted(name: str) -> str:
    """Backquote the parts Spark SQL would not take bare (Trino quotes them with double quotes instead)."""
    return ".".join(part if _PLAIN.match(part) else f"`{part}`" for part in name.split("."))


def _row_filter(row_filter: Optional[RowFilter]) -> BooleanExpression:
    if row_filter is None:
        return AlwaysTrue()
    if isinstance(row_filter, BooleanExpression):
        return row_filter
    if not isinstance(row_filter, str):
        raise InvalidArgument(f"row_filter must be a pyiceberg expression or its text, got {str(row_filter)[:60]!r}")
    try:
        return parse_filter(row_filter)
    except ParseException as exc:
        raise InvalidArgument(f"row filter {row_filter[:80]!r} is not a pyiceberg expression (at character "
                              f"{exc.loc + 1}): write it as \"amount > 5000 and id in (1, 2)\"") from None


def _columns(columns: Optional[Sequence[str]]) -> tuple[str, ...]:
    if columns is None:
        return ("*",)
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise InvalidArgument(f"columns must be a list of column names, got {str(columns)[:60]!r}")
    if not columns:
        raise InvalidArgument("columns is empty: name at least one column, or leave it out to read them all")
    return tuple(columns)


def _view_names(tables: Sequence[str]) -> dict[str, str]:
    """Each table's view name, its last identifier part; two tables sharing it cannot both be views."""
    views: dict[str, str] = {}
    for table in tables:
        view = table.rsplit(".", 1)[-1]
        clash = [t for t, v in views.items() if v == view]
        if clash:
            raise InvalidArgument(f"tables {clash[0]} and {table} would both be the view {view!r}: read them into "
                                  "separate connections, or register one yourself (connection.register(name, "
                                  "reader.arrow(table)))")
        views[table] = view
    return views


def _optional(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigurationError(f"{module} is not installed: install the package with its readers extra "
                                 "(pip install '.[readers]' in a clone)") from None


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
