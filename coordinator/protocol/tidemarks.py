"""Reading table tidemarks: one-shot (pipelined) and through a watch-backed cache.

    tm.tidemarks(["lake.db.a", "lake.db.b"])     # {table: TableTidemark | None}: one multiRead per 256 tables
    cache = tm.tidemark_cache()
    cache.get(tables)                             # served from memory once watched
    cache.cached(tables)                          # memory only, never a ZooKeeper read (for metrics scrapes)
    cache.wait_for(tables, epoch=T, timeout=60)   # block until every table reached T
    cache.wait_changed(cache.generation, 1.0)     # block until any watched tidemark moves
    older_copy(tm, "lake.db.a", loaded_table, mark)  # why the tidemark is behind what Iceberg proves, or None

The cache sets one data watch per table; a watch callback only re-arms the watch with an
asynchronous read (it never blocks). kazoo drops every watch when the connection drops (SUSPENDED),
session or not, so the cache then forgets its values and re-reads (and re-watches) on the next get().
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Optional

from kazoo.client import KazooState
from kazoo.exceptions import ConnectionLoss, NoNodeError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import WatchedEvent
from pyiceberg.table import Table

from coordinator.errors import CorruptState, TidemarkError
from coordinator.iceberg.lineage import proven_committed_epoch
from coordinator.iceberg.snapshots import writer_job
from coordinator.names import validate_names
from coordinator.records import TableTidemark
from coordinator.zookeeper.multiread import read_many
from coordinator.zookeeper.session import ZooKeeperSession


def read_tidemarks(tm: ZooKeeperSession, tables: Iterable[str]) -> dict[str, Optional[TableTidemark]]:
    """Every table's tidemark (None for a table no registered job writes)."""
    names = list(validate_names(tables, "table name"))
    results = read_many(tm, [tm.paths.tidemark(t) for t in names])
    return {t: (None if r is None else TableTidemark.from_json(r[0], tm.paths.tidemark(t)))
            for t, r in zip(names, results)}


def older_copy(tm: ZooKeeperSession, table: str, loaded: Table, mark: Optional[TableTidemark]) -> Optional[str]:
    """Why ``table``'s tidemark in ZooKeeper is behind ``loaded``, its metadata from the catalog, or None. A healthy
    tree's tidemark is never below the epoch its table's metadata proves committed (``proven_committed_epoch``), so
    one that is holds the state of an older copy of the tree (restored from a backup): its versions are older than
    readers were given before, and must not be read until the job has resumed from Iceberg. A ``mark`` found behind
    is read again from ZooKeeper before saying so, so that a watch not delivered yet, or a commit since it was read,
    is no reason.

    :param mark: the tidemark the caller read (from its watch cache, or ZooKeeper), None if it found none.
    :raises ZooKeeperUnavailable: the tidemark cannot be read again before the session's deadline.
    """
    job = writer_job(loaded)
    if job is None:
        return None
    proven = proven_committed_epoch(loaded, job, mark.epoch if mark else None)
    if proven is not None:
        mark = read_tidemarks(tm, [table])[table]
        proven = proven_committed_epoch(loaded, job, mark.epoch if mark else None)
    if proven is None:
        return None
    return (f"its Iceberg metadata shows epoch {proven} of job {job!r} committed, and its tidemark in ZooKeeper is at "
            f"{mark.epoch if mark else None}: ZooKeeper holds an older copy's state (restored?). It is read again "
            "once the job has resumed from Iceberg; retry")


class TidemarkCache:
    """Table tidemarks kept in memory by one data watch per table: one read per change, none per look.

        cache = tm.tidemark_cache()
        marks = cache.get(["lake.db.a", "lake.db.b"])     # read and watched at the first get, then from memory
        cache.wait_for(["lake.db.a"], epoch=T, timeout=60)
        cache.close()

    Znodes: reads, never writes, the ``/tables/<table>/tidemark`` of each table asked for (a missing one is
    watched for its creation, and is None meanwhile).

    Failure behaviour: ``get`` raises ``ZooKeeperUnavailable`` when the tidemarks cannot be read before the
    session's deadline and ``CorruptState`` for a tidemark that cannot be decoded; ``wait_for`` raises
    ``TidemarkError`` after its timeout. kazoo drops every watch when the connection drops (SUSPENDED or LOST),
    so the cache then forgets its values, and the next ``get`` reads and watches them again. ``cached`` answers
    from memory only, whatever ZooKeeper's state.
    """

    def __init__(self, tm: ZooKeeperSession) -> None:
        self.tm = tm
        self._values: dict[str, Optional[TableTidemark]] = {}
        self._errors: dict[str, CorruptState] = {}
        self._changed = threading.Condition()
        self._generation = 0  # bumped on every stored change, so a waiter never misses one
        self._closed = False
        tm.add_state_listener(self._on_state)

    def get(self, tables: Iterable[str]) -> dict[str, Optional[TableTidemark]]:
        """Every table's tidemark; ``ZooKeeperUnavailable`` when they cannot be read before the deadline."""
        names = list(validate_names(tables, "table name"))

        def attempt() -> dict[str, Optional[TableTidemark]]:
            missing = [t for t in names if t not in self._values]
            if missing:
                self._load(missing)
            with self._changed:
                if any(t not in self._values for t in names):
                    raise ConnectionLoss()  # a re-read failed meanwhile and dropped the value: read again
                for t in names:
                    if t in self._errors:
                        raise self._errors[t]
                return {t: self._values[t] for t in names}
        return self.tm.with_deadline(f"reading the tidemarks of {len(names)} tables", attempt)

    def cached(self, tables: Iterable[str]) -> dict[str, Optional[TableTidemark]]:
        """The tables already loaded, from memory only: never waits on ZooKeeper."""
        with self._changed:
            return {t: self._values[t] for t in tables if t in self._values}

    def _load(self, tables: list[str]) -> None:
        # Read-and-watch in one pipelined batch; the watches keep the values fresh afterwards.
        pending = [(t, self.tm.client.get_async(self.tm.paths.tidemark(t), watch=self._on_watch)) for t in tables]
        for table, result in pending:
            try:
                result.get(timeout=self.tm.operation_timeout)  # connection trouble reaches get()'s deadline
            except NoNodeError:
                pass
            self._arrived(table, result)

    def _arrived(self, table: str, result: IAsyncResult) -> None:
        """Store a finished read; a missing znode is watched for creation instead."""
        try:
            self._store(table, result.get_nowait()[0])
        except NoNodeError:
            self._store(table, None)
            self.tm.client.exists_async(self.tm.paths.tidemark(table), watch=self._on_watch)
        except Exception:  # noqa: BLE001 - connection trouble: dropped, re-read on the next get()
            with self._changed:
                self._values.pop(table, None)

    def _store(self, table: str, raw: Optional[bytes]) -> None:
        with self._changed:
            self._errors.pop(table, None)
            try:
                where = self.tm.paths.tidemark(table)
                self._values[table] = None if raw is None else TableTidemark.from_json(raw, where)
            except CorruptState as exc:
                self._errors[table] = exc
                self._values[table] = None
            self._generation += 1
            self._changed.notify_all()

    def _rearm(self, table: str) -> None:
        if not self._closed:
            self.tm.client.get_async(self.tm.paths.tidemark(table), watch=self._on_watch).rawlink(
                lambda result: self._arrived(table, result))

    def _on_watch(self, event: WatchedEvent) -> None:
        prefix, suffix = self.tm.paths.tables + "/", "/tidemark"
        if event.path and event.path.startswith(prefix) and event.path.endswith(suffix):
            self._rearm(event.path[len(prefix):-len(suffix)])

    def _on_state(self, state: str) -> None:
        # kazoo drops every watch when the connection is lost, not only with the session (it does not
        # re-register them on reconnection): forget the values, reload and re-watch on the next get().
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            with self._changed:
                self._values.clear()
                self._changed.notify_all()

    def wait_for(self, tables: Iterable[str], epoch: int, timeout: float) -> dict[str, Optional[TableTidemark]]:
        """Block until every table's tidemark is ``>= epoch``; ``TidemarkError`` after ``timeout``."""
        names = list(validate_names(tables, "table name"))
        deadline = time.monotonic() + timeout
        while True:
            values = self.get(names)
            behind = [t for t, v in values.items() if v is None or v.epoch is None or v.epoch < epoch]
            if not behind:
                return values
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TidemarkError(f"tables {behind} did not reach epoch {epoch} within {timeout:.0f}s "
                                    "(their writer jobs may be stale: see `tidemark status`)")
            with self._changed:
                self._changed.wait(min(remaining, 1.0))

    @property
    def generation(self) -> int:
        """A counter of stored changes: pass it to ``wait_changed`` to wait for the next one."""
        return self._generation

    def wait_changed(self, since: int, timeout: float) -> None:
        """Block until a tidemark changed after generation ``since`` (see ``generation``), or ``timeout`` passes."""
        with self._changed:
            self._changed.wait_for(lambda: self._generation != since, timeout=max(0.0, timeout))

    def close(self) -> None:
        """Stop watching: a watch that fires after this is not set again, and state changes are no longer followed."""
        self._closed = True
        self.tm.remove_state_listener(self._on_state)
