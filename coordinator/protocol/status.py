"""A cluster-wide status report: per job its leader, committed epoch, lag, cadence and what it waits for.

    status = tm.status()
    status.pipeline("orders").consistent_epoch  # the newest epoch the pipeline's tables all hold (None: none yet)
    status.consistent_epoch  # the same across every pipeline's tables (the ``all`` scope)
    job = status.job("word_counts")
    job.lag_seconds          # now (wall clock) minus the job's committed epoch
    job.cadence_ms           # its own cadence (``every``; the grid interval when it has none)
    job.effective_cadence_ms, job.cadence_from   # the cadence it follows, and the slower upstream job setting it
    job.waiting_for          # managed sources holding no epoch after its committed epoch, with their writers' state
    job.stale                # the job is what holds consistent reads back (``read_status`` says when)

``read_status`` reads it, for ``tidemark status`` and the exporter alike, and asks the writers' own rules
(``pacing.py``: ``Pacing.choose``, ``effective_cadences``) and the readers' (``held_epochs``), never a copy.
A job's **state** is ``leading`` or, with no live leader, ``retired``, ``paused`` (an operator said so:
``coordinator.protocol.rest``), ``finished`` (its last leader ended a bounded or batch run), ``fenced`` (its
leader's term is older than the job's) or ``no leader``. Finished, paused and retired jobs are **at rest**:
nobody runs them now, on purpose; every other job is **live**. A job **waits for** the managed sources that
hold no epoch after its committed epoch (``Choice.behind``), and is **stale** when it, rather than something
upstream of it, holds its pipeline's consistent epoch back. A **pipeline's consistent epoch** is the newest epoch
every table its jobs write holds (``PipelineStatus``; ``coordinator.protocol.pipelines`` says what a pipeline is);
its **live consistent epoch**, the same over the tables its live jobs read and write, is its freshness. A stale
job holds back its own pipeline only. ``docs/design.md``, "Observability", says why.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from coordinator.errors import JobNotFound
from coordinator.formatting import fmt_cadence, fmt_epoch, fmt_seconds, fmt_time
from coordinator.protocol.barriers import BarrierGrid
from coordinator.protocol.held_epochs import held_epochs, newest_common_epoch
from coordinator.protocol.pacing import Pacing, effective_cadences
from coordinator.protocol.pipelines import Pipeline, Pipelines
from coordinator.protocol.topology import Topology, read_topology
from coordinator.records import (
    FinishedRecord,
    LeaderRecord,
    RestRecord,
    TableTidemark,
    TermRecord,
    job_committed_epoch,
    now_ms,
)
from coordinator.zookeeper.session import ZooKeeperSession

STALE_INTERVALS = 3
STALE_SLACK_MS = 1000  # processing time: a healthy job lags up to a cadence plus grace plus processing

LEADING, FINISHED, PAUSED, RETIRED, FENCED, NO_LEADER = "leading", "finished", "paused", "retired", "fenced", \
    "no leader"
AT_REST = (FINISHED, PAUSED, RETIRED)


def _seconds(ms: Optional[int]) -> Optional[float]:
    return None if ms is None else round(ms / 1000, 3)


@dataclass(frozen=True)
class Blocker:
    """A managed source that holds no epoch after the committed epoch of the job reading it."""

    table: str
    epoch: Optional[int]             # the source's tidemark (None: its writer has committed nothing yet)
    writer: str
    writer_state: str                # leading | finished | paused | retired | fenced | no leader
    writer_finished_epoch: Optional[int] = None

    @property
    def writer_live(self) -> bool:
        """Whether the source's writer job has a live, unfenced leader."""
        return self.writer_state == LEADING

    def describe(self) -> str:
        """One line for operators: the source, its epoch, its writer job and why that job is or is not running."""
        at = "no committed epoch yet" if self.epoch is None else f"at {fmt_time(self.epoch)}"
        if self.writer_state == LEADING:
            who = "which has a live leader"
        elif self.writer_state == FINISHED:
            who = (f"which has no live leader (it finished a bounded run at "
                   f"{fmt_epoch(self.writer_finished_epoch)})")
        elif self.writer_state in (PAUSED, RETIRED):
            who = f"which has no live leader (an operator {self.writer_state} it)"
        elif self.writer_state == FENCED:
            who = "which has no live leader (its leader was fenced)"
        else:
            who = "which has no live leader"
        return f"waiting for {self.table} ({at}), written by job {self.writer}, {who}"

    def to_dict(self) -> dict[str, Any]:
        """The blocker as JSON values (``tidemark status --json``)."""
        return {"table": self.table, "epoch": self.epoch, "writer": self.writer, "writer_state": self.writer_state,
                "writer_live": self.writer_live, "writer_finished_epoch": self.writer_finished_epoch}


@dataclass(frozen=True)
class JobStatus:
    """One job as ``read_status`` found it: its tables, leader and term, the marks of a job at rest, its sinks'
    tidemarks, cadences and lag, what it waits for, and whether it is stale (a stale job is live: it should run).
    """

    name: str
    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    term: Optional[int]
    leader: Optional[LeaderRecord]
    fenced_by: Optional[str]
    tidemarks: dict[str, Optional[int]] = field(default_factory=dict)   # each sink's newest committed epoch
    finished: Optional[FinishedRecord] = None
    paused: Optional[RestRecord] = None       # an operator's pause in force at the read (read when no live leader)
    retired: Optional[RestRecord] = None      # an operator's retirement (read when no live leader)
    pause_ended: Optional[RestRecord] = None  # a pause whose end passed: it no longer counts
    pacing: Optional[Pacing] = None           # as its leader recorded it (None: not recorded yet)
    cadence_ms: Optional[int] = None          # its own cadence: ``every``, or the grid interval (None: no grid)
    effective_cadence_ms: Optional[int] = None  # the cadence its epochs follow (a slower upstream's, or its own)
    cadence_from: Optional[str] = None        # the upstream job that sets the effective cadence (None: its own)
    consistent_epoch: Optional[int] = None    # the newest epoch its sinks and managed sources all hold, by the
                                              # rule on the tidemarks' lists alone (no read per job), the figure
                                              # its driver exports
    lag_ms: Optional[int] = None              # wall clock at the read minus the committed epoch
    stale_after_ms: Optional[int] = None      # the lag beyond which it is stale unless upstream explains it
    waiting_for: tuple[Blocker, ...] = ()
    waiting: Optional[str] = None             # why it lags, when that is not waiting_for alone
    stale: bool = False
    stale_reason: Optional[str] = None
    holds_back_ms: Optional[int] = None       # for a stale job: how far it holds the consistent epoch back
    leader_since_ms: Optional[int] = None     # when its leader znode was created: the live leader's takeover

    @property
    def committed_epoch(self) -> Optional[int]:
        """The epoch committed in every sink: the lowest sink tidemark (None while a sink has none)."""
        return job_committed_epoch(self.tidemarks.values())

    @property
    def leader_state(self) -> str:
        """``leading``, ``fenced`` or ``no leader`` (the leader znode alone)."""
        if self.leader is None:
            return NO_LEADER
        if self.term is not None and self.leader.term < self.term:
            return FENCED
        return LEADING

    @property
    def state(self) -> str:
        """``leading``; with no live leader ``retired``, ``paused`` (an operator said so), ``finished`` (its last
        run was bounded and ended), ``fenced`` or ``no leader``."""
        live = self.leader_state
        if live == LEADING:
            return live
        if self.retired is not None:
            return RETIRED
        if self.paused is not None:
            return PAUSED
        return FINISHED if self.finished is not None else live

    @property
    def at_rest(self) -> bool:
        """Nobody runs the job now, on purpose (finished, paused or retired): not stale, not live."""
        return self.state in AT_REST

    @property
    def lag_seconds(self) -> Optional[float]:
        """``lag_ms`` in seconds (None: nothing committed yet)."""
        return _seconds(self.lag_ms)

    def describe_cadence(self) -> str:
        """``cadence 5s`` or ``cadence 5s, follows the cadence of hourly (1h)``."""
        text = f"cadence {fmt_cadence(self.cadence_ms)}"
        if self.cadence_from is not None:
            text += f", follows the cadence of {self.cadence_from} ({fmt_cadence(self.effective_cadence_ms)})"
        return text

    def reasons(self) -> list[str]:
        """One line per thing the job waits for (empty when it is not held back)."""
        return [b.describe() for b in self.waiting_for] + ([self.waiting] if self.waiting else [])

    def to_dict(self) -> dict[str, Any]:
        """The job's status as JSON values, derived ones (``state``, ``reasons``, ...) included."""
        return {
            "name": self.name, "sources": list(self.sources), "sinks": list(self.sinks), "term": self.term,
            "leader": self.leader.to_dict() if self.leader else None, "leader_state": self.leader_state,
            "leader_since_ms": self.leader_since_ms,
            "state": self.state, "fenced_by": self.fenced_by,
            "finished": self.finished.to_dict() if self.finished else None,
            "paused": self.paused.to_dict() if self.paused else None,
            "retired": self.retired.to_dict() if self.retired else None, "at_rest": self.at_rest,
            "tidemarks": self.tidemarks, "committed_epoch": self.committed_epoch,
            "consistent_epoch": self.consistent_epoch, "lag_seconds": self.lag_seconds,
            "pacing": self.pacing.to_dict() if self.pacing else None, "cadence_ms": self.cadence_ms,
            "effective_cadence_ms": self.effective_cadence_ms, "cadence_from": self.cadence_from,
            "waiting_for": [b.to_dict() for b in self.waiting_for], "reasons": self.reasons(),
            "stale": self.stale, "stale_reason": self.stale_reason,
            "stale_after_seconds": _seconds(self.stale_after_ms), "holds_back_seconds": _seconds(self.holds_back_ms),
        }


@dataclass(frozen=True)
class PipelineStatus:
    """One pipeline as ``read_status`` found it: its name, jobs and tables, its consistent epoch (the newest epoch
    every table its jobs write holds, by the rule readers resolve by: what ``tidemark serve`` and ``tidemark
    resolve`` give its tables) and its live consistent epoch (over the tables of its live jobs; None when none is
    live), the jobs holding them back (stale), and the wall clock ``read_ms`` of the read."""

    name: str
    jobs: tuple[str, ...]
    tables: tuple[str, ...]
    consistent_epoch: Optional[int]
    live_consistent_epoch: Optional[int]
    stale_jobs: tuple[str, ...]
    read_ms: int

    @property
    def consistent_lag_ms(self) -> Optional[int]:
        """Wall clock at the read minus the consistent epoch (None: there is none)."""
        return _lag_ms(self.read_ms, self.consistent_epoch)

    @property
    def live_consistent_lag_ms(self) -> Optional[int]:
        """The pipeline's freshness: wall clock minus its live consistent epoch."""
        return _lag_ms(self.read_ms, self.live_consistent_epoch)

    def to_dict(self) -> dict[str, Any]:
        """The pipeline's status as JSON values."""
        return {
            "name": self.name, "jobs": list(self.jobs), "tables": list(self.tables),
            "consistent_epoch": self.consistent_epoch, "consistent_lag_seconds": _seconds(self.consistent_lag_ms),
            "live_consistent_epoch": self.live_consistent_epoch,
            "live_consistent_lag_seconds": _seconds(self.live_consistent_lag_ms), "stale_jobs": list(self.stale_jobs),
        }


@dataclass(frozen=True)
class Status:
    """One read of the whole deployment (``read_status``): the topology, every job's ``JobStatus``, every
    pipeline's ``PipelineStatus``, the grid, and the wall clock ``read_ms`` the lags are measured against.

    ``consistent_epoch`` is the newest epoch every managed table of every pipeline holds, by the rule readers
    resolve by (``coordinator.protocol.held_epochs``): what a reader of the ``all`` scope gets; None when they
    share none (pipelines on different cadences may never), or a table has committed nothing.
    ``live_consistent_epoch`` is the same over the tables live jobs read and write, None when no job is live.
    Each pipeline's own are in ``pipelines``: nothing outside a pipeline holds them back.
    """

    topology: Topology
    jobs: tuple[JobStatus, ...]
    grid: Optional[BarrierGrid]
    interval_ms: Optional[int]                     # the grid's interval in force at the read
    consistent_epoch: Optional[int] = None         # the newest epoch every managed table holds
    read_ms: int = field(default_factory=now_ms)   # the wall clock the lags are measured against
    live_consistent_epoch: Optional[int] = None    # the same over the tables of live jobs (None: no job is live)
    pipelines: tuple[PipelineStatus, ...] = ()     # each pipeline, by name

    def job(self, name: str) -> JobStatus:
        """The status of job ``name``.

        :raises JobNotFound: no job of that name was registered at the read.
        """
        for job in self.jobs:
            if job.name == name:
                return job
        raise JobNotFound(f"job {name!r} is not registered (see `tidemark status`)")

    def pipeline(self, name: str) -> PipelineStatus:
        """The status of pipeline ``name``.

        :raises PipelineNotFound: no pipeline of that name at the read (the message lists those there are).
        """
        named = Pipelines(self.topology).named(name)  # its error lists the pipelines there are
        return next(p for p in self.pipelines if p.name == named.name)

    @property
    def consistent_lag_ms(self) -> Optional[int]:
        """Wall clock at the read minus the consistent epoch (None: there is none)."""
        return _lag_ms(self.read_ms, self.consistent_epoch)

    @property
    def live_consistent_lag_ms(self) -> Optional[int]:
        """The deployment's freshness: wall clock minus the live consistent epoch."""
        return _lag_ms(self.read_ms, self.live_consistent_epoch)

    def to_dict(self) -> dict[str, Any]:
        """The whole status as JSON values (``tidemark status --json``)."""
        return {
            "topology_version": self.topology.version,
            "read_ms": self.read_ms,
            "grid": self.grid.to_dict() if self.grid else None,
            "interval_ms": self.interval_ms,
            "consistent_epoch": self.consistent_epoch,
            "consistent_lag_seconds": _seconds(self.consistent_lag_ms),
            "live_consistent_epoch": self.live_consistent_epoch,
            "live_consistent_lag_seconds": _seconds(self.live_consistent_lag_ms),
            "live_jobs": [j.name for j in self.jobs if not j.at_rest],
            "stale_jobs": [j.name for j in self.jobs if j.stale],
            "pipelines": [p.to_dict() for p in self.pipelines],
            "jobs": [j.to_dict() for j in self.jobs],
        }


def read_status(tm: ZooKeeperSession, stale_intervals: int = STALE_INTERVALS,
                clock: Callable[[], int] = now_ms) -> Status:
    """The status as of ``clock()`` (milliseconds since the Unix epoch; tests that simulate idle time pass
    their own).

    Reads at most two pipelined batches whatever the number of jobs, beside the topology (cached while
    ``/topology`` is unchanged): one ``get_many`` of every job's term, leader and pacing (``/jobs/<job>/pacing``),
    every table's tidemark and ``/barriers``; then the finished, paused and retired markers of the jobs with no
    live leader, if there are any (a pause past its end no longer counts). Beside a laggard whose epoch the other
    tables' lists no longer reach, the epoch records there are read too: one more batch for the deployment's
    consistent epoch, and one for the live one. A job with no recorded pacing (its leader has not run this
    release yet) counts as a job taking every grid point.

    A job is stale when it has no live leader and is not at rest, or has a live leader but lags the wall clock
    by more than ``stale_intervals`` of its effective cadence (plus ``STALE_SLACK_MS`` of processing and the
    largest grace of it and its upstream jobs) while nothing upstream explains the lag: a managed source holds no
    epoch after its committed epoch, its sources hold no common epoch on its cadence yet, or a source committed
    its first epoch after the job's only lately (less than that threshold ago: the job is catching up). Such a
    job is shown waiting (with the reason), not stale: the job it waits for is the one flagged. A stale job whose
    live leader has committed nothing since it took over (its leader znode's creation) says so: the leader is
    stuck. A job at rest is never stale.

    :param stale_intervals: how many of its effective cadences a live job may lag before it is stale.
    :raises CorruptState: a znode read cannot be decoded.
    :raises ZooKeeperUnavailable: ZooKeeper did not answer within the session's deadline.
    """
    deployment = _read_deployment(tm, clock)
    topo, marks, read_ms = deployment.topology, deployment.marks, deployment.read_ms
    names, writers = sorted(topo.jobs), topo.writers
    interval = deployment.grid.interval_at(read_ms) if deployment.grid is not None else None
    cadences = effective_cadences(topo, deployment.pacings, interval)
    graces = _upstream_graces(topo, writers, deployment.pacings)
    judged = {name: _judge(deployment, name, stale_intervals, interval, cadences[name], graces[name])
              for name in names}
    live_tables = {t for job in judged.values() if not job.at_rest for t in _own_tables(job, writers)}
    consistent = _consistent_epoch(marks, sorted(writers), tm, writers)
    live_consistent = _consistent_epoch(marks, live_tables, tm, writers)
    pipelines = Pipelines(topo).all
    jobs: dict[str, JobStatus] = {}
    for pipeline in pipelines:  # a stale job holds back its own pipeline, nothing else
        own = {name: judged[name] for name in pipeline.jobs}
        reference = _holds_back_reference(own, deployment)
        jobs.update({name: replace(job, holds_back_ms=max(0, reference - c))
                     if job.stale and (c := job.committed_epoch) is not None else job for name, job in own.items()})
    return Status(topo, tuple(jobs[name] for name in names), deployment.grid, interval, consistent, read_ms,
                  live_consistent, tuple(_pipeline_status(p, jobs, marks, tm, writers, read_ms) for p in pipelines))


def _pipeline_status(pipeline: Pipeline, jobs: Mapping[str, JobStatus], marks: Mapping[str, Optional[TableTidemark]],
                     tm: ZooKeeperSession, writers: Mapping[str, str], read_ms: int) -> PipelineStatus:
    own = [jobs[name] for name in pipeline.jobs]
    written = sorted(t for t in pipeline.tables if t in writers)
    live = {t for job in own if not job.at_rest for t in _own_tables(job, writers)}
    return PipelineStatus(pipeline.name, pipeline.jobs, pipeline.tables, _consistent_epoch(marks, written, tm, writers),
                          _consistent_epoch(marks, live, tm, writers), tuple(j.name for j in own if j.stale), read_ms)


@dataclass(frozen=True)
class _Deployment:
    """What ``read_status`` reads: the topology, every table's tidemark, the grid, every job's pacing and its
    status as read (leader, term, the marks of a job at rest), and the wall clock at the read."""

    topology: Topology
    marks: Mapping[str, Optional[TableTidemark]]
    grid: Optional[BarrierGrid]
    pacings: Mapping[str, Optional[Pacing]]
    jobs: Mapping[str, JobStatus]
    read_ms: int


def _read_deployment(tm: ZooKeeperSession, clock: Callable[[], int]) -> _Deployment:
    """The reads of ``read_status``: two pipelined batches beside the topology."""
    topo = read_topology(tm)
    names = sorted(topo.jobs)
    tables = sorted(topo.writers)
    p = tm.paths
    n = len(names)
    raw = tm.get_many([p.term(j) for j in names] + [p.leader(j) for j in names] + [p.pacing(j) for j in names]
                      + [p.tidemark(t) for t in tables] + [p.barriers])
    marks = {t: (TableTidemark.from_json(r[0], p.tidemark(t)) if r else None)
             for t, r in zip(tables, raw[3 * n:3 * n + len(tables)])}
    grid = BarrierGrid.from_json(raw[-1][0], p.barriers) if raw[-1] and raw[-1][0] else None
    pacings = {name: (Pacing.from_json(r[0], p.pacing(name)) if r else None)
               for name, r in zip(names, raw[2 * n:3 * n])}
    base: dict[str, JobStatus] = {}
    for name, term_raw, leader_raw in zip(names, raw[:n], raw[n:2 * n]):
        term = TermRecord.from_json(term_raw[0], p.term(name)) if term_raw else None
        leader = LeaderRecord.from_json(leader_raw[0], p.leader(name)) if leader_raw else None
        tidemarks = {t: (m.epoch if (m := marks.get(t)) else None) for t in topo.jobs[name].sinks}
        base[name] = JobStatus(name, topo.jobs[name].sources, topo.jobs[name].sinks, term.term if term else None,
                               leader, term.fenced_by if term else None, tidemarks, pacing=pacings[name],
                               leader_since_ms=leader_raw[1].ctime if leader_raw else None)
    read_ms = clock()
    # The markers of a job at rest matter only while it has no live leader (a job being run is live, and a
    # leader that starts removes the finished marker): a healthy cluster costs no read for them.
    leaderless = [name for name in names if base[name].leader_state != LEADING]
    found = tm.get_many([path for j in leaderless for path in (p.finished(j), p.paused(j), p.retired(j))]) \
        if leaderless else []
    for i, name in enumerate(leaderless):
        fin_raw, paused_raw, retired_raw = found[3 * i:3 * i + 3]
        paused = RestRecord.from_json(paused_raw[0], p.paused(name)) if paused_raw else None
        in_force = paused is not None and paused.in_force(read_ms)
        base[name] = replace(
            base[name], finished=FinishedRecord.from_json(fin_raw[0], p.finished(name)) if fin_raw else None,
            paused=paused if in_force else None, pause_ended=None if in_force else paused,
            retired=RestRecord.from_json(retired_raw[0], p.retired(name)) if retired_raw else None)
    return _Deployment(topo, marks, grid, pacings, base, read_ms)


def _judge(deployment: _Deployment, name: str, stale_intervals: int, interval: Optional[int],
           cadence: tuple[Optional[int], Optional[str]], grace_ms: int) -> JobStatus:
    """Job ``name`` with its cadences, lag, what it waits for and whether it is stale (``read_status``)."""
    job, marks, read_ms = deployment.jobs[name], deployment.marks, deployment.read_ms
    c = job.committed_epoch
    pacing = deployment.pacings[name] or Pacing()
    effective, setter = cadence
    lag = None if c is None else max(0, read_ms - c)
    stale_after = None if effective is None else stale_intervals * effective + grace_ms + STALE_SLACK_MS
    lagging = lag is not None and stale_after is not None and lag > stale_after
    blockers, waiting = _waits(deployment, job, pacing, lagging, stale_after)
    stale, why = False, None
    if job.state in (NO_LEADER, FENCED):
        stale, why = True, _leaderless_text(job)
    elif job.state == LEADING and lagging and not (blockers or waiting is not None):
        stale, why = True, (f"lags {fmt_seconds(lag)}, more than {stale_intervals} of its "
                            f"{'effective ' if setter else ''}cadence ({fmt_cadence(effective)})"
                            + _silent_leader(job, marks, read_ms))
    own = pacing.every_ms if pacing.every_ms is not None else interval
    listed = newest_common_epoch(marks.get(t) for t in _own_tables(job, deployment.topology.writers))
    return replace(job, cadence_ms=own, effective_cadence_ms=effective, cadence_from=setter, consistent_epoch=listed,
                   lag_ms=lag, stale_after_ms=stale_after, waiting_for=tuple(blockers), waiting=waiting,
                   stale=stale, stale_reason=why)


def _waits(deployment: _Deployment, job: JobStatus, pacing: Pacing, lagging: bool,
           stale_after: Optional[int]) -> tuple[list[Blocker], Optional[str]]:
    """What a live job waits for: the managed sources behind it (its pacing's own ``Choice.behind``), and why it
    lags when that is not them (nothing committed yet, no common epoch on its cadence, a source caught up lately)."""
    grid, marks, read_ms, writers = deployment.grid, deployment.marks, deployment.read_ms, deployment.topology.writers
    if job.at_rest or grid is None:
        return [], None
    c = job.committed_epoch
    managed = [s for s in job.sources if s in writers]
    choice = pacing.choose(grid, after=c, sources={s: marks.get(s) for s in managed},
                           has_root_source=len(managed) < len(job.sources), now=read_ms)
    blockers = [_blocker(s, deployment) for s in choice.behind]
    if blockers:
        return blockers, None
    if c is None:
        return [], "has not committed an epoch yet"
    if lagging and managed:
        if choice.epoch is None:
            return [], f"waiting for its sources: {choice.reason}"
        late = _caught_up_lately(managed, marks, c, read_ms, stale_after)
        if late is not None:
            return [], (f"catching up: {late[0]} committed its first epoch after {fmt_time(c)} only "
                        f"{fmt_seconds(late[1])} ago")
    return [], None


def _leaderless_text(job: JobStatus) -> str:
    return "no live leader" + (" (its leader was fenced)" if job.state == FENCED else "") + \
        " and no finished bounded run" + (
            f" (its pause ended at {fmt_time(job.pause_ended.until_ms)})" if job.pause_ended else "")


def _own_tables(job: JobStatus, writers: Mapping[str, str]) -> list[str]:
    """A job's sinks and managed sources: the tables its consistent epoch is over."""
    return [*job.sinks, *(s for s in job.sources if s in writers)]


def _holds_back_reference(judged: Mapping[str, JobStatus], deployment: _Deployment) -> int:
    """What a stale job of a pipeline (whose jobs are ``judged``) holds its consistent epoch back from: the
    consistent epoch of the tables of its healthy jobs (live, neither stale nor waiting on something), or the wall
    clock when there are none. A job at rest is no reference: its tables stay where it stopped."""
    healthy = [job for job in judged.values() if not job.stale and not job.waiting_for and job.waiting is None
               and job.committed_epoch is not None and not job.at_rest]
    reference = newest_common_epoch(deployment.marks.get(t) for job in healthy for t in job.sinks) if healthy else None
    if reference is None:
        reference = min((c for job in healthy if (c := job.committed_epoch) is not None), default=deployment.read_ms)
    return reference


def _consistent_epoch(marks: Mapping[str, Optional[TableTidemark]], tables: Iterable[str], tm: ZooKeeperSession,
                      writers: Mapping[str, str]) -> Optional[int]:
    """The newest epoch every one of ``tables`` holds as a reader resolves it from ZooKeeper (``held_epochs``): the
    tidemarks' lists, and the epoch records when the laggard's epoch is beyond them (one more read). A job's own row
    takes the rule on the lists alone (``newest_common_epoch``, what its driver exports: no read per job)."""
    own = {t: marks.get(t) for t in tables}
    return held_epochs(own, tm=tm, writers=writers).consistent_epoch() if own else None


def _silent_leader(job: JobStatus, marks: Mapping[str, Optional[TableTidemark]], read_ms: int) -> str:
    """A live leader znode held by a replica that has committed nothing since it took over (stuck taking over,
    or in a step that does not end) is not a slow leader: say so. Its log says what it waits for."""
    since, leader = job.leader_since_ms, job.leader
    if since is None or leader is None or any(
            (m := marks.get(t)) is not None and m.committed_ms is not None and m.committed_ms >= since
            for t in job.sinks):
        return ""
    return (f"; its leader {leader.member} (term {leader.term}) has committed nothing since it took over "
            f"{fmt_seconds(max(0, read_ms - since))} ago (its log says what it waits for)")


def _upstream_graces(topo: Topology, writers: Mapping[str, str],
                     pacings: Mapping[str, Optional[Pacing]]) -> dict[str, int]:
    """Per job, the largest grace of it and every job upstream of it: what delays its epochs behind the clock."""
    result: dict[str, int] = {}
    for job in topo.upstream_first():
        parents = {writers[s] for s in topo.jobs[job].sources if s in writers and writers[s] != job}
        own = (pacings.get(job) or Pacing()).grace_ms
        result[job] = max([own, *(result.get(p, (pacings.get(p) or Pacing()).grace_ms) for p in parents)])
    return result


def _caught_up_lately(managed: Iterable[str], marks: Mapping[str, Optional[TableTidemark]], after: Optional[int],
                      read_ms: int, within_ms: Optional[int]) -> Optional[tuple[str, int]]:
    """A managed source whose only epoch after ``after`` is its newest, committed less than ``within_ms`` ago:
    the job can have had no epoch to take before that commit (it takes only epochs every source holds)."""
    if after is None or within_ms is None:
        return None
    for source in managed:
        mark = marks.get(source)
        if mark is None or mark.committed_ms is None:
            continue
        newer = [e for e in mark.epochs if e > after]
        if newer == [mark.epoch] and read_ms - mark.committed_ms <= within_ms:
            return source, max(0, read_ms - mark.committed_ms)
    return None


def _blocker(source: str, deployment: _Deployment) -> Blocker:
    writer = deployment.topology.writers[source]
    job = deployment.jobs[writer]
    fin = job.finished if job.state == FINISHED else None
    return Blocker(source, _epoch_of(deployment.marks, source), writer, job.state, fin.epoch if fin else None)


def _lag_ms(read_ms: int, epoch: Optional[int]) -> Optional[int]:
    """The wall clock ``read_ms`` minus ``epoch``, never below 0 (None: no epoch)."""
    return None if epoch is None else max(0, read_ms - epoch)


def _epoch_of(marks: Mapping[str, Optional[TableTidemark]], table: str) -> Optional[int]:
    mark = marks.get(table)
    return mark.epoch if mark else None


__all__ = ["AT_REST", "STALE_INTERVALS", "STALE_SLACK_MS", "Blocker", "JobStatus", "PipelineStatus", "Status",
           "read_status"]
