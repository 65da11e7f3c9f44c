"""Old metadata files: deleted when a commit pushes them out of the table's metadata log.

    previous = table.metadata
    response = table.catalog.commit_table(table, requirements, updates)
    delete_unlogged_metadata(table, previous, response.metadata)

pyiceberg does this inside its own commits when the table property
``write.metadata.delete-after-commit.enabled`` is true (keeping
``write.metadata.previous-versions-max`` files in the log); a commit sent to the catalog
directly must do it itself, or every such commit leaves a metadata file behind for good.
Failure behaviour: a file already gone is fine; other I/O errors propagate.
"""
from __future__ import annotations

from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

DELETE_AFTER_COMMIT = "write.metadata.delete-after-commit.enabled"
PREVIOUS_VERSIONS_MAX = "write.metadata.previous-versions-max"


def delete_unlogged_metadata(table: Table, previous: TableMetadata, current: TableMetadata) -> list[str]:
    """Delete the metadata files in ``previous``'s log that ``current``'s log dropped; returns them."""
    if str(current.properties.get(DELETE_AFTER_COMMIT, "false")).lower() != "true":
        return []
    kept = {entry.metadata_file for entry in current.metadata_log}
    dropped = sorted({entry.metadata_file for entry in previous.metadata_log} - kept)
    for path in dropped:
        try:
            table.io.delete(path)
        except FileNotFoundError:
            pass
    return dropped


__all__ = ["DELETE_AFTER_COMMIT", "PREVIOUS_VERSIONS_MAX", "delete_unlogged_metadata"]
