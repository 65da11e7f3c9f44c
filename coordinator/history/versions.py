"""Retained consistent versions: ``/versions/<T>`` in ZooKeeper plus the Iceberg tag ``tidemark-<T>`` on every table.

    versions = RetainedVersions(tm)
    versions.epochs()                      # retained epochs, oldest first
    versions.get(T)                        # VersionRecord: every covered table's snapshot at T, or None
    versions.get(T).tagged                 # whether its tables carry the tag (the policy's tagged tiers)
    parse_version_ref("tidemark-1700000000000")  # -> 1700000000000; a bare epoch is accepted too

A version exists only at an epoch ``T`` every managed table (a table some registered job writes,
and that committed something) holds, since a table whose job coalesced over ``T`` has no exact
state there; it records each of them at its snapshot of ``T`` as its tidemark lists it, plus the
root tables those jobs read (each at its newest snapshot committed at or before ``T``). A table
that was empty at ``T`` is recorded with ``None`` and carries no tag (a tag needs a snapshot), so
a version *covers* the tables it names a snapshot of; GC creates no version at which every table
was empty. A *tagged* version (``tagged``: kept by a tier the policy tags, ``tags:hourly`` by
default, or the newest consistent version) has its tag on each table it covers, and any engine
reads it by name: Spark SQL ``SELECT * FROM t VERSION AS OF 'tidemark-<T>'``, Trino ``FOR VERSION
AS OF``, pyiceberg ``table.scan(snapshot_id=table.refs()['tidemark-<T>'].snapshot_id)``. An
untagged version (the ``all`` tier by default: a tag per epoch would bloat every table's
metadata) is read by its snapshot ids, from its record (``tidemark resolve --as-of T``,
``Resolver.resolve(as_of=T)``); GC protects its snapshots all the same.

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

from coordinator.errors import ConfigurationError, InvalidArgument
from coordinator.history.retention import read_policy
from coordinator.records import JsonOutput, JsonRecord, int_field, now_ms, opt_int_map_field
from coordinator.zookeeper.session import ZooKeeperSession

TAG_PREFIX = "tidemark-"


def tag_name(epoch: int) -> str:
    """The Iceberg tag of the retained version at ``epoch``."""
    return f"{TAG_PREFIX}{epoch}"


def tag_epoch(name: str) -> Optional[int]:
    """The epoch a Tidemark tag names (None for any other ref)."""
    match = re.fullmatch(re.escape(TAG_PREFIX) + r"(\d+)", name)
    return int(match.group(1)) if match else None


def parse_version_ref(text: str) -> int:
    """An epoch from ``"tidemark-<T>"`` or ``"<T>"`` (what ``--as-of`` accepts)."""
    epoch = tag_epoch(text.strip())
    if epoch is None and text.strip().isdigit():
        epoch = int(text.strip())
    if epoch is None:
        raise ConfigurationError(f"{text!r} names no version: give an epoch (milliseconds) or a tag "
                                 f"{TAG_PREFIX}<epoch>; `tidemark versions` lists the retained ones")
    return epoch


@dataclass(frozen=True)
class VersionRecord(JsonRecord):
    """``/versions/<T>``: each covered table's snapshot at epoch ``T`` (None: the table was empty then), and
    whether the covered tables carry the tag ``tidemark-<T>`` (records written before untagged versions
    existed were all tagged)."""

    epoch: int
    snapshots: Mapping[str, Optional[int]]
    created_ms: int = field(default_factory=now_ms)
    tagged: bool = True

    def __post_init__(self) -> None:
        int_field(self.epoch, "epoch")
        int_field(self.created_ms, "created_ms")
        object.__setattr__(self, "snapshots", opt_int_map_field(self.snapshots, "snapshots"))
        if not isinstance(self.tagged, bool):
            raise InvalidArgument(f"tagged must be true or false, got {str(self.tagged)[:40]}")

    @property
    def covered(self) -> list[str]:
        """The tables the version names a snapshot of."""
        return sorted(t for t, s in self.snapshots.items() if s is not None)

    @property
    def tag(self) -> Optional[str]:
        """``tidemark-<T>`` when the covered tables carry it (None: read the version by its snapshot ids)."""
        return tag_name(self.epoch) if self.tagged else None

    @property
    def empty(self) -> list[str]:
        """The tables that were empty at ``T``: recorded with no snapshot, so with no tag."""
        return sorted(t for t, s in self.snapshots.items() if s is None)


class RetainedVersions:
    """Read access to ``/versions`` (``coordinator.history.gc`` writes it)."""

    def __init__(self, tm: ZooKeeperSession) -> None:
        self.tm = tm

    def epochs(self) -> list[int]:
        """The epochs of the retained versions, oldest first (the children of ``/versions``; [] without it).

        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached before the session's deadline.
        """
        return sorted(int(c) for c in self.tm.children(self.tm.paths.versions) if c.isdigit())

    def get(self, epoch: int) -> Optional[VersionRecord]:
        """The retained version at ``epoch``, or None when there is none.

        :raises CorruptState: ``/versions/<epoch>`` does not hold a version record.
        :raises ZooKeeperUnavailable: ZooKeeper cannot be reached before the session's deadline.
        """
        found = self.tm.read(self.tm.paths.version(epoch), VersionRecord)
        return None if found is None else found[0]

    def all(self) -> list[VersionRecord]:
        """Every retained version, oldest first (one pipelined read)."""
        epochs = self.epochs()
        raw = self.tm.get_many([self.tm.paths.version(e) for e in epochs])
        return [VersionRecord.from_json(r[0], self.tm.paths.version(e)) for e, r in zip(epochs, raw) if r is not None]


@dataclass(frozen=True)
class VersionListing(JsonOutput):
    """One line of ``tidemark versions``: a retained version, the tier keeping it and its age."""

    epoch: int
    tag: Optional[str]              # None: an untagged version, read by its snapshot ids (``--as-of <epoch>``)
    tier: str
    age_ms: int
    snapshots: Mapping[str, Optional[int]]
    tagged: tuple[str, ...] = ()    # the tables carrying the tag (those with a snapshot at T; none when untagged)
    empty: tuple[str, ...] = ()     # the tables empty at T: no snapshot, no tag


def tier_listing(tm: ZooKeeperSession, records: list[VersionRecord], now: Optional[int] = None) -> list[VersionListing]:
    """``records`` with the tier of the deployment's policy that keeps each (the newest is always kept; a
    version no tier keeps any more goes at the next ``tidemark gc``, unless a live reader pinned it)."""
    now = now_ms() if now is None else now
    tiers = read_policy(tm).keep([r.epoch for r in records], now)
    newest = max((r.epoch for r in records), default=None)
    fallback = {newest: "newest consistent version"}
    unlisted = "out of policy (kept while a reader pins it)"
    return [VersionListing(r.epoch, r.tag, tiers.get(r.epoch) or fallback.get(r.epoch, unlisted), now - r.epoch,
                           dict(r.snapshots), tuple(r.covered) if r.tagged else (), tuple(r.empty)) for r in records]


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
    "tag_epoch",
    "tag_name",
    "tier_listing",
]
