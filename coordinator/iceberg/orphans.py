"""Orphan files: files under a table's location that its metadata no longer references.

    found = find_orphan_files(table, "db.events", cutoff_ms=now - 3 * DAY_MS)   # nothing changed
    deleted = delete_orphan_files(table, found)

Where they come from: a writer killed after writing data files but before its commit; a commit
that lost its race after writing its manifests or metadata file; a garbage collection killed
after its expiry commit but before deleting the files of the expired snapshots (those snapshots
are gone from the metadata, so no later expiry can find their files). Iceberg's
``remove_orphan_files`` procedure does the same for Spark users.

A file is referenced when the table's current metadata reaches it: the metadata file and every
file in its metadata log, each snapshot's manifest list, manifests, data and delete files (of
every branch and tag), and statistics files; and the files of a write staged with no catalog commit that its
job's epoch in flight precommitted (``pending``: published moments later, or rolled forward by the job's next
leader however long it is down). Only files last modified before ``cutoff_ms`` are
candidates: a write in progress has written files its commit does not reference yet, so the
cutoff must be older than any write can take (the CLI refuses less than a day, as Iceberg's
procedure does). The files are listed *before* the metadata is read, so a commit that lands
during the listing only adds references.

Listing goes through the table's pyarrow file system (local, S3, GCS, HDFS, ...): the table
location, plus ``write.data.path`` and ``write.metadata.path`` when they point elsewhere. A table
must not share a directory with another table, or each takes the other's files for orphans (as
with Iceberg's procedure); ``shared_locations`` finds such tables so the caller can refuse.

Failure behaviour: a FileIO other than pyiceberg's ``PyArrowFileIO`` raises ``ConfigurationError``;
a file already gone is fine; other I/O errors propagate to the caller (``GarbageCollector``
turns them into ``TidemarkError``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import combinations
from typing import Optional

from pyarrow.fs import FileSelector, FileType
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot

from coordinator.errors import ConfigurationError
from coordinator.iceberg.reachability import FileIndex
from coordinator.records import JsonOutput

DATA_PATH = "write.data.path"
METADATA_PATH = "write.metadata.path"


@dataclass(frozen=True)
class OrphanFiles(JsonOutput):
    """The unreferenced files of one table older than ``cutoff_ms``, with their total size."""

    table: str
    cutoff_ms: int
    paths: tuple[str, ...]
    size_bytes: int


def _io(table: Table) -> PyArrowFileIO:
    if not isinstance(table.io, PyArrowFileIO):
        raise ConfigurationError(f"orphan-file removal lists files through pyiceberg's PyArrowFileIO, but the "
                                 f"catalog uses {type(table.io).__name__}: set the catalog property py-io-impl to "
                                 "pyiceberg.io.pyarrow.PyArrowFileIO")
    return table.io


def _roots(table: Table) -> list[str]:
    """The directories to list, none inside another."""
    location = table.metadata.location.rstrip("/")
    props = table.metadata.properties
    candidates = sorted({location, props.get(DATA_PATH, location).rstrip("/"),
                         props.get(METADATA_PATH, location).rstrip("/")})
    return [c for c in candidates if not any(c != o and c.startswith(o + "/") for o in candidates)]


def shared_locations(tables: Mapping[str, Table]) -> list[tuple[str, str, str]]:
    """``(table, other, directory)`` for every two tables where a directory listed for one is, or is
    inside, a directory listed for the other: each would take the other's files for orphans."""
    roots = {name: _roots(table) for name, table in tables.items()}
    shared = []
    for (name, mine), (other, theirs) in combinations(sorted(roots.items()), 2):
        for a in mine:
            for b in theirs:
                if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                    shared.append((name, other, min(a, b, key=len)))
    return shared


def _location(scheme: str, netloc: str, path: str) -> str:
    """A listed file system path as a location FileIO accepts (``parse_location`` inverted)."""
    if scheme == "file":
        return path
    if scheme in ("hdfs", "viewfs"):
        return f"{scheme}://{netloc}{path}"
    return f"{scheme}://{path}"


def _referenced(table: Table, files: FileIndex) -> set[str]:
    metadata = table.metadata
    paths = files.referenced(table, metadata.snapshots)
    paths.add(table.metadata_location)
    paths.update(entry.metadata_file for entry in metadata.metadata_log)
    paths.update(s.statistics_path for s in metadata.statistics)
    paths.update(s.statistics_path for s in metadata.partition_statistics)
    return paths


def find_orphan_files(table: Table, name: str, cutoff_ms: int, files: Optional[FileIndex] = None,
                      pending: Iterable[Snapshot] = ()) -> OrphanFiles:
    """The files under ``table``'s locations that nothing references and nobody modified since ``cutoff_ms``.

    ``files`` caches what manifests reference across calls (``GarbageCollector`` keeps one per table).
    ``pending``: snapshots of a write staged with no catalog commit and precommitted, not published yet
    (``staging.py``): in no metadata, their files are no orphans either.
    """
    io = _io(table)
    listed: dict[str, tuple[str, int, int]] = {}   # path in the file system -> (location, mtime ms, size)
    for root in _roots(table):
        scheme, netloc, path = io.parse_location(root)
        fs = io.fs_by_scheme(scheme, netloc)
        for info in fs.get_file_info(FileSelector(path, recursive=True, allow_not_found=True)):
            if info.type == FileType.File and info.mtime_ns is not None:
                listed[info.path] = (_location(scheme, netloc, info.path), info.mtime_ns // 1_000_000, info.size or 0)
    table.refresh()  # after the listing: a commit during it only adds references
    index = files or FileIndex()
    referenced = {io.parse_location(p)[2] for p in _referenced(table, index) | index.referenced(table, pending)}
    orphans = sorted((loc, size) for path, (loc, mtime, size) in listed.items()
                     if mtime < cutoff_ms and path not in referenced)
    return OrphanFiles(name, cutoff_ms, tuple(loc for loc, _ in orphans), sum(size for _, size in orphans))


def delete_orphan_files(table: Table, found: OrphanFiles) -> None:
    """Delete what ``find_orphan_files`` found (a file already gone is fine)."""
    io = _io(table)
    for path in found.paths:
        try:
            io.delete(path)
        except FileNotFoundError:
            pass


__all__ = ["OrphanFiles", "delete_orphan_files", "find_orphan_files", "shared_locations"]
