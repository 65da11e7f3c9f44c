"""Which epochs each table holds, at which snapshot, and the newest epoch a set of tables all hold: the
consistency rule, in one place. The resolver, garbage collection, ``tidemark status``, the exporter, the
drivers' metrics and pacing all ask it.

    newest_common_epoch(marks)                   # from the tidemarks alone: no request (metrics, pacing)
    read_floor(marks)                            # no consistent epoch of these tables is older
    held = held_epochs(marks, iceberg, tm)       # the tables' epochs and where to look further, built one way
    held.consistent_epoch()                      # the newest epoch they all hold, reaching for the laggard's
    held.place(T)                                # every table's snapshot at epoch T, or the table that lacks it
    held.held[table][epoch]                      # the table's snapshot there (None: it was empty)

**The rule.** A set of managed tables has a consistent version at every epoch each of them holds
(committed), and the consistent version is the newest such epoch (docs/design.md, "Why reads stay
consistent"). A table holds exactly the epochs its writer committed, not every barrier: a job coalesces.
It is never older than the read floor of a table of the set (``read_floor``: set when its writer resumed from
Iceberg after ZooKeeper lost its state), so no reader steps back behind what it saw before the loss.

What is known of a table's epochs is each a subset of what it holds: its tidemark's list of recent epochs
(``TableTidemark.recent``), its Iceberg records (``IcebergRecords``: a resolver's summaries, GC's lineages), and,
for the epoch that matters most, what ``Evidence`` finds on demand. ``held_epochs`` assembles them for every
reader (resolver, GC, ``tidemark status``). ``HeldEpochs.consistent_epoch`` says how the laggard's epoch is
looked for, ``Evidence.root_reads`` where a root table stands in a version (docs/design.md, "Consistency levels"
and "A root table in a consistent version").
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Optional, Protocol, Union

from coordinator.protocol.topology import read_topology
from coordinator.records import EpochInputs, EpochRecord, EpochState, RootRead, TableTidemark
from coordinator.zookeeper.session import ZooKeeperSession

PLACE_TRIES = 4  # epochs tried at most, newest first, below the laggard's: each may cost a table metadata load

Held = dict[str, dict[int, Optional[int]]]


def common_epochs(epochs: Iterable[Iterable[int]]) -> set[int]:
    """The epochs every one of ``epochs`` (one collection per table) holds; empty for no table."""
    common: Optional[set[int]] = None
    for held in epochs:
        common = set(held) if common is None else common.intersection(held)
        if not common:
            return set()
    return common or set()


def read_floor(marks: Iterable[Optional[TableTidemark]]) -> int:
    """The oldest epoch a consistent version of ``marks``' tables may be at: the highest of their read floors
    (``TableTidemark.read_floor``; 0 when none has one)."""
    return max((m.read_floor for m in marks if m is not None and m.read_floor is not None), default=0)


def newest_common_epoch(marks: Iterable[Optional[TableTidemark]]) -> Optional[int]:
    """The newest epoch every one of ``marks`` lists, at or above their read floor (None when they share none,
    or one has none): the rule on the tidemarks alone, which a driver's metrics and a bench sample read from
    memory."""
    lists = []
    given = list(marks)
    for mark in given:
        if mark is None:
            return None
        lists.append(mark.epochs)
    common = common_epochs(lists)
    newest = max(common) if common else None
    return newest if newest is not None and newest >= read_floor(given) else None


@dataclass
class Evidence:
    """Where to look for an epoch a table's lists do not reach, found on demand for the one epoch that matters most:

    - its writer's epoch record (``/jobs/<writer>/epochs/<T>`` keeps the newest ``history``);
    - what a job reading it records of that epoch: an epoch ``T`` of a job reads each managed source at that
      source's snapshot at ``T`` and takes only epochs all its managed sources hold, so the
      ``inputs.sources[table].end`` its epoch record, its snapshot or its marker of ``T`` records *is* the table's
      snapshot at ``T``, at or after the table's first epoch (before it, the table had no writer and was read by
      commit time, which holds no epoch).

    ``tm`` and ``writers`` (table -> writer job, read from the topology when not given): the epoch records;
    ``recorded``: a table's epochs in its Iceberg records; ``recorded_inputs``: the inputs a table's epoch records
    in Iceberg (its snapshot or marker of that epoch; None when it records none there); ``newest_inputs``: the
    inputs a table's newest epoch records, for the tables where they are at hand at no cost (a resolver's summaries
    of the tables it read from Iceberg); ``first_epoch``: a table's first epoch where known (asked only when a
    reader's inputs are weighed).
    """

    tm: Optional[ZooKeeperSession] = None
    writers: Optional[Mapping[str, str]] = None
    recorded: Optional[Callable[[str], Mapping[int, Optional[int]]]] = None
    recorded_inputs: Optional[Callable[[str, int], Optional[EpochInputs]]] = None
    newest_inputs: Optional[Callable[[str], Optional[EpochInputs]]] = None
    first_epoch: Callable[[str], Optional[int]] = lambda table: None

    def epoch_records(self, tables: Iterable[str], epochs: Iterable[int]) -> dict[tuple[str, int], EpochRecord]:
        """The COMMITTED epoch records at ``epochs`` of the writers of ``tables``, by (job, epoch): one pipelined
        read."""
        if self.tm is None:
            return {}
        writers = self.writers_of()
        keys = sorted({(job, epoch) for job in {writers[t] for t in tables if t in writers} for epoch in epochs})
        if not keys:
            return {}
        paths = [self.tm.paths.epoch(job, epoch) for job, epoch in keys]
        found = {}
        for key, path, raw in zip(keys, paths, self.tm.get_many(paths)):
            if raw is not None and (record := EpochRecord.from_json(raw[0], path)).state == EpochState.COMMITTED:
                found[key] = record
        return found

    def writers_of(self) -> Mapping[str, str]:
        """Each table's writer job (read once, only when an epoch record is looked for)."""
        if self.writers is None:
            self.writers = read_topology(self.tm).writers if self.tm is not None else {}
        return self.writers

    def root_reads(self, readers: Iterable[str], roots: Iterable[str], epoch: int) -> dict[str, Optional[RootRead]]:
        """What the jobs writing ``readers`` read of each of ``roots`` at ``epoch``: the snapshot, where those that
        recorded it agree; None where they disagree; a root none of them recorded is not in the answer (cut it by
        commit time). Their epoch records first (one pipelined read), then each reader's Iceberg records; with
        ZooKeeper, only the readers whose jobs read one of ``roots`` are asked.

        Root tables (read by a job, written by none) hold no epochs: a job's epoch ``T`` reads one at the newest
        snapshot stamped at or before ``T``, once the clock has passed ``T`` by the job's grace. A commit that
        becomes visible later than that after its stamp (a slow producer's) is missed by the epoch that read ``T``
        (the job's next epoch reads it), while a later read by commit time at ``T`` sees it. So in a consistent
        version at ``T`` a root table is at the snapshot the jobs of the set that read it recorded for ``T`` (this,
        then ``EpochLineage.root_at``); by commit time only when none recorded it, or when the snapshot they read
        was expired since. When they disagree, no root snapshot is consistent with both: a resolver cuts it by
        commit time, and GC keeps no version there.
        """
        readers, roots = sorted(readers), set(roots)
        if not readers or not roots:
            return {}
        if self.tm is not None:
            topo = read_topology(self.tm)
            self.writers = self.writers if self.writers is not None else topo.writers
            readers = [r for r in readers if (job := topo.writers.get(r)) is not None and job in topo.jobs
                       and roots.intersection(topo.jobs[job].sources)]
        records = self.epoch_records(readers, [epoch])
        writers = self.writers_of() if records else {}
        ends: dict[str, set[Optional[int]]] = {}
        for reader in readers:
            record = records.get((writers.get(reader, ""), epoch))
            inputs = record.inputs if record is not None else (
                self.recorded_inputs(reader, epoch) if self.recorded_inputs is not None else None)
            for root in roots.intersection(inputs.sources if inputs is not None else ()):
                ends.setdefault(root, set()).add(inputs.sources[root].end)  # type: ignore[union-attr]
        return {root: RootRead(next(iter(read))) if len(read) == 1 else None for root, read in ends.items()}

    def read_at(self, table: str, epoch: int) -> bool:
        """Whether a reader's inputs of ``epoch`` name ``table`` at its snapshot there: only at or after its first
        epoch (before it, ``table`` was read by commit time)."""
        first = self.first_epoch(table)
        return first is not None and epoch >= first


@dataclass(frozen=True)
class Placement:
    """Every table's snapshot at one epoch (``HeldEpochs.place``), or the first table not shown to hold it."""

    snapshots: Mapping[str, Optional[int]]  # every table's, when ``missing`` is None
    missing: Optional[str] = None           # a table not shown to hold ``epoch``


class HeldEpochs:
    """The epochs each table of a set of managed tables holds, with its snapshot at each (``held``), and each
    table's newest epoch (``newest``; None: it has committed nothing), completed from ``evidence`` on demand.

    From Iceberg, a table's newest epoch understates the truth when its idle epochs since fell between marker
    rounds: a table of the set whose newest epoch records reading it (``Evidence.newest_inputs``, at hand in a
    resolver's summaries) shows it holds that epoch too, at the snapshot read, so it is placed there, and its
    newest epoch raised to it, before anything else.

    ``floor``: no consistent epoch is older than it (``read_floor`` of the tables' tidemarks).

    Failure behaviour: nothing here raises for a missing record (an epoch record GC'd meanwhile, a table's
    history expired): that evidence is absent and an older common epoch, or none, is the answer. ZooKeeper and
    catalog errors propagate from the callbacks and reads as the callers raise them.
    """

    def __init__(self, held: Mapping[str, Mapping[int, Optional[int]]], newest: Mapping[str, Optional[int]],
                 evidence: Optional[Evidence] = None, floor: int = 0) -> None:
        self.held: Held = {name: dict(epochs) for name, epochs in held.items()}
        self.newest = dict(newest)
        self.evidence = evidence if evidence is not None else Evidence()
        self.floor = floor
        self._recorded: dict[str, Mapping[int, Optional[int]]] = {}  # ``Evidence.recorded``, asked once per table

    def common(self) -> set[int]:
        """The epochs every table holds as far as known now."""
        return common_epochs(h.keys() for h in self.held.values())

    def consistent_epoch(self) -> Optional[int]:
        """The newest epoch every table holds, after asking the evidence for the laggard's epoch and the next
        older ones; the epochs it finds are added to ``held``. None: they share none, or a table has committed
        nothing.

        No consistent version can be newer than the lowest newest epoch among the tables, the laggard's ``L``. The
        lists stop reaching ``L`` once the other jobs went on (a fast job's list and records hold its recent
        epochs; an idle epoch of it is in Iceberg only on a marker round), so this asks the evidence for ``L``,
        then for the next older epochs some table holds, newest first, at most ``PLACE_TRIES`` of them above the
        newest epoch already common: one pipelined ZooKeeper read for all of them, and at most one table metadata
        load per epoch tried and table that records it. A slow job downstream of a fast one records the fast
        table's snapshot at every epoch it takes, so across cadences ZooKeeper and Iceberg alone both find ``L``.
        Nothing below ``floor`` is an answer.
        """
        if not self.held or any(e is None for e in self.newest.values()):
            return None
        self._place_newest_reads()
        common = {e for e in self.common() if e >= self.floor}
        newest_common = max(common) if common else None
        laggard = min(e for e in self.newest.values() if e is not None)
        if laggard < self.floor:
            return None
        if newest_common == laggard:
            return laggard
        candidates = sorted({e for h in self.held.values() for e in h if self.floor <= e <= laggard and (
            newest_common is None or e > newest_common)} | {laggard}, reverse=True)[:PLACE_TRIES]
        records = self.evidence.epoch_records(self.held, candidates)
        for epoch in candidates:
            if self._placed(epoch, records).missing is None:
                return epoch
        return newest_common

    def place(self, epoch: int) -> Placement:
        """Every table's snapshot at ``epoch``, looked for as ``consistent_epoch`` looks for the laggard's (one
        pipelined read of the epoch records, then the tables' Iceberg records and their readers'); the snapshots
        it finds are added to ``held``. ``missing`` names a table not shown to hold ``epoch``."""
        self._place_newest_reads()
        missing = any(epoch not in h for h in self.held.values())
        return self._placed(epoch, self.evidence.epoch_records(self.held, [epoch]) if missing else {})

    def _placed(self, epoch: int, records: Mapping[tuple[str, int], EpochRecord]) -> Placement:
        found = self._place(epoch, records)
        if isinstance(found, str):
            return Placement({}, found)
        for name, snapshot_id in found.items():
            self.held[name][epoch] = snapshot_id
        return Placement({n: h[epoch] for n, h in self.held.items()})

    def _place_newest_reads(self) -> None:
        """Place each table's newest epoch in the tables of the set it read then, from the inputs at hand
        (``Evidence.newest_inputs``), and raise their newest epochs to it: a table's newest epoch in Iceberg
        understates the truth when its idle epochs since fell between marker rounds, and a job that read it later
        says so (its reads are the table's epochs)."""
        newest_inputs = self.evidence.newest_inputs
        if newest_inputs is None:
            return
        for reader, epoch in sorted(self.newest.items()):
            inputs = newest_inputs(reader) if epoch is not None else None
            if epoch is None or inputs is None:
                continue
            for source, bounds in inputs.sources.items():
                if source != reader and source in self.held and self.evidence.read_at(source, epoch):
                    self.held[source].setdefault(epoch, bounds.end)
                    self.newest[source] = max(self.newest[source] or epoch, epoch)

    def _place(self, epoch: int,
               records: Mapping[tuple[str, int], EpochRecord]) -> Union[dict[str, Optional[int]], str]:
        """The snapshot at ``epoch`` of every table not known to hold it, or the name of one not shown to."""
        evidence = self.evidence
        missing = [n for n, h in self.held.items() if epoch not in h]
        found: dict[str, Optional[int]] = {}
        readers = [records[key] for key in sorted(records) if key[1] == epoch]
        for name in missing:
            writer = records.get((evidence.writers_of().get(name, ""), epoch)) if records else None
            if writer is not None and name in writer.published:
                found[name] = writer.published[name]
                continue
            if evidence.recorded is not None:
                if name not in self._recorded:
                    self._recorded[name] = evidence.recorded(name)
                if epoch in self._recorded[name]:
                    found[name] = self._recorded[name][epoch]
                    continue
            read = self._read_by_reader(name, epoch, readers)
            if read is None:
                return name
            found[name] = read[0]
        return found

    def _read_by_reader(self, name: str, epoch: int, readers: list[EpochRecord]) -> Optional[tuple[Optional[int]]]:
        """``(snapshot id,)`` of ``name`` at ``epoch`` as a job reading it recorded it, in ZooKeeper or Iceberg."""
        if not self.evidence.read_at(name, epoch):
            return None
        for record in readers:
            if name in record.inputs.sources:
                return (record.inputs.sources[name].end,)
        if self.evidence.recorded_inputs is None:
            return None
        for other, epochs in sorted(self.held.items()):
            if other == name or epoch not in epochs:
                continue
            inputs = self.evidence.recorded_inputs(other, epoch)
            if inputs is not None and name in inputs.sources:
                return (inputs.sources[name].end,)
        return None


class IcebergRecords(Protocol):
    """What Iceberg records of a table's epochs, as the rule asks it: a resolver's summaries of the tables it read,
    GC's lineages (``lineage.LineageRecords``). Any of these may load the table's metadata."""

    def recorded(self, table: str) -> Mapping[int, Optional[int]]: ...  # its epochs -> snapshot (recorded_epochs)
    def committed_epoch(self, table: str) -> Optional[int]: ...
    def inputs_at(self, table: str, epoch: int) -> Optional[EpochInputs]: ...
    def first_epoch(self, table: str) -> Optional[int]: ...


def held_epochs(marks: Mapping[str, Optional[TableTidemark]], iceberg: Optional[IcebergRecords] = None,
                tm: Optional[ZooKeeperSession] = None, writers: Optional[Mapping[str, str]] = None, *,
                reach_back: bool = False) -> HeldEpochs:
    """The epochs the tables of ``marks`` hold and where to look further, assembled one way for every reader:

    - a table with a tidemark holds the epochs its list names, up to its epoch (with ``reach_back`` also those its
      Iceberg records name below it, for GC's older versions); Iceberg's records are asked for the laggard's epoch
      on demand;
    - a table without one (its writer is not registered, or there is no ZooKeeper) holds what Iceberg records, up to
      its committed epoch there, and the inputs of that epoch place the tables it read then;
    - a table's first epoch is its tidemark's, else Iceberg's; the epoch records are read from ``tm`` (none
      without it), the writers from ``writers`` or the topology.

    :param marks: table -> its tidemark (None: it has none).
    :param iceberg: the tables' Iceberg records; None to go by ZooKeeper alone (``tidemark status``).
    :param tm: the session the epoch records are read with; None for a reader without ZooKeeper.
    :param writers: table -> writer job, when already read.
    :param reach_back: add what Iceberg records below each tidemark's list.
    """
    held: Held = {}
    newest: dict[str, Optional[int]] = {}
    for name, mark in marks.items():
        if mark is None:
            held[name] = dict(iceberg.recorded(name)) if iceberg is not None else {}
            newest[name] = iceberg.committed_epoch(name) if iceberg is not None else None
            continue
        below = {} if iceberg is None or not reach_back or mark.epoch is None else {
            e: s for e, s in iceberg.recorded(name).items() if e <= mark.epoch}
        held[name] = {**below, **dict(mark.recent)}
        newest[name] = mark.epoch

    def first_epoch(name: str) -> Optional[int]:
        mark = marks.get(name)
        if mark is not None and mark.first_epoch is not None:
            return mark.first_epoch
        return iceberg.first_epoch(name) if iceberg is not None and name in marks else None
    floor = read_floor(marks.values())
    if iceberg is None:
        return HeldEpochs(held, newest, Evidence(tm, writers, first_epoch=first_epoch), floor)
    records = iceberg

    def recorded(name: str) -> Mapping[int, Optional[int]]:  # a table with a tidemark: Iceberg may reach further
        return records.recorded(name) if marks.get(name) is not None else {}

    def newest_inputs(name: str) -> Optional[EpochInputs]:  # a table without: what it read at its newest epoch
        epoch = newest.get(name)
        return None if marks.get(name) is not None or epoch is None else records.inputs_at(name, epoch)
    return HeldEpochs(held, newest, Evidence(tm, writers, recorded, records.inputs_at, newest_inputs, first_epoch),
                      floor)


__all__ = ["PLACE_TRIES", "Evidence", "HeldEpochs", "IcebergRecords", "Placement", "common_epochs", "held_epochs",
           "newest_common_epoch", "read_floor"]
