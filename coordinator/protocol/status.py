"""A cluster-wide status report: per job its leader, committed epoch, lag, pending barriers and what it waits for.

    status = tm.status()
    job = status.job("word_counts")
    job.lag_seconds          # now (wall clock) minus the job's committed epoch
    job.pending_barriers     # agreed barriers after its committed epoch
    job.waiting_for          # the managed sources below its next barrier, with their writers' state
    job.stale                # the job is what holds consistent reads back (see below)

Read with a few pipelined batches whatever the number of jobs: the topology (cached while
``/topology`` is unchanged), one ``get_many`` of every job's term and leader, every table's
tidemark and ``/barriers`` (whose ``newest_agreed`` is the newest barrier); then the finished
markers of the jobs with no live leader, and, only when some job is behind the newest
barrier, one listing of ``/barriers``.

A job's **state**: ``leading`` (a live, unfenced leader), ``finished`` (no live leader and
``/jobs/<job>/finished``: its last leader ended a bounded run), ``fenced`` (its leader's term
is older than the job's) or ``no leader``.

A job is **stale** when it, rather than something upstream of it, holds the consistent
epoch back: it has no live leader and did not finish a bounded run, or it has a live leader
but lags the wall clock by more than ``stale_intervals`` barrier intervals (plus
``STALE_SLACK_MS`` for the writers' grace and processing time) while nothing upstream
explains the lag. A lagging job that waits for a source whose writer is behind, for a
barrier that other jobs agree, or under backpressure from a job far behind, is shown
waiting (with the reason), not stale: the job it waits for is the one flagged. A finished
job is never stale.
"""
from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Optional

from coordinator.errors import JobNotFound
from coordinator.names import parse_epoch
from coordinator.protocol.barriers import DEFAULT_MAX_PENDING_BARRIERS
from coordinator.protocol.topology import Topology, read_topology
from coordinator.records import FinishedRecord, LeaderRecord, TableTidemark, TermRecord, now_ms
from coordinator.zookeeper.session import ZooKeeperSession

STALE_INTERVALS = 3
STALE_SLACK_MS = 1000  # a writer's default grace: a healthy job lags up to an interval plus grace plus processing

LEADING, FINISHED, FENCED, NO_LEADER = "leading", "finished", "fenced", "no leader"


def fmt_time(epoch: Optional[int]) -> str:
    """``10:00:05Z`` (``10:00:05.200Z`` for an epoch that is not a whole second), ``-`` for None."""
    if epoch is None:
        return "-"
    text = time.strftime("%H:%M:%S", time.gmtime(epoch // 1000))
    return f"{text}.{epoch % 1000:03d}Z" if epoch % 1000 else f"{text}Z"


def fmt_epoch(epoch: Optional[int]) -> str:
    return "-" if epoch is None else f"{epoch} ({fmt_time(epoch)})"


def fmt_seconds(ms: Optional[int]) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f} s"


def _seconds(ms: Optional[int]) -> Optional[float]:
    return None if ms is None else round(ms / 1000, 3)


@dataclass(frozen=True)
class Blocker:
    """A managed source below the barrier a job must process next."""

    table: str
    epoch: Optional[int]             # the source's tidemark (None: its writer has committed nothing yet)
    writer: str
    writer_state: str                # leading | finished | fenced | no leader
    writer_finished_epoch: Optional[int] = None

    @property
    def writer_live(self) -> bool:
        return self.writer_state == LEADING

    def describe(self, barrier: Optional[int] = None) -> str:
        at = "no committed epoch yet" if self.epoch is None else f"at {fmt_time(self.epoch)}"
        until = f" to reach {fmt_time(barrier)}" if barrier is not None else ""
        if self.writer_state == LEADING:
            who = "which has a live leader"
        elif self.writer_state == FINISHED:
            who = (f"which has no live leader (it finished a bounded run at "
                   f"{fmt_epoch(self.writer_finished_epoch)})")
        elif self.writer_state == FENCED:
            who = "which has no live leader (its leader was fenced)"
        else:
            who = "which has no live leader"
        return f"waiting for {self.table} ({at}){until}, written by job {self.writer}, {who}"

    def to_dict(self) -> dict[str, Any]:
        return {"table": self.table, "epoch": self.epoch, "writer": self.writer, "writer_state": self.writer_state,
                "writer_live": self.writer_live, "writer_finished_epoch": self.writer_finished_epoch}


@dataclass(frozen=True)
class JobStatus:
    name: str
    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    term: Optional[int]
    leader: Optional[LeaderRecord]
    fenced_by: Optional[str]
    tidemarks: dict[str, Optional[int]] = field(default_factory=dict)
    finished: Optional[FinishedRecord] = None
    lag_ms: Optional[int] = None              # wall clock at the read minus the committed epoch
    pending_barriers: Optional[int] = None    # agreed barriers after the committed epoch (None: nothing committed)
    next_barrier: Optional[int] = None        # the first of them
    waiting_for: tuple[Blocker, ...] = ()
    waiting: Optional[str] = None             # why it does not advance, when that is not waiting_for alone
    stale: bool = False
    stale_reason: Optional[str] = None
    holds_back_ms: Optional[int] = None       # for a stale job: how far it holds the consistent epoch back

    @property
    def committed_epoch(self) -> Optional[int]:
        return _minimum(self.tidemarks.values())

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
        """``leading``, ``finished`` (no live leader, its last run was bounded and ended), ``fenced``
        or ``no leader``."""
        live = self.leader_state
        return FINISHED if live != LEADING and self.finished is not None else live

    @property
    def lag_seconds(self) -> Optional[float]:
        return _seconds(self.lag_ms)

    def reasons(self) -> list[str]:
        """One line per thing the job waits for (empty when it is not held back)."""
        lines = [b.describe(self.next_barrier) for b in self.waiting_for]
        return lines + ([self.waiting] if self.waiting else [])

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "sources": list(self.sources), "sinks": list(self.sinks), "term": self.term,
            "leader": self.leader.to_dict() if self.leader else None, "leader_state": self.leader_state,
            "state": self.state, "fenced_by": self.fenced_by,
            "finished": self.finished.to_dict() if self.finished else None,
            "tidemarks": self.tidemarks, "committed_epoch": self.committed_epoch, "lag_seconds": self.lag_seconds,
            "pending_barriers": self.pending_barriers, "next_barrier": self.next_barrier,
            "waiting_for": [b.to_dict() for b in self.waiting_for], "reasons": self.reasons(),
            "stale": self.stale, "stale_reason": self.stale_reason,
            "holds_back_seconds": _seconds(self.holds_back_ms),
        }


@dataclass(frozen=True)
class Status:
    topology: Topology
    jobs: tuple[JobStatus, ...]
    newest_barrier: Optional[int]
    interval_ms: Optional[int]
    read_ms: int = field(default_factory=now_ms)   # the wall clock the lags are measured against

    def job(self, name: str) -> JobStatus:
        for job in self.jobs:
            if job.name == name:
                return job
        raise JobNotFound(f"job {name!r} is not registered (see `tidemark status`)")

    @property
    def consistent_epoch(self) -> Optional[int]:
        """The minimum committed epoch over every job (None while some job has committed nothing)."""
        return _minimum(j.committed_epoch for j in self.jobs)

    @property
    def consistent_lag_ms(self) -> Optional[int]:
        epoch = self.consistent_epoch
        return None if epoch is None else max(0, self.read_ms - epoch)

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology_version": self.topology.version,
            "read_ms": self.read_ms,
            "newest_barrier": self.newest_barrier,
            "interval_ms": self.interval_ms,
            "consistent_epoch": self.consistent_epoch,
            "consistent_lag_seconds": _seconds(self.consistent_lag_ms),
            "stale_jobs": [j.name for j in self.jobs if j.stale],
            "jobs": [j.to_dict() for j in self.jobs],
        }


def read_status(tm: ZooKeeperSession, stale_intervals: int = STALE_INTERVALS) -> Status:
    from coordinator.protocol.barriers import BarrierGrid
    topo = read_topology(tm)
    names = sorted(topo.jobs)
    writers = topo.writers
    tables = sorted(writers)
    p = tm.paths
    n = len(names)
    raw = tm.get_many([p.term(j) for j in names] + [p.leader(j) for j in names]
                      + [p.tidemark(t) for t in tables] + [p.barriers])
    marks = {t: (TableTidemark.from_json(r[0], p.tidemark(t)) if r else None)
             for t, r in zip(tables, raw[2 * n:2 * n + len(tables)])}
    grid = BarrierGrid.from_json(raw[-1][0], p.barriers) if raw[-1] and raw[-1][0] else None
    base: dict[str, JobStatus] = {}
    for name, term_raw, leader_raw in zip(names, raw[:n], raw[n:2 * n]):
        term = TermRecord.from_json(term_raw[0], p.term(name)) if term_raw else None
        leader = LeaderRecord.from_json(leader_raw[0], p.leader(name)) if leader_raw else None
        tidemarks = {t: (m.epoch if (m := marks.get(t)) else None) for t in topo.jobs[name].sinks}
        base[name] = JobStatus(name, topo.jobs[name].sources, topo.jobs[name].sinks, term.term if term else None,
                               leader, term.fenced_by if term else None, tidemarks)
    # Finished markers matter only for jobs with no live leader (a leader removes it when it starts):
    # a healthy cluster costs no read for them.
    leaderless = [name for name in names if base[name].leader_state != LEADING]
    for name, fin_raw in zip(leaderless, tm.get_many([p.finished(j) for j in leaderless]) if leaderless else []):
        if fin_raw is not None:
            base[name] = replace(base[name], finished=FinishedRecord.from_json(fin_raw[0], p.finished(name)))
    read_ms = now_ms()

    newest = grid.newest_agreed if grid else None
    committed = {name: job.committed_epoch for name, job in base.items()}
    agreed: list[int] = []
    if grid is not None and (newest is None or any(c is not None and c < newest for c in committed.values())):
        # One listing, only when some job is behind (or for a grid written before newest_agreed existed).
        agreed = sorted(e for e in map(parse_epoch, tm.children(p.barriers)) if e is not None)
        if newest is None:
            newest = agreed[-1] if agreed else None
        agreed = [t for t in agreed if newest is not None and t <= newest]
    interval = grid.interval_at(newest) if grid is not None and newest is not None else (
        grid.interval_ms if grid else None)
    stale_after = None if interval is None else stale_intervals * interval + STALE_SLACK_MS

    states = {name: job.state for name, job in base.items()}
    agreers = [name for name in names if _agrees_barriers(topo, name)]
    agreer_set = set(agreers)
    live_agreers = [a for a in agreers if states[a] == LEADING]
    pending_of: dict[str, Optional[int]] = {}
    for name in names:
        c = committed[name]
        if c is None:
            pending_of[name] = None
        elif newest is None or c >= newest:
            pending_of[name] = 0
        else:
            pending_of[name] = len(agreed) - bisect.bisect_right(agreed, c)

    # Jobs far enough behind that root jobs stop agreeing barriers (EpochWriter's default backpressure).
    far_behind = [o for o in names
                  if states[o] == LEADING and (pending_of[o] or 0) > DEFAULT_MAX_PENDING_BARRIERS]
    partial: dict[str, JobStatus] = {}
    blocked: dict[str, bool] = {}
    for name in names:
        job, c, pending = base[name], committed[name], pending_of[name]
        lag = None if c is None else max(0, read_ms - c)
        nxt = None
        if c is not None and pending:
            nxt = agreed[bisect.bisect_right(agreed, c)]
        managed = [s for s in job.sources if s in writers]
        blockers: list[Blocker] = []
        waiting: Optional[str] = None
        if job.state == FINISHED:
            pass
        elif c is None:
            blockers = [_blocker(s, marks, writers, states, base) for s in managed if _epoch_of(marks, s) is None]
            if not blockers:
                waiting = "has not committed an epoch yet"
        elif nxt is not None:
            blockers = [_blocker(s, marks, writers, states, base) for s in managed
                        if (e := _epoch_of(marks, s)) is None or e < nxt]
        lagging = lag is not None and stale_after is not None and lag > stale_after
        explained = bool(blockers)
        if not explained and lagging and job.state == LEADING and not pending:
            if name not in agreer_set:
                who = _some([f"{a} ({states[a]})" for a in agreers]) or "none registered"
                waiting = (f"no barrier agreed after {fmt_epoch(c)}: jobs with root sources agree them ({who})"
                           + ("" if live_agreers else ", and none has a live leader"))
                explained = True
            else:
                behind = [o for o in far_behind if o != name]
                if behind:
                    waiting = "backpressure: " + _some(
                        [f"job {o} is {pending_of[o]} agreed barriers behind" for o in behind])
                    explained = True
        blocked[name] = explained
        stale, why = False, None
        if job.state in (NO_LEADER, FENCED):
            stale = True
            why = "no live leader" + (" (its leader was fenced)" if job.state == FENCED else "") + \
                " and no finished bounded run"
        elif job.state == LEADING and lagging and not explained:
            stale, why = True, f"lags {fmt_seconds(lag)}, more than {stale_intervals} intervals"
        partial[name] = JobStatus(job.name, job.sources, job.sinks, job.term, job.leader, job.fenced_by,
                                  job.tidemarks, job.finished, lag, pending, nxt, tuple(blockers), waiting, stale,
                                  why)

    # How far each stale job holds the consistent epoch back: the consistent epoch the healthy jobs (neither
    # stale nor waiting on something) would give, or the wall clock when there are none, minus its epoch.
    healthy = [c for j in names if not partial[j].stale and not blocked[j] and (c := committed[j]) is not None]
    reference = min(healthy) if healthy else read_ms
    jobs = []
    for name in names:
        job, c = partial[name], committed[name]
        if job.stale and c is not None:
            job = replace(job, holds_back_ms=max(0, reference - c))
        jobs.append(job)
    return Status(topo, tuple(jobs), newest, interval, read_ms)


def _some(items: list[str], limit: int = 5) -> str:
    return ", ".join(items[:limit]) + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _agrees_barriers(topo: Topology, name: str) -> bool:
    """Like ``EpochWriter.agrees_barriers``: a job with a root source, or with no source, agrees barriers."""
    sources = topo.jobs[name].sources
    return not sources or any(s not in topo.writers for s in sources)


def _blocker(source: str, marks: Mapping[str, Optional[TableTidemark]], writers: Mapping[str, str],
             states: Mapping[str, str], base: Mapping[str, JobStatus]) -> Blocker:
    writer = writers[source]
    fin = base[writer].finished if states[writer] == FINISHED else None
    return Blocker(source, _epoch_of(marks, source), writer, states[writer], fin.epoch if fin else None)


def _minimum(epochs: Iterable[Optional[int]]) -> Optional[int]:
    """The lowest of ``epochs``; None when there are none or one is None (not committed yet)."""
    listed = list(epochs)
    known = [e for e in listed if e is not None]
    return min(known) if known and len(known) == len(listed) else None


def _epoch_of(marks: Mapping[str, Optional[TableTidemark]], table: str) -> Optional[int]:
    mark = marks.get(table)
    return mark.epoch if mark else None


__all__ = ["Blocker", "JobStatus", "Status", "fmt_epoch", "fmt_seconds", "fmt_time", "read_status"]
