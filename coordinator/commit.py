"""Steps 3 to 5 of the epoch protocol, shared by every writer: precommit, publish, commit.

    committer = EpochCommitter(epochs, load_table)
    committer.finish(T, staged={"lake.db.counts": 123, "lake.db.hist": None})   # None: empty epoch
    committer.roll_forward(recovery.epoch)                                      # after a failover

Publishing is idempotent (a table whose ``main`` already holds epoch T is skipped), so a
precommitted epoch is rolled forward by running the same steps again. After the
ZooKeeper commit, each table's ``tidemark.committed-epoch`` property is advanced, which
is also how an epoch with no new data is marked in Iceberg.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

from pyiceberg.table import Table

from .epochs import EpochCoordinator
from .publish import advance_committed_epoch, claim_table, publish_staged
from .records import EpochRecord, EpochState
from .snapshots import snapshot_at_epoch


class EpochCommitter:
    def __init__(self, epochs: EpochCoordinator, load_table: Callable[[str], Table]) -> None:
        self.epochs = epochs
        self.load_table = load_table
        for name in epochs.sinks:
            claim_table(load_table(name), epochs.job)

    def finish(self, epoch: int, staged: Mapping[str, Optional[int]]) -> EpochRecord:
        """Precommit ``staged`` (every sink; None for a sink with no new data), publish, commit."""
        return self.roll_forward(self.epochs.precommit(epoch, staged))

    def roll_forward(self, record: EpochRecord) -> EpochRecord:
        """Publish a precommitted epoch's staged snapshots (skipping those already published) and commit it."""
        if record.state != EpochState.PRECOMMITTED:
            raise ValueError(f"only a PRECOMMITTED epoch rolls forward; epoch {record.epoch} is {record.state.value}")
        tables = {name: self.load_table(name) for name in record.staged}
        published: dict[str, Optional[int]] = {}
        for name, snapshot_id in sorted(record.staged.items()):
            self.epochs.leadership.ensure_leading()  # a fenced zombie must not even move refs
            if snapshot_id is not None:
                published[name] = publish_staged(tables[name], snapshot_id, record.epoch).snapshot_id
            else:
                tables[name].refresh()
                newest = snapshot_at_epoch(tables[name], record.epoch)
                published[name] = newest.snapshot_id if newest else None
        committed = self.epochs.commit(record.epoch, published)
        for table in tables.values():
            advance_committed_epoch(table, record.epoch)
        return committed

    def mark_committed(self, epoch: int) -> None:
        """Re-advance every sink's committed-epoch property (after a crash between commit and advance)."""
        for name in self.epochs.sinks:
            advance_committed_epoch(self.load_table(name), epoch)
