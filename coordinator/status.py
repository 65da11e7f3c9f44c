"""A cluster-wide status report: jobs, leaders, terms, tidemarks and how far each job lags.

Read with a handful of pipelined batches, so 1,000 jobs cost a few round trips' latency.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .records import LeaderRecord, TableTidemark, TermRecord
from .topology import Topology


@dataclass(frozen=True)
class JobStatus:
    name: str
    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    term: Optional[int]
    leader: Optional[LeaderRecord]
    fenced_by: Optional[str]
    tidemarks: dict[str, Optional[int]] = field(default_factory=dict)

    @property
    def committed_epoch(self) -> Optional[int]:
        epochs = list(self.tidemarks.values())
        return None if not epochs or any(e is None for e in epochs) else min(epochs)  # type: ignore[type-var]

    @property
    def leader_state(self) -> str:
        if self.leader is None:
            return "no leader"
        if self.term is not None and self.leader.term < self.term:
            return "fenced"
        return "leading"


@dataclass(frozen=True)
class Status:
    topology: Topology
    jobs: tuple[JobStatus, ...]
    newest_barrier: Optional[int]
    interval_ms: Optional[int]

    def lag_ms(self, job: JobStatus) -> Optional[int]:
        if self.newest_barrier is None or job.committed_epoch is None:
            return None
        return max(0, self.newest_barrier - job.committed_epoch)

    def is_stale(self, job: JobStatus, stale_barriers: int = 3) -> bool:
        """A job with no live leader, or lagging more than ``stale_barriers`` intervals."""
        lag = self.lag_ms(job)
        behind = lag is not None and self.interval_ms is not None and lag > stale_barriers * self.interval_ms
        return job.leader_state != "leading" or behind

    @property
    def consistent_epoch(self) -> Optional[int]:
        epochs = [j.committed_epoch for j in self.jobs]
        return None if not epochs or any(e is None for e in epochs) else min(epochs)  # type: ignore[type-var]

    def to_dict(self) -> dict:
        return {
            "topology_version": self.topology.version,
            "newest_barrier": self.newest_barrier,
            "interval_ms": self.interval_ms,
            "consistent_epoch": self.consistent_epoch,
            "jobs": [{
                "name": j.name, "sources": list(j.sources), "sinks": list(j.sinks), "term": j.term,
                "leader": j.leader.to_dict() if j.leader else None, "leader_state": j.leader_state,
                "fenced_by": j.fenced_by, "tidemarks": j.tidemarks, "committed_epoch": j.committed_epoch,
                "lag_ms": self.lag_ms(j), "stale": self.is_stale(j),
            } for j in self.jobs],
        }


def read_status(tm) -> Status:
    from .barriers import Barriers
    topo = tm.topology()
    names = sorted(topo.jobs)
    p = tm.paths
    terms = tm.get_many([p.term(n) for n in names])
    leaders = tm.get_many([p.leader(n) for n in names])
    tables = sorted({t for n in names for t in topo.jobs[n].sinks})
    marks = dict(zip(tables, tm.get_many([p.tidemark(t) for t in tables])))
    jobs = []
    for name, term_raw, leader_raw in zip(names, terms, leaders):
        term = TermRecord.from_json(term_raw[0], p.term(name)) if term_raw else None
        leader = LeaderRecord.from_json(leader_raw[0], p.leader(name)) if leader_raw else None
        tidemarks = {t: (TableTidemark.from_json(marks[t][0], p.tidemark(t)).epoch if marks[t] else None)
                     for t in topo.jobs[name].sinks}
        jobs.append(JobStatus(name, topo.jobs[name].sources, topo.jobs[name].sinks, term.term if term else None,
                              leader, term.fenced_by if term else None, tidemarks))
    barriers = Barriers(tm)
    found = tm.get(p.barriers)
    interval = barriers.grid().interval_ms if found and found[0] else None
    return Status(topo, tuple(jobs), barriers.latest(), interval)
