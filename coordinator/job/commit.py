"""Steps 3 to 5 of the epoch protocol, shared by every writer: precommit, publish, commit.

    committer = EpochCommitter(epochs, table)     # table(name): the sink's pyiceberg Table, loaded once
                                                  # timed=metrics.phase: time precommit, publish, commit
    committer.finish(T, staged={"lake.db.counts": 123, "lake.db.hist": None})   # None: nothing new
    committer.commit_idle(T, inputs)                                            # no source changed
    committer.roll_forward(recovery.epoch)                                      # after a failover

Publishing is idempotent (a table whose ``main`` already holds epoch T is skipped), so a
precommitted epoch is rolled forward by running the same steps again. An epoch's sinks are published
one catalog commit each, or all in one where their REST catalog has multi-table commits
(``publish.publish_together``): a reader of the catalog then sees them move together. A sink that
published a snapshot needs nothing more, because the snapshot carries the epoch, its term
and its inputs. A sink that published nothing (every sink, in an idle epoch) gets its
committed-epoch marker advanced after the ZooKeeper commit, but only at the writer's first
epoch and at the first epoch of each ``marker_every_ms`` period (aligned to the clock, so
jobs mark the same barriers and Iceberg alone still finds common epochs): an idle epoch
otherwise costs no catalog commit at all. What a lagging marker means for a restart with no
ZooKeeper history is in ``progress.py``: the newest epoch any sink records is recomputed from
its own recorded inputs, so nothing is read twice or skipped.
Every Iceberg commit here is fenced by the leader's term (``publish.py``): the committer
claims each sink for its term first, so an older leader can no longer change any of them.
"""
from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from types import MappingProxyType
from typing import Callable, Optional

from pyiceberg.table import Table

from coordinator.crashpoints import crash_point
from coordinator.errors import EpochOrderError
from coordinator.iceberg.publish import advance_committed_epoch, claim_table, publish_staged, publish_together
from coordinator.iceberg.snapshots import snapshot_at_epoch
from coordinator.iceberg.transactions import supports_multi_table_commit
from coordinator.protocol.epochs import EpochCoordinator
from coordinator.records import EpochInputs, EpochProgress, EpochRecord, EpochState, StagedWrite

DEFAULT_MARKER_EVERY = "1m"  # at most one committed-epoch marker commit per sink and minute


class EpochCommitter:
    """Precommit, publish and commit of one leader's epochs (steps 3 to 5 of the protocol), over its
    ``EpochCoordinator`` and its sinks' Iceberg tables; one per term, made when the leader takes over.

        committer = EpochCommitter(epochs, writer.table, marker_every_ms=60_000)   # claims every sink first
        committer.finish(T, staged={"lake.db.counts": 123})    # STARTED -> PRECOMMITTED -> published -> COMMITTED
        committer.roll_forward(record)                         # PRECOMMITTED (after a failover) -> COMMITTED
        committer.commit_idle(T, inputs)                       # no source changed: COMMITTED in one multi

    :param epochs: the leader's epoch state machine (its leadership, job and sinks).
    :param table: a sink's pyiceberg ``Table`` by name, loaded once (the writer's ``table``).
    :param timed: a context manager per phase (``precommit``, ``publish``, ``commit``), for metrics and logs.
    :param marker_every_ms: the period of committed-epoch marker rounds (module docstring); 0: every epoch.

    Failure behaviour: the constructor claims every sink for the leader's term (``claim_table``): ``Fenced``
    when a newer term claimed one, ``NotLeader`` when the leadership holds no term, ``PublishConflict`` when
    the claim keeps losing commit races. Each step raises ``EpochOrderError`` for a transition out of order,
    ``NotLeader`` (``Fenced``) once this replica no longer leads, in ZooKeeper or in Iceberg, and
    ``PublishConflict`` for a snapshot that cannot be published or a marker that keeps losing races; the
    epoch is left as the failed step found it, for the next leader to recover.
    """

    def __init__(self, epochs: EpochCoordinator, table: Callable[[str], Table],
                 timed: Callable[[str], AbstractContextManager] = lambda phase: nullcontext(),
                 marker_every_ms: int = 60_000) -> None:
        self.epochs = epochs
        self.table = table
        self.timed = timed
        self.marker_every_ms = marker_every_ms
        self._marked: Optional[int] = None  # the epoch of this leader's last marker round
        for name in epochs.sinks:
            claim_table(table(name), epochs.job, self.term)
        # An epoch's sinks are published in one commit where their catalog (one per writer) has multi-table commits.
        self.together = bool(epochs.sinks) and supports_multi_table_commit(table(epochs.sinks[0]).catalog)

    @property
    def term(self) -> int:
        """The leader's term; ``NotLeader`` when its leadership holds none."""
        return self.epochs.leadership.leading_term

    def finish(self, epoch: int, staged: Mapping[str, Optional[int]],
               writes: Mapping[str, StagedWrite] = MappingProxyType({})) -> EpochRecord:
        """Precommit ``staged`` (every sink; None for a sink with no new data) and ``writes`` (the sinks staged with
        no catalog commit), publish, commit.

        :raises EpochOrderError: ``epoch`` is not the STARTED epoch in flight, or ``staged`` does not name exactly
            the sinks.
        :raises NotLeader: this replica no longer leads the job (``Fenced``).
        :raises PublishConflict: a staged snapshot cannot be published (``publish_staged``).
        """
        crash_point("staged")
        with self.timed("precommit"):
            record = self.epochs.precommit(epoch, staged, writes)
        return self._publish_and_commit(record)

    def commit_idle(self, epoch: int, inputs: Optional[EpochInputs] = None) -> EpochRecord:
        """Commit an epoch whose sinks do not change: one ZooKeeper multi (and a marker round when one is due).

        :raises EpochOrderError: ``epoch`` cannot be committed now (``EpochCoordinator.commit_idle``).
        :raises NotLeader: this replica no longer leads the job (``Fenced``).
        """
        with self.timed("commit"):
            committed = self.epochs.commit_idle(epoch, inputs)
            crash_point("idle-commit")
            self.mark_committed(committed)
        return committed

    def roll_forward(self, record: EpochRecord) -> EpochRecord:
        """Publish a precommitted epoch found at a take-over (skipping the sinks that hold it already) and commit it.
        Its writes staged with no catalog commit are checked to be in storage still (``publish_staged``).

        :raises EpochOrderError: ``record`` is not PRECOMMITTED, or not the epoch in flight.
        :raises NotLeader: this replica no longer leads the job (``Fenced``): checked before every publish.
        :raises PublishConflict: a staged snapshot cannot be published (``publish_staged``).
        """
        return self._publish_and_commit(record, verify_files=True)

    def _publish_and_commit(self, record: EpochRecord, verify_files: bool = False) -> EpochRecord:
        if record.state != EpochState.PRECOMMITTED:
            raise EpochOrderError(f"only a PRECOMMITTED epoch rolls forward; epoch {record.epoch} is "
                                  f"{record.state.value}")
        crash_point("precommitted")
        published: dict[str, Optional[int]] = {}
        changed = {name: (snapshot_id, record.writes.get(name))
                   for name, snapshot_id in record.staged.items() if snapshot_id is not None}
        with self.timed("publish"):
            if len(changed) > 1 and self.together:
                self.epochs.leadership.ensure_leading()  # a fenced zombie must not even move refs
                results = publish_together({name: self.table(name) for name in changed}, changed, record.epoch,
                                           self.term, verify_files)
                published.update({name: result.snapshot_id for name, result in results.items()})
            for name, snapshot_id in sorted(record.staged.items()):
                if name in published:
                    continue
                self.epochs.leadership.ensure_leading()
                if snapshot_id is not None:
                    published[name] = publish_staged(self.table(name), snapshot_id, record.epoch, self.term,
                                                     record.writes.get(name), verify_files).snapshot_id
                    if sum(record.staged.get(n) is not None for n in published) == 1:
                        crash_point("published-one")
                else:
                    published[name] = self._unchanged_snapshot(name, record.epoch)
        with self.timed("commit"):
            committed = self.epochs.commit(record.epoch, published)
            crash_point("committed")
            self.mark_committed(committed)
        return committed

    def _unchanged_snapshot(self, name: str, epoch: int) -> Optional[int]:
        """The snapshot of a sink that published nothing in ``epoch``: the one its tidemark already names."""
        mark = self.epochs.mark(name)
        if mark.epoch is not None:
            return mark.snapshot_id
        table = self.table(name)  # no commit yet under this job: look at what the table holds
        table.refresh()
        newest = snapshot_at_epoch(table, epoch)
        return newest.snapshot_id if newest else None

    def mark_committed(self, record: EpochRecord) -> None:
        """Advance the committed-epoch marker of every sink that published nothing in ``record``'s epoch, when a
        marker round is due (see the module docstring), and record the first epoch in every sink at the writer's
        first.

        Idempotent: run again after a crash between the ZooKeeper commit and these marks.
        """
        first = {name for name in self.epochs.sinks if self.epochs.mark(name).first_epoch == record.epoch}
        due = self._marker_due(record.epoch)
        progress = EpochProgress(self.epochs.job, record.epoch, record.term, record.inputs)
        marked = [name for name in self.epochs.sinks if name in first or (due and record.staged.get(name) is None)]
        for name in marked:
            advance_committed_epoch(self.table(name), progress, self.term)
        if due:
            self._marked = record.epoch
        if marked:
            crash_point("marked")

    def _marker_due(self, epoch: int) -> bool:
        """The first epoch of a new ``marker_every_ms`` period since this leader's last round (the first one always)."""
        if self._marked is None or self.marker_every_ms <= 0:
            return True
        return epoch // self.marker_every_ms > self._marked // self.marker_every_ms
