"""Which version of a table ``tidemark serve`` hands out: the rule of docs/design.md, "Serving consistent versions".

    served = ServedVersions(settings, connect=lambda: Tidemark.connect(...))
    choice = served.choose(scope, "demo.word_counts", client="10.0.0.7 Trino/476")
    choice.snapshot_id, choice.version.epoch          # None for a table Tidemark neither writes nor reads: as it is
    served.pin_now(scope)                             # a ``@pinned`` warehouse's pin, at /v1/config

A table that a Tidemark job writes or reads belongs to a *group* of the scope (``scope.py``); every table of a group
is served at one consistent version of the group (``Resolver``, level ``consistent`` or ``as_of``). The rules on top:

- **Never back**: an unpinned group's version never goes below the newest one this server handed out (a resolution
  from Iceberg after ZooKeeper's state was lost may be older: the newer one is served).
- **One query, one version**: a client's loads that follow each other by less than the query gap are one query
  (longer for a table the query has not loaded yet), served at the version the client holds; the first load after a
  quieter gap starts the next query at the newest version, never below the client's hold (``hold.py``). The hold
  comes with each request (a cookie, so any replica continues a client's query) or, for a client that keeps no
  cookies, from this process's memory of the client (address, user agent, credentials). A pinned scope never
  changes at all.
- **ZooKeeper unreachable**: the group's last version is served, marked stale; with none yet, a version from Iceberg
  alone (consistent too, possibly older). Never a newer unchecked one.
- **ZooKeeper's state lost**: a job this server saw in the job graph keeps its tables in their groups for
  ``FORGET_JOBS_S`` while the jobs register again (``CatalogServer`` also refuses to pass through a table whose
  metadata names a Tidemark writer).

``choose(..., wait=False)`` answers from memory alone, on an event loop: what needs a resolution, a ZooKeeper read or
a lock another thread holds raises ``WouldWait`` instead, to be asked again where waiting is allowed.

Failure behaviour: ``choose`` raises ``VersionNotFound`` when a group has no consistent version and never had one here
(a job that committed nothing yet), ``ZooKeeperUnavailable`` when ZooKeeper is unreachable and no topology was ever
read (whether a table is Tidemark's is not known), and the backing catalog's errors as ``load_table`` raises them.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Optional

from kazoo.client import KazooState
from pyiceberg.table import Table

from coordinator.errors import VersionNotFound, ZooKeeperRebuilt, ZooKeeperUnavailable
from coordinator.history.resolve import Resolver
from coordinator.history.versions import RetainedVersions
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.protocol.held_epochs import common_epochs
from coordinator.protocol.pipelines import SET, Group, Pipelines
from coordinator.protocol.tidemarks import TidemarkCache, older_copy
from coordinator.protocol.topology import Topology, read_topology
from coordinator.records import ConsistentVersion, JobRecord
from coordinator.serving.hold import Hold, HoldRule, cookie_name, table_bit
from coordinator.serving.scope import Pin, PinKind, Scope
from coordinator.zookeeper.session import ZooKeeperSession

TOPOLOGY_TTL_S = 1.0  # the job graph is read again at most this often (it changes on registrations only)
CAP_TRIES = 4  # epochs tried, newest first, for the newest version at or before a pin
FORGET_JOBS_S = 300.0  # a job gone from the graph keeps its tables' groups this long (ZooKeeper's state lost)
RESOLVED_KEPT = 1_024  # resolutions remembered (by group, pin and tidemark generation), all dropped beyond
HELD_CLIENTS = 10_000  # holds remembered for clients that keep no cookies, least recently used dropped
EXACT_KEPT = 4_096  # versions at an exact epoch (what holds name), all dropped beyond: a published epoch never changes


class WouldWait(Exception):
    """The answer needs a wait (a resolution, a ZooKeeper read, a catalog load, a lock another thread holds): ask
    again with ``wait=True``, where waiting is allowed (a worker thread, not the event loop)."""


@contextmanager
def _taken(lock: threading.Lock | threading.RLock, wait: bool) -> Iterator[None]:
    """``with lock``; without ``wait``, ``WouldWait`` at once when another thread holds it."""
    if not lock.acquire(blocking=wait):
        raise WouldWait
    try:
        yield
    finally:
        lock.release()


@dataclass(frozen=True)
class Choice:
    """The answer for one table: its ``group`` (None: not Tidemark's, served as it is), the ``version`` served
    (None with a group: no snapshot is served), whether ZooKeeper was unreachable (``stale``), and the client's
    ``hold`` after this load (None for a pinned scope or a table passed through)."""

    table: str
    group: Optional[frozenset[str]]
    version: Optional[ConsistentVersion]
    stale: bool = False
    hold: Optional[Hold] = None

    @property
    def snapshot_id(self) -> Optional[int]:
        """The table's snapshot in the version served (None: passed through, no version, or empty in it)."""
        if self.version is None or self.group is None:
            return None
        return self.version.snapshots.get(self.table)

    @property
    def passthrough(self) -> bool:
        """True for a table that is not Tidemark's (no ``group``): served as the backing catalog has it."""
        return self.group is None


class ServedVersions:
    """The versions a serving process hands out (module docstring), shared by its request threads.

    :param settings: the backing catalog.
    :param connect: opens a ZooKeeper session (what the job graph and the tidemarks are read from); called again when
        the server finds its session ended (a rebuilt ZooKeeper) or could not open one.
    :param rule: when a client's load starts a new query (``hold.py``; default its defaults).
    """

    settings: CatalogSettings
    rule: HoldRule

    def __init__(self, settings: CatalogSettings, connect: Callable[[], ZooKeeperSession], *,
                 rule: Optional[HoldRule] = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings, self.rule = settings, rule or HoldRule()
        self._connect, self._clock = connect, clock
        self._catalog = settings.load()
        # No lock is held across another group's resolution: one group's slow catalog holds back only that group's
        # loads. A group's resolutions run one at a time (its lock): the ones waiting then find the answer kept.
        self._session_lock = threading.Lock()  # opening and closing the ZooKeeper session
        self._graph_lock = threading.Lock()  # the job graph and the jobs seen in it
        self._held_lock = threading.Lock()  # the holds of clients that keep no cookies
        self._group_locks: dict[frozenset[str], threading.RLock] = {}
        self._group_locks_lock = threading.Lock()
        self._iceberg = Resolver(self._catalog, settings, None)
        self._tm: Optional[ZooKeeperSession] = None
        self._resolver: Optional[Resolver] = None
        self._cache: Optional[TidemarkCache] = None
        self._topology: Optional[Topology] = None
        self._topology_read = float("-inf")
        self._resolved: dict[tuple, ConsistentVersion] = {}  # (group, pin, tidemark generation) -> version
        self._newest: dict[frozenset[str], ConsistentVersion] = {}  # never back: the newest served per group
        self._held: OrderedDict[tuple, Hold] = OrderedDict()  # (client, prefix, group) -> hold, for cookieless clients
        self._exact: dict[tuple[frozenset[str], int], ConsistentVersion] = {}  # (group, epoch) -> the version
        self._seen_jobs: dict[str, tuple[JobRecord, float]] = {}  # job -> (record, when last in the graph)
        self._index: Optional[_GraphIndex] = None  # the job graph last read, indexed
        self._reconnecting = threading.Lock()  # held by the one background reconnection under way
        self._closed = False
        self._open_session()

    # -- ZooKeeper ------------------------------------------------------------------------

    def _open_session(self) -> None:
        try:
            tm = self._connect()
        except ZooKeeperUnavailable:
            return  # served from Iceberg until it answers (``_live_session`` tries again, in the background)
        with self._session_lock:
            if self._closed:
                tm.close()
                return
            self._tm, self._cache = tm, TidemarkCache(tm)
            self._resolver = Resolver(self._catalog, self.settings, tm, self._cache)
            self._resolved.clear()

    def _live_session(self, wait: bool = True) -> Optional[ZooKeeperSession]:
        """The live session, or None while ZooKeeper cannot be asked (down, or being reconnected in the background:
        a request never waits for a connection). Without ``wait``, ``WouldWait`` for a session to close."""
        tm = self._tm
        if tm is not None and tm.ended_error() is not None:  # rebuilt under us: this session never comes back
            if not wait:
                raise WouldWait
            with self._session_lock:
                if self._tm is tm:
                    self._cache.close()  # type: ignore[union-attr]
                    tm.close()
                    self._tm = self._resolver = self._cache = None
                    self._resolved.clear()
            tm = None
        if tm is None:
            self._start_reconnecting()
        return tm if tm is not None and tm.connection_state == KazooState.CONNECTED else None

    def _group_lock(self, group: frozenset[str]) -> threading.RLock:
        """The lock a group's resolutions take, one at a time (single flight)."""
        lock = self._group_locks.get(group)
        if lock is None:
            with self._group_locks_lock:
                lock = self._group_locks.setdefault(group, threading.RLock())
        return lock

    def _start_reconnecting(self) -> None:
        if not self._reconnecting.acquire(blocking=False):
            return  # one is under way
        threading.Thread(target=self._reconnect, name="tidemark-serve-reconnect", daemon=True).start()

    def _reconnect(self) -> None:
        try:
            self._open_session()
        finally:
            self._reconnecting.release()

    @property
    def zookeeper_connected(self) -> bool:
        """Whether a live session is connected to ZooKeeper now. It never waits, not even for a resolution under way
        (a health check answers whatever the backing catalog does); asking while there is no session starts a
        reconnection in the background."""
        tm = self._tm
        if tm is None:
            self._start_reconnecting()
        return tm is not None and tm.ended_error() is None and tm.connection_state == KazooState.CONNECTED

    def close(self) -> None:
        """Close the tidemark cache and the ZooKeeper session; a session a background reconnection opens later is
        closed at once."""
        with self._session_lock:
            self._closed = True
            if self._cache is not None:
                self._cache.close()
            if self._tm is not None:
                self._tm.close()

    # -- groups ---------------------------------------------------------------------------

    def topology(self, wait: bool = True) -> Topology:
        """The job graph, read again at most every ``TOPOLOGY_TTL_S``; the last one read while ZooKeeper is
        unreachable. Without ``wait``, ``WouldWait`` when it is to be read again."""
        with _taken(self._graph_lock, wait):
            now = self._clock()
            tm = self._live_session(wait)
            if tm is not None and now - self._topology_read >= TOPOLOGY_TTL_S:
                if not wait:
                    raise WouldWait
                try:
                    self._topology, self._topology_read = read_topology(tm), now
                except (ZooKeeperUnavailable, ZooKeeperRebuilt):
                    pass
            if self._topology is None:
                raise ZooKeeperUnavailable("ZooKeeper is unreachable and this server has not read the job graph yet, "
                                           "so it cannot tell which tables are Tidemark's: check TIDEMARK_ZK and "
                                           "that ZooKeeper is up")
            return self._topology

    def group_of(self, scope: Scope, table: str, wait: bool = True) -> tuple[Optional[str], Optional[frozenset[str]]]:
        """``table`` (an identifier ``ns.t``) as the job graph names it, and its group in ``scope``; (None, None) for a
        table no Tidemark job writes or reads. Without ``wait``, ``WouldWait`` when the graph is to be read again."""
        index = self._graph_index(wait)
        name = index.names.get(table)
        if name is None:
            return None, None
        key = (scope.group, scope.namespace, name)
        if key not in index.groups:
            index.groups[key] = self._group(scope, index.pipelines, name)
        return name, index.groups[key]

    def _graph_index(self, wait: bool = True) -> _GraphIndex:
        graph = self._graph(wait)
        index = self._index
        if index is None or index.pipelines.topology is not graph:  # a job graph read again: worked out again
            pipelines = Pipelines(graph)
            index = self._index = _GraphIndex(pipelines, {self.settings.identifier(t): t for t in pipelines.tables})
        return index

    def _group(self, scope: Scope, pipelines: Pipelines, name: str) -> frozenset[str]:
        """The tables one version of ``scope`` covers with table ``name`` (as the job graph names it)."""
        if scope.group == Group.PIPELINE:
            pipeline = pipelines.of_table(name)
            return frozenset(pipeline.tables if pipeline is not None else (name,))
        groups = pipelines.groups(scope.group, scope.namespace, self.settings.identifier)
        return frozenset(next(iter(groups.values()), ()))

    def _graph(self, wait: bool = True) -> Topology:
        """The job graph with every job seen in it during the last ``FORGET_JOBS_S``: while ZooKeeper's state is lost
        and the jobs register again one by one, their tables keep their groups (never served as they are)."""
        topology = self.topology(wait)
        with _taken(self._graph_lock, wait):
            now = self._clock()
            for name, job in topology.jobs.items():
                self._seen_jobs[name] = (job, now)
            for name in [n for n, (_, seen) in self._seen_jobs.items() if now - seen > FORGET_JOBS_S]:
                del self._seen_jobs[name]
            if len(self._seen_jobs) == len(topology.jobs):
                return topology
            return Topology(topology.version, topology.znode_version,
                            {name: job for name, (job, _) in self._seen_jobs.items()})

    # -- versions -------------------------------------------------------------------------

    def behind_iceberg(self, table: str, loaded: Table) -> Optional[str]:
        """Why ZooKeeper's tidemark of ``table`` is behind ``loaded``, its metadata from the backing catalog (the
        tree restored from an older copy, ``older_copy``: its older versions must not be served), or None."""
        cache, tm = self._cache, self._tm
        if cache is None or tm is None:
            return None
        try:
            return older_copy(tm, table, loaded, cache.get([table])[table])
        except (ZooKeeperUnavailable, ZooKeeperRebuilt):
            return None  # served stale from memory meanwhile (module docstring)

    def choose(self, scope: Scope, table: str, client: str = "", hold: Optional[Hold] = None,
               now_ms: Optional[int] = None, refresh: bool = False,
               cookies: Optional[Mapping[str, str]] = None, wait: bool = True) -> Choice:
        """The version ``table`` is served at for ``client`` in ``scope`` (module docstring), and the client's hold.

        :param scope: the request's scope (its prefix).
        :param table: the table's identifier, ``namespace.name``.
        :param client: who asks (address, user agent, credentials): whose hold is remembered when ``hold`` is None.
        :param hold: the hold the client sent (its cookie for this group), None if it sent none.
        :param now_ms: when the request arrived, wall-clock milliseconds (default now), not when the server got to it.
        :param refresh: the client reloads a table it holds (never the start of a new query).
        :param cookies: the request's cookies, where the client's hold for the table's group is found when ``hold``
            is None (``hold.cookie_name``).
        :param wait: False: from memory alone (module docstring), and nothing remembered: the caller's
            ``answered`` remembers the client's hold once the answer is given.
        :raises WouldWait: without ``wait``, the choice needs a wait.
        :raises VersionNotFound: the table's group has no consistent version, and this server served none before.
        :raises ZooKeeperUnavailable: ZooKeeper is unreachable and the job graph was never read.
        """
        name, group = self.group_of(scope, table, wait)
        if name is None or group is None:
            return Choice(table, None, None)
        if scope.pin is not None:
            version, stale = self._pinned(group, scope.pin, wait)
            return Choice(name, group, version, stale)
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        key = (client, scope.prefix, group)
        if hold is None and cookies:
            hold = Hold.decode(cookies.get(cookie_name(scope.prefix, group)))
        if hold is None:
            with self._held_lock:
                hold = self._held.get(key)
        version, stale, hold = self._for_client(group, name, hold, now_ms, refresh, wait)
        if wait:  # from memory, the answer may still wait (its load): ``answered`` remembers the hold once it is given
            self._remember(key, hold)
        return Choice(name, group, version, stale, hold)

    def answered(self, scope: Scope, client: str, choice: Choice, now_ms: Optional[int] = None) -> Optional[Hold]:
        """The client's hold once its load is answered (what its cookie carries): a client's quiet gap counts from
        the answer, since a slow answer (a backing catalog's load) is not a pause of the client's.

        :param choice: what ``choose`` answered for the load.
        :param now_ms: when the answer is ready, wall-clock milliseconds (default now).
        """
        if choice.hold is None or choice.group is None:
            return None
        hold = choice.hold.loaded(int(time.time() * 1000) if now_ms is None else now_ms)
        self._remember((client, scope.prefix, choice.group), hold)
        return hold

    def _remember(self, key: tuple, hold: Optional[Hold]) -> None:
        if hold is None:
            return
        with self._held_lock:
            self._held[key] = hold
            self._held.move_to_end(key)
            while len(self._held) > HELD_CLIENTS:
                self._held.popitem(last=False)

    def _for_client(self, group: frozenset[str], table: str, hold: Optional[Hold], now_ms: int, refresh: bool,
                    wait: bool) -> tuple[ConsistentVersion, bool, Optional[Hold]]:
        """The version a client holding ``hold`` gets for ``table`` at ``now_ms``, whether it is stale, and the
        client's new hold."""
        bit = table_bit(group, table)
        if hold is not None and self.rule.continues(hold, bit, now_ms, refresh):
            held, stale = self._exactly(group, hold.epoch, self._newest.get(group), wait)
            if held is not None:
                return held, stale, hold.loaded(now_ms, bit)
            hold = None  # not a version of this group: no floor either
        version, stale = self._newest_of(group, wait)  # a new query: the newest, never below the client's hold
        if hold is not None and version.epoch is not None and version.epoch < hold.epoch:
            held, held_stale = self._exactly(group, hold.epoch, version, wait)  # this server is behind the client's
            if held is not None:
                version, stale = held, held_stale
        return version, stale, (Hold.taken(version.epoch, now_ms, bit) if version.epoch is not None else None)

    def newest_versions(self) -> Mapping[frozenset[str], ConsistentVersion]:
        """The newest version served per group (for metrics: their ages; a copy taken without waiting for a
        resolution under way)."""
        return dict(self._newest)

    def pin_now(self, scope: Scope) -> Pin:
        """A ``@pinned`` scope's pin: the newest epoch served now (its group's, for one group; the newest of the
        groups', for the pipeline group, so that no pipeline goes back)."""
        pipelines = self._graph_index().pipelines
        groups = {frozenset(tables) for tables in pipelines.groups(scope.group, scope.namespace,
                                                                   self.settings.identifier).values()}
        epochs = []
        for group in groups:
            if not group:
                continue
            try:
                version, _ = self._newest_of(group)
            except VersionNotFound:
                continue
            if version.epoch is not None:
                epochs.append(version.epoch)
        return Pin(PinKind.AT_OR_BEFORE, max(epochs, default=int(time.time() * 1000)))

    def _newest_of(self, group: frozenset[str], wait: bool = True) -> tuple[ConsistentVersion, bool]:
        """The group's newest consistent version, never older than one served before; stale when from memory."""
        with _taken(self._group_lock(group), wait):
            previous = self._newest.get(group)
            try:
                version, stale = self._resolve(group, None, wait), False
            except (ZooKeeperUnavailable, ZooKeeperRebuilt):
                if previous is not None:
                    return previous, True
                if not wait:
                    raise WouldWait from None
                version, stale = self._iceberg.resolve(sorted(group), scope=SET), True
            except VersionNotFound:
                if previous is None:
                    raise
                return previous, False
            if previous is not None and previous.epoch is not None and (
                    version.epoch is None or version.epoch < previous.epoch):
                return previous, stale
            self._newest[group] = version
            self._keep_exact(group, version)
            return version, stale

    def _exactly(self, group: frozenset[str], epoch: int, newest: Optional[ConsistentVersion], wait: bool = True,
                 ) -> tuple[Optional[ConsistentVersion], bool]:
        """The group's version at exactly ``epoch`` (a hold's), None when the group does not hold it (a hold from
        another deployment, or made up); stale when read from Iceberg alone.

        :param newest: the group's newest version here: a hold newer than it was served by a replica whose tidemarks
            are ahead of this one's, so the tidemarks are read from ZooKeeper rather than this process's cache."""
        with _taken(self._group_lock(group), wait):
            found = self._exact.get((group, epoch))
            if found is not None:
                return found, False
            if not wait:
                raise WouldWait
            tables = sorted(group)
            try:
                version, stale = self._resolve(group, Pin(PinKind.EXACT, epoch)), False
            except (ZooKeeperUnavailable, ZooKeeperRebuilt):
                try:
                    version, stale = self._iceberg.resolve(tables, as_of=epoch, scope=SET), True
                except VersionNotFound:
                    return None, False
            except VersionNotFound:
                ahead = newest is None or newest.epoch is None or epoch > newest.epoch
                if self._tm is None or not ahead:
                    return None, False
                uncached = Resolver(self._catalog, self.settings, self._tm)
                try:
                    version, stale = uncached.resolve(tables, as_of=epoch, scope=SET), False
                except (VersionNotFound, ZooKeeperUnavailable, ZooKeeperRebuilt):
                    return None, False
            self._keep_exact(group, version)
            return version, stale

    def _keep_exact(self, group: frozenset[str], version: ConsistentVersion) -> None:
        if version.epoch is None:
            return
        if len(self._exact) >= EXACT_KEPT:
            self._exact.clear()
        self._exact[(group, version.epoch)] = version

    def _pinned(self, group: frozenset[str], pin: Pin, wait: bool = True) -> tuple[ConsistentVersion, bool]:
        with _taken(self._group_lock(group), wait):
            try:
                return self._resolve(group, pin, wait), False
            except (ZooKeeperUnavailable, ZooKeeperRebuilt):
                if not wait:
                    raise WouldWait from None
                tables = sorted(group)
                if pin.kind == PinKind.EXACT:
                    return self._iceberg.resolve(tables, as_of=pin.epoch, scope=SET), True
                return _at_or_before(self._iceberg, tables, pin.epoch, {}), True

    def _resolve(self, group: frozenset[str], pin: Optional[Pin], wait: bool = True) -> ConsistentVersion:
        """One resolution through ZooKeeper, remembered until a tidemark moves; without ``wait``, only a remembered
        one (else ``WouldWait``)."""
        resolver, cache = self._resolver, self._cache  # this session's, whatever another thread finds ended meanwhile
        if self._live_session(wait) is None or resolver is None or cache is None:
            raise ZooKeeperUnavailable("ZooKeeper is unreachable")
        key = (group, pin, cache.generation)
        found = self._resolved.get(key)
        if found is not None:
            return found
        if not wait:
            raise WouldWait
        tables = sorted(group)
        if pin is None:
            version = resolver.resolve(tables, scope=SET)
        elif pin.kind == PinKind.EXACT:
            version = resolver.resolve(tables, as_of=pin.epoch, scope=SET)
        else:
            version = _at_or_before(resolver, tables, pin.epoch, cache.get(tables))
        if len(self._resolved) > RESOLVED_KEPT:
            self._resolved.clear()
        self._resolved[key] = version
        return version


@dataclass
class _GraphIndex:
    """One job graph's pipelines, its tables by identifier, and their groups as asked for (by group kind, namespace
    and table)."""

    pipelines: Pipelines
    names: dict[str, str]
    groups: dict[tuple[Group, Optional[str], str], frozenset[str]] = field(default_factory=dict)


def _at_or_before(resolver: Resolver, tables: list[str], cap: int, marks: Mapping) -> ConsistentVersion:
    """The newest consistent version of ``tables`` whose epoch is at or before ``cap``: the newest, if it is; else the
    newest epoch every table's recent list or every table's Iceberg records hold (those reach back once ZooKeeper's
    lists moved past: a session pinned longer keeps its version), else a retained version."""
    newest = resolver.resolve(tables, scope=SET)
    if newest.epoch is None or newest.epoch <= cap:
        return newest
    lists = [m.epochs for m in marks.values() if m is not None] if marks else []
    listed = set(common_epochs(lists)) if len(lists) == len(tables) else set()
    if cap not in listed:  # only then can an epoch the lists no longer reach be the newest: read the tables' records
        listed |= set(resolver.recorded_epochs(tables))
    candidates = sorted((e for e in listed if e <= cap), reverse=True)
    if resolver.tm is not None:
        candidates += sorted((e for e in RetainedVersions(resolver.tm).epochs() if e <= cap), reverse=True)
    else:
        candidates += sorted((e for e in resolver.retained_epochs(tables) if e <= cap), reverse=True)
    for epoch in list(dict.fromkeys(candidates))[:CAP_TRIES]:
        try:
            return resolver.resolve(tables, as_of=epoch, scope=SET)
        except VersionNotFound:
            continue
    raise VersionNotFound(f"no version of {tables} at or before {cap} is still known: ZooKeeper's recent epochs, the "
                          "tables' Iceberg records and the retained versions (`tidemark versions`) start later")


__all__ = ["Choice", "ServedVersions", "WouldWait"]
