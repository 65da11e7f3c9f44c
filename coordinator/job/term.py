"""One term of a writer's leadership, and everything it leads its epochs with, as one value.

    term = LeaderTerm(7, leadership, epochs, committer, next_epoch, opened_ms=None, doing=writer.doing)
    term.epochs.begin(T, inputs); term.committer.finish(T, staged)   # epochs of term 7
    term.next_epoch.close()                                          # stepping down: its watches end

``EpochWriter.open`` makes one once it has taken over and recovered the job's last epoch, and ``close`` drops it:
the writer either holds a whole term or none.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Callable, Optional

from coordinator.job.commit import EpochCommitter
from coordinator.protocol.epochs import EpochCoordinator
from coordinator.protocol.leadership import Leadership
from coordinator.protocol.next_epoch import NextEpoch


@dataclass(frozen=True)
class LeaderTerm:
    """The term this replica leads a job as, with what it processes that term's epochs with (module docstring).

    An epoch's context belongs to the term that made it: it stages under ``number``, and not at all once
    ``leadership`` knows the term is over. Nothing here makes a ZooKeeper request: the parts do, when used.
    """

    number: int                  # the fencing term this replica won (its Leadership's term)
    leadership: Leadership       # the contention that won it: ensure_leading() before a write ZooKeeper does not fence
    epochs: EpochCoordinator     # the job's epoch state machine, recovered
    committer: EpochCommitter    # precommit, publish, commit: it claimed every sink for ``number``
    next_epoch: NextEpoch        # the next epoch, from watched state (the sources' tidemarks, the grid, the topology)
    opened_ms: Optional[int]     # a new job's: when this term opened (its first epoch comes after); None otherwise
    doing: Callable[[str, Optional[str]], AbstractContextManager[None]]  # says what the leader does, times its phase


__all__ = ["LeaderTerm"]
