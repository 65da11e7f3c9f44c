"""Garbage collection: retained versions, snapshot expiry and file deletion, in one pass.

    collector = GarbageCollector(tm, settings)        # policy: the deployment's (``/versions``); clock: now_ms
    plan = collector.plan()                            # what would be kept and dropped, and why (changes nothing)
    report = collector.run()                           # apply it; run(dry_run=True) == plan() wrapped in a report
    collector.remove_orphan_files()                    # files no metadata references, older than 3 days
    collector.run(wait_s=60)                           # one run at a time: waits for another, then GcRunning

``tidemark gc`` runs it, and ``GcSchedule`` (``gc_schedule.py``) in one elected driver. ``GarbageCollector``
says what one run does, in which order, and how it fails; docs/design.md ("Retention and garbage collection")
says why what it keeps must stay. Its parts elsewhere: the policy (``coordinator.history.retention``), what a
version covers (``coordinator.history.versions``), the newest consistent epoch ``C`` as readers find it
(``coordinator.protocol.held_epochs``), which files snapshots reference (``coordinator.iceberg.reachability``)
and orphan files (``coordinator.iceberg.orphans``).

The records: ``GcPlan`` (a ``VersionDecision`` per candidate version, a ``TablePlan`` per table with its
``SnapshotDecision`` per snapshot) and ``GcReport`` (a plan applied); ``summarize`` gives the lines
``tidemark gc`` prints.
"""
from __future__ import annotations

import logging
import re
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from kazoo.exceptions import KazooException, LockTimeout, NoAuthError
from kazoo.protocol.states import KazooState
from kazoo.recipe.lock import Lock
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    AssertRefSnapshotId,
    RemoveSnapshotRefUpdate,
    RemoveSnapshotsUpdate,
    SetPropertiesUpdate,
    SetSnapshotRefUpdate,
)
from tenacity import RetryError, Retrying, retry_if_exception_type, stop_after_attempt, wait_random_exponential

from coordinator.crashpoints import crash_point
from coordinator.errors import (
    ConfigurationError,
    GcRunning,
    InvalidArgument,
    PermissionDenied,
    PublishConflict,
    StorageError,
    TableNotFound,
    TidemarkError,
    ZooKeeperUnavailable,
)
from coordinator.history.resolve import pinned_versions
from coordinator.history.retention import RetentionPolicy, read_policy
from coordinator.history.versions import RetainedVersions, VersionRecord, tag_epoch, tag_name
from coordinator.iceberg.catalog import CatalogSettings, load_table
from coordinator.iceberg.lineage import EpochLineage, LineageRecords
from coordinator.iceberg.metadata_files import DELETE_AFTER_COMMIT, PREVIOUS_VERSIONS_MAX, delete_unlogged_metadata
from coordinator.iceberg.orphans import OrphanFiles, delete_orphan_files, find_orphan_files, shared_locations
from coordinator.iceberg.reachability import FileIndex
from coordinator.iceberg.snapshots import snapshot_epoch
from coordinator.iceberg.staging import staged_snapshots
from coordinator.protocol.epochs import newest_epoch
from coordinator.protocol.held_epochs import Evidence, held_epochs
from coordinator.protocol.pipelines import Pipelines
from coordinator.protocol.tidemarks import read_tidemarks
from coordinator.protocol.topology import read_topology
from coordinator.records import EpochRecord, EpochState, JsonOutput, TableTidemark, job_committed_epoch, now_ms
from coordinator.zookeeper.ops import Create, Delete, SetData
from coordinator.zookeeper.session import ZooKeeperSession

log = logging.getLogger(__name__)
METADATA_VERSIONS_KEPT = 10
ORPHAN_AGE_MS = 3 * 24 * 3600 * 1000  # Iceberg's default for remove_orphan_files
ZK_BATCH = 200
NO_WAIT_S = 0.1  # how long exclusive(wait_s=0) gives ZooKeeper to answer


@dataclass(frozen=True)
class VersionDecision(JsonOutput):
    """One candidate version of a pipeline: ``create`` (newly retained), ``keep`` or ``drop``, and why."""

    epoch: int
    action: str
    reason: str
    tagged: bool = False  # the version carries (or after the run will carry) its tag tidemark-<pipeline>-<T>
    pipeline: Optional[str] = None  # None: an earlier release's version, across every pipeline


@dataclass(frozen=True)
class SnapshotDecision(JsonOutput):
    """One snapshot of a ``TablePlan``, kept or expired: its id, its epoch (None: it carries none) and why."""

    snapshot_id: int
    epoch: Optional[int]
    reason: str


@dataclass(frozen=True)
class TablePlan(JsonOutput):
    """What GC does to one table: tags to create (tag -> snapshot) and remove, snapshots kept and expired."""

    table: str
    managed: bool
    tags_to_create: Mapping[str, int] = field(default_factory=dict)
    tags_to_remove: tuple[str, ...] = ()
    keep: tuple[SnapshotDecision, ...] = ()
    expire: tuple[SnapshotDecision, ...] = ()
    set_properties: Mapping[str, str] = field(default_factory=dict)

    @property
    def changes_anything(self) -> bool:
        """Whether applying the plan commits anything to the table."""
        return bool(self.tags_to_create or self.tags_to_remove or self.expire or self.set_properties)


@dataclass(frozen=True)
class GcPlan(JsonOutput):
    """What a GC run would do (``plan``) or did (``run``): when, under which policy, each pipeline's newest
    consistent epoch ``C`` (None: its tables share none), a decision per candidate version, a plan per table, and
    notes on what it could not do."""

    now_ms: int
    policy: str
    consistent_epochs: Mapping[str, Optional[int]]
    versions: tuple[VersionDecision, ...]
    tables: tuple[TablePlan, ...]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class GcReport(JsonOutput):
    """A GC run's outcome: its plan (as applied), whether it was a dry run, and how many snapshots it expired and
    files it deleted."""

    plan: GcPlan
    dry_run: bool
    expired_snapshots: int = 0
    deleted_files: int = 0


Key = tuple[Optional[str], int]  # a retained version: (its pipeline, None for an earlier release's; its epoch)


@dataclass
class _PipelineState:
    """One pipeline's part of a run (or an earlier release's versions, or a renamed pipeline's: ``current``
    False, no tables): its tables, the epochs they hold as readers find them, and its retained versions."""

    name: Optional[str]
    current: bool
    roots: list[str] = field(default_factory=list)   # its root tables in the catalog
    retained: dict[int, VersionRecord] = field(default_factory=dict)
    held: dict[str, dict[int, Optional[int]]] = field(default_factory=dict)  # table -> its epochs -> snapshot
    common: list[int] = field(default_factory=list)  # epochs every table of ``held`` holds, oldest first
    consistent: Optional[int] = None  # ``C``: the newest epoch its managed tables all hold (None: they share none)
    evidence: Evidence = field(default_factory=Evidence)  # where the readers' records are (root tables' reads)


@dataclass
class _State:
    """Everything one run decides on, read once: ZooKeeper first, then the tables."""

    now: int
    policy: RetentionPolicy
    managed: dict[str, TableTidemark]            # managed table -> its tidemark (with a committed epoch)
    roots: list[str]                             # tables read by registered jobs that no registered job writes
    readers: dict[str, list[tuple[str, int]]]    # table -> (job, last committed epoch) of jobs reading it
    retained: dict[Key, VersionRecord]
    pinned: Mapping[int, Mapping[str, Optional[int]]]
    tables: dict[str, Table]
    lineages: dict[str, EpochLineage]
    notes: list[str]
    pipelines: list[_PipelineState] = field(default_factory=list)  # current ones by name, then the others
    pipeline_of: dict[str, _PipelineState] = field(default_factory=dict)  # table -> its current pipeline


class GarbageCollector:
    """The deployment's garbage collector: which consistent versions to retain (records and tags), which snapshots
    of each managed table to expire and which files to delete, in one pass (``run``) or only planned (``plan``).

        collector = GarbageCollector(tm, settings)       # the deployment's policy (``/versions``) unless given
        lines = summarize(collector.plan())              # what a run would do now, and why
        report = collector.run(wait_s=60)                # GcRunning if another run holds the lock that long

    What one run does (docs/design.md, "Retention and garbage collection", says why each rule is safe):

    1. **Versions**, per pipeline (``coordinator.protocol.pipelines``; one pipeline's tables never hold back
       another's versions). The candidates are its retained versions plus every epoch every managed table of it
       holds (a table whose writer committed nothing yet is left out) after its newest retained version, up to its
       newest consistent epoch ``C``, found as readers find it. The policy keeps some of them; ``C`` and every
       version a live reader pinned are always kept. A kept version gets ``/versions/<T>-<pipeline>``, and the tag
       ``tidemark-<pipeline>-<T>`` on every table it covers when a tagged tier keeps it, it is ``C`` or it is pinned
       (a pinned version with no record, older than the candidates, gets the tag ``tidemark-<T>`` alone); an
       earlier release's versions (``/versions/<T>``, across pipelines) are decided among themselves and no new
       one is made; a dropped one loses both, and one that stops being tagged
       keeps its record, set untagged. A version's snapshots are those the tidemarks list for ``T`` (no lineage
       walk). No version is made where every table was empty (no tag could name it), and a retained version
       whose snapshot in some table is gone (a root table's owner expired it) is dropped.
    2. **Snapshots** of each managed table are expired unless they are a ref's head (any tag not named
       ``tidemark-...-<T>``, and every branch with its ancestors), in a retained version (tagged or not), pinned by
       a live reader (``/readers``), in ``main`` from the snapshot at ``F`` (the lower of its pipeline's ``C`` and
       the last committed epoch of every registered job reading the table) up to the head, or the staged write of
       an epoch not committed yet. With no consistent epoch all of ``main`` stays. A staged write of an epoch at or
       below the table's tidemark was aborted and goes. Tables with no tidemark (root tables written outside Tidemark,
       or a table whose writer is not registered) are only tagged, never expired: their owner expires them, and
       the tags protect the retained versions from that.
    3. **Files.** pyiceberg's expiry removes metadata only: the manifest lists, manifests, data and delete files
       that only expired snapshots referenced are deleted through the table's FileIO, computed from the metadata the
       expiry commit produced (so a snapshot committed concurrently counts as remaining). Old metadata files go
       with every commit once ``write.metadata.delete-after-commit.enabled`` is set, which GC sets on managed
       tables (with ``write.metadata.previous-versions-max``: ``metadata_versions``).

    Order: the ZooKeeper records of dropped versions go first (deleted, or set untagged), then per table its one
    catalog commit (tags, expiry, properties, conditional on ``main`` and the changed tags not having moved: a
    concurrent publish makes GC plan that table again) followed by the deletion of its files, then the records of
    new versions and of versions that gained their tags. So wherever a run is killed, every record that says
    tagged has its tag on every table it covers (a tag with no such record names the snapshot of its epoch, and
    the next run removes or records it). ZooKeeper is read before table metadata, so a snapshot published after
    the read is never mistaken for an aborted one.

    Failure behaviour: a run that stops half-way leaves nothing unsafe, and the next run finishes it, with one
    exception: a run killed after a table's expiry commit and before its file deletion leaves those files
    unreferenced, where no later expiry finds them; ``remove_orphan_files`` (``tidemark gc --orphans``; run it
    daily, say) finds every unreferenced file by listing the table's locations, which also covers files of
    writers killed before their commit. Every run that changes anything holds the deployment's GC lock
    (``exclusive``): ``GcRunning`` when another process holds it, ``PermissionDenied`` without the writer
    identity, ``ZooKeeperUnavailable`` when ZooKeeper cannot be reached or the connection drops mid-run.
    ``PublishConflict`` when a table's commit keeps losing races with its writer. The constructor raises
    ``ConfigurationError`` for a catalog that cannot be opened. An error of the catalog or the file system while
    a run commits or deletes (other than a lost race) propagates as it is.
    """

    def __init__(self, tm: ZooKeeperSession, settings: Optional[CatalogSettings] = None, *,
                 policy: Optional[RetentionPolicy] = None,
                 clock: Callable[[], int] = now_ms, metadata_versions: int = METADATA_VERSIONS_KEPT) -> None:
        self.tm = tm
        self.settings = settings or CatalogSettings.from_env()
        self.catalog = self.settings.load()
        self.policy, self.clock, self.metadata_versions = policy, clock, metadata_versions
        self._files: dict[str, FileIndex] = {}
        self._tables: dict[str, Table] = {}
        self._lock_owner: Optional[int] = None   # the thread inside exclusive()
        self._lock_dropped: Optional[threading.Event] = None

    @contextmanager
    def exclusive(self, wait_s: float = 0.0) -> Iterator[None]:
        """Hold the deployment's GC lock for the block; wait for another holder up to ``wait_s`` seconds
        (0: not at all, only ``NO_WAIT_S`` for ZooKeeper to answer).

        Raises ``GcRunning`` naming the holder when another process keeps it, ``ZooKeeperUnavailable``
        when ZooKeeper cannot be reached within the session's operation timeout. The lock goes with
        the holder's session, so a killed run never blocks the next one for longer than the session
        timeout. Re-entrant in the thread that holds it: ``run()`` and ``remove_orphan_files()`` take
        it too. When the connection drops inside the block (SUSPENDED or LOST: another process may
        hold the lock by now), the run stops before its next table with ``ZooKeeperUnavailable``.

        :raises PermissionDenied: ZooKeeper refuses the lock to this session's identity (GC needs the writer's).
        """
        if self._lock_owner == threading.get_ident():
            yield
            return
        lock = self._acquire(wait_s)
        dropped = threading.Event()

        def on_state(state: str) -> None:  # called on kazoo's event thread: never block here
            if state != KazooState.CONNECTED:
                dropped.set()
        self.tm.add_state_listener(on_state)
        self._lock_owner, self._lock_dropped = threading.get_ident(), dropped
        try:
            yield
        finally:
            self._lock_owner, self._lock_dropped = None, None
            self.tm.remove_state_listener(on_state)
            try:
                lock.release()
            except KazooException as exc:  # the lock node is ephemeral: it goes with the session anyway
                log.warning("gc: could not release the GC lock (%s); it goes with this session", type(exc).__name__)

    def _acquire(self, wait_s: float) -> Lock:
        self.tm.ensure_path(self.tm.paths.gc)
        lock = self.tm.client.Lock(self.tm.paths.gc_lock, identifier=self.tm.member)
        try:
            # Always with a timeout: it is also the deadline of kazoo's own retries, endless without one
            # (and kazoo takes no timeout for a non-blocking acquire).
            gotten = lock.acquire(blocking=True, timeout=max(wait_s, NO_WAIT_S))
        except LockTimeout:
            gotten = False
        except NoAuthError:
            raise PermissionDenied(f"ZooKeeper refused the GC lock {self.tm.paths.gc_lock} to "
                                   f"{self.tm.credentials.identity}: GC needs the writer identity "
                                   "(TIDEMARK_ZK_USER and TIDEMARK_ZK_PASSWORD)") from None
        except KazooException as exc:  # kazoo's lock recipe gave up on its own retries
            raise ZooKeeperUnavailable(f"could not take the GC lock ({type(exc).__name__}); check that ZooKeeper "
                                       "is up") from None
        if gotten:
            return lock
        if not self.tm.client.connected:  # kazoo gives up quietly when its retries run out
            raise ZooKeeperUnavailable("could not take the GC lock: ZooKeeper is unreachable; check that it is up")
        try:
            holders = lock.contenders()
        except KazooException:
            holders = []
        holder = holders[0] if holders else "a run that has just finished"
        raise GcRunning(f"another garbage collection is running (held by {holder}); it does the same work, "
                        "so wait for it to finish and run again if needed")

    def _still_exclusive(self, before: str) -> None:
        """``ZooKeeperUnavailable`` when the connection holding the GC lock dropped since it was taken."""
        if self._lock_dropped is not None and self._lock_dropped.is_set():
            raise ZooKeeperUnavailable(f"gc stopped before {before}: the connection to ZooKeeper dropped during "
                                       "the run, so another process may hold the GC lock now; run it again")

    # -- reading ---------------------------------------------------------------------------------

    def _table(self, name: str) -> Table:
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = load_table(self.catalog, self.settings, name)
        else:
            table.refresh()
        return table

    def _read_state(self) -> _State:
        topo = read_topology(self.tm)
        writers = topo.writers
        marks = read_tidemarks(self.tm, sorted(writers)) if writers else {}
        managed = {t: m for t, m in marks.items() if m is not None and m.epoch is not None}
        job_epochs = {name: epoch for name, job in topo.jobs.items() if (epoch := job_committed_epoch(
            managed[s].epoch if s in managed else None for s in job.sinks)) is not None}
        readers: dict[str, list[tuple[str, int]]] = {}
        for name, job in topo.jobs.items():
            for source in job.sources:
                if name in job_epochs:
                    readers.setdefault(source, []).append((name, job_epochs[name]))
        state = _State(now=self.clock(), policy=self.policy or read_policy(self.tm), managed=managed,
                       roots=sorted(topo.root_tables), readers=readers,
                       retained={(r.pipeline, r.epoch): r for r in RetainedVersions(self.tm).all()},
                       pinned=pinned_versions(self.tm), tables={}, lineages={}, notes=[])
        for name in [*sorted(managed), *state.roots]:  # after ZooKeeper: see the class docstring
            try:
                state.tables[name] = self._table(name)
            except TableNotFound:
                state.notes.append(f"table {name} is registered but not in the catalog: skipped")
                continue
            state.lineages[name] = EpochLineage(state.tables[name])
        records = LineageRecords(state.lineages)
        for pipeline in Pipelines(topo).all:  # one pipeline's tables never hold another's versions back
            part = _PipelineState(pipeline.name, True, [t for t in pipeline.tables if t in state.roots])
            # ZooKeeper lists the newest epochs; the tables' own records reach back (a first run keeps an hour's
            # oldest version, as its tier says). A root table with Tidemark metadata (its writer is not registered)
            # counts with what it records.
            counted: dict[str, Optional[TableTidemark]] = {
                n: managed[n] for n in pipeline.tables if n in managed and n in state.tables}
            counted.update({n: None for n in part.roots if n in state.lineages and state.lineages[n].recorded_epochs()})
            if counted:
                holdings = held_epochs(counted, records, self.tm, writers, reach_back=True)
                part.consistent = holdings.consistent_epoch()  # as readers resolve it, a laggard's reached as they do
                part.held, part.evidence, part.common = holdings.held, holdings.evidence, sorted(holdings.common())
            if part.held and not part.common:
                newest = ", ".join(f"{t} at {max(h)}" for t, h in sorted(part.held.items()))
                state.notes.append(f"pipeline {pipeline.name}: its tables share no epoch ({newest}): no version of it "
                                   "is created and each of its managed tables keeps all of main")
            state.pipelines.append(part)
            state.pipeline_of.update(dict.fromkeys(pipeline.tables, part))
        current: dict[Optional[str], _PipelineState] = {part.name: part for part in state.pipelines}
        for (owner, epoch), record in sorted(state.retained.items(), key=lambda item: (item[0][0] or "", item[0][1])):
            if owner not in current:  # an earlier release's versions, or a pipeline's under a name it no longer has
                current[owner] = _PipelineState(owner, False)
                state.pipelines.append(current[owner])
            current[owner].retained[epoch] = record
        return state

    # -- deciding --------------------------------------------------------------------------------

    def plan(self) -> GcPlan:
        """What a run would do now, with the reason for every version and snapshot kept or dropped."""
        return self._plan(self._read_state())[0]

    def _plan(self, state: _State) -> tuple[GcPlan, dict[Key, VersionRecord]]:
        decisions: list[VersionDecision] = []
        kept: dict[Key, VersionRecord] = {}
        for part in state.pipelines:
            decided, kept_here = self._decide_versions(state, part)
            decisions += decided
            kept.update({(part.name, epoch): record for epoch, record in kept_here.items()})
        tables = tuple(self._plan_table(state, name, kept) for name in state.tables)
        consistent = {part.name: part.consistent for part in state.pipelines if part.current and part.name}
        plan = GcPlan(state.now, state.policy.to_text(), consistent, tuple(decisions), tables, tuple(state.notes))
        return plan, kept

    def _decide_versions(self, state: _State, part: _PipelineState) -> tuple[list[VersionDecision],
                                                                             dict[int, VersionRecord]]:
        """Which of a pipeline's versions are kept (with their records: existing, or computed for new ones), by the
        policy among its own versions."""
        retained = part.retained
        newest = max(retained, default=None)
        fresh = [e for e in part.common if newest is None or e > newest]  # all at or below C
        reasons = dict(state.policy.keep([*retained, *fresh], state.now))
        tagged = state.policy.tagged([*retained, *fresh], state.now)
        consistent = part.consistent
        if consistent is not None and (consistent in retained or consistent in fresh):
            reasons.setdefault(consistent, "newest consistent version")
            tagged.add(consistent)  # readers by tag find a recent version too (one more tag per table)
        elif consistent is not None:
            state.notes.append(f"pipeline {part.name}: its newest consistent epoch {consistent} is below its newest "
                               f"retained version {newest}: no version of it is created this run")
        for epoch, pinned in state.pinned.items():  # tagged, so that any engine's snapshot expiry keeps it too
            if (epoch in retained and set(pinned) & set(retained[epoch].snapshots)) or (
                    epoch in fresh and set(pinned) & set(part.held)):
                reasons.setdefault(epoch, "pinned by a live reader")
                tagged.add(epoch)
        decisions, kept = [], {}
        for epoch in sorted(set(retained) | set(fresh)):
            if epoch in retained:
                gone = self._expired_elsewhere(state, retained[epoch])
                if gone is not None:
                    decisions.append(VersionDecision(epoch, "drop", gone, pipeline=part.name))
                elif epoch in reasons:
                    kept[epoch] = replace(retained[epoch], tagged=epoch in tagged)
                    decisions.append(VersionDecision(epoch, "keep", reasons[epoch], epoch in tagged, part.name))
                else:
                    decisions.append(VersionDecision(epoch, "drop", "out of policy", pipeline=part.name))
                continue
            if epoch not in reasons:
                continue  # an epoch the policy does not keep: it never becomes a version
            record = self._new_version(state, part, epoch, epoch in tagged)
            if record is not None:
                kept[epoch] = record
                decisions.append(VersionDecision(epoch, "create", reasons[epoch], epoch in tagged, part.name))
        return decisions, kept

    @staticmethod
    def _expired_elsewhere(state: _State, record: VersionRecord) -> Optional[str]:
        """Why a retained version cannot be read any more (None: it can). GC keeps the snapshots of every
        retained version in the tables it expires, and a tag protects a snapshot from any expiry; a root
        table's owner may expire the snapshot an untagged version names, and then the version is gone."""
        for name in record.covered:
            lineage = state.lineages.get(name)
            if lineage is not None and record.snapshots[name] not in lineage.by_id:
                return f"table {name}'s snapshot {record.snapshots[name]} was expired outside Tidemark"
        return None

    def _new_version(self, state: _State, part: _PipelineState, epoch: int, tagged: bool) -> Optional[VersionRecord]:
        """Every table of the pipeline at ``epoch``, an epoch every managed table of it holds; None when its snapshot
        is gone from a table, or every table was empty then (no tag could name the version)."""
        snapshots: dict[str, Optional[int]] = {}
        for name, held in part.held.items():
            snapshot_id = held[epoch]
            if snapshot_id is not None and snapshot_id not in state.lineages[name].by_id:
                state.notes.append(f"epoch {epoch} cannot become a version: table {name}'s snapshot there expired")
                return None
            snapshots[name] = snapshot_id
        read = part.evidence.root_reads(part.held, part.roots, epoch)
        for name in part.roots:
            lineage = state.lineages.get(name)
            if lineage is not None and name not in part.held:
                if name in read and read[name] is None:
                    state.notes.append(f"epoch {epoch} cannot become a version: the jobs reading root table {name} "
                                       "read it at different snapshots then (a commit landed between their reads)")
                    return None
                cut = lineage.root_at(epoch, read.get(name))
                if cut is None:
                    state.notes.append(f"epoch {epoch} cannot become a version: root table {name}'s history "
                                       "there expired")
                    return None
                snapshots[name] = cut.snapshot_id
        if all(s is None for s in snapshots.values()):
            state.notes.append(f"epoch {epoch} is not made a version: every table was empty then, so no tag could "
                               "name it")
            return None
        return VersionRecord(epoch, snapshots, state.now, tagged, part.name)

    def _plan_table(self, state: _State, name: str, kept: Mapping[Key, VersionRecord]) -> TablePlan:
        table, lineage = state.tables[name], state.lineages[name]
        managed = name in state.managed
        wanted = {r.tag: s for r in kept.values() if r.tag and (s := r.snapshots.get(name)) is not None}
        at_epoch = {(tag_epoch(tag), snapshot) for tag, snapshot in wanted.items()}
        for at, pinned in sorted(state.pinned.items()):  # a pinned version that is no retained one: tagged too
            if (pinned_id := pinned.get(name)) is not None and pinned_id in lineage.by_id and \
                    (at, pinned_id) not in at_epoch:
                wanted.setdefault(tag_name(at), pinned_id)
        present = {ref: r.snapshot_id for ref, r in table.metadata.refs.items()
                   if r.snapshot_ref_type == SnapshotRefType.TAG and tag_epoch(ref) is not None}
        create_tags = {t: s for t, s in wanted.items() if present.get(t) != s}
        remove_tags = tuple(sorted(t for t in present if t not in wanted or t in create_tags))
        if not managed:
            return TablePlan(name, False, create_tags, remove_tags)
        keep = self._protected(state, name, table, lineage, kept)
        expire = []
        for snapshot in lineage.by_id.values():
            if snapshot.snapshot_id in keep:
                continue
            epoch = snapshot_epoch(snapshot)
            if snapshot.snapshot_id not in lineage.main_ids and epoch is not None:
                why = f"staged write of aborted epoch {epoch}"
            elif epoch is not None:
                why = f"epoch {epoch}: in no retained version, below every reader's next inputs"
            else:
                why = "no epoch, in no retained version"
            expire.append(SnapshotDecision(snapshot.snapshot_id, epoch, why))
        properties = {DELETE_AFTER_COMMIT: "true", PREVIOUS_VERSIONS_MAX: str(self.metadata_versions)}
        properties = {k: v for k, v in properties.items() if table.properties.get(k) != v}
        decisions = tuple(SnapshotDecision(s, snapshot_epoch(lineage.by_id[s]), why) for s, why in sorted(keep.items()))
        return TablePlan(name, True, create_tags, remove_tags, decisions,
                         tuple(sorted(expire, key=lambda d: d.snapshot_id)), properties)

    def _protected(self, state: _State, name: str, table: Table, lineage: EpochLineage,
                   kept: Mapping[Key, VersionRecord]) -> dict[int, str]:
        """Snapshot id -> why it must stay."""
        keep: dict[int, str] = {}

        def protect(snapshot_id: Optional[int], why: str) -> None:
            if snapshot_id is not None and snapshot_id in lineage.by_id:
                keep.setdefault(snapshot_id, why)

        for (_, at), record in sorted(kept.items(), key=lambda item: item[0][1]):  # untagged too: records name them
            protect(record.snapshots.get(name), f"retained version {record.tag or f'{at} (untagged)'}")
        for ref_name, ref in table.metadata.refs.items():
            if ref_name == MAIN_BRANCH:
                protect(ref.snapshot_id, "head of main")
            elif ref.snapshot_ref_type == SnapshotRefType.BRANCH:
                for snapshot in lineage.ancestors(ref.snapshot_id):
                    protect(snapshot.snapshot_id, f"in branch {ref_name}")
            elif tag_epoch(ref_name) is None:
                protect(ref.snapshot_id, f"tag {ref_name}")
        for pinned, snapshots in state.pinned.items():
            protect(snapshots.get(name), f"pinned by a live reader (version {pinned})")
        consistent = state.pipeline_of[name].consistent
        if consistent is None:
            for snapshot in lineage.main:
                protect(snapshot.snapshot_id, "main, whole: the pipeline's tables share no epoch")
        floors = [(consistent, "the newest consistent version")] if consistent is not None else []
        floors += [(e, f"the next inputs of job {job}") for job, e in state.readers.get(name, [])]
        for floor, why in sorted(floors, key=lambda f: f[0], reverse=True):
            for snapshot in lineage.main_since(floor):  # no snapshot that old: all of main
                protect(snapshot.snapshot_id, f"main since epoch {floor}, {why}")
        committed = state.managed[name].epoch
        for snapshot in lineage.by_id.values():
            epoch = snapshot_epoch(snapshot)
            if epoch is not None and committed is not None and epoch > committed:
                protect(snapshot.snapshot_id, f"staged write of epoch {epoch}, not committed yet")
        return keep

    # -- applying --------------------------------------------------------------------------------

    def run(self, dry_run: bool = False, wait_s: float = 0.0) -> GcReport:
        """Apply one pass (see the class docstring) under the GC lock, waiting up to ``wait_s`` seconds
        for another run to finish (``GcRunning`` after that); with ``dry_run`` only plan it, unlocked.

        :raises GcRunning: another process holds the GC lock past ``wait_s``.
        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached, or the connection dropped during the run.
        :raises PermissionDenied: the session's identity may not take the GC lock (GC needs the writer identity).
        :raises PublishConflict: a table's commit kept losing races with its writer (8 attempts).
        """
        if dry_run:
            return GcReport(self.plan(), True)
        with self.exclusive(wait_s):
            return self._apply(self._read_state())

    def _apply(self, state: _State) -> GcReport:
        plan, kept = self._plan(state)
        p = self.tm.paths
        dropped = [(v.pipeline, v.epoch) for v in plan.versions if v.action == "drop"]
        untagged = [k for k, r in kept.items() if k in state.retained and state.retained[k].tagged and not r.tagged]
        self._zk_batches([*(Delete(p.version(e, name)) for name, e in dropped),
                          *(SetData(p.version(e, name), kept[(name, e)].to_json()) for name, e in untagged)])
        expired = deleted = 0
        final_tables = []
        for table_plan in plan.tables:
            done, table_plan, files = self._apply_table(state, table_plan, kept)
            final_tables.append(table_plan)
            expired += done
            deleted += files
        created = [(v.pipeline, v.epoch) for v in plan.versions if v.action == "create"]
        tagged = [k for k, r in kept.items() if k in state.retained and not state.retained[k].tagged and r.tagged]
        self._zk_batches([*(Create(p.version(e, name), kept[(name, e)].to_json()) for name, e in created),
                          *(SetData(p.version(e, name), kept[(name, e)].to_json()) for name, e in tagged)])
        final = GcPlan(plan.now_ms, plan.policy, plan.consistent_epochs, plan.versions, tuple(final_tables),
                       plan.notes)
        log.info("gc: %d versions created, %d dropped; %d snapshots expired, %d files deleted",
                 len(created), len(dropped), expired, deleted)
        return GcReport(final, False, expired, deleted)

    def _zk_batches(self, ops: list) -> None:
        for start in range(0, len(ops), ZK_BATCH):
            self.tm.multi(ops[start:start + ZK_BATCH])

    def _apply_table(self, state: _State, table_plan: TablePlan,
                     kept: Mapping[Key, VersionRecord]) -> tuple[int, TablePlan, int]:
        """One commit for the table (planned again after losing a race with a writer), then its files."""
        name = table_plan.table
        table = state.tables[name]
        self._still_exclusive(f"table {name}")
        try:
            for attempt in Retrying(stop=stop_after_attempt(8), wait=wait_random_exponential(0.05, 1.0),
                                    retry=retry_if_exception_type(CommitFailedException)):
                with attempt:
                    if attempt.retry_state.attempt_number > 1:  # main moved: plan again on the new metadata
                        table.refresh()
                        state.lineages[name] = EpochLineage(table)
                        table_plan = self._plan_table(state, name, kept)
                    doomed = [state.lineages[name].by_id[d.snapshot_id] for d in table_plan.expire]
                    if table_plan.changes_anything:
                        self._commit(table, table_plan)
        except RetryError:
            raise PublishConflict(f"gc kept losing commit races with the writer of table {name}; "
                                  "run it again") from None
        if doomed:
            crash_point("gc-expired")
        return len(doomed), table_plan, self._delete_files(name, table, doomed)

    def _commit(self, table: Table, plan: TablePlan) -> None:
        """Tags, expiry and properties in one catalog commit, conditional on ``main`` and every changed tag.

        The updates go to the catalog directly: pyiceberg's builders recompute (deep-copy) the whole
        metadata for each tag and each expired snapshot, which makes a large GC quadratic.
        """
        refs = table.metadata.refs
        requirements = [AssertRefSnapshotId(ref=MAIN_BRANCH, snapshot_id=table.metadata.current_snapshot_id)]
        updates: list = []
        for tag in plan.tags_to_remove:
            requirements.append(AssertRefSnapshotId(ref=tag, snapshot_id=refs[tag].snapshot_id))
            updates.append(RemoveSnapshotRefUpdate(ref_name=tag))
        for tag, snapshot_id in sorted(plan.tags_to_create.items()):
            if tag not in plan.tags_to_remove:
                requirements.append(AssertRefSnapshotId(ref=tag, snapshot_id=None))
            updates.append(SetSnapshotRefUpdate(ref_name=tag, type=SnapshotRefType.TAG, snapshot_id=snapshot_id,
                                                max_ref_age_ms=None, max_snapshot_age_ms=None,
                                                min_snapshots_to_keep=None))
        if plan.expire:
            updates.append(RemoveSnapshotsUpdate(snapshot_ids=[d.snapshot_id for d in plan.expire]))
        if plan.set_properties:
            updates.append(SetPropertiesUpdate(updates=dict(plan.set_properties)))
        previous = table.metadata
        table.catalog.commit_table(table, tuple(requirements), tuple(updates))
        table.refresh()
        delete_unlogged_metadata(table, previous, table.metadata)

    def _delete_files(self, name: str, table: Table, doomed: list[Snapshot]) -> int:
        """Delete the files only expired snapshots referenced (reachability from the committed metadata)."""
        if not doomed:
            return 0
        files = self._files.setdefault(name, FileIndex())
        remaining = list(table.snapshots())
        orphaned = sorted(files.referenced(table, doomed) - files.referenced(table, remaining))
        files.forget_except(remaining)
        for path in orphaned:
            try:
                table.io.delete(path)
            except FileNotFoundError:
                pass  # deleted by an earlier run that stopped before its commit was recorded
            except OSError as exc:  # the snapshots are expired already: the next run deletes what is left
                raise StorageError(f"gc expired table {name}'s snapshots but could not delete their file {path}: "
                                   f"{exc}; check the storage's permissions and run gc again") from None
        return len(orphaned)

    def remove_orphan_files(self, older_than_ms: int = ORPHAN_AGE_MS, dry_run: bool = False,
                            wait_s: float = 0.0) -> list[OrphanFiles]:
        """Delete the files under each managed table's location that no metadata references (see
        ``coordinator.iceberg.orphans``) and that nobody modified for ``older_than_ms`` (by the wall clock,
        as file modification times are; a table sharing a directory with another is refused).

        The age protects writes in progress, whose files are not referenced yet: it must exceed the
        longest write (the CLI refuses less than a day). Root tables are left to their owner. With
        ``dry_run`` it only lists them; otherwise it holds the GC lock like ``run()``.

        :raises InvalidArgument: ``older_than_ms`` is not positive.
        :raises ConfigurationError: two tables share a directory, or a table's location cannot be listed as given.
        :raises StorageError: the file system refused to list or delete a table's files.
        :raises GcRunning: another process holds the GC lock past ``wait_s`` (not with ``dry_run``).
        """
        if older_than_ms <= 0:
            raise InvalidArgument(f"older_than_ms must be positive, got {older_than_ms}")
        if dry_run:
            return self._orphans(older_than_ms, dry_run=True)
        with self.exclusive(wait_s):
            return self._orphans(older_than_ms, dry_run=False)

    def _precommitted_write(self, job: Optional[str], table: str) -> tuple[Snapshot, ...]:
        """The snapshots of ``table``'s write that ``job``'s precommitted epoch records and has not published yet:
        in no metadata, and older than any cutoff when the job has been down that long; its files are no orphans.
        Read before the table's files are listed, which is safe: an epoch is precommitted moments after its files
        are written, far inside the cutoff, and one published meanwhile is in the metadata read after the listing."""
        epoch = newest_epoch(self.tm, job) if job is not None else None
        found = self.tm.read(self.tm.paths.epoch(job, epoch), EpochRecord) if job is not None and epoch else None
        if found is None or found[0].state != EpochState.PRECOMMITTED or table not in found[0].writes:
            return ()
        return tuple(staged_snapshots(found[0].writes[table]))

    def _orphans(self, older_than_ms: int, dry_run: bool) -> list[OrphanFiles]:
        cutoff = now_ms() - older_than_ms  # against files' modification times: the wall clock, not self.clock
        tables, topology = {}, read_topology(self.tm)
        for name in sorted(topology.writers):
            try:
                tables[name] = self._table(name)
            except TableNotFound:
                continue
        shared = shared_locations(tables)
        if shared:
            name, other, directory = shared[0]
            raise ConfigurationError(f"tables {name} and {other} share the directory {directory}, so each would "
                                     "take the other's files for orphans: give each table a location of its own "
                                     "(location, write.data.path, write.metadata.path); nothing was deleted")
        found = []
        for name, table in tables.items():
            try:
                orphans = find_orphan_files(table, name, cutoff, self._files.setdefault(name, FileIndex()),
                                            pending=self._precommitted_write(topology.writer_of(name), name))
                if not dry_run:
                    self._still_exclusive(f"deleting the orphan files of table {name}")
                    delete_orphan_files(table, orphans)
            except NoSuchTableError:
                continue  # dropped meanwhile: nothing of it to keep
            except TidemarkError:
                raise
            except OSError as exc:
                raise StorageError(f"cannot list or delete the files of table {name}: {exc}; check the "
                                   "warehouse's credentials and permissions, then run it again") from None
            except ValueError as exc:  # pyarrow and pyiceberg refuse a location they cannot parse this way
                raise ConfigurationError(f"cannot list the files of table {name} ({exc}); check its location and "
                                         "the catalog's file IO settings") from None
            found.append(orphans)
        log.info("gc: %d orphan files (%d bytes) %s", sum(len(o.paths) for o in found),
                 sum(o.size_bytes for o in found), "found" if dry_run else "deleted")
        return found


def summarize(plan: GcPlan) -> list[str]:
    """Human-readable lines for ``tidemark gc``: versions kept and dropped, and per table what goes and why."""
    lines = [f"policy {plan.policy}"]
    lines += [f"  pipeline {name}: newest consistent epoch {epoch}"
              for name, epoch in sorted(plan.consistent_epochs.items())]
    for v in plan.versions:
        tag = ", tagged" if v.tagged else (", untagged" if v.action != "drop" else "")
        of = f"pipeline {v.pipeline}'s" if v.pipeline else "an earlier release's"
        lines.append(f"  version {v.epoch}, {of}: {v.action} ({v.reason}{tag})")
    for t in plan.tables:
        head = f"  table {t.table}" + ("" if t.managed else " (root table: tagged, never expired)")
        parts = []
        if t.tags_to_create:
            parts.append(f"{len(t.tags_to_create)} tags to create")
        if t.tags_to_remove:
            parts.append(f"{len(t.tags_to_remove)} tags to remove")
        if t.managed:
            parts.append(f"{len(t.keep)} snapshots kept, {len(t.expire)} expired")
        if t.set_properties:
            parts.append("sets " + ", ".join(f"{k}={v}" for k, v in sorted(t.set_properties.items())))
        lines.append(head + ": " + "; ".join(parts))
        for why, count in sorted(Counter(_reason_kind(d.reason) for d in t.keep).items()):
            lines.append(f"    keep   {count:>6}  {why}")
        for why, count in sorted(Counter(_reason_kind(d.reason) for d in t.expire).items()):
            lines.append(f"    expire {count:>6}  {why}")
    lines.extend(f"  note: {n}" for n in plan.notes)
    return lines


def _reason_kind(reason: str) -> str:
    """A reason without its numbers (epochs, tags), for counting."""
    return re.sub(r"\d+", "N", reason)


__all__ = ["GarbageCollector", "GcPlan", "GcReport", "SnapshotDecision", "TablePlan", "VersionDecision", "summarize"]
