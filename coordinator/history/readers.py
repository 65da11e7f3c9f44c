"""Reading a resolved version with pandas, polars, DuckDB, Spark SQL or Trino.

    reader = VersionReader.resolve(["lake.db.orders", "lake.db.big_orders"], tm)   # newest consistent version
    big = reader.pandas("lake.db.big_orders", columns=["id"], row_filter="amount > 5000")   # or .polars, .arrow
    con = reader.duckdb()                     # a DuckDB view per table: orders, big_orders
    con.sql("SELECT count(*) FROM orders JOIN big_orders USING (id)")
    version_sql(reader.resolver, reader.version)   # Spark SQL / Trino: {table: "SELECT ... FOR VERSION AS OF ..."}

Every DataFrame and view is a pyiceberg scan of one table at its snapshot of the version, by
snapshot id: ``columns`` (pyiceberg's ``selected_fields``) and ``row_filter`` (a pyiceberg
expression or its string form, ``"amount > 5000 and id < 10"``) are pushed into the scan, so
Iceberg skips files by partition and column statistics and reads only the columns asked for.
Delete files, schema evolution and the object store are pyiceberg's, so any table pyiceberg
reads, these readers read. DuckDB's own Iceberg extension cannot read tags (duckdb-iceberg #1252),
and a reader pinned by snapshot id needs no tag anyway: ``duckdb()`` registers the scans'
Arrow tables as views on a DuckDB connection, one call for the whole version. The scans are read into
memory then (DuckDB queries the Arrow tables without copying them): ``columns`` and ``row_filters``
keep that to what the queries need.

Spark SQL and Trino read Iceberg by ref: ``version_sql`` names a table's tag ``tidemark-<T>``
when the version is retained (every table holding data at ``T`` carries the tag, so
``tidemark versions`` lists it and GC keeps it), else its snapshot id, which GC may expire once
the version is no longer the newest (pin it with ``ReaderSession.pin`` for long reads).

pandas, polars and duckdb are the ``readers`` extra (``pip install '.[readers]'`` in a clone):
each is imported when first used, and a missing one is a ``ConfigurationError`` naming the extra.
"""
from __future__ import annotations

import importlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Optional, Union

from pyiceberg.expressions import AlwaysTrue, BooleanExpression
from pyiceberg.expressions.parser import parse as parse_filter
from pyiceberg.table import DataScan
from pyparsing import ParseException

from coordinator.errors import ConfigurationError, InvalidArgument
from coordinator.history.resolve import Resolver, scan_at
from coordinator.history.versions import tag_name
from coordinator.iceberg.catalog import CatalogSettings
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


@dataclass(frozen=True)
class VersionReader:
    """The tables of one resolved version (``Resolver.resolve`` or ``ReaderSession.resolve``), read by snapshot id."""

    resolver: Resolver
    version: ConsistentVersion

    @classmethod
    def resolve(cls, tables: Iterable[str], tm: Optional[ZooKeeperSession] = None, *,
                settings: Optional[CatalogSettings] = None,
                level: Union[str, ConsistencyLevel] = ConsistencyLevel.CONSISTENT,
                as_of: Optional[int] = None) -> VersionReader:
        """Resolve ``tables`` at ``level`` (or ``as_of`` an epoch): with ZooKeeper when ``tm`` is given, else from
        Iceberg metadata alone; the catalog is ``settings`` or the environment's (``CatalogSettings.from_env``)."""
        settings = settings or CatalogSettings.from_env()
        resolver = Resolver(settings.load(), settings, tm)
        return cls(resolver, resolver.resolve(tables, level, as_of))

    @property
    def tables(self) -> list[str]:
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
        ``row_filters`` map table names to what to read of them."""
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


def version_sql(resolver: Resolver, version: ConsistentVersion) -> dict[str, str]:
    """``{table: "SELECT * FROM <table> FOR VERSION AS OF <ref>"}`` for Spark SQL (3.3+) and Trino: the ref is the
    tag ``'tidemark-<T>'`` when the table carries it at its snapshot of the version, else the snapshot id; a table
    empty at the version selects nothing. Table names start with the catalog's name as Spark knows it
    (``CatalogSettings.name``, ``lake``)."""
    tag = None if version.epoch is None else tag_name(version.epoch)
    statements = {}
    for table, snapshot_id in sorted(version.snapshots.items()):
        quoted = _quoted(f"{resolver.settings.name}.{resolver.settings.identifier(table)}")
        if snapshot_id is None:
            statements[table] = f"SELECT * FROM {quoted} WHERE false"
            continue
        ref = resolver.table(table, refresh=False).metadata.refs.get(tag) if tag is not None else None
        by = f"'{tag}'" if ref is not None and ref.snapshot_id == snapshot_id else str(snapshot_id)
        statements[table] = f"SELECT * FROM {quoted} FOR VERSION AS OF {by}"
    return statements


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
