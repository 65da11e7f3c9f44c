"""Which files Iceberg snapshots reference: manifest lists, manifests, data and delete files.

    files = FileIndex()
    files.referenced(table, snapshots)      # every path those snapshots need, each manifest read once
    files.forget_except(snapshots)          # drop cache entries of manifest lists no longer around

Manifest lists and manifests are immutable, so what they reference is cached by path across
runs: a garbage collector on a schedule reads only the manifests written since its last run.
Use one index per table. A manifest's DELETED entries count as referenced: deleting less is
always safe.
"""
from __future__ import annotations

from collections.abc import Iterable

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot


class FileIndex:
    """One table's cache of what its manifest lists and manifests reference, by path (they are immutable), so a
    run reads only the manifests written since the last; see the module docstring."""

    def __init__(self) -> None:
        self._lists: dict[str, tuple[str, ...]] = {}      # manifest list -> its manifests
        self._manifests: dict[str, tuple[str, ...]] = {}  # manifest -> its data and delete files

    def _manifests_of(self, table: Table, snapshot: Snapshot) -> tuple[str, ...]:
        manifests = self._lists.get(snapshot.manifest_list)
        if manifests is None:
            listed = snapshot.manifests(table.io)
            for manifest in listed:
                if manifest.manifest_path not in self._manifests:
                    self._manifests[manifest.manifest_path] = tuple(
                        entry.data_file.file_path
                        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False))
            manifests = self._lists[snapshot.manifest_list] = tuple(m.manifest_path for m in listed)
        return manifests

    def referenced(self, table: Table, snapshots: Iterable[Snapshot]) -> set[str]:
        """Every file the ``snapshots`` reference, their manifest lists included."""
        lists: set[str] = set()
        manifests: set[str] = set()
        for snapshot in snapshots:
            lists.add(snapshot.manifest_list)
            manifests.update(self._manifests_of(table, snapshot))
        files = lists | manifests
        for manifest in manifests:
            files.update(self._manifests[manifest])
        return files

    def forget_except(self, snapshots: Iterable[Snapshot]) -> None:
        """Keep the cache for these snapshots' manifest lists (and their manifests) only."""
        keep = {s.manifest_list for s in snapshots}
        self._lists = {k: v for k, v in self._lists.items() if k in keep}
        wanted = {m for manifests in self._lists.values() for m in manifests}
        self._manifests = {k: v for k, v in self._manifests.items() if k in wanted}


__all__ = ["FileIndex"]
