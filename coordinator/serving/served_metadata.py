"""A table's metadata as ``tidemark serve`` hands it out: ``main`` at the served snapshot, nothing newer visible.

    served = served_metadata(table.metadata, snapshot_id)      # a new TableMetadata; the original is untouched

What changes, and why:

- ``main`` (``current-snapshot-id``, ``refs.main``) names the served snapshot (None: the table was empty then);
- ``snapshots`` keeps only the served snapshot's ancestors: a staged snapshot of an epoch not yet published, and
  every snapshot committed after the served one, are not there to be time-travelled to;
- ``refs`` keeps ``main`` and the tags on a kept snapshot (retained versions): other branches are a writer's;
- ``snapshot-log``, ``statistics`` and ``partition-statistics`` keep their entries of kept snapshots, the log up to
  the served snapshot's entry.

Everything else (schemas, specs, properties, the metadata log) is passed through as the backing catalog has it.
"""
from __future__ import annotations

from typing import Optional

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRef, SnapshotRefType


def served_metadata(metadata: TableMetadata, snapshot_id: Optional[int]) -> TableMetadata:
    """``metadata`` with ``main`` at ``snapshot_id`` and no snapshot that is not its ancestor (module docstring).

    :param metadata: the table's current metadata, which must hold ``snapshot_id``.
    :param snapshot_id: the snapshot served, or None to serve the table with no snapshot.
    :raises KeyError: ``snapshot_id`` is not in ``metadata`` (expired, or newer than this metadata).
    """
    by_id = {s.snapshot_id: s for s in metadata.snapshots}
    kept: list[int] = []
    current = snapshot_id
    while current is not None and current in by_id:
        kept.append(current)
        current = by_id[current].parent_snapshot_id
    if snapshot_id is not None and not kept:
        raise KeyError(snapshot_id)
    if (snapshot_id == metadata.current_snapshot_id and len(kept) == len(by_id)
            and set(metadata.refs) <= {MAIN_BRANCH}):
        return metadata  # the newest snapshot is served and nothing else is in the metadata
    keep = set(kept)
    refs = {name: ref for name, ref in metadata.refs.items()
            if ref.snapshot_ref_type == SnapshotRefType.TAG and ref.snapshot_id in keep}
    if snapshot_id is not None:
        main = metadata.refs.get(MAIN_BRANCH)
        refs[MAIN_BRANCH] = (main.model_copy(update={"snapshot_id": snapshot_id}) if main is not None else
                             SnapshotRef(snapshot_id=snapshot_id,  # type: ignore[call-arg]  # optional fields
                                         snapshot_ref_type=SnapshotRefType.BRANCH))
    log = []
    for entry in metadata.snapshot_log:
        if entry.snapshot_id in keep:
            log.append(entry)
        if entry.snapshot_id == snapshot_id:
            break
    return metadata.model_copy(update={
        "current_snapshot_id": snapshot_id,
        "snapshots": [s for s in metadata.snapshots if s.snapshot_id in keep],
        "refs": refs,
        "snapshot_log": log,
        "statistics": [s for s in metadata.statistics if s.snapshot_id in keep],
        "partition_statistics": [s for s in metadata.partition_statistics if s.snapshot_id in keep],
    })


__all__ = ["served_metadata"]
