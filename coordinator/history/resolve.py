"""Resolving a version of several tables at one consistency level, with or without ZooKeeper.

    resolver = Resolver(catalog, settings, tm)          # tm=None: from Iceberg metadata alone
    version = resolver.resolve(["lake.db.words", "lake.db.word_counts"], level="consistent")
    arrow = read_arrow(resolver, version)                # {table: pyarrow.Table} for pandas/DuckDB users

Levels (docs/design.md, "Consistency levels"):
- ``latest``: each table's current snapshot (read uncommitted; ``epoch`` is None);
- ``committed``: each table at its own committed epoch;
- ``consistent``: ``T*`` = the minimum committed epoch over the tables, each table at its
  newest snapshot with ``tidemark.epoch <= T*``;
- ``as_of=T``: the same at an older epoch ``T`` every table has committed: a retained version
  (``/versions/<T>``, or without ZooKeeper the tag ``tidemark-<T>`` on every table) is read from
  its record; any other epoch only while every table's history back to it is still there.

A table no Tidemark job writes (a root table fed from outside) has no epochs: it is read
at its newest snapshot committed at or before ``T*`` (barrier ``T*`` covers its commits up
to time ``T*``) and does not hold ``T*`` back.

No version exists below a managed table's **first epoch** (its writer's first committed
epoch: the table has no exact state before it), nor where the table's history was expired:
``consistent`` and ``as_of`` then raise ``VersionNotFound`` naming the table and its first
epoch, or the retained versions nearest to the one asked for. That happens to a set of siblings
whose writers started at different times (one table's first epoch is above another's committed
epoch) until the slower one catches up.

With ZooKeeper, committed epochs come from the tables' tidemarks (a watch-backed cache
when given one) and a table already at ``T*`` needs no metadata load at all; without it,
from each table's Iceberg progress (``snapshots.table_progress``: the newer of ``main``'s
newest epoch snapshot and the committed-epoch marker); first epochs come from the
tidemarks' ``first_epoch`` and from ``tidemark.first-epoch`` (or the oldest epoch in
``main``) respectively. On the same state both agree.
"""
from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Optional, Union

from pyiceberg.catalog import Catalog
from pyiceberg.table import DataScan, Snapshot, Table

from coordinator.errors import ConfigurationError, EpochOrderError, InvalidName, VersionNotFound
from coordinator.history.versions import RetainedVersions, nearest, tag_epoch, tag_name
from coordinator.iceberg.catalog import CatalogSettings, load_table
from coordinator.iceberg.snapshots import (
    committed_epoch,
    first_epoch,
    is_tidemark_table,
    main_lineage,
    snapshot_at_epoch,
    snapshot_at_time,
)
from coordinator.names import validate_epoch, validate_name
from coordinator.protocol.tidemarks import TidemarkCache, read_tidemarks
from coordinator.records import ConsistencyLevel, ConsistentVersion, ReaderPins, TableTidemark
from coordinator.zookeeper.session import ZooKeeperSession

if TYPE_CHECKING:
    import pyarrow as pa

ROOT = "root"  # marker: a table written outside Tidemark


class Resolver:
    def __init__(self, catalog: Catalog, settings: CatalogSettings, tm: Optional[ZooKeeperSession] = None,
                 cache: Optional[TidemarkCache] = None) -> None:
        self.catalog, self.settings, self.tm, self.cache = catalog, settings, tm, cache
        self._tables: dict[str, Table] = {}

    def table(self, name: str, refresh: bool = True) -> Table:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = load_table(self.catalog, self.settings, name)
        elif refresh:
            table.refresh()
        return table

    def _tidemarks(self, tables: list[str]) -> dict[str, Optional[TableTidemark]]:
        if self.tm is None:
            return {t: None for t in tables}
        return self.cache.get(tables) if self.cache is not None else read_tidemarks(self.tm, tables)

    def committed_epochs(self, tables: Iterable[str],
                         marks: Optional[Mapping[str, Optional[TableTidemark]]] = None,
                         ) -> dict[str, Union[int, str, None]]:
        """Each table's committed epoch, None if it has none yet, or ``ROOT`` for a root table."""
        names = sorted(set(tables))
        marks = self._tidemarks(names) if marks is None else marks
        result: dict[str, Union[int, str, None]] = {}
        for name in names:
            mark = marks[name]
            if mark is not None:  # a registered writer exists: ZooKeeper is the authority
                result[name] = mark.epoch
                continue
            table = self.table(name)
            result[name] = committed_epoch(table) if is_tidemark_table(table) else ROOT
        return result

    def resolve(self, tables: Iterable[str], level: Union[str, ConsistencyLevel] = ConsistencyLevel.CONSISTENT,
                as_of: Optional[int] = None) -> ConsistentVersion:
        if isinstance(tables, str) or not hasattr(tables, "__iter__"):
            raise InvalidName(f"resolve takes a list of table names, got {str(tables)[:60]!r}")
        names = sorted({validate_name(t, "table name") for t in tables})
        if not names:
            raise InvalidName("resolve needs at least one table")
        level = ConsistencyLevel.AS_OF if as_of is not None else _level(level)
        if isinstance(as_of, int):
            validate_epoch(as_of, "as_of")
        if as_of is not None:
            retained = self._retained(names, as_of)
            if retained is not None:
                return retained
        if level == ConsistencyLevel.LATEST:
            return ConsistentVersion(None, self._current(names), level)
        marks = self._tidemarks(names)
        epochs = self.committed_epochs(names, marks)
        if level == ConsistencyLevel.COMMITTED:
            return ConsistentVersion(None, {n: self._snapshot_at(n, epochs[n]) for n in names}, level)
        never = sorted(n for n, e in epochs.items() if e is None)
        if never:
            raise VersionNotFound(f"tables {never} have no committed epoch yet: no consistent version exists")
        managed = [e for e in epochs.values() if isinstance(e, int)]  # not ROOT (and none is None, above)
        target = min(managed) if managed else None
        if as_of is not None:
            if target is not None and as_of > target:
                raise VersionNotFound(f"epoch {as_of} is not committed in every table (the consistent epoch is "
                                      f"{target})")
            target = as_of
        if target is None:  # only root tables: nothing to align them on
            return ConsistentVersion(None, self._current(names), level)
        self._refuse_below_first_epochs(names, marks, epochs, target, as_of)
        snapshots = {}
        for name in names:
            mark = marks[name]
            if mark is not None and mark.epoch == target:
                snapshots[name] = mark.snapshot_id  # ZooKeeper recorded it at commit: no metadata load
            else:
                snapshots[name] = self._snapshot_at(name, ROOT if epochs[name] == ROOT else target, target)
        if as_of is not None and not managed and all(s is None for s in snapshots.values()):
            raise VersionNotFound(f"epoch {as_of} is before the history of every table in {names}: none had a "
                                  "snapshot then. Ask for a later epoch")
        return ConsistentVersion(target, snapshots, level)

    def _retained(self, names: list[str], epoch: int) -> Optional[ConsistentVersion]:
        """The retained version at ``epoch`` when it covers every table of ``names`` (None otherwise)."""
        if self.tm is not None:
            record = RetainedVersions(self.tm).get(epoch)
            if record is None or not set(names) <= set(record.snapshots):
                return None
            return ConsistentVersion(epoch, {n: record.snapshots[n] for n in names}, ConsistencyLevel.AS_OF)
        tags = {n: ref for n in names if (ref := self.table(n).metadata.refs.get(tag_name(epoch))) is not None}
        if len(tags) < len(set(names)):
            return None
        return ConsistentVersion(epoch, {n: ref.snapshot_id for n, ref in tags.items()}, ConsistencyLevel.AS_OF)

    def retained_epochs(self, names: Iterable[str]) -> list[int]:
        """The retained versions (from ZooKeeper, or the ``tidemark-<T>`` tags every table of ``names`` has)."""
        if self.tm is not None:
            return RetainedVersions(self.tm).epochs()
        tagged = [{e for e in map(tag_epoch, self.table(n, refresh=False).metadata.refs) if e is not None}
                  for n in names]
        return sorted(set.intersection(*tagged)) if tagged else []

    def _expired(self, what: str, names: Iterable[str], epoch: int) -> VersionNotFound:
        below, above = nearest(self.retained_epochs(names), epoch)
        near = " and ".join(f"{tag_name(e)}" for e in (below, above) if e is not None)
        hint = (f"the nearest retained versions are {near}" if near else "no version is retained")
        return VersionNotFound(f"{what}: {hint} (`tidemark versions` lists them; `--as-of` takes a tag or an "
                               "epoch)")

    def first_epochs(self, tables: Iterable[str],
                     marks: Optional[Mapping[str, Optional[TableTidemark]]] = None) -> dict[str, Optional[int]]:
        """Each managed table's first epoch (None when not known yet); root tables are left out.

        With ZooKeeper it is the tidemark's ``first_epoch`` (no metadata load); without it, or for a
        tidemark written before first epochs were recorded, Iceberg's ``tidemark.first-epoch``.
        """
        names = sorted(set(tables))
        marks = self._tidemarks(names) if marks is None else marks
        return self._first_epochs(names, marks, self.committed_epochs(names, marks))

    def _first_epochs(self, names: list[str], marks: Mapping[str, Optional[TableTidemark]],
                      epochs: Mapping[str, Union[int, str, None]]) -> dict[str, Optional[int]]:
        result: dict[str, Optional[int]] = {}
        for name in names:
            if epochs[name] == ROOT:
                continue
            mark = marks[name]
            first = mark.first_epoch if mark is not None else None
            if first is None and epochs[name] is not None:
                first = first_epoch(self.table(name, refresh=False))
            result[name] = first
        return result

    def _refuse_below_first_epochs(self, names: list[str], marks: Mapping[str, Optional[TableTidemark]],
                                   epochs: Mapping[str, Union[int, str, None]], target: int,
                                   as_of: Optional[int]) -> None:
        """``VersionNotFound`` when ``target`` is below the first epoch of a managed table of the set."""
        firsts = self._first_epochs(names, marks, epochs)
        below = {n: f for n, f in sorted(firsts.items()) if f is not None and target < f}
        if not below:
            return
        tables = ", ".join(f"{n} (first epoch {f})" for n, f in below.items())
        need = max(below.values())
        if as_of is not None:
            raise VersionNotFound(
                f"epoch {as_of} is before the first epoch of {tables}: a table has no exact state before its "
                f"writer's first epoch. Ask for as_of {need} or later, or leave {', '.join(below)} out of the set")
        lagging = sorted(n for n, e in epochs.items() if isinstance(e, int) and e < need)  # not ROOT
        at = ", ".join(f"{n} at {epochs[n]}" for n in lagging)
        raise VersionNotFound(
            f"no consistent version of {names} exists yet: the consistent epoch is {target} ({at}), below the "
            f"first epoch of {tables}, whose writer started later: the table has no exact state before it. Wait "
            f"until {', '.join(lagging)} commit epoch {need} (`tidemark status` says what holds them back), or "
            f"read {', '.join(below)} without {', '.join(lagging)}")

    def _current(self, names: list[str]) -> dict[str, Optional[int]]:
        return {n: _id(self.table(n).current_snapshot()) for n in names}

    def _snapshot_at(self, name: str, epoch: Union[int, str, None], wall_ms: Optional[int] = None) -> Optional[int]:
        table = self.table(name)
        if isinstance(epoch, str):  # ROOT
            if wall_ms is None:
                return _id(table.current_snapshot())
            found = snapshot_at_time(table, wall_ms)
            if found is None and _truncated(table):
                raise self._expired(f"root table {name}'s history at {wall_ms} was expired", [name], wall_ms)
            return _id(found)
        if epoch is None:
            return None
        found = snapshot_at_epoch(table, epoch)
        if found is None and _truncated(table):
            raise self._expired(f"epoch {epoch} is not a retained version and table {name}'s history there was "
                                "expired", [name], epoch)
        return _id(found)


def _level(level: Union[str, ConsistencyLevel]) -> ConsistencyLevel:
    try:
        return ConsistencyLevel(level)
    except ValueError:
        raise ConfigurationError(f"consistency level {level!r} is not one of latest, committed, consistent") from None


def _id(snapshot: Optional[Snapshot]) -> Optional[int]:
    return None if snapshot is None else snapshot.snapshot_id


def _truncated(table: Table) -> bool:
    """True when ``main``'s older history was expired. Expiry clears the parent id of the oldest snapshot
    left, so it is recognised by its sequence number: only a table's first snapshot has number 1."""
    oldest = next(iter(deque(main_lineage(table), maxlen=1)), None)
    return oldest is not None and (oldest.parent_snapshot_id is not None or (oldest.sequence_number or 0) > 1)


class ReaderSession:
    """A reader's view: consistent resolutions never move backwards, and pinned versions are protected.

        session = ReaderSession(resolver, tm)
        version = session.resolve(tables)           # monotonic per reader
        session.pin(version)                        # ephemeral /readers/<id>: retention keeps it

    Pins live in one ephemeral znode per reader and vanish with the reader's session.
    """

    def __init__(self, resolver: Resolver, tm: Optional[ZooKeeperSession] = None,
                 reader_id: Optional[str] = None) -> None:
        self.resolver, self.tm = resolver, tm
        self.reader_id = validate_name(reader_id or f"reader-{uuid.uuid4().hex[:12]}", "reader id")
        self._last: dict[tuple[str, ...], ConsistentVersion] = {}
        self._pinned: dict[int, Mapping[str, Optional[int]]] = {}

    def resolve(self, tables: Iterable[str], level: Union[str, ConsistencyLevel] = ConsistencyLevel.CONSISTENT,
                as_of: Optional[int] = None) -> ConsistentVersion:
        key = tuple(sorted(set(tables)))
        version = self.resolver.resolve(key, level, as_of)
        if version.level != ConsistencyLevel.CONSISTENT:
            return version
        previous = self._last.get(key)
        if previous is not None and previous.epoch is not None and (version.epoch is None
                                                                     or version.epoch < previous.epoch):
            return previous  # e.g. a fallback to Iceberg metadata that lags ZooKeeper: never go back
        self._last[key] = version
        return version

    def pin(self, version: ConsistentVersion) -> None:
        if version.epoch is None:
            raise EpochOrderError("only a version with an epoch (consistent, as_of) can be pinned")
        self._pinned[version.epoch] = dict(version.snapshots)
        self._write_pins()

    def unpin(self, version: ConsistentVersion) -> None:
        if version.epoch is not None:
            self._pinned.pop(version.epoch, None)
        self._write_pins()

    @property
    def pinned(self) -> dict[int, Mapping[str, Optional[int]]]:
        return dict(self._pinned)

    def _write_pins(self) -> None:
        if self.tm is None:
            return
        path = self.tm.paths.reader(self.reader_id)
        data = ReaderPins(self._pinned).to_json()
        if self.tm.get(path) is None:
            self.tm.call(f"create {path}", self.tm.client.create_async, path, data, None, True)
        else:
            self.tm.call(f"set {path}", self.tm.client.set_async, path, data)

    def close(self) -> None:
        self._pinned.clear()
        if self.tm is not None and self.tm.get(self.tm.paths.reader(self.reader_id)) is not None:
            self.tm.call("unpin", self.tm.client.delete_async, self.tm.paths.reader(self.reader_id))


def pinned_versions(tm: ZooKeeperSession) -> dict[int, dict[str, Optional[int]]]:
    """Every version pinned by a live reader: ``{epoch: {table: snapshot id}}`` (what GC must keep)."""
    pinned: dict[int, dict[str, Optional[int]]] = {}
    paths = [tm.paths.reader(r) for r in tm.children(tm.paths.readers)]
    for path, raw in zip(paths, tm.get_many(paths)):
        if raw is None:
            continue  # the reader's session ended meanwhile
        for epoch, snapshots in ReaderPins.from_json(raw[0] or b"{}", path).versions.items():
            pinned.setdefault(epoch, {}).update(snapshots)
    return pinned


def scans(resolver: Resolver, version: ConsistentVersion) -> dict[str, Optional[DataScan]]:
    """A pyiceberg scan per table at its snapshot (None for a table that was empty at that point)."""
    result: dict[str, Optional[DataScan]] = {}
    for name, sid in version.snapshots.items():
        table = resolver.table(name, refresh=False)
        if sid is not None and table.snapshot_by_id(sid) is None:
            table = resolver.table(name)  # resolved from ZooKeeper alone: metadata loaded before that commit
        result[name] = None if sid is None else table.scan(snapshot_id=sid)
    return result


def read_arrow(resolver: Resolver, version: ConsistentVersion) -> dict[str, pa.Table]:
    """Every table at its snapshot as a ``pyarrow.Table`` (empty with the table's schema when it had none)."""
    result = {}
    for name, scan in scans(resolver, version).items():
        result[name] = (resolver.table(name, refresh=False).schema().as_arrow().empty_table() if scan is None
                        else scan.to_arrow())
    return result
