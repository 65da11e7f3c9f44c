"""Small immutable records stored in znodes or handed to users, each with ``to_json``/``from_json``.

``from_json`` raises ``CorruptState`` naming the znode when the bytes are not the
record they should be (any bytes at all: tests fuzz every decoder), so a damaged znode
is reported, never crash-looped on.
"""
from __future__ import annotations

import enum
import functools
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from typing import Any, ClassVar, Optional, TypeVar

from coordinator.errors import CorruptState, InvalidArgument, InvalidName
from coordinator.names import MAX_EPOCH_MS, parse_epoch, validate_epoch

R = TypeVar("R", bound="JsonRecord")


def now_ms() -> int:
    return int(time.time() * 1000)


def job_committed_epoch(sink_epochs: Iterable[Optional[int]]) -> Optional[int]:
    """A job's committed epoch from its sinks' (each None while it has committed nothing): the lowest, since an
    epoch of the job is committed once every sink holds it; None for no sink, or while one has none."""
    epochs = list(sink_epochs)
    if not epochs or any(e is None for e in epochs):
        return None
    return min(e for e in epochs if e is not None)


class JsonOutput:
    """Mixin: compact JSON encoding of a frozen dataclass, for reports that are printed and never read back."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]  # set by @dataclass on every subclass

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain values (an enum as its value), for JSON."""
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(self).items()}

    def to_json(self) -> bytes:
        """The record as compact JSON bytes, keys sorted: what a znode holds."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()


class JsonRecord(JsonOutput):
    """Mixin: compact JSON encoding of a frozen dataclass, strict decoding (znodes, snapshot summaries)."""

    @classmethod
    def from_dict(cls: type[R], data: Mapping[str, Any], where: str = "value") -> R:
        """The record in decoded JSON ``data``; keys that are not fields are ignored.

        :param where: what ``data`` is, for messages: the znode's path.
        :raises CorruptState: ``data`` is not an object, lacks a required field or holds an invalid value.
        """
        if not isinstance(data, Mapping):
            raise CorruptState(f"{where}: expected a JSON object for {cls.__name__}, got {type(data).__name__}")
        kwargs = {}
        for f in fields(cls):
            if f.name in data:
                kwargs[f.name] = data[f.name]
            elif f.default is MISSING and f.default_factory is MISSING:
                raise CorruptState(f"{where}: {cls.__name__} lacks the field {f.name!r}; "
                                   "fix or delete the znode (see `tidemark status`)")
        try:
            return cls(**kwargs)  # __post_init__ validates and normalizes types
        except (TypeError, ValueError, AttributeError) as exc:
            raise CorruptState(f"{where}: invalid {cls.__name__}: {str(exc)[:200]}") from None

    @classmethod
    def from_json(cls: type[R], raw: Optional[bytes], where: str = "value") -> R:
        """The record in JSON bytes (``from_dict``).

        :param where: what ``raw`` is, for messages: the znode's path.
        :raises CorruptState: ``raw`` is not JSON (``None`` and empty bytes are not), or not the record.
        """
        try:
            data = json.loads(raw or b"")
        except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: "[[[[...": nested too deep
            shown = (raw or b"")[:60]
            raise CorruptState(f"{where}: not valid JSON ({shown!r}); fix or delete the znode") from None
        return cls.from_dict(data, where)


def int_field(value: Any, name: str) -> int:
    # 64-bit, as ZooKeeper's and Iceberg's Java sides store them.
    if isinstance(value, bool) or not isinstance(value, int) or not -2**63 <= value < 2**63:
        raise InvalidArgument(f"{name} must be a 64-bit integer, got {str(value)[:40]}")
    return value


def opt_int_field(value: Any, name: str) -> Optional[int]:
    return None if value is None else int_field(value, name)


def epoch_field(value: Any, name: str) -> int:
    try:
        return validate_epoch(value, name)
    except InvalidName as exc:
        raise InvalidArgument(str(exc)) from None


def opt_epoch_field(value: Any, name: str) -> Optional[int]:
    return None if value is None else epoch_field(value, name)


def str_field(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidArgument(f"{name} must be a string, got {str(value)[:40]}")
    return value


def opt_str_field(value: Any, name: str) -> Optional[str]:
    return None if value is None else str_field(value, name)


def str_tuple_field(value: Any, name: str) -> tuple[str, ...]:
    if isinstance(value, (str, Mapping)) or not all(isinstance(v, str) for v in value):
        raise InvalidArgument(f"{name} must be a list of strings, got {value!r}")
    return tuple(value)


def _json_int(value: Optional[int]) -> str:
    return "null" if value is None else str(value)


def opt_int_map_field(value: Any, name: str) -> dict[str, Optional[int]]:
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{name} must be an object, got {value!r}")
    return {str(k): opt_int_field(v, f"{name}[{k!r}]") for k, v in value.items()}


@dataclass(frozen=True)
class TopologyVersion(JsonRecord):
    """``/topology``: the topology's version, bumped by every registration change (the compare-and-set point)."""

    version: int = 0

    def __post_init__(self) -> None:
        int_field(self.version, "version")


@dataclass(frozen=True)
class JobRecord(JsonRecord):
    """``/jobs/<job>``: what a job reads and writes."""

    sources: tuple[str, ...]
    sinks: tuple[str, ...]
    created_ms: int = field(default_factory=now_ms)
    incarnation: Optional[str] = None   # this registration's id: ``/jobs/<job>/incarnation-<id>`` exists while it does

    def __post_init__(self) -> None:
        object.__setattr__(self, "sources", str_tuple_field(self.sources, "sources"))
        object.__setattr__(self, "sinks", str_tuple_field(self.sinks, "sinks"))
        epoch_field(self.created_ms, "created_ms")
        if self.incarnation is not None and not isinstance(self.incarnation, str):
            raise InvalidArgument(f"incarnation must be a string, got {self.incarnation!r}")


@dataclass(frozen=True)
class TermRecord(JsonRecord):
    """``/jobs/<job>/term``: the fencing counter; ``fenced_by`` is set when an operator fenced the job."""

    term: int = 0
    fenced_by: Optional[str] = None
    changed_ms: int = field(default_factory=now_ms)

    def __post_init__(self) -> None:
        int_field(self.term, "term")
        opt_str_field(self.fenced_by, "fenced_by")
        epoch_field(self.changed_ms, "changed_ms")


@dataclass(frozen=True)
class LeaderRecord(JsonRecord):
    """``/jobs/<job>/leader`` (ephemeral): who leads the job, under which term."""

    member: str
    term: int
    host: str
    since_ms: int = field(default_factory=now_ms)

    def __post_init__(self) -> None:
        str_field(self.member, "member")
        str_field(self.host, "host")
        int_field(self.term, "term")
        epoch_field(self.since_ms, "since_ms")


class EpochState(str, enum.Enum):
    """The life of one epoch of one job (the state machine lives in ``epochs.py``)."""

    STARTED = "STARTED"            # inputs recorded; sinks being computed and staged
    PRECOMMITTED = "PRECOMMITTED"  # every sink staged; from here on the epoch must commit
    COMMITTED = "COMMITTED"        # published and every sink tidemark advanced
    ABORTED = "ABORTED"            # never precommitted; its staged snapshots are never published


@dataclass(frozen=True)
class SourceRange(JsonRecord):
    """The slice of one source an epoch reads: ``main``'s snapshots after ``start``, up to and including ``end``.

    ``start`` is the source's snapshot at the job's previous epoch (None: from the
    beginning) and ``end`` its snapshot at this barrier (None: the table was empty).
    """

    start: Optional[int] = None
    end: Optional[int] = None

    def __post_init__(self) -> None:
        opt_int_field(self.start, "start")
        opt_int_field(self.end, "end")

    @property
    def is_empty(self) -> bool:
        """True when the range holds no snapshot: the source did not change (``start == end``)."""
        return self.start == self.end


@dataclass(frozen=True)
class EpochInputs(JsonRecord):
    """What one epoch reads, recorded before it computes so a replay reads exactly the same data.

    ``sources`` has one ``SourceRange`` per source table; ``batch_id`` is the Structured
    Streaming micro-batch an epoch was made from (None for barrier-driven epochs).
    """

    sources: Mapping[str, SourceRange] = field(default_factory=dict)
    batch_id: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.sources, Mapping):
            raise InvalidArgument(f"sources must be an object, got {self.sources!r}")
        object.__setattr__(self, "sources", {
            str(table): r if isinstance(r, SourceRange) else SourceRange.from_dict(r, f"sources[{table!r}]")
            for table, r in self.sources.items()})
        opt_int_field(self.batch_id, "batch_id")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "value") -> EpochInputs:
        """As ``JsonRecord.from_dict``; also reads the 0.1 layout ``{table: {"from": s, "to": e}, "batch_id": n}``."""
        if isinstance(data, Mapping) and set(data) - {"sources", "batch_id"}:
            # The 0.1 layout: {table: {"from": s, "to": e}, "batch_id": n}.
            data = {"batch_id": data.get("batch_id"), "sources": {
                t: {"start": r.get("from"), "end": r.get("to")} if isinstance(r, Mapping) else r
                for t, r in data.items() if t not in ("batch_id", "_abort_reason")}}
        return super().from_dict(data, where)

    @property
    def unchanged(self) -> bool:
        """True when the job has sources and none of them changed since its previous epoch (an idle barrier)."""
        return bool(self.sources) and self.batch_id is None and all(r.is_empty for r in self.sources.values())


class WriteMode(str, enum.Enum):
    """What a staged write does to its sink's rows: adds to them, or replaces them all."""

    APPEND = "append"
    OVERWRITE = "overwrite"


@dataclass(frozen=True)
class StagedWrite(JsonRecord):
    """A sink's write staged with no catalog commit (``coordinator.iceberg.staging``): its snapshots in the Iceberg
    REST spec's JSON (oldest first), whose data files, manifests and manifest lists are in the table's storage and
    in no metadata yet, and the ``main`` snapshot they were built on (None: the table had none). The precommit
    records it; the publish adds the snapshots and moves ``main`` to the newest in one catalog commit."""

    mode: WriteMode
    base: Optional[int]
    snapshots: tuple[Mapping[str, Any], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", WriteMode(self.mode))
        opt_int_field(self.base, "base")
        if isinstance(self.snapshots, (str, Mapping)) or not self.snapshots or \
                not all(isinstance(s, Mapping) for s in self.snapshots):
            raise InvalidArgument(f"snapshots must be a non-empty list of objects, got {str(self.snapshots)[:60]}")
        object.__setattr__(self, "snapshots", tuple(self.snapshots))
        for snapshot in self.snapshots:
            int_field(snapshot.get("snapshot-id"), "snapshot-id")

    @property
    def snapshot_id(self) -> int:
        """The newest of the write's snapshots: what ``main`` is moved to."""
        return int(self.snapshots[-1]["snapshot-id"])

    def to_dict(self) -> dict[str, Any]:
        """The write as JSON values."""
        return {"mode": self.mode.value, "base": self.base, "snapshots": [dict(s) for s in self.snapshots]}


@dataclass(frozen=True)
class EpochRecord(JsonRecord):
    """``/jobs/<job>/epochs/<T>``: one epoch's inputs, staged snapshots and state.

    ``writes`` holds, while the epoch is PRECOMMITTED, the sinks' writes staged with no catalog commit (their
    snapshots are in ``staged`` too, by id); a commit drops them, since the published snapshots carry the rest.
    """

    epoch: int
    state: EpochState
    term: int
    inputs: EpochInputs = field(default_factory=EpochInputs)
    staged: Mapping[str, Optional[int]] = field(default_factory=dict)
    writes: Mapping[str, StagedWrite] = field(default_factory=dict)
    published: Mapping[str, Optional[int]] = field(default_factory=dict)
    updated_ms: int = field(default_factory=now_ms)
    abort_reason: Optional[str] = None

    def __post_init__(self) -> None:
        epoch_field(self.epoch, "epoch")
        int_field(self.term, "term")
        epoch_field(self.updated_ms, "updated_ms")
        opt_str_field(self.abort_reason, "abort_reason")
        object.__setattr__(self, "state", EpochState(self.state))
        if not isinstance(self.inputs, EpochInputs):
            try:
                object.__setattr__(self, "inputs", EpochInputs.from_dict(self.inputs, "inputs"))
            except CorruptState as exc:
                raise InvalidArgument(str(exc)) from None
        object.__setattr__(self, "staged", opt_int_map_field(self.staged, "staged"))
        object.__setattr__(self, "published", opt_int_map_field(self.published, "published"))
        if not isinstance(self.writes, Mapping):
            raise InvalidArgument(f"writes must be an object, got {str(self.writes)[:60]}")
        try:
            object.__setattr__(self, "writes", {
                str(sink): w if isinstance(w, StagedWrite) else StagedWrite.from_dict(w, f"writes[{sink!r}]")
                for sink, w in self.writes.items()})
        except CorruptState as exc:
            raise InvalidArgument(str(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON values: the state as its value, the inputs and writes as dicts."""
        # Not ``asdict``, which deep-copies the staged and published maps (an entry per sink) at every epoch step.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["state"], data["inputs"] = self.state.value, self.inputs.to_dict()
        data["writes"] = {sink: write.to_dict() for sink, write in self.writes.items()}
        return data


@dataclass(frozen=True)
class EpochProgress(JsonRecord):
    """What a sink's Iceberg metadata records about one committed (or precommitted) epoch of its writer job:
    enough for a restart with no ZooKeeper history to resume exactly (see ``snapshots.py`` for the keys).

    ``inputs`` is None only for snapshots written by Tidemark releases that did not record them.
    """

    job: str
    epoch: int
    term: int
    inputs: Optional[EpochInputs] = None

    def __post_init__(self) -> None:
        int_field(self.epoch, "epoch")
        int_field(self.term, "term")
        if not isinstance(self.job, str):
            raise InvalidArgument(f"job must be a string, got {self.job!r}")
        if self.inputs is not None and not isinstance(self.inputs, EpochInputs):
            try:
                object.__setattr__(self, "inputs", EpochInputs.from_dict(self.inputs, "inputs"))
            except CorruptState as exc:
                raise InvalidArgument(str(exc)) from None


@dataclass(frozen=True)
class TableRecord(JsonRecord):
    """``/tables/<table>``: the one job allowed to commit to the table, and the Iceberg table it is (its
    ``table-uuid`` in the catalog the job writes; None: recorded by a release before 0.1, or not yet)."""

    writer: str
    table_uuid: Optional[str] = None

    def __post_init__(self) -> None:
        str_field(self.writer, "writer")
        opt_str_field(self.table_uuid, "table_uuid")


# Which committed epochs a tidemark keeps beside its newest (``TableTidemark.recent``): the newest
# RECENT_PER_LEVEL of every epoch, and as many aligned to each coarser period. A job at a coarse cadence
# (hourly) that looks at a fine-grained source (5 s) some minutes after the hour still finds the hour in
# it, while the record stays a few KiB whatever the table's age.
RECENT_PER_LEVEL = 16
RECENT_LEVELS_MS = (1, 60_000, 3_600_000, 86_400_000)


def keep_recent(entries: Iterable[tuple[int, Optional[int]]]) -> tuple[tuple[int, Optional[int]], ...]:
    """The ``(epoch, snapshot_id)`` entries a tidemark keeps, oldest first (see ``RECENT_LEVELS_MS``)."""
    return _keep_ordered(tuple(sorted(dict(entries).items())))


def _keep_ordered(ordered: tuple[tuple[int, Optional[int]], ...]) -> tuple[tuple[int, Optional[int]], ...]:
    """``keep_recent`` of entries already in epoch order, one per epoch."""
    if len(ordered) <= RECENT_PER_LEVEL:
        return ordered  # the newest RECENT_PER_LEVEL of every epoch: all of them
    kept = _kept_epochs(tuple([e for e, _ in ordered]))
    return tuple(entry for entry in ordered if entry[0] in kept)


@functools.lru_cache(maxsize=64)
def _kept_epochs(epochs: tuple[int, ...]) -> frozenset[int]:
    """Which of ``epochs`` (ordered, distinct) a tidemark keeps. Cached: a job's sinks list the same epochs, so a
    commit that advances all of them decides once."""
    kept = set(epochs[-RECENT_PER_LEVEL:])  # the finest level (every epoch is a multiple of 1 ms)
    for period in RECENT_LEVELS_MS[1:]:
        kept.update([e for e in epochs if e % period == 0][-RECENT_PER_LEVEL:])
    return frozenset(kept)


@dataclass(frozen=True)
class TableTidemark(JsonRecord):
    """``/tables/<table>/tidemark``: the highest epoch committed in the table, and the recent epochs it holds.

    ``epoch`` is None until the writer's first commit; ``snapshot_id`` is None for a
    table with no snapshot yet (every committed epoch so far was empty). ``first_epoch``
    is the writer's first committed epoch: the table has no exact state before it.
    ``recent`` lists committed epochs with the snapshot that holds each (``keep_recent``),
    the newest included: a job coalesces barriers, so a table holds exactly the epochs its
    writer committed, not every barrier. A consistent version is an epoch every table of
    the set holds (``holds``), and ``snapshot_at`` names its snapshot with no metadata load.
    ``read_floor`` is set when the writer resumed from Iceberg after ZooKeeper lost its state: the newest
    barrier then, at or above every epoch a reader could have seen before the loss. No consistent version of a
    set holding this table is older than it (``held_epochs``), so no reader steps back; the writer's commits
    keep it.
    """

    table: str
    epoch: Optional[int] = None
    snapshot_id: Optional[int] = None
    committed_ms: Optional[int] = None
    first_epoch: Optional[int] = None
    recent: tuple[tuple[int, Optional[int]], ...] = ()
    read_floor: Optional[int] = None

    def __post_init__(self) -> None:
        str_field(self.table, "table")
        opt_epoch_field(self.epoch, "epoch")
        opt_epoch_field(self.first_epoch, "first_epoch")
        opt_int_field(self.snapshot_id, "snapshot_id")
        opt_epoch_field(self.committed_ms, "committed_ms")
        opt_epoch_field(self.read_floor, "read_floor")
        if isinstance(self.recent, (str, Mapping)):
            raise InvalidArgument(f"recent must be a list of [epoch, snapshot_id] pairs, got {str(self.recent)[:40]}")
        pairs = []
        for entry in self.recent:
            # Decoded on every tidemark read and built on every commit: plain types are checked inline, anything
            # else goes through the checks that say what is wrong.
            if not isinstance(entry, (list, tuple)) or len(entry) != 2:
                raise InvalidArgument(f"recent entries are [epoch, snapshot_id] pairs, got {str(entry)[:40]}")
            epoch, snapshot_id = entry
            if type(epoch) is not int or not 0 <= epoch <= MAX_EPOCH_MS:
                epoch = epoch_field(epoch, "recent epoch")
            if snapshot_id is not None and (type(snapshot_id) is not int or not -2**63 <= snapshot_id < 2**63):
                snapshot_id = int_field(snapshot_id, "recent snapshot_id")
            pairs.append((epoch, snapshot_id))
        if self.epoch is not None:
            pairs.append((self.epoch, self.snapshot_id))  # a tidemark written before ``recent`` existed
        object.__setattr__(self, "recent", keep_recent(pairs))

    def holds(self, epoch: int) -> bool:
        """True when ZooKeeper records ``epoch`` as committed in this table (it may hold older ones too)."""
        return any(e == epoch for e, _ in self.recent)

    @property
    def epochs(self) -> tuple[int, ...]:
        """The committed epochs this record lists, oldest first."""
        return tuple(e for e, _ in self.recent)

    def snapshot_at(self, epoch: int) -> Optional[int]:
        """The snapshot holding ``epoch``; only for an epoch the record ``holds``.

        :raises KeyError: the record does not list ``epoch``.
        """
        for e, snapshot_id in self.recent:
            if e == epoch:
                return snapshot_id
        raise KeyError(epoch)

    def advanced(self, epoch: int, snapshot_id: Optional[int], committed_ms: int) -> TableTidemark:
        """The record after committing ``epoch`` with ``snapshot_id`` (the first epoch too, for the first commit)."""
        first = self.first_epoch if self.first_epoch is not None else epoch
        recent = self.recent
        if (recent and type(epoch) is int and recent[-1][0] < epoch <= MAX_EPOCH_MS
                and (snapshot_id is None or (type(snapshot_id) is int and -2**63 <= snapshot_id < 2**63))
                and type(committed_ms) is int and 0 <= committed_ms <= MAX_EPOCH_MS):
            # Every commit builds one per sink: this record's entries were checked and kept when it was built, and
            # the new epoch is newer than all of them, so only the new values are checked and nothing is sorted.
            record = object.__new__(TableTidemark)
            for name, value in (("table", self.table), ("epoch", epoch), ("snapshot_id", snapshot_id),
                                ("committed_ms", committed_ms), ("first_epoch", first),
                                ("recent", _keep_ordered((*recent, (epoch, snapshot_id)))),
                                ("read_floor", self.read_floor)):
                object.__setattr__(record, name, value)
            return record
        return TableTidemark(self.table, epoch, snapshot_id, committed_ms, first,
                             (*self.recent, (epoch, snapshot_id)), self.read_floor)

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON values, ``recent`` as ``[epoch, snapshot_id]`` lists."""
        # Not ``asdict``, which deep-copies every pair: each commit writes one of these per sink.
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["recent"] = [list(pair) for pair in self.recent]
        return data

    def to_json(self) -> bytes:
        """The record as compact JSON bytes, exactly as ``JsonOutput.to_json`` would encode it."""
        # Each commit encodes one per sink: written out in ``JsonOutput.to_json``'s exact form (keys sorted,
        # compact), without the generic encoder's walk of a dict of lists.
        recent = ",".join([f"[{e},{'null' if s is None else s}]" for e, s in self.recent])
        return (f'{{"committed_ms":{_json_int(self.committed_ms)},"epoch":{_json_int(self.epoch)},'
                f'"first_epoch":{_json_int(self.first_epoch)},"read_floor":{_json_int(self.read_floor)},'
                f'"recent":[{recent}],'
                f'"snapshot_id":{_json_int(self.snapshot_id)},"table":{json.dumps(self.table)}}}').encode()


@dataclass(frozen=True)
class FinishedRecord(JsonRecord):
    """``/jobs/<job>/finished``: the job's last leader ended a bounded run here; removed when a leader starts again.

    A finished job is at rest: not stale, and out of the live consistent epoch (``coordinator.protocol.status``).
    """

    epoch: Optional[int]
    member: str
    finished_ms: int = field(default_factory=now_ms)

    def __post_init__(self) -> None:
        opt_epoch_field(self.epoch, "epoch")
        str_field(self.member, "member")
        epoch_field(self.finished_ms, "finished_ms")


MAX_NOTE_CHARS = 1000  # who paused or retired a job, and why: a line for `tidemark status`, not a document


@dataclass(frozen=True)
class RestRecord(JsonRecord):
    """``/jobs/<job>/paused`` or ``/jobs/<job>/retired``: an operator said that no leader runs the job, on purpose.

    While no live leader runs it, such a job is *at rest* like a finished one: not stale, and its
    tables are left out of the consistent lag of what is live (``coordinator.protocol.status``).
    A pause lasts until ``until_ms`` (None: until ``tidemark resume``); a retired job's drivers
    refuse to lead it until ``tidemark resume``. A live leader outranks both: a job being run is live.
    """

    by: str
    reason: str = ""
    since_ms: int = field(default_factory=now_ms)
    until_ms: Optional[int] = None

    def __post_init__(self) -> None:
        for name, text in (("by", self.by), ("reason", self.reason)):
            if len(str_field(text, name)) > MAX_NOTE_CHARS:
                raise InvalidArgument(f"{name} must be at most {MAX_NOTE_CHARS} characters, got {len(text)}")
        epoch_field(self.since_ms, "since_ms")
        opt_epoch_field(self.until_ms, "until_ms")
        if self.until_ms is not None and self.until_ms <= self.since_ms:
            raise InvalidArgument(f"a pause must end after it starts (until_ms {self.until_ms} <= since_ms "
                                  f"{self.since_ms})")

    def in_force(self, at_ms: int) -> bool:
        """Whether the mark holds at ``at_ms``: until ``until_ms``, or for good when that is None."""
        return self.until_ms is None or at_ms < self.until_ms


class BarrierMode(str, enum.Enum):
    """How the grid places barriers: on ZooKeeper's wall clock (processing time, ``coordinator.zookeeper.clock``),
    the one mode there is."""

    PROCESSING_TIME = "processing-time"


@dataclass(frozen=True)
class ReaderPins(JsonRecord):
    """``/readers/<id>`` (ephemeral): the versions a live reader pinned, ``{epoch: {table: snapshot id}}``."""

    versions: Mapping[int, Mapping[str, Optional[int]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.versions, Mapping):
            raise InvalidArgument(f"versions must be an object, got {str(self.versions)[:40]}")
        pins = {}
        for epoch, snapshots in self.versions.items():
            parsed = parse_epoch(epoch) if isinstance(epoch, str) else epoch
            pins[epoch_field(parsed, "pinned epoch")] = opt_int_map_field(snapshots, f"versions[{epoch!r}]")
        object.__setattr__(self, "versions", pins)

    def to_dict(self) -> dict[str, Any]:
        """The pins as JSON values, each epoch as a string (a JSON object's key)."""
        return {"versions": {str(epoch): dict(snapshots) for epoch, snapshots in self.versions.items()}}


@dataclass(frozen=True)
class RootRead:
    """A root table's snapshot as the jobs reading it read it at a barrier (None: it was empty then)."""

    snapshot_id: Optional[int]


class ConsistencyLevel(str, enum.Enum):
    """How a set of tables is resolved (``coordinator.history.resolve``): ``latest`` (each table's current
    snapshot), ``committed`` (each table at its own tidemark), ``consistent`` (at the newest epoch every managed
    table of the set holds) or ``as_of`` (at a given epoch)."""

    LATEST = "latest"
    COMMITTED = "committed"
    CONSISTENT = "consistent"
    AS_OF = "as_of"


@dataclass(frozen=True)
class ConsistentVersion(JsonRecord):
    """One snapshot id per table, all at one logical point (``epoch``) of the data flow.

    ``epoch`` is None for the ``latest`` level (no common epoch) and a table's snapshot id
    is None when the table has no snapshot at that point (it is empty).
    """

    epoch: Optional[int]
    snapshots: Mapping[str, Optional[int]]
    level: ConsistencyLevel = ConsistencyLevel.CONSISTENT

    def __post_init__(self) -> None:
        opt_epoch_field(self.epoch, "epoch")
        object.__setattr__(self, "snapshots", opt_int_map_field(self.snapshots, "snapshots"))
        object.__setattr__(self, "level", ConsistencyLevel(self.level))
