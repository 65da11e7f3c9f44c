"""What a job's leader records about its run: the pacing it runs with, and that a bounded run finished.

    run = JobRun(leadership)                  # the leader's Leadership: every write is fenced by its term
    run.started(pacing)                       # on taking over: /jobs/<job>/pacing, and no /jobs/<job>/finished
    run.finished(last_epoch)                  # a bounded run (max_epochs, until, once) ended: /jobs/<job>/finished
    read_pacing(tm, "word_counts")            # for anyone: the job's cadence and grace (None: not recorded yet)

- ``/jobs/<job>/pacing`` (``pacing.Pacing``): the cadence (``every``) and grace its leader runs
  with, where ``tidemark status``, the exporter, a grid change (``Barriers.check_cadences``)
  and other jobs' catch-up decisions read them. Written when a leader takes over, only if it
  differs from what is there (an unreadable record is replaced).
- ``/jobs/<job>/finished`` (``records.FinishedRecord``): the job's last leader ended a bounded
  run at that epoch. The job is then at rest, not stale (``coordinator.protocol.status``); the
  next leader removes it when it takes over. An operator's pause or retirement is
  ``coordinator.protocol.rest``'s, and a leader never removes those.

Failure behaviour: each write is one multi with the leader's fencing checks
(``Leadership.transact``): a replica that lost its term writes nothing and gets ``Fenced``;
ZooKeeper errors are the session's (``ZooKeeperUnavailable`` past the operation timeout).
"""
from __future__ import annotations

from typing import Optional

from coordinator.errors import CorruptState
from coordinator.protocol.leadership import Leadership
from coordinator.protocol.pacing import Pacing
from coordinator.records import FinishedRecord
from coordinator.zookeeper.ops import Create, Delete, SetData
from coordinator.zookeeper.session import ZooKeeperSession


def read_pacing(tm: ZooKeeperSession, job: str) -> Optional[Pacing]:
    """The cadence and grace ``job``'s leader runs with (None: no leader of this release recorded them yet)."""
    found = tm.read(tm.paths.pacing(job), Pacing)
    return found[0] if found is not None else None


class JobRun:
    """The leader's records of its run (see the module docstring); one per leadership."""

    def __init__(self, leadership: Leadership) -> None:
        self.leadership = leadership
        self.tm, self.job = leadership.tm, leadership.job

    def started(self, pacing: Pacing) -> None:
        """A leader took over: record its pacing, and end the at-rest state a finished bounded run left."""
        path = self.tm.paths.pacing(self.job)
        found = self.tm.get(path)
        try:
            same = found is not None and Pacing.from_json(found[0], path) == pacing
        except CorruptState:
            same = False  # this leader's record replaces it
        if not same:
            data = pacing.to_json()
            self.leadership.transact([SetData(path, data) if found is not None else Create(path, data)])
        finished = self.tm.paths.finished(self.job)
        if self.tm.get(finished) is not None:
            self.leadership.transact([Delete(finished)])

    def finished(self, last_epoch: Optional[int]) -> None:
        """A bounded run ended at ``last_epoch``: the job is at rest until a leader starts again."""
        path = self.tm.paths.finished(self.job)
        data = FinishedRecord(last_epoch, self.tm.member).to_json()
        self.leadership.transact([SetData(path, data) if self.tm.get(path) is not None else Create(path, data)])


__all__ = ["JobRun", "read_pacing"]
