"""``Tidemark``: a ZooKeeper session with the recipes at hand, the object users start from.

    tm = Tidemark.connect("zk1:2181,zk2:2181/tidemark-prod", session_timeout=10)
    tm.register_job("word_counts", sources=["lake.db.words"], sinks=["lake.db.word_counts"])
    print(tm.status().consistent_epoch)

Each method is a shortcut to one recipe module (``coordinator.protocol``); the recipes take
the plain ``ZooKeeperSession`` underneath, so this module is the only place that knows them all.
Failure behaviour is each recipe's, documented in its module.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Optional

from coordinator.errors import InvalidName
from coordinator.protocol.barriers import Barriers
from coordinator.protocol.leadership import Leadership
from coordinator.protocol.registry import UnregisterPlan, fence_job, register_job, release_tables, unregister_job
from coordinator.protocol.rest import pause_job, resume_job, retire_job
from coordinator.protocol.status import STALE_INTERVALS, Status, read_status
from coordinator.protocol.tidemarks import TidemarkCache, read_tidemarks
from coordinator.protocol.topology import Topology, read_topology
from coordinator.records import JobRecord, RestRecord, TableTidemark
from coordinator.zookeeper.session import ZooKeeperSession

if TYPE_CHECKING:
    from coordinator.iceberg.catalog import CatalogSettings


class Tidemark(ZooKeeperSession):
    """A ZooKeeper session plus the Tidemark recipes; see ``ZooKeeperSession.connect`` for the options."""

    def topology(self) -> Topology:
        """The job graph: every registered job with its sources and sinks, read consistently (``read_topology``).

        :raises CorruptState: a job's znode does not hold a job record.
        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached, or the topology kept changing while it was read,
            until the session's deadline.
        """
        return read_topology(self)

    def register_job(self, name: str, *, sources: Iterable[str], sinks: Iterable[str],
                     replace: bool = False) -> JobRecord:
        """Register job ``name`` reading ``sources`` and writing ``sinks`` (``registry.register_job``); idempotent
        for the same tables.

        :param replace: change the tables of a job already registered with others.
        :raises InvalidName: a job or table name that cannot be used.
        :raises RegistrationError: no sink, or the job exists with other tables and ``replace`` is not set.
        :raises WriterConflict: a sink has another writer job.
        :raises CycleError: the job would close a cycle in the job graph.
        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached, or registration kept racing with others, until
            the session's deadline.
        """
        return register_job(self, name, sources=sources, sinks=sinks, replace=replace)

    def unregister_job(self, name: str, *, confirm: bool = False, catalog: Optional[CatalogSettings] = None,
                       allow_unfenced: bool = False) -> UnregisterPlan:
        """See ``registry.unregister_job``: without ``confirm=True`` it only raises ``UnregisterNotConfirmed``,
        and without a readable catalog ``SinksNotFenced`` (unless ``allow_unfenced=True``)."""
        return unregister_job(self, name, confirm=confirm, catalog=catalog, allow_unfenced=allow_unfenced)

    def release_tables(self, tables: Iterable[str], *, confirm: bool = False,
                       catalog: Optional[CatalogSettings] = None) -> dict[str, int]:
        """See ``registry.release_tables``: tables of a job no longer registered, read by their Iceberg records from
        now on; without ``confirm=True`` nothing changes (the terms it would claim are returned)."""
        return release_tables(self, tables, catalog, confirm=confirm)

    def fence_job(self, name: str, by: str = "operator") -> int:
        """Bump the job's term so its current leader can no longer precommit or commit; returns the new term.

        :param by: who fenced it, recorded in the term znode and named to the fenced leader.
        :raises InvalidName: ``by`` is not a string, or ``name`` is not a job name.
        :raises JobNotFound: the job is not registered.
        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached, or the term kept moving (leader elections),
            until the session's deadline.
        """
        if not isinstance(by, str):
            raise InvalidName(f"who fenced the job (by=) must be a string, got {str(by)[:40]!r}")
        return fence_job(self, name, by=by)

    def pause_job(self, name: str, *, by: str = "operator", reason: str = "",
                  until_ms: Optional[int] = None) -> RestRecord:
        """See ``coordinator.protocol.rest``: no leader runs the job on purpose, until ``until_ms`` or a resume;
        while no live leader runs it, it is not stale and leaves the consistent lag of what is live."""
        return pause_job(self, name, by=by, reason=reason, until_ms=until_ms)

    def retire_job(self, name: str, *, by: str = "operator", reason: str = "") -> RestRecord:
        """See ``coordinator.protocol.rest``: refused while a live leader runs the job; its drivers refuse to lead
        it until ``resume_job``; its tables stay readable at their last epoch."""
        return retire_job(self, name, by=by, reason=reason)

    def resume_job(self, name: str) -> Optional[str]:
        """Remove a pause or a retirement: ``"paused"``, ``"retired"``, or None when the job had neither."""
        return resume_job(self, name)

    def leadership(self, job: str) -> Leadership:
        """A new contention for the leadership of ``job`` (``Leadership``: nothing is asked until ``acquire``).

        :raises InvalidName: ``job`` is not a job name.
        """
        return Leadership(self, job)

    @property
    def barriers(self) -> Barriers:
        """The barrier grid's recipe (``Barriers``), on this session."""
        return Barriers(self)

    def tidemarks(self, tables: Iterable[str]) -> dict[str, Optional[TableTidemark]]:
        """Every table's tidemark, read now (None for a table with no tidemark: no registered job writes it).

        :raises InvalidName: ``tables`` is not a list of valid, distinct table names.
        :raises CorruptState: a tidemark znode cannot be decoded.
        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached before the session's deadline.
        """
        return read_tidemarks(self, tables)

    def tidemark_cache(self) -> TidemarkCache:
        """A new ``TidemarkCache`` on this session: tidemarks kept in memory by watches (``close`` it when done)."""
        return TidemarkCache(self)

    def status(self, stale_intervals: int = STALE_INTERVALS) -> Status:
        """Every job's leader, committed epoch, lag, cadence and what it waits for (``coordinator.protocol.status``);
        a job lagging more than ``stale_intervals`` of its effective cadence, with nothing upstream to blame, is
        stale."""
        return read_status(self, stale_intervals)
