"""Resolving a version of several tables at one consistency level, with or without ZooKeeper.

    resolver = Resolver(catalog, settings, tm)          # tm=None: from Iceberg metadata alone
    version = resolver.resolve(["lake.db.words", "lake.db.word_counts"], level="consistent")
    arrow = read_arrow(resolver, version)                # {table: pyarrow.Table} for pandas/DuckDB users

Levels (docs/design.md, "Consistency levels", has the rules and why they are consistent):
- ``latest``: each table's current snapshot (read uncommitted; ``epoch`` is None);
- ``committed``: each table at its own committed epoch;
- ``consistent``: the newest epoch ``T`` that every managed table of the set holds (committed), each table at
  its snapshot of ``T``; a table that coalesced over a barrier is never read "at its newest snapshot before" it;
- ``as_of=T``: the retained versions at ``T``, whichever pipelines' (``/versions/<T>-<pipeline>``, or without
  ZooKeeper a Tidemark tag at ``T`` on every table), are read from their records; any other epoch only when every
  managed table holds ``T`` and its snapshot there still exists.

Which epochs a table holds: with ZooKeeper, those its tidemark lists (``TableTidemark.recent``), so
``consistent`` loads no metadata of a managed table while the lists share an epoch (beyond one sink per job the
first time a resolver meets its tidemarks: ``tidemarks.older_copy`` refuses a tree restored from an older copy);
for an older epoch, a table with no tidemark (writer unregistered, ZooKeeper lost) or no ZooKeeper at all, those
its Iceberg metadata records (``EpochLineage.recorded_epochs``). A root table (no Tidemark writer) takes no part
in choosing ``T``: it is read as the set's jobs that read it recorded for ``T``, else at its newest snapshot
committed at or before ``T`` (``held_epochs``, "Root tables").

The parts: ``Resolver`` (its docstring says when there is no version), ``ReaderSession`` (a reader that never
steps back, and its pins), ``pinned_versions`` (what GC keeps for readers), and ``scan_at``, ``scans`` and
``read_arrow`` (reading a resolved version through pyiceberg).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Optional, Union

from pyiceberg.catalog import Catalog
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import ALWAYS_TRUE, DataScan, Snapshot, Table
from pyiceberg.utils.concurrent import ExecutorFactory

from coordinator.errors import (
    ConfigurationError,
    EpochOrderError,
    InvalidArgument,
    InvalidName,
    VersionNotFound,
    ZooKeeperRebuilt,
    ZooKeeperUnavailable,
)
from coordinator.history.versions import RetainedVersions, nearest, tag_at, tag_epoch
from coordinator.iceberg.catalog import CatalogSettings, load_table
from coordinator.iceberg.lineage import EpochLineage, LineageSummary
from coordinator.names import validate_epoch, validate_name
from coordinator.protocol.held_epochs import held_epochs
from coordinator.protocol.pipelines import SET, Group, Pipelines, parse_group
from coordinator.protocol.registry import check_table_identities
from coordinator.protocol.tidemarks import TidemarkCache, older_copy, read_tidemarks
from coordinator.protocol.topology import read_topology
from coordinator.records import (
    RECENT_PER_LEVEL,
    ConsistencyLevel,
    ConsistentVersion,
    EpochInputs,
    ReaderPins,
    RootRead,
    TableTidemark,
)
from coordinator.zookeeper.session import ZooKeeperSession

if TYPE_CHECKING:
    import pyarrow as pa

ROOT = "root"  # marker: a table written outside Tidemark


class Resolver:
    """Resolves a set of tables to a ``ConsistentVersion`` (one snapshot id per table) at a consistency level
    (module docstring), from ZooKeeper's tidemarks when ``tm`` is given, else from the tables' Iceberg metadata
    alone. It writes nothing, and keeps the tables it hands out (``table``) and a summary of each table's lineage
    (indexed again when the table's metadata file changes), so one resolver serves many resolutions.

        resolver = Resolver(catalog, settings, tm)
        version = resolver.resolve(["lake.db.words", "lake.db.word_counts"])     # consistent
        again = resolver.resolve(["lake.db.words"], as_of=version.epoch)

    :param catalog: the catalog the tables are loaded from; ``settings`` its settings (messages name it).
    :param tm: the ZooKeeper session; None resolves from Iceberg alone (``as_of`` then finds only tagged versions).
    :param cache: the tidemarks, kept in memory by watches (``TidemarkCache``), instead of a read per resolution.

    Failure behaviour: ``resolve`` raises ``VersionNotFound`` (one line) when a managed table has committed
    nothing yet; when the tables share no epoch (it names each one's newest: a table at a coarser cadence, or
    one whose job caught up over the others' epochs); ``as_of`` an epoch a table does not hold (it names the
    table and the nearest epochs it holds) or whose history was expired (it names the nearest retained
    versions); or for an epoch below a managed table's **first epoch** (its writer's first committed epoch: the
    table has no exact state before it), naming the table and its first epoch. First epochs come from the
    tidemarks' ``first_epoch``, else from ``tidemark.first-epoch`` (or the oldest epoch in ``main``). A table
    loaded for the first time is checked to be the Iceberg table its writer registered (``ConfigurationError``
    otherwise); with ZooKeeper gone meanwhile it is read unchecked. A tidemark met for the first time (or below
    the one met before) is checked against its table's metadata: one behind the epoch that metadata proves
    committed comes from a tree restored from an older copy, and ``consistent`` and ``committed`` raise
    ``VersionNotFound`` (retry) until the job has resumed from Iceberg, instead of going back in time.
    """

    def __init__(self, catalog: Catalog, settings: CatalogSettings, tm: Optional[ZooKeeperSession] = None,
                 cache: Optional[TidemarkCache] = None) -> None:
        self.catalog, self.settings, self.tm, self.cache = catalog, settings, tm, cache
        self._tables: dict[str, Table] = {}  # handed out by ``table``: what readers scan
        self._summaries: dict[str, LineageSummary] = {}  # per table, for the metadata location it was indexed from
        self._identified: dict[str, str] = {}  # each table's Iceberg uuid, once checked against its writer's record
        self._confirmed: dict[str, int] = {}  # per table, the tidemark epoch found not behind its Iceberg metadata

    def table(self, name: str, refresh: bool = True) -> Table:
        """The table for reads of it (scans, schema, refs): loaded once and kept, reloaded when ``refresh``."""
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = self._identified_table(name)
        elif refresh:
            table.refresh()
        return table

    def _load(self, name: str, refresh: bool = True) -> Table:
        """The table's metadata for one question of resolution. A table ``table`` handed out is refreshed in place,
        as before; any other is loaded and not kept: a resolution of many tables keeps only their summaries
        (``LineageSummary``), so the metadata it loads does not pile up for the garbage collector to walk."""
        if name in self._tables:
            return self.table(name, refresh)
        return self._identified_table(name)

    def _identified_table(self, name: str) -> Table:
        return self._identified_tables([name])[name]

    def _identified_tables(self, names: list[str]) -> dict[str, Table]:
        """The tables, loaded side by side on pyiceberg's executor (they wait on the catalog); the first time (and
        when one is another Iceberg table than before), checked in one read to be the ones their writer jobs write
        (``check_table_identities``: a tree used with another catalog is refused). With ZooKeeper gone meanwhile (a
        version resolved, then read after the session closed) they are read unchecked."""
        pool_map = ExecutorFactory.get_or_create().map if len(names) > 1 else map
        loads = pool_map(lambda n: load_table(self.catalog, self.settings, n), names)
        tables = dict(zip(names, loads))
        unchecked = {n: identity for n, t in tables.items()
                     if self._identified.get(n) != (identity := str(t.metadata.table_uuid))}
        if self.tm is not None and unchecked:
            try:
                check_table_identities(self.tm, unchecked, self.settings.describe())
            except (ZooKeeperUnavailable, ZooKeeperRebuilt):  # a version resolved, then ZooKeeper gone: still read
                return tables
            self._identified.update(unchecked)
        return tables

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
            summary = self._summary(name)  # no tidemark: the table's Iceberg records say, from one walk
            result[name] = summary.committed_epoch if summary.is_tidemark_table else ROOT
        return result

    def _summary(self, name: str, refresh: bool = True) -> LineageSummary:
        """The table's lineage as resolution reads it, indexed once per version of its metadata (a refresh that
        finds a newer metadata file indexes again; without ``refresh``, the one indexed last)."""
        summary = self._summaries.get(name)
        if summary is not None and not refresh:
            return summary
        table = self._load(name, refresh)
        if summary is None or summary.location != table.metadata_location:
            summary = self._summaries[name] = EpochLineage(table).summary()
        return summary

    def _lineage(self, name: str) -> EpochLineage:
        """The table's whole lineage, from its metadata as it is now, for the questions its summary does not
        answer (a snapshot by id, by time, at an epoch): not kept."""
        return EpochLineage(self._load(name))

    def resolve(self, tables: Iterable[str], level: Union[str, ConsistencyLevel] = ConsistencyLevel.CONSISTENT,
                as_of: Optional[int] = None, *, scope: str = Group.PIPELINE.value) -> ConsistentVersion:
        """Resolve ``tables`` at ``level``, or at epoch ``as_of`` (module docstring). A set of root tables only has
        no epoch to align on: their current snapshots, or with ``as_of`` each at its newest snapshot committed at
        or before it.

        :param tables: the table names (``namespace.table``), a list and not one string.
        :param level: ``latest``, ``committed`` or ``consistent``; ignored when ``as_of`` is given.
        :param as_of: the epoch to read the tables at (a barrier, in ms since 1970).
        :param scope: what a ``consistent`` version is consistent across (``coordinator.protocol.pipelines``):
            ``pipeline`` (the default: every table of the tables' pipelines, as ``tidemark serve`` serves them),
            ``namespace:<ns>``, ``all``, or ``set`` (exactly ``tables``: the newest epoch they hold, which another
            table of their pipeline may not). Without ZooKeeper the job graph is unknown: ``set``.
        :raises VersionNotFound: no such version exists (the class docstring lists each case).
        :raises InvalidName: ``tables`` is one string or empty, or a table name or ``as_of`` is malformed.
        :raises InvalidArgument: ``scope`` names no scope.
        :raises ConfigurationError: ``level`` is not a level, or a table is not the Iceberg table its writer
            registered.
        :raises TableNotFound: a table that must be loaded is not in the catalog.
        """
        if isinstance(tables, str) or not hasattr(tables, "__iter__"):
            raise InvalidName(f"resolve takes a list of table names, got {str(tables)[:60]!r}")
        names = sorted({validate_name(t, "table name") for t in tables})
        if not names:
            raise InvalidName("resolve needs at least one table")
        level = ConsistencyLevel.AS_OF if as_of is not None else _level(level)
        if isinstance(as_of, int):
            validate_epoch(as_of, "as_of")
        group = None if scope == SET else _scope(scope)
        if group is not None and level == ConsistencyLevel.CONSISTENT and self.tm is not None:
            wider = self._around(names, *group)
            if wider:  # one version across them all, of which the tables asked for
                version = self.resolve([*names, *wider], level, scope=SET)
                return ConsistentVersion(version.epoch, {n: version.snapshots[n] for n in names}, version.level)
        if as_of is not None:
            retained = self._retained(names, as_of)
            if retained is not None:
                return retained
        if level == ConsistencyLevel.LATEST:
            return ConsistentVersion(None, self._current(names), level)
        marks = self._tidemarks(names)
        if as_of is None:
            self._refuse_older_copy(names, marks)
        epochs = self.committed_epochs(names, marks)
        if level == ConsistencyLevel.COMMITTED:
            return ConsistentVersion(None, {n: self._snapshot_at(n, epochs[n]) for n in names}, level)
        never = sorted(n for n, e in epochs.items() if e is None)
        if never:
            raise VersionNotFound(f"tables {never} have no committed epoch yet: no consistent version exists")
        managed = [n for n in names if epochs[n] != ROOT]
        roots = [n for n in names if epochs[n] == ROOT]
        if not managed:  # only root tables: nothing to align them on but the time asked for
            if as_of is None:
                return ConsistentVersion(None, self._current(names), level)
            snapshots = {n: self._root_snapshot(n, as_of, {}) for n in roots}
            if all(s is None for s in snapshots.values()):
                raise VersionNotFound(f"epoch {as_of} is before the history of every table in {names}: none had a "
                                      "snapshot then. Ask for a later epoch")
            return ConsistentVersion(as_of, snapshots, level)
        if as_of is None:
            self._refuse_unreleased(managed, marks)
        records = _SummaryRecords(self, marks)
        holdings = held_epochs({n: marks[n] for n in managed}, records, self.tm)
        if as_of is None:
            target_or_none = holdings.consistent_epoch()
            if target_or_none is None and holdings.floor:
                raise self._below_read_floor(names, epochs, managed, marks, holdings.floor)
            if target_or_none is None:
                raise self._no_common_epoch(names, epochs, managed, holdings.evidence.first_epoch)
            target = target_or_none
            self._refuse_below_first_epochs(names, epochs, target, None, holdings.evidence.first_epoch)
            snapshots = {n: holdings.held[n][target] for n in managed}  # ZooKeeper names them: no metadata load
        else:
            target = as_of
            self._refuse_below_first_epochs(names, epochs, target, as_of, holdings.evidence.first_epoch)
            behind = {n: e for n in managed if isinstance(e := epochs[n], int) and e < as_of}
            if behind:
                at = ", ".join(f"{n} is at {e}" for n, e in sorted(behind.items()))
                raise VersionNotFound(f"epoch {as_of} is not committed in every table of {names} ({at})")
            placement = holdings.place(as_of)
            if placement.missing is not None:
                raise self._not_held(placement.missing, marks[placement.missing], holdings.held[placement.missing],
                                     as_of, names)
            snapshots = {n: self._retained_snapshot(n, marks[n], placement.snapshots[n], as_of, names, records)
                         for n in managed}
        read = holdings.evidence.root_reads(managed, roots, target)
        for name in roots:
            snapshots[name] = self._root_snapshot(name, target, read)
        return ConsistentVersion(target, snapshots, level)

    def _around(self, names: list[str], group: Group, namespace: Optional[str]) -> list[str]:
        """The managed tables (the job graph's names) besides ``names`` that the scope makes a version of ``names``
        consistent across; root tables choose no epoch, so none is added."""
        topology = read_topology(self.tm)  # type: ignore[arg-type]  # only called with ZooKeeper
        identifier = self.settings.identifier
        named = {identifier(n) for n in names}
        return [t for t in Pipelines(topology).around(names, group, namespace, identifier)
                if t in topology.writers and identifier(t) not in named]

    def _retained_snapshot(self, name: str, mark: Optional[TableTidemark], snapshot_id: Optional[int], epoch: int,
                           names: list[str], records: _SummaryRecords) -> Optional[int]:
        """``name``'s snapshot at ``epoch`` for ``as_of``, or ``VersionNotFound`` when it was expired since: one
        its metadata as read in this resolution names is there; one from ZooKeeper or a reader's inputs is looked
        up."""
        if snapshot_id is None or (mark is not None and epoch == mark.epoch):
            return snapshot_id  # empty, or the table's newest (never expired)
        if records.read_now(name).get(epoch) == snapshot_id:
            return snapshot_id
        if self._load(name).snapshot_by_id(snapshot_id) is not None:
            return snapshot_id
        raise self._expired(f"epoch {epoch} is not a retained version and table {name}'s snapshot at it "
                            f"({snapshot_id}) was expired", names, epoch)

    def _not_held(self, name: str, mark: Optional[TableTidemark], held: Mapping[int, Optional[int]], epoch: int,
                  names: list[str]) -> VersionNotFound:
        """Why ``name`` has no state at ``epoch`` (``as_of``): its history there was expired, or it does not hold
        the epoch, with the nearest ones it holds."""
        summary = self._summary(name, refresh=False)
        known = sorted({*held, *(e for e, _ in summary.recorded)})
        if summary.truncated and (not known or epoch < known[0]):
            return self._expired(f"epoch {epoch} is not a retained version and table {name}'s history there was "
                                "expired", names, epoch)
        below, above = nearest(known, epoch)
        holds = " and ".join(str(e) for e in (below, above) if e is not None) or "none"
        retained = self._retained_hint(names, epoch)
        window = mark.epochs[-RECENT_PER_LEVEL:] if mark is not None else ()
        if window and epoch >= window[0]:  # ZooKeeper lists every recent epoch the table committed
            why = ("its job coalesced over it: one epoch covered it and the barriers around it, so the table has "
                   "no exact state there")
        else:
            why = ("its job coalesced over it, or it was an idle epoch between marker rounds, which Iceberg does "
                   "not record" + (" and ZooKeeper's list of recent epochs no longer reaches" if mark else ""))
        return VersionNotFound(
            f"epoch {epoch} is not a version of {names}: table {name} does not hold it ({why}); the nearest "
            f"epochs {name} holds are {holds}" + (f"; {retained}" if retained else "") +
            " (`--as-of` takes a tag or an epoch)")

    def _refuse_older_copy(self, names: list[str], marks: Mapping[str, Optional[TableTidemark]]) -> None:
        """``VersionNotFound`` when a tidemark is behind what its table's Iceberg metadata proves committed: the tree
        was restored from an older copy, and its versions are older than readers were given. Checked the first
        time this resolver meets a table's tidemark, and again whenever it is below the one checked: a tidemark
        that only moves forward from one found sound stays sound. A restore brings back all of a job's tidemarks
        at once, so one sink per job is checked (one metadata load, side by side), and it answers for the job's
        others."""
        unchecked = {n: m.epoch for n in names if (m := marks[n]) is not None and m.epoch is not None
                     and self._confirmed.get(n, m.epoch + 1) > m.epoch}
        if not unchecked or self.tm is None:
            return
        writers = read_topology(self.tm).writers
        by_job: dict[str, list[str]] = {}
        for name in sorted(unchecked):
            by_job.setdefault(writers.get(name, name), []).append(name)
        checked = [sinks[0] for sinks in by_job.values()]
        loaded = {n: self.table(n) for n in checked if n in self._tables}
        loaded.update(self._identified_tables([n for n in checked if n not in loaded]))
        for sinks in by_job.values():
            reason = older_copy(self.tm, sinks[0], loaded[sinks[0]], marks[sinks[0]])
            if reason is not None:
                raise VersionNotFound(f"table {sinks[0]}: {reason}")
            self._confirmed.update({n: unchecked[n] for n in sinks})

    def _refuse_unreleased(self, managed: list[str], marks: Mapping[str, Optional[TableTidemark]]) -> None:
        """With ZooKeeper, a Tidemark table with no tidemark is read by its Iceberg records only when its writer
        released it (``tidemark unregister``). Otherwise ZooKeeper lost its writer's state, and Iceberg may be behind
        what readers saw (an idle epoch is marked once per marker period): the version waits for the writer to
        resume, rather than step back."""
        if self.tm is None:
            return
        lost = [n for n in managed if marks[n] is None and not self._summary(n, refresh=False).released]
        if lost:
            raise VersionNotFound(
                f"tables {lost} have no tidemark in ZooKeeper, and their writer did not release them: ZooKeeper lost "
                "their job's state (a wipe or a rebuilt ensemble), and Iceberg may record less than readers saw. "
                "Start the job again (it resumes from Iceberg, and the tables are readable once it committed past "
                "the loss), read without ZooKeeper (`resolve --no-zk`), or, for a job unregistered for good by an "
                f"earlier Tidemark release, `tidemark release {' '.join(lost)}`")

    def _below_read_floor(self, names: list[str], epochs: Mapping[str, Union[int, str, None]], managed: list[str],
                          marks: Mapping[str, Optional[TableTidemark]], floor: int) -> VersionNotFound:
        resuming = sorted(n for n in managed if (m := marks[n]) is not None and m.read_floor == floor)
        at = ", ".join(f"{n} at {e}" for n, e in sorted(epochs.items()) if n in managed)
        return VersionNotFound(
            f"tables {names} have no consistent version at or after epoch {floor} yet ({at}): the jobs of {resuming} "
            f"resumed from Iceberg after ZooKeeper lost their state, and a version before {floor} could be older "
            "than one read before the loss. They commit one within an interval or two; `tidemark status` shows them")

    def _no_common_epoch(self, names: list[str], epochs: Mapping[str, Union[int, str, None]], managed: list[str],
                         first_epoch: Callable[[str], Optional[int]]) -> VersionNotFound:
        newest = {n: e for n in managed if isinstance(e := epochs[n], int)}
        firsts = {n: first_epoch(n) for n in managed}
        lowest = min(newest.values())
        if any(f is not None and f > lowest for f in firsts.values()):
            self._refuse_below_first_epochs(names, epochs, lowest, None, first_epoch)  # raises: the clearer reason
        at = ", ".join(f"{n} at {e}" for n, e in sorted(newest.items()))
        source = "" if self.tm is not None else " (Iceberg records an idle epoch once per marker period only)"
        return VersionNotFound(
            f"tables {names} share no epoch, so no consistent version of them exists now ({at}){source}: a job at "
            "a coarser cadence holds only the barriers on its cadence, and a job that caught up took one epoch "
            "over the barriers in between. Wait for an epoch they all hold (`tidemark barriers` shows each job's "
            "cadence and last epoch), or read fewer tables together")

    def _retained(self, names: list[str], epoch: int) -> Optional[ConsistentVersion]:
        """The retained version at ``epoch`` when it covers every table of ``names`` (None otherwise)."""
        covered: dict[str, Optional[int]] = {}  # the pipelines' versions at one epoch: together consistent there
        if self.tm is not None:
            for record in RetainedVersions(self.tm).at(epoch):
                covered.update(record.snapshots)
        else:
            for name in names:
                refs = self._load(name).metadata.refs
                if (tag := tag_at(refs, epoch)) is not None:
                    covered[name] = refs[tag].snapshot_id
        if not set(names) <= set(covered):
            return None
        return ConsistentVersion(epoch, {n: covered[n] for n in names}, ConsistencyLevel.AS_OF)

    def recorded_epochs(self, names: Iterable[str]) -> list[int]:
        """The epochs every Tidemark table of ``names`` records in its Iceberg snapshots, oldest first (root tables
        record none and are left out): what ``as_of`` reaches once ZooKeeper's recent lists moved past them."""
        recorded = [{e for e, _ in summary.recorded} for summary in map(self._summary, names)
                    if summary.is_tidemark_table]
        return sorted(set.intersection(*recorded)) if recorded else []

    def retained_epochs(self, names: Iterable[str]) -> list[int]:
        """The epochs of the retained versions (from ZooKeeper, or the Tidemark tags every table of ``names``
        has)."""
        if self.tm is not None:
            return RetainedVersions(self.tm).epochs()
        tagged = [{e for e in map(tag_epoch, self._load(n, refresh=False).metadata.refs) if e is not None}
                  for n in names]
        return sorted(set.intersection(*tagged)) if tagged else []

    def _retained_hint(self, names: Iterable[str], epoch: int) -> str:
        below, above = nearest(self.retained_epochs(names), epoch)
        near = " and ".join(f"{e}" for e in (below, above) if e is not None)
        return f"the nearest retained versions are at epochs {near}" if near else ""

    def _expired(self, what: str, names: Iterable[str], epoch: int) -> VersionNotFound:
        hint = self._retained_hint(names, epoch) or "no version is retained"
        return VersionNotFound(f"{what}: {hint} (`tidemark versions` lists them; `--as-of` takes a tag or an "
                               "epoch)")

    def _refuse_below_first_epochs(self, names: list[str], epochs: Mapping[str, Union[int, str, None]], target: int,
                                   as_of: Optional[int], first_epoch: Callable[[str], Optional[int]]) -> None:
        """``VersionNotFound`` when ``target`` is below the first epoch of a managed table of the set (each table's
        first epoch: ``first_epoch``, the held epochs' rule)."""
        firsts = {n: first_epoch(n) for n in names if epochs[n] != ROOT}
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
            f"no consistent version of {names} exists yet: {at}, below the first epoch of {tables}, whose writer "
            f"started later: the table has no exact state before it. Wait until {', '.join(lagging)} commit an "
            f"epoch at or after {need} that every table holds (`tidemark status` says what holds them back), or "
            f"read {', '.join(below)} without {', '.join(lagging)}")

    def _current(self, names: list[str]) -> dict[str, Optional[int]]:
        return {n: _id(self._load(n).current_snapshot()) for n in names}

    def _root_snapshot(self, name: str, wall_ms: int, read: Mapping[str, Optional[RootRead]]) -> Optional[int]:
        """A root table at barrier ``wall_ms`` (``EpochLineage.root_at``: as the jobs of the set that read it then
        recorded, ``read``, else by commit time). When that history was expired (another engine's maintenance may
        expire all but a compaction on top), the tag of the version at ``wall_ms``, which GC puts on every table it
        covers, still names that snapshot."""
        lineage = self._lineage(name)
        cut = lineage.root_at(wall_ms, read.get(name))
        if cut is None:
            refs = lineage.table.metadata.refs
            if (tag := tag_at(refs, wall_ms)) is not None:
                return refs[tag].snapshot_id
            raise self._expired(f"root table {name}'s history at {wall_ms} was expired", [name], wall_ms)
        return cut.snapshot_id

    def _snapshot_at(self, name: str, epoch: Union[int, str, None]) -> Optional[int]:
        """For ``committed``: the table at its own committed epoch (a root table at its current snapshot)."""
        if isinstance(epoch, str):  # ROOT
            return _id(self._load(name).current_snapshot())
        if epoch is None:
            return None
        lineage = self._lineage(name)
        found = lineage.at_epoch(epoch)
        if found is None and lineage.truncated:
            raise self._expired(f"table {name}'s history at its committed epoch {epoch} was expired", [name], epoch)
        return _id(found)


class _SummaryRecords:
    """``held_epochs.IcebergRecords`` over a resolver's summaries, for one resolution. A table with no tidemark was
    refreshed when its committed epoch was read; one with a tidemark is refreshed the first time its recorded epochs
    are asked (they may reach below its tidemark's list); every other answer comes from the summary at hand (one is
    loaded when there is none). An epoch older than the newest takes a metadata load."""

    resolver: Resolver
    refreshed: set[str]  # the tables refreshed in this resolution

    def __init__(self, resolver: Resolver, marks: Mapping[str, Optional[TableTidemark]]) -> None:
        self.resolver = resolver
        self.refreshed = {n for n, m in marks.items() if m is None}

    def recorded(self, table: str) -> Mapping[int, Optional[int]]:
        summary = self.resolver._summary(table, refresh=table not in self.refreshed)
        self.refreshed.add(table)
        return dict(summary.recorded)

    def read_now(self, table: str) -> Mapping[int, Optional[int]]:
        """The epochs ``table``'s metadata as refreshed in this resolution records (empty: not refreshed)."""
        return dict(self.resolver._summary(table, refresh=False).recorded) if table in self.refreshed else {}

    def committed_epoch(self, table: str) -> Optional[int]:
        return self.resolver._summary(table, refresh=False).committed_epoch

    def inputs_at(self, table: str, epoch: int) -> Optional[EpochInputs]:
        summary = self.resolver._summary(table, refresh=False)
        return summary.committed_inputs if epoch == summary.committed_epoch else \
            self.resolver._lineage(table).inputs_at(epoch)

    def first_epoch(self, table: str) -> Optional[int]:
        return self.resolver._summary(table, refresh=False).first_epoch


def _level(level: Union[str, ConsistencyLevel]) -> ConsistencyLevel:
    """A level asked for by name; ``as_of`` is not one: it is asked for by giving ``as_of=T``."""
    try:
        found = ConsistencyLevel(level)
    except ValueError:
        found = None
    if found is None or found == ConsistencyLevel.AS_OF:
        raise ConfigurationError(f"consistency level {level!r} is not one of latest, committed, consistent (for a "
                                 "version as of an epoch, pass as_of=T)")
    return found


def _scope(text: str) -> tuple[Group, Optional[str]]:
    try:
        return parse_group(text)
    except InvalidArgument as exc:
        raise InvalidArgument(f"{exc}; resolve also takes set (exactly the tables named)") from None


def _id(snapshot: Optional[Snapshot]) -> Optional[int]:
    return None if snapshot is None else snapshot.snapshot_id


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
        self._last: dict[tuple[str, ...], ConsistentVersion] = {}  # (scope, *tables) -> the newest version given
        self._pinned: dict[int, Mapping[str, Optional[int]]] = {}

    def resolve(self, tables: Iterable[str], level: Union[str, ConsistencyLevel] = ConsistencyLevel.CONSISTENT,
                as_of: Optional[int] = None, *, scope: str = Group.PIPELINE.value) -> ConsistentVersion:
        """``Resolver.resolve`` (``scope`` as there), except that a ``consistent`` version never goes back: when the
        resolver answers an older epoch than this session gave for the same tables and scope (a fallback to Iceberg
        metadata that lags ZooKeeper), or none (``VersionNotFound``: a job resuming after ZooKeeper lost its state
        is below its read floor), the earlier version is returned again. Raises what ``Resolver.resolve``
        raises."""
        names = tuple(sorted(set(tables)))
        key = (scope, *names)
        previous = self._last.get(key)
        try:
            version = self.resolver.resolve(names, level, as_of, scope=scope)
        except VersionNotFound:
            if previous is None or as_of is not None or _level(level) != ConsistencyLevel.CONSISTENT:
                raise
            return previous
        if version.level != ConsistencyLevel.CONSISTENT:
            return version
        if previous is not None and previous.epoch is not None and (version.epoch is None
                                                                     or version.epoch < previous.epoch):
            return previous  # e.g. a fallback to Iceberg metadata that lags ZooKeeper: never go back
        self._last[key] = version
        return version

    def pin(self, version: ConsistentVersion) -> None:
        """Pin ``version`` in this reader's ephemeral ``/readers/<reader_id>``, so GC keeps (and tags) its snapshots
        while this session lives; without ``tm`` it is only remembered here.

        :raises EpochOrderError: ``version`` has no epoch (``latest``, ``committed``).
        """
        if version.epoch is None:
            raise EpochOrderError("only a version with an epoch (consistent, as_of) can be pinned")
        self._pinned[version.epoch] = dict(version.snapshots)
        self._write_pins()

    def unpin(self, version: ConsistentVersion) -> None:
        """Remove the pin of ``version``'s epoch (nothing for a version with no epoch), and write the pins anew."""
        if version.epoch is not None:
            self._pinned.pop(version.epoch, None)
        self._write_pins()

    @property
    def pinned(self) -> dict[int, Mapping[str, Optional[int]]]:
        """The versions this session pinned: ``{epoch: {table: snapshot id}}``."""
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
        """Drop every pin and delete this reader's znode."""
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


def scan_at(resolver: Resolver, name: str, snapshot_id: Optional[int], *, row_filter: BooleanExpression = ALWAYS_TRUE,
            selected_fields: tuple[str, ...] = ("*",)) -> Optional[DataScan]:
    """A pyiceberg scan of table ``name`` at ``snapshot_id`` (None for a table that was empty at that point)."""
    if snapshot_id is None:
        return None
    table = table_at(resolver, name, snapshot_id)
    return table.scan(row_filter=row_filter, selected_fields=selected_fields, snapshot_id=snapshot_id)


def table_at(resolver: Resolver, name: str, snapshot_id: int) -> Table:
    """Table ``name`` as ``resolver`` keeps it, with metadata that holds ``snapshot_id``: reloaded when the metadata
    kept predates that commit (a version resolved from ZooKeeper alone loads no metadata)."""
    table = resolver.table(name, refresh=False)
    if table.snapshot_by_id(snapshot_id) is None:
        table = resolver.table(name)
    return table


def scans(resolver: Resolver, version: ConsistentVersion) -> dict[str, Optional[DataScan]]:
    """A pyiceberg scan per table at its snapshot (None for a table that was empty at that point)."""
    return {name: scan_at(resolver, name, sid) for name, sid in version.snapshots.items()}


def read_arrow(resolver: Resolver, version: ConsistentVersion) -> dict[str, pa.Table]:
    """Every table at its snapshot as a ``pyarrow.Table`` (empty with the table's schema when it had none)."""
    result = {}
    for name, scan in scans(resolver, version).items():
        result[name] = (resolver.table(name, refresh=False).schema().as_arrow().empty_table() if scan is None
                        else scan.to_arrow())
    return result
