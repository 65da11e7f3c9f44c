"""Retained consistent versions, one pipeline's each: ``/versions/<T>-<pipeline>`` in ZooKeeper plus the Iceberg tag
``tidemark-<pipeline>-<T>`` on every table of the pipeline.

    versions = RetainedVersions(tm)
    versions.all()                         # every VersionRecord, by epoch then pipeline
    versions.epochs()                      # the epochs any pipeline retains, oldest first
    versions.at(T)                         # the records at T (a pipeline's each): every covered table's snapshot
    versions.get(T, "orders").tagged       # whether its tables carry the tag (the policy's tagged tiers)
    parse_version_ref("tidemark-orders-1700000000000")  # -> 1700000000000; tidemark-<T> and a bare epoch too

A version belongs to one pipeline (``coordinator.protocol.pipelines``): nothing outside a pipeline
holds its versions back, so two pipelines on cadences that never meet each keep their own. It
exists only at an epoch ``T`` every managed table of the pipeline (a table one of its jobs writes,
and that committed something) holds, since a table whose job coalesced over ``T`` has no exact
state there; it records each of them at its snapshot of ``T`` as its tidemark lists it, plus the
root tables those jobs read (each at its newest snapshot committed at or before ``T``). A table
that was empty at ``T`` is recorded with ``None`` and carries no tag (a tag needs a snapshot), so
a version *covers* the tables it names a snapshot of; GC creates no version at which every table
was empty. A *tagged* version (``tagged``: kept by a tier the policy tags, ``tags:hourly`` by
default, or the pipeline's newest consistent version) has its tag on each table it covers, and any
engine reads it by name: Spark SQL ``SELECT * FROM t VERSION AS OF 'tidemark-orders-<T>'``, Trino
``FOR VERSION AS OF``, pyiceberg ``table.scan(snapshot_id=table.refs()['tidemark-orders-<T>'].snapshot_id)``.
An untagged version (the ``all`` tier by default: a tag per epoch would bloat every table's
metadata) is read by its snapshot ids, from its record (``tidemark resolve --as-of T``,
``Resolver.resolve(as_of=T)``); GC protects its snapshots all the same. Versions at one epoch of
several pipelines together are a consistent version of all their tables (each table holds ``T``).

Records an earlier release wrote, ``/versions/<T>`` across every pipeline with the tag
``tidemark-<T>`` (``pipeline`` None), stay readable the same way; GC decides them by the policy
among themselves, so they age out as before, and makes no new ones. A version keeps the pipeline
name it was made under (``pipeline``); when a job whose name sorts first joins the pipeline (and so
renames it), GC decides the older name's versions among themselves in the same way.

Only ``coordinator.history.gc`` creates and drops versions (``tidemark gc``). A record that says
``tagged`` is written after every tag exists, and it is deleted or set untagged before any tag
is removed, so a record always names snapshots that exist and a tagged record's tags exist on
every table it covers, whenever a GC run is killed.
"""
from __future__ import annotations

import bisect
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Optional

from pyiceberg.table.refs import SnapshotRef, SnapshotRefType

from coordinator.errors import ConfigurationError, InvalidArgument
from coordinator.history.retention import read_policy
from coordinator.names import NAME_PATTERN, validate_name
from coordinator.records import JsonOutput, JsonRecord, int_field, now_ms, opt_int_map_field
from coordinator.zookeeper.session import ZooKeeperSession

TAG_PREFIX = "tidemark-"
# tidemark-<pipeline>-<T>, or an earlier release's tidemark-<T>: the epoch is the digits after the last '-'.
_TAG = re.compile(re.escape(TAG_PREFIX) + rf"(?:(?P<pipeline>{NAME_PATTERN})-)?(?P<epoch>\d{{1,15}})")
_RECORD = re.compile(rf"(?P<epoch>\d{{1,15}})(?:-(?P<pipeline>{NAME_PATTERN}))?")


def tag_name(epoch: int, pipeline: Optional[str] = None) -> str:
    """The Iceberg tag of pipeline ``pipeline``'s retained version at ``epoch`` (``tidemark-<pipeline>-<T>``; with
    no pipeline, ``tidemark-<T>``: an earlier release's versions, and a live reader's pin)."""
    return f"{TAG_PREFIX}{epoch}" if pipeline is None else f"{TAG_PREFIX}{pipeline}-{epoch}"


def tag_epoch(name: str) -> Optional[int]:
    """The epoch a Tidemark tag names, whichever pipeline's (None for any other ref)."""
    match = _TAG.fullmatch(name)
    return int(match.group("epoch")) if match else None


def tag_at(refs: Mapping[str, SnapshotRef], epoch: int, snapshot_id: Optional[int] = None) -> Optional[str]:
    """The name of a Tidemark tag in ``refs`` (a table's ``metadata.refs``) at ``epoch``, on ``snapshot_id`` when it is
    given: a pipeline's retained version, an earlier release's, or a pin (None: there is none)."""
    return next((name for name, ref in sorted(refs.items()) if ref.snapshot_ref_type == SnapshotRefType.TAG
                 and tag_epoch(name) == epoch and snapshot_id in (None, ref.snapshot_id)), None)


def parse_version_ref(text: str) -> int:
    """An epoch from ``"tidemark-<pipeline>-<T>"``, ``"tidemark-<T>"`` or ``"<T>"`` (what ``--as-of`` accepts)."""
    epoch = tag_epoch(text.strip())
    if epoch is None and text.strip().isdigit():
        epoch = int(text.strip())
    if epoch is None:
        raise ConfigurationError(f"{text!r} names no version: give an epoch (milliseconds) or a tag "
                                 f"{TAG_PREFIX}<pipeline>-<epoch>; `tidemark versions` lists the retained ones")
    return epoch


@dataclass(frozen=True)
class VersionRecord(JsonRecord):
    """``/versions/<T>-<pipeline>``: pipeline ``pipeline``'s version at epoch ``T``, each covered table's snapshot
    then (None: the table was empty), and whether the covered tables carry its tag ``tidemark-<pipeline>-<T>``
    (records written before untagged versions existed were all tagged). ``pipeline`` None: an earlier release's
    record, ``/versions/<T>`` with the tag ``tidemark-<T>``."""

    epoch: int
    snapshots: Mapping[str, Optional[int]]
    created_ms: int = field(default_factory=now_ms)
    tagged: bool = True
    pipeline: Optional[str] = None

    def __post_init__(self) -> None:
        int_field(self.epoch, "epoch")
        int_field(self.created_ms, "created_ms")
        object.__setattr__(self, "snapshots", opt_int_map_field(self.snapshots, "snapshots"))
        if not isinstance(self.tagged, bool):
            raise InvalidArgument(f"tagged must be true or false, got {str(self.tagged)[:40]}")
        if self.pipeline is not None:
            validate_name(self.pipeline, "pipeline")

    @property
    def covered(self) -> list[str]:
        """The tables the version names a snapshot of."""
        return sorted(t for t, s in self.snapshots.items() if s is not None)

    @property
    def tag(self) -> Optional[str]:
        """``tidemark-<pipeline>-<T>`` when the covered tables carry it (None: read the version by its snapshot
        ids)."""
        return tag_name(self.epoch, self.pipeline) if self.tagged else None

    @property
    def empty(self) -> list[str]:
        """The tables that were empty at ``T``: recorded with no snapshot, so with no tag."""
        return sorted(t for t, s in self.snapshots.items() if s is None)


class RetainedVersions:
    """Read access to ``/versions`` (``coordinator.history.gc`` writes it): every pipeline's retained versions, and
    an earlier release's records across pipelines (module docstring)."""

    tm: ZooKeeperSession

    def __init__(self, tm: ZooKeeperSession) -> None:
        self.tm = tm

    def keys(self) -> list[tuple[int, Optional[str]]]:
        """The retained versions as (epoch, pipeline), oldest first (the children of ``/versions``; [] without it).

        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached before the session's deadline.
        """
        found = (_RECORD.fullmatch(c) for c in self.tm.children(self.tm.paths.versions))
        return sorted(((int(m.group("epoch")), m.group("pipeline")) for m in found if m),
                      key=lambda key: (key[0], key[1] or ""))

    def epochs(self) -> list[int]:
        """The epochs some pipeline retains a version at, oldest first.

        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached before the session's deadline.
        """
        return sorted({epoch for epoch, _ in self.keys()})

    def get(self, epoch: int, pipeline: Optional[str] = None) -> Optional[VersionRecord]:
        """Pipeline ``pipeline``'s retained version at ``epoch`` (None: an earlier release's), or None when there is
        none.

        :raises CorruptState: the znode does not hold a version record.
        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached before the session's deadline.
        """
        found = self.tm.read(self.tm.paths.version(epoch, pipeline), VersionRecord)
        return None if found is None else found[0]

    def at(self, epoch: int) -> list[VersionRecord]:
        """Every retained version at ``epoch``, whichever pipeline's (one pipelined read)."""
        return self._read([key for key in self.keys() if key[0] == epoch])

    def all(self) -> list[VersionRecord]:
        """Every retained version, by epoch then pipeline (one pipelined read)."""
        return self._read(self.keys())

    def _read(self, keys: list[tuple[int, Optional[str]]]) -> list[VersionRecord]:
        paths = [self.tm.paths.version(epoch, pipeline) for epoch, pipeline in keys]
        raw = self.tm.get_many(paths)
        return [VersionRecord.from_json(r[0], path) for path, r in zip(paths, raw) if r is not None]


@dataclass(frozen=True)
class VersionListing(JsonOutput):
    """One line of ``tidemark versions``: a retained version, its pipeline, the tier keeping it and its age."""

    epoch: int
    pipeline: Optional[str]         # None: an earlier release's version, across every pipeline
    tag: Optional[str]              # None: an untagged version, read by its snapshot ids (``--as-of <epoch>``)
    tier: str
    age_ms: int
    snapshots: Mapping[str, Optional[int]]
    tagged: tuple[str, ...] = ()    # the tables carrying the tag (those with a snapshot at T; none when untagged)
    empty: tuple[str, ...] = ()     # the tables empty at T: no snapshot, no tag


def tier_listing(tm: ZooKeeperSession, records: list[VersionRecord], now: Optional[int] = None) -> list[VersionListing]:
    """``records`` with the tier of the deployment's policy that keeps each, among its pipeline's versions (each
    pipeline's newest is always kept; a version no tier keeps any more goes at the next ``tidemark gc``, unless a
    live reader pinned it), by pipeline then epoch."""
    now = now_ms() if now is None else now
    policy = read_policy(tm)
    unlisted = "out of policy (kept while a reader pins it)"
    listing = []
    for pipeline, own in _by_pipeline(records).items():
        tiers = policy.keep([r.epoch for r in own], now)
        newest = max(r.epoch for r in own)
        listing += [VersionListing(r.epoch, pipeline, r.tag, tiers.get(r.epoch) or (
            "newest consistent version" if r.epoch == newest else unlisted), now - r.epoch, dict(r.snapshots),
            tuple(r.covered) if r.tagged else (), tuple(r.empty)) for r in own]
    return listing


def _by_pipeline(records: list[VersionRecord]) -> dict[Optional[str], list[VersionRecord]]:
    """``records`` by pipeline (an earlier release's, None, first), each oldest first."""
    grouped: dict[Optional[str], list[VersionRecord]] = {}
    for record in sorted(records, key=lambda r: (r.pipeline is not None, r.pipeline or "", r.epoch)):
        grouped.setdefault(record.pipeline, []).append(record)
    return grouped


def nearest(epochs: list[int], epoch: int) -> tuple[Optional[int], Optional[int]]:
    """The retained epochs just below and just above ``epoch`` in the sorted ``epochs``."""
    at = bisect.bisect_left(epochs, epoch)
    below = epochs[at - 1] if at > 0 else None
    above = epochs[at] if at < len(epochs) and epochs[at] != epoch else (
        epochs[at + 1] if at + 1 < len(epochs) else None)
    return below, above


__all__ = [
    "TAG_PREFIX",
    "RetainedVersions",
    "VersionListing",
    "VersionRecord",
    "nearest",
    "parse_version_ref",
    "tag_at",
    "tag_epoch",
    "tag_name",
    "tier_listing",
]
