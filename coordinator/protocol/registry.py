"""Registering, fencing and unregistering jobs: FLIP-276's MetaService duties, atomically.

Every registration is an *incarnation* with a fresh id (``JobRecord.incarnation``) and
the znode ``/jobs/<job>/incarnation-<id>``; leaders check that znode in every write, so a
leader of an earlier incarnation is fenced for good (``leadership.py``). Unregistering
deletes the job's ZooKeeper history; its progress stays in the sinks' Iceberg metadata,
which a re-registered job resumes from (``progress.py``). ``unregister_job`` therefore
says what that resume point is and goes ahead only with ``confirm=True``.

Registration is one multi: the job's znodes, ``/tables/<sink>`` for each sink (which fails if
another job already writes it) and ``set(/topology, v+1)`` conditional on version ``v``. The
decision (writer conflict, cycle) is taken on the topology read at version ``v``, so a
concurrent registration makes the multi fail and the whole decision is retried, with a
deadline, on the new topology.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional, TypeVar

from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError
from kazoo.security import Permissions

from coordinator.errors import (
    ConfigurationError,
    CorruptState,
    CycleError,
    JobNotFound,
    MultiFailed,
    RegistrationError,
    SinksNotFenced,
    TidemarkError,
    UnregisterNotConfirmed,
    WriterConflict,
)
from coordinator.names import parse_epoch, validate_name, validate_names
from coordinator.protocol.topology import Topology, read_topology, remember_topology
from coordinator.records import (
    EpochProgress,
    EpochRecord,
    EpochState,
    JobRecord,
    LeaderRecord,
    TableRecord,
    TableTidemark,
    TermRecord,
    TopologyVersion,
    now_ms,
)
from coordinator.zookeeper.ops import Create, Delete, Op, SetData
from coordinator.zookeeper.races import Raced
from coordinator.zookeeper.session import ZooKeeperSession

if TYPE_CHECKING:
    from coordinator.iceberg.catalog import CatalogSettings
    from coordinator.iceberg.progress import ResumePoint

T = TypeVar("T")


class TermMoved(Raced):
    """A job's term moved (a leader was elected) between the read and the multi conditional on it: decide again."""


def retry_term_change(tm: ZooKeeperSession, what: str, attempt: Callable[[], T]) -> T:
    """Run ``attempt`` again while it raises ``TermMoved`` (``tm.retry_races``, counted as ``registration``); then
    ``ZooKeeperUnavailable`` saying ``what`` kept racing with the job's leader elections."""
    return tm.retry_races(f"{what} kept racing with its leader elections for {tm.operation_timeout:.0f}s; try again",
                          attempt, counter="registration")


def _with_topology(tm: ZooKeeperSession, decide: Callable[[Topology], T]) -> T:
    """``decide`` on the topology there is now, again each time its multi lost a race (``_apply``)."""
    return tm.retry_races(f"registration kept racing with other registrations for {tm.operation_timeout:.0f}s; "
                          "try again", lambda: decide(read_topology(tm)), counter="registration")


def _apply(tm: ZooKeeperSession, topo: Topology, ops: list[Op], after: Topology) -> None:
    """Apply ``ops`` if the topology is still ``topo``; ``after`` is what it is then (kept as the cache).

    The version-checked bump of ``/topology`` in the same multi is the compare-and-set.
    """
    bump = SetData(tm.paths.topology, TopologyVersion(topo.version + 1).to_json(), topo.znode_version)
    try:
        tm.multi([*ops, bump])
    except MultiFailed as failed:
        if isinstance(failed.error, (BadVersionError, NodeExistsError, NoNodeError)):
            raise Raced() from None
        raise
    remember_topology(tm, Topology(topo.version + 1, topo.znode_version + 1, after.jobs))


def _orphan_removal(tm: ZooKeeperSession, name: str) -> list[Op]:
    """Deletes for a ``/jobs/<job>`` znode without a record: kazoo's lock recipe re-creates the election path of
    a standby that was contending when the tree was wiped. Nothing else writes there, and that standby can
    never lead this new registration (its election checks the incarnation it started with), so it goes."""
    found = tm.get(tm.paths.job(name))
    if found is None or found[0]:
        return []

    def below(path: str) -> list[Op]:
        ops: list[Op] = []
        for child in tm.children(path):
            ops += below(f"{path}/{child}")
        return ops + [Delete(path)]
    return below(tm.paths.job(name))


def register_job(tm: ZooKeeperSession, name: str, *, sources: Iterable[str], sinks: Iterable[str],
                 replace: bool = False) -> JobRecord:
    """Register ``name`` reading ``sources`` and writing ``sinks``; idempotent for the same tables.

    Raises ``WriterConflict`` when a sink has another writer, ``CycleError`` naming the cycle
    the job would close, and ``RegistrationError`` when the job exists with other tables
    and ``replace`` is not set.
    """
    validate_name(name, "job name")
    sources_t, sinks_t = validate_names(sources, "source table"), validate_names(sinks, "sink table")
    if not sinks_t:
        raise RegistrationError(f"job {name!r} declares no sink table; every job writes at least one table")

    def decide(topo: Topology) -> JobRecord:
        existing = topo.jobs.get(name)
        fresh = uuid.uuid4().hex  # the incarnation of a new registration
        if existing and (existing.sources, existing.sinks) == (sources_t, sinks_t):
            if existing.incarnation is None:  # registered by a release before incarnations: give it one
                upgraded = JobRecord(existing.sources, existing.sinks, existing.created_ms, fresh)
                _apply(tm, topo, [SetData(tm.paths.job(name), upgraded.to_json()),
                                  Create(tm.paths.incarnation(name, fresh), b"")],
                       topo.with_job(name, upgraded))
                return upgraded
            return existing
        if existing and not replace:
            raise RegistrationError(
                f"job {name!r} is registered with sources {list(existing.sources)} and sinks {list(existing.sinks)}; "
                "pass replace=True to change them (or unregister it first)")
        writers = topo.writers
        for sink in sinks_t:
            if writers.get(sink, name) != name:
                raise WriterConflict(sink, writers[sink], name)
        record = JobRecord(sources_t, sinks_t, existing.created_ms if existing else now_ms(),
                           existing.incarnation if existing else fresh)
        cycle = topo.with_job(name, record).find_cycle()
        if cycle:
            raise CycleError(cycle)
        p = tm.paths
        if existing:
            ops: list[Op] = [SetData(p.job(name), record.to_json())]
            for dropped in sorted(set(existing.sinks) - set(sinks_t)):
                ops += [Delete(p.tidemark(dropped)), Delete(p.table(dropped))]
        else:
            ops = [*_orphan_removal(tm, name),
                   Create(p.job(name), record.to_json()), Create(p.incarnation(name, fresh), b""),
                   Create(p.term(name), TermRecord(0).to_json()), Create(p.election(name)), Create(p.epochs(name))]
        for added in sorted(set(sinks_t) - set(existing.sinks if existing else ())):
            ops += [Create(p.table(added), TableRecord(name).to_json()),
                    Create(p.tidemark(added), TableTidemark(added).to_json())]
        _apply(tm, topo, ops, topo.with_job(name, record))
        return record

    return _with_topology(tm, decide)


def check_table_identities(tm: ZooKeeperSession, tables: Mapping[str, str], catalog: str, *,
                           record: bool = False) -> None:
    """Check that each of ``tables`` (name: its Iceberg ``table-uuid`` in ``catalog``) is the table its writer job
    writes: a tree used with two catalogs would otherwise answer for tables it never wrote. Tables no job writes
    are not checked.

    :param catalog: the catalog the tables were loaded from, as messages name it (``CatalogSettings.describe``).
    :param record: a writer's check: a table whose record has no uuid yet gets this one (a reader writes nothing).
    :raises ConfigurationError: a table is another Iceberg table than the one its writer's registration recorded.
    """
    names = sorted(tables)
    for name, found in zip(names, tm.get_many([tm.paths.table(name) for name in names])):
        if found is None:
            continue
        registered = TableRecord.from_json(found[0], tm.paths.table(name))
        if registered.table_uuid is None and record:
            try:
                tm.multi([SetData(tm.paths.table(name), TableRecord(registered.writer, tables[name]).to_json(),
                                  found[1].version)])
            except MultiFailed:  # recorded meanwhile: compare with that
                check_table_identities(tm, {name: tables[name]}, catalog)
        elif registered.table_uuid not in (None, tables[name]):
            raise ConfigurationError(
                f"table {name} in {catalog} is not the table job {registered.writer} writes (its Iceberg table-uuid "
                f"is {tables[name]}, the job registered {registered.table_uuid}): this ZooKeeper tree belongs to "
                "another catalog. Point TIDEMARK_CATALOG_URI (or PYICEBERG_CATALOG__*) at the catalog its jobs "
                "write, or give this catalog a ZooKeeper root or chroot of its own; if the table was dropped and "
                f"created again, `tidemark unregister {registered.writer}` first")


def fence_job(tm: ZooKeeperSession, name: str, by: str = "operator") -> int:
    """Bump the job's term so its current leader can no longer precommit or commit; returns the new term.

    :param by: who fenced it, recorded in the term znode (``fenced_by``) and named to the fenced leader.
    :raises JobNotFound: the job is not registered.
    :raises ZooKeeperUnavailable: the term kept moving (leader elections) until the session's deadline.
    """
    validate_name(name, "job name")

    def attempt() -> int:
        found = tm.read(tm.paths.term(name), TermRecord)
        if found is None:
            raise JobNotFound(f"job {name!r} is not registered (see `tidemark status`)")
        record, stat = found
        new = TermRecord(record.term + 1, fenced_by=by)
        try:
            tm.multi([SetData(tm.paths.term(name), new.to_json(), stat.version)])
        except MultiFailed:
            raise TermMoved() from None  # a leader was elected meanwhile: fence that one
        return new.term
    return retry_term_change(tm, f"fencing job {name!r}", attempt)


@dataclass(frozen=True)
class UnregisterPlan:
    """What unregistering ``job`` removes, and what a re-registration of it will resume from."""

    job: str
    record: JobRecord
    resume: Optional[ResumePoint]     # None when the sinks' Iceberg metadata could not be read
    unreadable: Optional[str] = None    # why not
    committed: Optional[EpochProgress] = None   # the newest epoch ZooKeeper committed (carried into the sinks)

    @property
    def sinks(self) -> tuple[str, ...]:
        """The job's sink tables, as registered."""
        return tuple(self.record.sinks)

    def describe(self) -> str:
        """One line for operators."""
        removes = (f"unregistering job {self.job} deletes its ZooKeeper history and its claim on "
                   f"{', '.join(self.record.sinks)}")
        if self.resume is None:
            return (f"{removes}; its sinks' Iceberg metadata could not be read ({self.unreadable}), so what a "
                    "re-registration resumes from is unknown")
        return f"{removes}; {self.resume.describe()}"


def plan_unregister(tm: ZooKeeperSession, name: str, catalog: Optional[CatalogSettings] = None) -> UnregisterPlan:
    """Check that ``name`` may be unregistered (registered, no live leader) and read its Iceberg resume point.

    :param catalog: the catalog of the sinks (None: ``CatalogSettings.from_env()``); a plan whose sinks cannot be
        read says why in ``unreadable``.
    :raises JobNotFound: the job is not registered.
    :raises RegistrationError: the job has a live, unfenced leader.
    """
    from coordinator.iceberg.progress import resume_point
    validate_name(name, "job name")
    record = read_topology(tm).jobs.get(name)
    if record is None:
        raise JobNotFound(f"job {name!r} is not registered (see `tidemark status`)")
    _refuse_live_leader(tm, name)
    committed = _committed_in_zookeeper(tm, name)
    try:
        resume = resume_point(name, _sink_tables(record, catalog), committed)
    except TidemarkError as exc:
        return UnregisterPlan(name, record, None, str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                              committed)
    return UnregisterPlan(name, record, resume, None, committed)


def _committed_in_zookeeper(tm: ZooKeeperSession, name: str) -> Optional[EpochProgress]:
    """The job's newest epoch committed in ZooKeeper, as the progress its sinks record it with.

    It can be ahead of the sinks' Iceberg metadata: a sink that published nothing in an epoch
    gets its committed-epoch marker only after the ZooKeeper commit, and a leader killed or
    fenced in between never writes it.
    """
    p = tm.paths
    for epoch in sorted((e for e in map(parse_epoch, tm.children(p.epochs(name))) if e is not None), reverse=True):
        try:
            found = tm.read(p.epoch(name, epoch), EpochRecord)
        except CorruptState:
            continue  # unregistering is how an operator gets rid of a damaged history: never block it
        if found is not None and found[0].state == EpochState.COMMITTED:
            record = found[0]
            return EpochProgress(name, record.epoch, record.term, record.inputs)
    return None


def _sink_tables(record: JobRecord, catalog: Optional[CatalogSettings]) -> dict:
    from coordinator.iceberg.catalog import CatalogSettings, load_table
    settings = catalog or CatalogSettings.from_env()
    loaded = settings.load()
    return {sink: load_table(loaded, settings, sink) for sink in record.sinks}


def _fence_in_iceberg(tm: ZooKeeperSession, plan: UnregisterPlan, fence: int, catalog: Optional[CatalogSettings],
                      ) -> None:
    """Claim the sinks for a term above every term of this registration, before its ZooKeeper state goes:
    none of its leaders (a paused one included) can commit there any more, and the terms of the next
    registration start above it. Then record in each sink the newest epoch ZooKeeper committed, which
    its committed-epoch marker may lack: once ZooKeeper's tidemarks are gone, Iceberg is what readers
    and the next registration go by, and it must not be behind what readers already saw. Last, the
    release: readers with ZooKeeper go by Iceberg alone only for a released table (``is_released``)."""
    from coordinator.errors import Fenced
    from coordinator.iceberg.publish import advance_committed_epoch, claim_table
    for table in _sink_tables(plan.record, catalog).values():
        try:
            claim_table(table, plan.job, fence)
            if plan.committed is not None:
                advance_committed_epoch(table, plan.committed, fence)
            claim_table(table, plan.job, fence, release=True)
        except Fenced:
            pass  # already claimed by a higher term: fenced as well, and that registration's leader marks it


def release_tables(tm: ZooKeeperSession, tables: Iterable[str], catalog: Optional[CatalogSettings] = None,
                   confirm: bool = False) -> dict[str, int]:
    """Record that the writer of each of ``tables``, a job this tree no longer registers, released it for good, as
    ``unregister_job`` does for the sinks of a registered job: a reader with ZooKeeper then reads the table by its
    Iceberg records (``is_released``), and no leader of that job's earlier terms can commit there any more (the
    table is claimed for a term above them; a registration of the job again takes a higher one). For tables whose
    job was unregistered by a Tidemark release that did not record the release. Returns each table's new term;
    without ``confirm`` it changes nothing and returns the terms it would claim.

    :raises RegistrationError: a table is written by a job registered here (``tidemark unregister`` it), or no
        Tidemark job ever wrote it.
    :raises TableNotFound: a table is not in the catalog.
    """
    from coordinator.iceberg.catalog import CatalogSettings, load_table
    from coordinator.iceberg.publish import claim_table
    from coordinator.iceberg.snapshots import claimed_term, is_released, writer_job
    names = sorted(set(validate_names(tables, "table name")))
    writers = read_topology(tm).writers
    registered = {n: writers[n] for n in names if n in writers}
    if registered:
        raise RegistrationError(f"tables {sorted(registered)} are written by registered jobs "
                                f"{sorted(set(registered.values()))}: `tidemark unregister` the job instead, which "
                                "records the newest epoch ZooKeeper committed before it releases its tables")
    settings = catalog or CatalogSettings.from_env()
    loaded = settings.load()
    found = {n: load_table(loaded, settings, n) for n in names}
    jobs = {n: job for n, t in found.items() if (job := writer_job(t)) is not None}
    unwritten = sorted(set(names) - set(jobs))
    if unwritten:
        raise RegistrationError(f"no Tidemark job ever claimed tables {unwritten}: there is nothing to release")
    terms = {n: claimed_term(t.properties) + (0 if is_released(t.properties) else 1) for n, t in found.items()}
    if confirm:
        for name, table in found.items():
            claim_table(table, jobs[name], terms[name], release=True)
    return terms


def _refuse_live_leader(tm: ZooKeeperSession, name: str) -> None:
    p = tm.paths
    term = tm.read(p.term(name), TermRecord)
    leader = tm.read(p.leader(name), LeaderRecord)
    if leader is not None and term is not None and leader[0].term >= term[0].term:
        raise RegistrationError(
            f"job {name!r} has a live leader ({leader[0].member} on {leader[0].host}, term {leader[0].term}): "
            f"stop it, or `tidemark fence {name}` first")


def unregister_job(tm: ZooKeeperSession, name: str, *, confirm: bool = False,
                   catalog: Optional[CatalogSettings] = None, allow_unfenced: bool = False) -> UnregisterPlan:
    """Remove a job, its ZooKeeper history and its tables' writer claims; returns what was planned.

    Refused (``RegistrationError``) while the job has a live, unfenced leader, and
    (``SinksNotFenced``) when the sinks' Iceberg metadata cannot be read to fence them, unless
    ``allow_unfenced=True`` (for sinks that are gone for good). Without ``confirm=True``
    nothing changes and ``UnregisterNotConfirmed`` (carrying the plan: what a re-registration
    will resume from, read from the sinks' Iceberg metadata) is raised. Confirmed, it first
    claims the sinks in Iceberg for a term above the job's current one, so no leader of this
    registration can commit to them any more and the next registration's terms start above it.

    :raises JobNotFound: the job is not registered.
    :raises PermissionDenied: this session's identity may not delete the job's znodes (checked before anything
        changes, Iceberg included).
    """
    # The term first: the plan, the fence and the deletes all go by it, and a leader elected after this
    # read changes it, which makes the deletes refuse (its commits would otherwise go unrecorded).
    term = tm.read(tm.paths.term(name), TermRecord)
    plan = plan_unregister(tm, name, catalog)
    # Before anything changes, in Iceberg first: a job identity may unregister only its own job.
    if not tm.may_change(tm.paths.job(name), Permissions.DELETE):
        raise tm.denied(f"unregistering job {name!r} (delete under {tm.paths.job(name)})")
    if plan.resume is None and not allow_unfenced:
        raise SinksNotFenced(plan)
    if not confirm:
        raise UnregisterNotConfirmed(plan)
    if plan.resume is not None and term is not None:
        _fence_in_iceberg(tm, plan, term[0].term + 1, catalog)

    def decide(topo: Topology) -> JobRecord:
        record = topo.jobs.get(name)
        if record is None:
            raise JobNotFound(f"job {name!r} is not registered (see `tidemark status`)")
        p = tm.paths
        _refuse_live_leader(tm, name)
        now = tm.read(p.term(name), TermRecord)
        if term is not None and (now is None or now[1].version != term[1].version):
            raise RegistrationError(f"job {name!r} elected a leader while it was being unregistered, so nothing was "
                                    "deleted: stop its drivers (or `tidemark fence` it) and unregister it again")
        leader = tm.get(p.leader(name))
        ops: list[Op] = []
        for sub in ("election", "epochs"):
            ops += [Delete(f"{p.job(name)}/{sub}/{child}") for child in tm.children(f"{p.job(name)}/{sub}")]
        ops += [Delete(p.election(name)), Delete(p.epochs(name)),
                Delete(p.term(name), term[1].version if term is not None else -1)]
        if record.incarnation is not None:
            ops.append(Delete(p.incarnation(name, record.incarnation)))
        if leader is not None:
            ops.append(Delete(p.leader(name)))
        ops += [Delete(path) for path in (p.finished(name), p.pacing(name), p.paused(name), p.retired(name))
                if tm.get(path) is not None]
        ops.append(Delete(p.job(name)))
        for sink in record.sinks:
            ops += [Delete(p.tidemark(sink)), Delete(p.table(sink))]
        _apply(tm, topo, ops, topo.without_job(name))
        return record

    _with_topology(tm, decide)
    return plan
