"""The job graph: which job writes which table, who reads it, and the cycle check.

    topo = tm.topology()
    topo.writer_of("lake.db.word_counts")          # "word_counts"
    topo.upstream("count_histogram")              # {"word_counts"}
    topo.find_cycle()                             # None, or ["a", "b", "a"] with the tables between

A ``Topology`` is an immutable snapshot read at one ``/topology`` version; registration
compares that version in its multi so decisions made on it are never stale.
"""
from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Optional

from coordinator.records import JobRecord, TopologyVersion
from coordinator.zookeeper.races import Raced
from coordinator.zookeeper.session import ZooKeeperSession


@dataclass(frozen=True)
class Topology:
    """The job graph at one ``/topology`` version, immutable: every registered job's ``JobRecord`` (its sources
    and sinks). Registration compares ``znode_version`` in its multi, so decisions made on it are never stale.

        topo = read_topology(tm)                      # tm.topology()
        topo.writer_of("lake.db.word_counts")          # "word_counts"
        topo.upstream("count_histogram")              # {"word_counts"}
        topo.find_cycle()                             # None, or ["a -[t1]->", "b -[t2]->", "a"]

    Znodes: ``read_topology`` reads ``/topology`` (``version``, the ``TopologyVersion`` it holds, and
    ``znode_version``, the znode's own version, -1 while it does not exist) and every ``/jobs/<job>``; nothing
    here writes (``registry`` does).

    Failure behaviour: a ``Topology`` makes no request and raises nothing. ``read_topology`` reads again while a
    registration changes ``/topology`` under it, until the session's deadline, then raises
    ``ZooKeeperUnavailable`` (as when ZooKeeper does not answer in time), and ``CorruptState`` for a job record it
    cannot decode. It keeps the last topology read per session (only while the session lives) and reuses it
    while ``/topology``'s version is unchanged.
    """

    version: int
    znode_version: int
    jobs: Mapping[str, JobRecord] = field(default_factory=dict)

    @cached_property
    def writers(self) -> dict[str, str]:
        """Each table a job writes, and that job (one table, one writer)."""
        return {table: name for name, job in self.jobs.items() for table in job.sinks}

    def writer_of(self, table: str) -> Optional[str]:
        """The job that writes ``table`` (None: no registered job does)."""
        return self.writers.get(table)

    @property
    def root_tables(self) -> set[str]:
        """Tables read by some job but written by none (FLIP-276's root tables)."""
        writers = self.writers
        return {t for job in self.jobs.values() for t in job.sources if t not in writers}

    def edges(self) -> list[tuple[str, str, str]]:
        """``(upstream job, table, downstream job)`` for every table one job writes and another reads."""
        writers = self.writers
        return sorted((writers[t], t, name) for name, job in self.jobs.items() for t in job.sources if t in writers)

    def _neighbours(self, downstream: bool) -> dict[str, set[str]]:
        graph: dict[str, set[str]] = {name: set() for name in self.jobs}
        for up, _, down in self.edges():
            graph[up if downstream else down].add(down if downstream else up)
        return graph

    def _reachable(self, job: str, downstream: bool) -> set[str]:
        graph, seen, stack = self._neighbours(downstream), set(), [job]
        while stack:
            for nxt in graph.get(stack.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        seen.discard(job)
        return seen

    def upstream_first(self) -> list[str]:
        """Every job, each after every job upstream of it (a job in a cycle after the ones it meets first): the
        one walk up the graph that rules folding over upstream jobs use (``pacing.effective_cadences``, status's
        graces). Without recursion: a chain of thousands of jobs is fine."""
        parents = self._neighbours(downstream=False)
        order: list[str] = []
        done: set[str] = set()
        for root in sorted(self.jobs):
            stack, on_path = [(root, False)], set()
            while stack:
                job, expanded = stack.pop()
                if job in done:
                    continue
                if expanded:
                    on_path.discard(job)
                    done.add(job)
                    order.append(job)
                    continue
                on_path.add(job)
                stack.append((job, True))
                stack.extend((p, False) for p in sorted(parents[job]) if p not in done and p not in on_path)
        return order

    def upstream(self, job: str) -> set[str]:
        """Every job whose output ``job`` reads, directly or transitively."""
        return self._reachable(job, downstream=False)

    def downstream(self, job: str) -> set[str]:
        """Every job that reads ``job``'s output, directly or transitively."""
        return self._reachable(job, downstream=True)

    def with_job(self, name: str, record: JobRecord) -> Topology:
        """This topology with job ``name`` registered as ``record`` (the same versions: what a registration
        checks before it writes)."""
        jobs = dict(self.jobs)
        jobs[name] = record
        return Topology(self.version, self.znode_version, jobs)

    def without_job(self, name: str) -> Topology:
        """This topology without job ``name`` (the same versions)."""
        return Topology(self.version, self.znode_version, {k: v for k, v in self.jobs.items() if k != name})

    def find_cycle(self) -> Optional[list[str]]:
        """A cycle as ``["a -[t1]->", "b -[t2]->", "a"]`` (jobs and the tables between them), or None."""
        edges_by_job: dict[str, list[tuple[str, str]]] = {name: [] for name in self.jobs}
        for up, table, down in self.edges():
            edges_by_job[up].append((table, down))
        # Iterative depth-first search: job chains can be thousands long (no recursion limit).
        WHITE, GREY, BLACK = 0, 1, 2
        colour = {name: WHITE for name in self.jobs}
        for root in sorted(self.jobs):
            if colour[root] != WHITE:
                continue
            colour[root] = GREY
            stack: list[tuple[str, int]] = [(root, 0)]
            path: list[tuple[str, str]] = []  # (job, the table it passes downstream)
            while stack:
                job, index = stack[-1]
                if index == len(edges_by_job[job]):
                    colour[job] = BLACK
                    stack.pop()
                    if path:
                        path.pop()
                    continue
                stack[-1] = (job, index + 1)
                table, down = edges_by_job[job][index]
                if colour[down] == GREY:
                    steps = path + [(job, table)]
                    start = next(i for i, (j, _) in enumerate(steps) if j == down)
                    return [f"{j} -[{t}]->" for j, t in steps[start:]] + [down]
                if colour[down] == WHITE:
                    colour[down] = GREY
                    path.append((job, table))
                    stack.append((down, 0))
        return None

    def to_dict(self) -> dict:
        """The graph as JSON values: version, jobs, edges and root tables (``tidemark topology --json``)."""
        return {
            "version": self.version,
            "jobs": {n: {"sources": list(j.sources), "sinks": list(j.sinks)} for n, j in sorted(self.jobs.items())},
            "edges": [{"from": u, "table": t, "to": d} for u, t, d in self.edges()],
            "root_tables": sorted(self.root_tables),
        }

    def to_dot(self) -> str:
        """The graph in Graphviz's dot language: jobs as boxes, with their tables in and out."""
        lines = ["digraph tidemark {", "  rankdir=LR;"]
        for name, job in sorted(self.jobs.items()):
            lines.append(f'  "{name}" [shape=box];')
            lines += [f'  "{t}" -> "{name}";' for t in job.sources]
            lines += [f'  "{name}" -> "{t}";' for t in job.sinks]
        lines.append("}")
        return "\n".join(lines)

    def to_mermaid(self) -> str:
        """The graph as a Mermaid flowchart: jobs as boxes, tables as cylinders."""
        ids: dict[str, str] = {}

        def node(name: str, job: bool) -> str:
            if name not in ids:
                ids[name] = f"n{len(ids)}"
            return f'{ids[name]}["{name}"]' if job else f'{ids[name]}[("{name}")]'
        lines = ["flowchart LR"]
        for name, job in sorted(self.jobs.items()):
            lines += [f"  {node(t, False)} --> {node(name, True)}" for t in job.sources]
            lines += [f"  {node(name, True)} --> {node(t, False)}" for t in job.sinks]
        return "\n".join(lines)

    def to_text(self) -> str:
        """The version and one line per job, ``name: sources  =>  sinks`` (``tidemark topology``)."""
        if not self.jobs:
            return f"topology v{self.version}: no jobs registered"
        lines = [f"topology v{self.version}: {len(self.jobs)} jobs"]
        for name, job in sorted(self.jobs.items()):
            lines.append(f"  {name}: {', '.join(job.sources) or '-'}  =>  {', '.join(job.sinks) or '-'}")
        return "\n".join(lines)


# The last topology each session read or wrote, reused while ``/topology``'s version is unchanged. Kept here, the
# recipe's own state, not on the session, and only as long as the session lives.
_LAST_READ: weakref.WeakKeyDictionary[ZooKeeperSession, Topology] = weakref.WeakKeyDictionary()


def remember_topology(tm: ZooKeeperSession, topo: Topology) -> None:
    """Keep ``topo`` as what ``tm`` knows of ``/topology`` (the registry, after it changed it)."""
    _LAST_READ[tm] = topo


def last_read_topology(tm: ZooKeeperSession) -> Optional[Topology]:
    """The job graph ``tm`` last read or wrote (None: none yet), without a request: what a scrape may use."""
    return _LAST_READ.get(tm)


def read_topology(tm: ZooKeeperSession) -> Topology:
    """Read ``/topology`` and every job (pipelined), consistent with the version returned.

    The last topology read is kept for ``tm`` and reused while ``/topology``'s version is
    unchanged, so a check costs one round trip instead of one read per job.
    """
    cached = _LAST_READ.get(tm)

    def attempt() -> Topology:
        found = tm.read(tm.paths.topology, TopologyVersion)
        if cached is not None and found is not None and found[1].version == cached.znode_version:
            return cached
        topo_record, stat = found if found else (TopologyVersion(0), None)
        names = tm.children(tm.paths.jobs)
        records = tm.get_many([tm.paths.job(n) for n in names])
        # A job znode without a record is an orphan a lock recipe left after the tree was wiped (see registry).
        jobs = {n: JobRecord.from_json(r[0], tm.paths.job(n)) for n, r in zip(names, records) if r is not None and r[0]}
        again = tm.get(tm.paths.topology)
        # Registration bumps /topology in the same multi, so an unchanged version means a consistent read.
        if stat is None or (again is not None and again[1].version == stat.version):
            topo = Topology(topo_record.version, stat.version if stat else -1, jobs)
            remember_topology(tm, topo)
            return topo
        raise Raced()  # changed while it was read: read it again

    return tm.retry_races("the topology kept changing while it was read; try again", attempt)
