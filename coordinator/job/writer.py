"""An exactly-once epoch writer in plain Python: one call of your function per epoch, at its own cadence.

    tm = Tidemark.connect()
    writer = EpochWriter(tm, "counts", sources=["lake.db.events"], sinks=["lake.db.counts"])

    def step(ctx: EpochContext) -> None:
        new = ctx.changes("lake.db.events")                  # pyarrow.Table: rows appended in (previous, T]
        ctx.append("lake.db.counts", summarize(new))         # staged, published at commit

    writer.run(step)            # until stop() / SIGTERM; max_epochs=3 or until=T for a bounded run
    writer.run(step, once=True) # a batch run: one epoch, covering every root commit made before the call

    hourly = EpochWriter(tm, "daily_report", sources=["lake.db.counts"], sinks=[...], every="1h")

``EpochWriter`` says what ``run`` does, step by step, and how it fails; docs/design.md has the protocol ("The
epoch state machine") and which barriers a job takes and why its epochs are consistent ("Pacing").

The parts, in the order a run meets them: ``run`` hands the terms to the ``Supervisor``
(``supervisor.py``: contend, lead, step down, again); a term is ``open`` (register, contend, take
over, recover) and ``close`` here, held as one ``LeaderTerm`` (``term.py``), and its epochs are
``_loop`` and ``process`` here, each waiting for its epoch with ``NextEpoch``
(``coordinator.protocol.next_epoch``: pacing and catch-up over watched state) and committing with
``EpochCommitter`` (``commit.py``). ``EpochContext`` is what the function sees, ``Waiting`` why the
writer waits; ``DriverMetrics`` (``driver_metrics.py``) reads the writer through the view it is given.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional, Union

from pyiceberg.table import Table

from coordinator.crashpoints import crash_point
from coordinator.errors import (
    ConfigurationError,
    EpochOrderError,
    NotLeader,
    TableNotFound,
    TidemarkError,
    ZooKeeperUnavailable,
)
from coordinator.iceberg.catalog import CatalogSettings, load_table
from coordinator.iceberg.progress import resume_point
from coordinator.iceberg.snapshots import (
    appended_files,
    recorded_term,
    snapshot_at_epoch,
    snapshot_at_time,
    writer_job,
)
from coordinator.iceberg.staging import stage_append, stage_overwrite
from coordinator.job.commit import DEFAULT_MARKER_EVERY, EpochCommitter
from coordinator.job.driver_metrics import DriverMetrics
from coordinator.job.supervisor import Supervisor
from coordinator.job.term import LeaderTerm
from coordinator.names import validate_name, validate_names
from coordinator.protocol.barriers import BarrierGrid, Barriers
from coordinator.protocol.epochs import EpochCoordinator, RecoveryAction
from coordinator.protocol.job_run import JobRun
from coordinator.protocol.leadership import Leadership, current_leader
from coordinator.protocol.next_epoch import WAIT_SLICE_S, NextEpoch
from coordinator.protocol.pacing import (
    DEFAULT_GRACE_MS,
    Pacing,
    parse_every,
)
from coordinator.protocol.registry import check_table_identities, register_job
from coordinator.protocol.rest import refuse_retired
from coordinator.protocol.topology import read_topology
from coordinator.records import (
    EpochInputs,
    EpochRecord,
    EpochState,
    SourceRange,
    StagedWrite,
    TableTidemark,
    now_ms,
)
from coordinator.uncaught import report_uncaught_errors
from coordinator.zookeeper.session import ZooKeeperSession

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)
STANDBY_WARM_EVERY_S = 60.0
STANDBY_LOG_EVERY_S = 60.0  # a standby says who leads when it starts waiting, then this often


@dataclass(frozen=True)
class Waiting:
    """Why a writer is not processing an epoch right now."""

    after: Optional[int]     # it waits for an epoch after this one: its last, or for a new job the time it opened
    reason: str
    since_ms: int


class EpochContext:
    """What one epoch's function sees: its inputs and staged writes to its sinks, as ``pyarrow`` tables.

    A context belongs to the writer's term that made it (``process`` does): it stages under that term, and not at
    all once this replica knows the term is over. The constructor raises ``NotLeader`` when the writer holds no
    term (it is not open).
    """

    def __init__(self, writer: EpochWriter, record: EpochRecord) -> None:
        self.writer, self.record = writer, record
        self.epoch: int = record.epoch
        self.inputs: EpochInputs = record.inputs
        self.staged: dict[str, Optional[int]] = {}
        self.writes: dict[str, StagedWrite] = {}   # the sinks staged with no catalog commit (``append``, ``overwrite``)
        self._term: LeaderTerm = writer._leading()

    def range_of(self, source: str) -> SourceRange:
        """The snapshot range ``(previous epoch, T]`` this epoch recorded for ``source`` (``SourceRange()``, with
        no bounds, when none is recorded, as for a streaming epoch, whose input is a batch id).

        :raises ConfigurationError: ``source`` is not a declared source of the job.
        """
        if source not in self.writer.sources:
            raise ConfigurationError(f"{source!r} is not a declared source of job {self.writer.name!r}")
        return self.inputs.sources.get(source) or SourceRange()

    def changes(self, source: str) -> pa.Table:
        """Rows appended to ``source`` in ``(previous epoch, T]``, as a ``pyarrow.Table`` (append-only sources): the
        files its snapshots in between added (``snapshots.appended_files``: a compaction adds none), or all of it
        at ``T`` for the job's first epoch. ``InputsExpired`` when snapshots in between were expired outside
        Tidemark."""
        from pyiceberg.io.pyarrow import ArrowScan
        from pyiceberg.table import FileScanTask
        bounds = self.range_of(source)
        table = self.writer.table(source)
        if bounds.end is None or bounds.is_empty:
            return table.schema().as_arrow().empty_table()
        if table.snapshot_by_id(bounds.end) is None:
            table.refresh()
        scan = table.scan(snapshot_id=bounds.end)
        tasks = list(scan.plan_files()) if bounds.start is None else [
            FileScanTask(data_file) for data_file in appended_files(table, bounds.start, bounds.end)]
        return ArrowScan(table.metadata, table.io, table.schema(), scan.row_filter).to_table(tasks)

    def table(self, source: str) -> pa.Table:
        """All of ``source`` as of barrier ``T``, as a ``pyarrow.Table``."""
        bounds = self.range_of(source)
        table = self.writer.table(source)
        if bounds.end is None:
            return table.schema().as_arrow().empty_table()
        if table.snapshot_by_id(bounds.end) is None:
            table.refresh()
        return table.scan(snapshot_id=bounds.end).to_arrow()

    def append(self, sink: str, rows: pa.Table) -> None:
        """Stage ``rows`` (a ``pyarrow.Table``) appended to ``sink``.

        :raises ConfigurationError: ``sink`` is not a declared sink of the job.
        :raises EpochOrderError: ``sink`` was already written in this epoch (one write per sink and epoch).
        :raises NotLeader: this replica knows it no longer leads the job (``Fenced`` included).
        :raises PublishConflict: the staging commit kept losing races with other commits to the table.
        """
        self._stage_with(sink, stage_append, rows)

    def overwrite(self, sink: str, rows: pa.Table) -> None:
        """Stage ``sink`` replaced by ``rows``; raises as ``append`` does."""
        self._stage_with(sink, stage_overwrite, rows)

    def _stage_with(self, sink: str, stage: Callable[..., StagedWrite], rows: pa.Table) -> None:
        with self.staging(sink) as term:
            write = stage(self.writer.table(sink), rows, self.epoch, self.writer.name, term, self.inputs)
            self.stage(sink, write.snapshot_id)
            self.writes[sink] = write
            if len(self.writes) == 1 and len(self.writer.sinks) > 1:
                crash_point("staged-one")

    @contextmanager
    def staging(self, sink: str) -> Iterator[int]:
        """Around one write this epoch stages in ``sink`` (``append``, or an engine's own write): the sink is
        checked, the write timed as the ``stage`` phase; gives the term to stage under, this context's.

        :raises ConfigurationError: ``sink`` is not a declared sink of the job.
        :raises EpochOrderError: ``sink`` was already written in this epoch.
        :raises NotLeader: this replica knows its term is over (``Fenced`` included).
        """
        self.check_sink(sink)
        # A replica that knows it lost its term stages nothing. One that does not know yet (paused, partitioned)
        # may still stage: harmless, see docs/design.md "Zombies".
        term = self._term
        term.leadership.ensure_leading()
        with term.doing(f"epoch {self.epoch}: staging {sink}", "stage"):
            yield term.number

    def check_sink(self, sink: str) -> None:
        """Refuse a sink that is not declared, or already written in this epoch (one write per sink and epoch).

        :raises ConfigurationError: ``sink`` is not a declared sink of the job.
        :raises EpochOrderError: ``sink`` was already written in this epoch.
        """
        if sink not in self.writer.sinks:
            raise ConfigurationError(f"{sink!r} is not a declared sink of job {self.writer.name!r}")
        if sink in self.staged:
            raise EpochOrderError(f"job {self.writer.name!r} wrote {sink!r} twice in epoch {self.epoch}: "
                                  "combine the data into one write per sink and epoch")

    def stage(self, sink: str, snapshot_id: Optional[int]) -> None:
        """Record the staged snapshot of ``sink`` for this epoch (for writes made by other means).

        :param snapshot_id: the staged snapshot, None when the epoch writes nothing new to ``sink``.
        :raises ConfigurationError: ``sink`` is not a declared sink of the job.
        :raises EpochOrderError: ``sink`` was already written in this epoch.
        """
        self.check_sink(sink)
        self.staged[sink] = snapshot_id


class _MetricsView:
    """The writer as its metrics read it at scrape time (a ``DriverView``): from its memory, never a request."""

    def __init__(self, writer: EpochWriter) -> None:
        self.name, self.tm, self._writer = writer.name, writer.tm, writer

    def leading_term(self) -> Optional[int]:
        leadership = self._writer.leadership
        return leadership.term if leadership.is_leading else None

    def committed_epoch(self) -> Optional[int]:
        term = self._writer._term
        return None if term is None else term.epochs.last_committed

    def tidemarks_in_memory(self) -> Optional[dict[str, Optional[TableTidemark]]]:
        return self._writer.tidemarks_in_memory()


class EpochWriter:
    """One job's exactly-once epoch loop: it registers the job, contends for its leadership, recovers its last
    epoch, then calls a function once per epoch and commits what it staged in every sink at once.

        writer = EpochWriter(tm, "counts", sources=["lake.db.events"], sinks=["lake.db.counts"], every="1m")
        writer.run(step)                  # step(ctx: EpochContext), once per epoch, until stop() or SIGTERM
        writer.run(step, max_epochs=3)    # a bounded run: returns the epochs it committed

    What ``run`` does, in order (every step is safe to crash in):

    1. **register** the job's sources and sinks (idempotent) and join the shared barrier grid;
    2. **lead**: contend for leadership; a standby replica waits here, calling ``while_standby``
       every minute to stay warm, and takes over when the leader's session ends;
    3. **recover** the last epoch: roll a precommitted one forward, recompute a started one
       from its recorded inputs. With no epoch history in ZooKeeper (unregistered, new chroot,
       wiped ensemble) the history is first re-created from the sinks' Iceberg progress
       (``progress.py``), each sink's tidemark listing the epochs its lineage records;
    4. **pick the next epoch** (``pacing.py``): the newest barrier after the last epoch that every
       managed source holds, on the job's cadence (``every``: a multiple of the grid interval,
       default every grid point); a job with no managed source (a root job) takes the newest barrier
       on its cadence that the clock has passed by ``grace_ms``. One epoch covers every change since
       the previous one, so a job back from downtime catches up in one epoch, and one far behind the
       clock may first wait for a source's writer catching up too (``catch_up.py``). A new job's first
       epoch is after the time it opened. It waits on watches, never polling (its sources' tidemarks;
       ``/barriers`` and ``/topology`` for the grid and the job graph), and says why (``waiting``, and a
       log line every ``log_every`` seconds). A leader records the pacing it runs with, and that a bounded
       run finished, through ``job_run.py``;
    5. **record the inputs**: per source, the snapshot range ``(previous epoch, T]``;
    6. **compute**: call the function (skipped when no source changed and ``always_run`` is
       False: the epoch then commits in one ZooKeeper multi, with no catalog commit unless a marker
       round is due, see ``EpochCommitter``). A function that raises aborts the epoch with the error's
       first line (ABORTED), and it is recomputed from the same recorded inputs by whoever runs the job next;
    7. **stage, precommit, publish, commit** (``EpochCommitter``).

    States: closed (no term) until ``open`` wins the leadership and recovers, then leading, holding one
    ``LeaderTerm`` (its number, epoch state machine, committer and next epoch), until ``close`` steps down and
    drops it; ``run`` does both once per term. While closed, ``term``, ``epochs``, ``process``,
    ``commit_idle``, ``inputs_for`` and ``next_barrier`` raise ``NotLeader``.

    :param tm: the ZooKeeper session (a ``Tidemark``).
    :param name: the job's name; ``sources`` and ``sinks`` the tables it reads and writes (``namespace.table``).
    :param catalog: the catalog of those tables, else the environment's (``CatalogSettings.from_env``), which must
        exist: a writer never creates one (its sinks must exist before its first epoch anyway). The quickstart
        creates the embedded catalog, and its tables, with ``CatalogSettings.embedded().load()`` first.
    :param interval_ms: the barrier grid's interval: it defines the grid if none exists, else must match it.
    :param every: the job's cadence (``"1h"``, or milliseconds), a multiple of the grid interval; None: every barrier.
    :param grace_ms: how far the clock must be past a barrier before a root job takes it (late root commits).
    :param always_run: compute every epoch, even when no source changed (a function that reads the clock or an
        outside system).
    :param history: how many epoch znodes the leader keeps (at least 2).
    :param marker_every: how often a sink that published nothing gets its committed-epoch marker
        (``EpochCommitter``); None: at every epoch.
    :param log_every: seconds after which a step that lasts, or a wait, is logged, and again as often.
    :param context: builds what the function is called with from the writer and the epoch record.
    :param metrics_port: where ``writer.metrics`` (``coordinator.job.driver_metrics``: every phase timed, epochs,
        takeovers, fencings and retries counted) is served with ``/healthz`` (healthy while ``run`` runs), from
        the first ``open``; None: ``TIDEMARK_METRICS_PORT``, and not served when that is unset.

    Failure behaviour (``supervisor.py`` has it by cause): a leader that is fenced or whose session
    expires steps down and contends again (``run`` does not raise for it); so does a leader that loses
    the catalog's database (restarted, failing over: ``is_catalog_outage``), contending again after a
    pause, until it has been unreachable for ``CATALOG_OUTAGE_TIMEOUT_S``. Any other error while this
    replica still leads (the function's own, ``InputsExpired``, ``PublishConflict``, ...) is raised, and the
    next leader recovers the epoch in flight; so are ``NotLeader`` when not elected within ``leader_timeout``
    and ``JobRetired`` for a job an operator retired. A leader never goes quiet: a step that lasts
    ``log_every`` seconds (taking over, computing, staging, publishing, committing) is logged with what it
    is, and again every ``log_every`` seconds until it ends; its waits for the next epoch say why themselves.
    The constructor raises ``ConfigurationError`` for a setting out of range or a catalog that cannot be
    opened (one that does not exist names it), ``InvalidName`` for a malformed name.

    A rebuilt ZooKeeper (its data deleted or restored while this driver was connected: the session's
    ``ZooKeeperRebuilt``, see ``coordinator.zookeeper.session``) makes the writer start over in this
    process: it steps down, opens a new session with the old one's settings (``tm.reopen()``: ``writer.tm``
    is then the new one, and the old one stays ended), and its next take-over registers the job again and
    resumes from its sinks' Iceberg metadata, as a restarted driver would, with fresh recipes (leadership,
    the tidemark cache, barriers) on the new session. A tree restored from an older copy holds the job's
    history: the take-over resumes from Iceberg where that history is older than the sinks record, and gives
    the sinks' tidemarks a read floor either way. Where it cannot (a session not opened by
    ``connect``, no server answering), ``run`` logs one line and by default exits the process with
    ``EXIT_ZOOKEEPER_REBUILT`` (75, EX_TEMPFAIL) for its supervisor (Kubernetes) to restart it. SIGTERM
    while ZooKeeper is unreachable does not wait for it:
    the session fails every operation at once (``stop_waiting``), the epoch in flight is left to the
    next leader, and ``run`` returns after one line saying so.
    """

    def __init__(self, tm: ZooKeeperSession, name: str, *, sources: Iterable[str], sinks: Iterable[str],
                 catalog: Optional[CatalogSettings] = None, interval_ms: int = 5000,
                 every: Union[str, int, None] = None, grace_ms: int = DEFAULT_GRACE_MS, always_run: bool = False,
                 history: int = 100, marker_every: Union[str, int, None] = DEFAULT_MARKER_EVERY, log_every: float = 5.0,
                 context: Callable[[EpochWriter, EpochRecord], Any] = EpochContext,
                 metrics_port: Optional[int] = None) -> None:
        report_uncaught_errors()  # this script's uncaught TidemarkError: one line, as the CLI's
        if grace_ms < 0:
            raise ConfigurationError(f"grace_ms must not be negative, got {grace_ms}")
        if interval_ms <= 0:
            raise ConfigurationError(f"interval_ms must be positive, got {interval_ms}")
        if history < 2:
            raise ConfigurationError(f"history must keep at least 2 epochs, got {history}")
        self.pacing = Pacing(parse_every(every), grace_ms)
        self.marker_every_ms = parse_every(marker_every) or 0  # None: a marker at every epoch (0)
        self.tm = tm
        self.barriers = Barriers(tm)
        self.name = validate_name(name, "job name")
        self.sources, self.sinks = validate_names(sources, "source table"), validate_names(sinks, "sink table")
        self.catalog_settings = catalog or CatalogSettings.from_env()
        self.catalog = self.catalog_settings.load()
        self.interval_ms, self.history = interval_ms, history
        self.always_run, self.log_every = always_run, log_every
        self.context = context
        self.leadership = Leadership(tm, self.name)
        self.committed: list[int] = []
        self.waiting: Optional[Waiting] = None
        self._stop = threading.Event()
        self._tables: dict[str, Table] = {}
        self._term: Optional[LeaderTerm] = None  # while leading: made by open, dropped by close
        self._logged_at = 0.0
        # What this replica is busy with while it leads (and since when, monotonic): _watch_steps logs a step
        # that lasts, so a leader that commits nothing always says what it waits for (issue 22).
        self._doing: Optional[tuple[str, float]] = None
        # Set by a start-over, cleared by the next recovery: ZooKeeper went back, so that recovery gives the sinks'
        # tidemarks a read floor even where the tree still holds the job's history (restored from an older copy).
        self._after_loss = False
        # port None: TIDEMARK_METRICS_PORT, unset: not served
        self.metrics = DriverMetrics(_MetricsView(self), port=metrics_port)

    # -- what the loop reads ----------------------------------------------------------------

    @property
    def term(self) -> int:
        """The term this replica leads the job as; ``NotLeader`` when it holds none."""
        if self.leadership.term is None:
            raise NotLeader(f"job {self.name!r}: this replica does not lead the job")
        return self.leadership.term

    @property
    def epochs(self) -> EpochCoordinator:
        """The job's epoch state machine while this replica leads; ``NotLeader`` before ``open``."""
        return self._leading().epochs

    def _leading(self) -> LeaderTerm:
        """The term this replica leads, once ``open`` has taken over; ``NotLeader`` before."""
        if self._term is None:
            raise NotLeader(f"job {self.name!r}: open() the writer (or run it) first")
        return self._term

    @property
    def has_root_source(self) -> bool:
        """While leading: a source no Tidemark job writes (read by commit time, so the epochs follow the clock)."""
        term = self._term
        return term is not None and term.next_epoch.has_root_source

    def table(self, name: str) -> Table:
        """The pyiceberg table, loaded once per writer (callers refresh it when they need its newest metadata).

        :raises TableNotFound: the catalog has no such table.
        """
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = load_table(self.catalog, self.catalog_settings, name)
        return table

    def stop(self) -> None:
        """Finish the epoch in flight, commit it, and return from ``run``."""
        self._stop.set()

    def _on_sigterm(self, *_: object) -> None:
        """Stop, and while ZooKeeper is unreachable do not wait for it (the pod's grace period is short)."""
        self.stop()
        self.tm.stop_waiting()

    # -- leadership --------------------------------------------------------------------------

    def open(self, leader_timeout: Optional[float] = None,
             while_standby: Optional[Callable[[], None]] = None) -> None:
        """Register, wait for leadership and roll a precommitted epoch forward (``run`` calls it).

        :param leader_timeout: seconds to wait for leadership; None: as long as it takes.
        :param while_standby: called about every minute while this replica waits as a standby.
        :raises TableNotFound: a sink does not exist (checked before anything is registered).
        :raises RegistrationError: the registration was refused (``WriterConflict``, ``CycleError``).
        :raises ConfigurationError: a sink is another Iceberg table than the one registered, or the cadence or
            interval does not fit the barrier grid.
        :raises NotLeader: not elected within ``leader_timeout``, or fenced while taking over (``Fenced``).
        :raises JobRetired: an operator retired the job.
        """
        if self._term is not None:
            return
        self.metrics.serve()
        # TableNotFound names a missing sink before anything is registered: a job registered for tables that do
        # not exist would hold consistent reads back (stale) until an operator unregistered it.
        sinks = {sink: self.table(sink) for sink in self.sinks}
        register_job(self.tm, self.name, sources=self.sources, sinks=self.sinks)
        check_table_identities(self.tm, {sink: str(table.metadata.table_uuid) for sink, table in sinks.items()},
                               self.catalog_settings.describe(), record=True)
        grid, now = self.barriers.ensure_grid(self.interval_ms), self.tm.server_clock.now_ms()
        in_force = grid.interval_at(now)
        if in_force != self.interval_ms:  # accepted: an operator changed the grid for every job
            log.warning("job %s asked for barriers every %s ms, and the shared grid is every %s ms now (changed with "
                        "`tidemark barriers --set-interval`, which every job follows): it runs on the grid; give it "
                        "`every` for a slower cadence of it", self.name, self.interval_ms, in_force)
        self.pacing.check(grid, now)
        for table in sinks.values():
            table.refresh()
        self._acquire(leader_timeout, while_standby, max(recorded_term(t) for t in sinks.values()))
        self.metrics.became_leader()
        number = self.leadership.leading_term
        log.info("job %s: leading as term %s; taking over", self.name, number)
        self._doing = (f"taking over as term {number}: claiming its sinks in the catalog", time.monotonic())
        next_epoch: Optional[NextEpoch] = None
        try:
            next_epoch = NextEpoch(self.tm, self.name, self.sources, self.pacing, claimed=self._claimed_in_iceberg)
            # The grid from the watched copy: no read per epoch, and none while recovering.
            epochs = EpochCoordinator(self.leadership, self.sinks, self.history, grid=next_epoch.grid)
            committer = EpochCommitter(epochs, self.table, timed=self._timed, marker_every_ms=self.marker_every_ms)
            refuse_retired(self.tm, self.name)  # once leading: a standby may outlast the retirement of its job
            self._doing = (f"taking over as term {number}: recovering its last epoch", time.monotonic())
            plan = epochs.recover(lambda: resume_point(self.name, sinks), after_loss=self._after_loss)
            self._after_loss = False
            if plan.resumed_from is not None:
                log.info("%s", plan.resumed_from.describe())
            opened_ms = self.tm.server_clock.now_ms() if plan.action == RecoveryAction.START else None
            self._term = LeaderTerm(number, self.leadership, epochs, committer, next_epoch, opened_ms, self.doing)
            JobRun(self.leadership).started(self.pacing)
            last = plan.epoch  # None only for START
            if plan.action == RecoveryAction.ROLL_FORWARD and last is not None:
                log.info("job %s: rolling precommitted epoch %s forward", self.name, last.epoch)
                committer.roll_forward(last)
                self.committed.append(last.epoch)
                self.metrics.epoch_committed(rolled_forward=True)
            elif plan.action == RecoveryAction.NEXT and last is not None:
                committer.mark_committed(last)  # the last run may have died first
            self._doing = None
        except BaseException:
            if self._term is None and next_epoch is not None:
                next_epoch.close()  # no term holds its watches yet
            self.close()
            raise

    def _acquire(self, leader_timeout: Optional[float], while_standby: Optional[Callable[[], None]],
                 term_floor: int) -> None:
        deadline = None if leader_timeout is None else time.monotonic() + leader_timeout
        warmed = told = None
        while True:
            if while_standby is not None and (warmed is None or time.monotonic() - warmed > STANDBY_WARM_EVERY_S):
                warmed = time.monotonic()
                try:
                    while_standby()
                except Exception as exc:  # noqa: BLE001 - a failed warm-up must not end a standby
                    log.warning("job %s: standby warm-up failed (%s); the first epoch after takeover will be slower",
                                self.name, exc)
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            slice_s = 5.0 if remaining is None else min(5.0, remaining)
            try:
                self.leadership.acquire(timeout=slice_s, term_floor=term_floor)
                return
            except (NotLeader, ZooKeeperUnavailable) as exc:
                if self._stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                    raise
                if isinstance(exc, ZooKeeperUnavailable):
                    log.warning("job %s: %s; contending again", self.name, exc)
                elif told is None or time.monotonic() - told > STANDBY_LOG_EVERY_S:
                    told = time.monotonic()
                    log.info("job %s: standby (%s); taking over when its session ends", self.name, self._leader_note())

    def _leader_note(self) -> str:
        """Who leads the job, for a standby's log line."""
        try:
            leader = current_leader(self.tm, self.name)
        except TidemarkError as exc:
            return f"its leader could not be read: {type(exc).__name__}"
        return "no leader right now" if leader is None else f"{leader.member} leads as term {leader.term}"

    @contextmanager
    def doing(self, what: str, phase: Optional[str] = None) -> Iterator[None]:
        """Say what this leader is busy with (``_watch_steps`` logs it once it lasts ``log_every`` seconds),
        timing ``phase`` in the metrics."""
        outer, self._doing = self._doing, (what, time.monotonic())
        try:
            if phase is None:
                yield
            else:
                with self.metrics.phase(phase):
                    yield
        finally:
            self._doing = outer

    def _timed(self, phase: str) -> AbstractContextManager[None]:
        """The committer's phases (precommit, publish, commit), timed and said."""
        current = self._term.epochs.current if self._term is not None else None
        return self.doing(f"{phase} of epoch {current.epoch}" if current is not None else phase, phase)

    def _watch_steps(self, done: threading.Event) -> None:
        """While ``run`` runs: log a step of the leader that has lasted ``log_every`` seconds, and every
        ``log_every`` seconds after. Its waits for the next epoch say why themselves (``_note_wait``); this
        covers everything else, a catalog commit or a ZooKeeper request that takes long included."""
        last = 0.0
        while not done.wait(WAIT_SLICE_S):
            doing = self._doing
            now = time.monotonic()
            if doing is not None and now - doing[1] >= self.log_every and now - last >= self.log_every:
                log.info("job %s (term %s): %s for %.0f s so far", self.name, self.leadership.term, doing[0],
                         now - doing[1])
                last = now

    def _start_over(self) -> bool:
        """After ``ZooKeeperRebuilt``: this writer on a new session with the old one's settings (``reopen``), as a
        restarted process would be; the next take-over registers the job again and resumes from Iceberg. False when
        no session can be opened (one not made by ``connect``, no server answering): the process exits instead."""
        try:
            tm = self.tm.reopen()
        except TidemarkError as exc:
            log.error("job %s: cannot start over in this process (%s)", self.name, str(exc).splitlines()[0])
            return False
        self.tm, self.barriers, self.leadership = tm, Barriers(tm), Leadership(tm, self.name)
        self._after_loss = True
        return True

    def close(self) -> None:
        """Step down (a standby takes over). Nothing is left half-committed: every epoch finished or recovers."""
        if self._term is not None:
            self._term.next_epoch.close()
        if self.leadership.term is not None:
            self.metrics.stepping_down(self.leadership.state)
        self.leadership.release()
        self._term = None
        self._doing = None
        self.leadership = Leadership(self.tm, self.name)

    # -- the loop ----------------------------------------------------------------------------

    def run(self, function: Callable[..., None], *, max_epochs: Optional[int] = None, until: Optional[int] = None,
            once: bool = False, leader_timeout: Optional[float] = None,
            while_standby: Optional[Callable[[], None]] = None, stop_on_sigterm: bool = True,
            exit_on_rebuilt: bool = True) -> list[int]:
        """Process epochs until ``max_epochs`` epochs, barrier ``until``, or ``stop()``; with ``once``, process one
        epoch and return: a batch run. It covers every row committed before the call: with a root source it
        waits for the first barrier at or after the call to pass by the grace (on its cadence with ``every``: the
        newest one at or before that point), a derived job takes what its sources' writers committed; it
        returns without an epoch when the job has that one already.

        Each epoch is the newest barrier the job's pacing allows, so a bounded run that starts
        behind catches up in one epoch. ``until`` ends the run once the job committed the
        newest barrier on its cadence at or before ``until``, or its sources moved past it
        without holding it. Returns the epochs this call committed; every one of them is
        committed before it returns (FLIP-147). A replica that loses leadership (fenced,
        session expired) steps down and contends again; ``leader_timeout`` bounds only the
        wait to become leader.

        A ZooKeeper server found behind this session (rebuilt or restored) makes the run start over on
        a new session (class docstring); where it cannot, the run ends with one log line, and with
        ``exit_on_rebuilt`` (on the main thread) the process exits with status ``EXIT_ZOOKEEPER_REBUILT``
        for its supervisor to restart it, otherwise ``ZooKeeperRebuilt`` is raised.

        :raises NotLeader: not elected within ``leader_timeout``.
        :raises JobRetired: an operator retired the job.
        :raises Exception: the function's own error, or any other error while this replica still leads (the class
            docstring says which errors make it step down and contend again instead).
        """
        main = threading.current_thread() is threading.main_thread()
        if stop_on_sigterm and main:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        start = len(self.committed)
        self._stop.clear()
        # A batch run covers what was committed before it, on this host's clock or ZooKeeper's, whichever is ahead
        # (a root table's commits carry the time of the host that made them).
        called_at = max(now_ms(), self.tm.server_clock.now_ms()) if once else None

        def lead() -> None:  # one term
            remaining = None if max_epochs is None else max_epochs - (len(self.committed) - start)
            if self._loop(function, remaining, until, called_at):
                JobRun(self.leadership).finished(self.epochs.last_committed)
        supervisor = Supervisor(self.name, self._stop, take_over=lambda: self.open(leader_timeout, while_standby),
                                step_down=self.close, still_leading=lambda: self.leadership.confirm(),
                                start_over=self._start_over)
        watched = threading.Event()
        threading.Thread(target=self._watch_steps, args=(watched,), name=f"tidemark-steps-{self.name}",
                         daemon=True).start()
        try:
            supervisor.run(lead, exit_on_rebuilt=exit_on_rebuilt and main)
        finally:
            watched.set()
        self.metrics.loop_ended()
        return self.committed[start:]

    def _loop(self, function: Callable[..., None], max_epochs: Optional[int], until: Optional[int],
              called_at: Optional[int] = None) -> bool:
        """Process epochs; True when the bounded run is complete (False when stopped). ``called_at``: a batch run's
        (``once``) call time, which its one epoch covers."""
        once = called_at is not None
        done = 0
        while not self._stop.is_set():
            if max_epochs is not None and done >= max_epochs:
                return True
            current = self.epochs.current
            if current is not None and current.state in (EpochState.STARTED, EpochState.ABORTED):
                log.info("job %s: recomputing epoch %s from its recorded inputs%s", self.name, current.epoch,
                         f" (it failed: {current.abort_reason})" if current.abort_reason else "")
                self.process(current.epoch, function)
            else:
                if once and done:
                    return True
                with self.metrics.phase("wait"):
                    # A batch run of a new job waits for its first epoch (after it opened): nothing older exists.
                    # A new job's first epoch comes after it opened, after the call: it covers the call already.
                    last = self.epochs.last_committed
                    target = self.next_barrier(until, wait=not once or last is None,
                                               covering=called_at if last is not None else None)
                    inputs = None if target is None else self.inputs_for(target)
                if target is None:
                    return not self._stop.is_set()
                if inputs is None:
                    continue  # a root source got a writer meanwhile: wait for its tidemark instead
                self.process(target, function, inputs=inputs)
            done += 1
        return False

    def process(self, epoch: int, function: Callable[..., None], *args: Any,
                inputs: Optional[EpochInputs] = None) -> EpochRecord:
        """Run one epoch: record its inputs, compute (unless idle), stage, precommit, publish, commit.

        :param args: passed to ``function`` after the context (a streaming batch); given, the epoch is computed.
        :param inputs: the epoch's inputs (``inputs_for``); None to recompute the job's STARTED or ABORTED epoch
            from the inputs it recorded.
        :raises Exception: the function's own error, once the epoch is recorded ABORTED.
        :raises EpochOrderError: ``epoch`` cannot begin now (``EpochCoordinator``'s transitions), or ``inputs``
            differ from those recorded for it.
        :raises NotLeader: this replica does not lead the job, or was fenced (``Fenced``).
        :raises PublishConflict: a sink's staged snapshot could not be published.
        """
        term = self._leading()
        epochs, committer = term.epochs, term.committer
        recomputed = epochs.to_recompute(epoch)
        redo = recomputed is not None
        recorded = recomputed if redo else inputs
        idle = not self.always_run and not args and recorded is not None and recorded.unchanged
        if idle:
            committed = committer.commit_idle(epoch, inputs)
        else:
            with self.doing(f"computing epoch {epoch}", "compute"):
                record = epochs.begin(epoch, inputs)
                crash_point("begin")
                ctx = self.context(self, record)
                try:
                    function(ctx, *args)
                except Exception as exc:
                    self._abort(epoch, exc)
                    raise
            committed = committer.finish(epoch, {sink: ctx.staged.get(sink) for sink in self.sinks}, ctx.writes)
        self.committed.append(committed.epoch)
        self.metrics.epoch_committed(idle=idle, recomputed=redo)
        self.waiting = None
        return committed

    def _abort(self, epoch: int, failure: Exception) -> None:
        """The epoch's function failed: record it ABORTED with the reason, for the log of whoever recomputes it from
        its recorded inputs (its staged snapshots are never published). A leader that lost its term writes
        nothing, and a write that fails leaves the epoch STARTED, which is recomputed the same way."""
        if isinstance(failure, NotLeader):
            return
        reason = f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}"[:300]
        try:
            self.epochs.abort(epoch, reason)
        except TidemarkError as exc:
            log.warning("job %s: epoch %s failed (%s) and could not be marked aborted (%s)", self.name, epoch,
                        reason, type(exc).__name__)

    def commit_idle(self, epoch: int) -> EpochRecord:
        """Commit barrier ``epoch`` without computing, recording its inputs; refused unless no source changed.

        A streaming job (no source tables) uses it for barriers that passed with no micro-batch.

        :raises EpochOrderError: a source changed, or ``epoch`` cannot be committed now.
        :raises NotLeader: the writer is not open, or this replica was fenced.
        """
        inputs = self.inputs_for(epoch)
        if inputs is None or (self.sources and not inputs.unchanged):
            raise EpochOrderError(f"job {self.name!r} epoch {epoch}: its sources changed, so it must be computed")
        committed = self._leading().committer.commit_idle(epoch, inputs)
        self.committed.append(committed.epoch)
        self.metrics.epoch_committed(idle=True)
        return committed

    # -- inputs --------------------------------------------------------------------------------

    def inputs_for(self, epoch: int) -> Optional[EpochInputs]:
        """Each source's snapshot range ``(previous epoch, epoch]``; None when a source read as a root table
        turned out to have a Tidemark writer by now (the caller must wait for its tidemark instead)."""
        term = self._leading()
        current = term.epochs.current
        previous = current.inputs.sources if current is not None and current.state == EpochState.COMMITTED else {}
        next_epoch = term.next_epoch
        managed = next_epoch.managed
        ranges = {}
        for source in self.sources:
            end = self._managed_snapshot(source, epoch) if source in managed else self._root_snapshot(source, epoch)
            ranges[source] = SourceRange(previous[source].end if source in previous else None, end)
        if len(managed) < len(self.sources):
            # A writer registers before its first commit, so a source still without a writer now had none
            # when its metadata was loaded above: it was read as the root table it then was.
            next_epoch.read_sources()
            if next_epoch.managed != managed:
                return None
        return EpochInputs(ranges)

    def _managed_snapshot(self, source: str, epoch: int) -> Optional[int]:
        mark = self._leading().next_epoch.cache.get([source])[source]
        if mark is not None and mark.holds(epoch):
            return mark.snapshot_at(epoch)  # recorded by the source's writer at commit: no metadata load
        table = self.table(source)
        table.refresh()
        found = snapshot_at_epoch(table, epoch)
        return found.snapshot_id if found else None

    def _root_snapshot(self, source: str, epoch: int) -> Optional[int]:
        table = self.table(source)
        table.refresh()
        found = snapshot_at_time(table, epoch)
        return found.snapshot_id if found else None

    # -- waiting for the next barrier ----------------------------------------------------------

    def grid(self) -> BarrierGrid:
        """The barrier grid: from the watched copy while leading (no request), else read."""
        term = self._term
        return term.next_epoch.grid() if term is not None else self.barriers.grid()

    def tidemarks_in_memory(self) -> Optional[dict[str, Optional[TableTidemark]]]:
        """The managed sources' tidemarks as the loop's watches keep them and the sinks' as this leader committed
        them, from memory only (for metrics scrapes: never a request); None when not leading or a source's is
        not loaded."""
        term = self._term
        if term is None:
            return None
        next_epoch, epochs = term.next_epoch, term.epochs
        sources = next_epoch.cache.cached(next_epoch.managed)
        if len(sources) < len(next_epoch.managed):
            return None
        return {**sources, **{sink: epochs.mark(sink) for sink in self.sinks}}

    def _claimed_in_iceberg(self, source: str) -> bool:
        try:
            return writer_job(self.table(source)) is not None
        except TableNotFound:
            return False  # not created yet: nothing to read either way

    def next_barrier(self, until: Optional[int] = None, wait: bool = True,
                     covering: Optional[int] = None) -> Optional[int]:
        """Block until the job's pacing gives its next epoch, and return it; None when stopped, when the run
        bounded by ``until`` is complete, or (``wait`` False) when no epoch is available now (``NextEpoch``).
        ``covering``: a batch run's call time, which the epoch must cover (``NextEpoch.wait``)."""
        term = self._leading()
        last = term.epochs.last_committed
        after = last if last is not None else term.opened_ms  # a new job starts after it opened
        epoch = term.next_epoch.wait(after, until, wait, stopped=self._stop.is_set,
                                     on_wait=lambda choice: self._note_wait(after, choice.reason, choice.behind),
                                     covering=covering)
        if epoch is not None:
            self.waiting = None
        return epoch

    def _note_wait(self, after: Optional[int], reason: str, lagging: tuple[str, ...] = ()) -> None:
        """Record why the writer waits; log it once the wait has lasted ``log_every`` seconds, and every
        ``log_every`` seconds after (short waits for the clock are the normal rhythm, not news)."""
        if self.waiting is None or self.waiting.after != after:
            self.waiting = Waiting(after, reason, self.tm.server_clock.now_ms())
            self._logged_at = time.monotonic()
        elif self.waiting.reason != reason:  # the same wait, said anew (a reason names the sources' epochs)
            self.waiting = Waiting(after, reason, self.waiting.since_ms)
        if time.monotonic() - self._logged_at >= self.log_every:
            log.info("job %s waiting %.0f s%s: %s%s", self.name,
                     (self.tm.server_clock.now_ms() - self.waiting.since_ms) / 1000,
                     f" for an epoch after {after}" if after is not None else "", reason,
                     self._leaderless_writers(lagging))
            self._logged_at = time.monotonic()

    def _leaderless_writers(self, lagging: tuple[str, ...]) -> str:
        """For a wait on sources: which lagging source's writer has no live leader."""
        topo = read_topology(self.tm)
        notes = []
        for source in lagging:
            writer = topo.writer_of(source)
            if writer is None:
                notes.append(f"{source}'s writer job {writer_job(self.table(source))} "
                             "(named in its Iceberg metadata) is not registered: start it")
            elif self.tm.get(self.tm.paths.leader(writer)) is None:
                notes.append(f"{source}'s writer job {writer} has no live leader")
        return " (" + "; ".join(notes) + ")" if notes else ""

