"""Checking a running pipeline: every consistent version while it runs, and exactly-once at the end.

    def invariant(frames) -> Optional[str]:            # {table: pyarrow.Table} -> None, or what is wrong
        ...
    checker = ConsistencyChecker(Resolver(catalog, settings, tm), ["db.words", "db.word_counts"], invariant)
    while running:
        checker.observe()                              # resolve; read and check the version if its epoch is new
    checker.checked, checker.failures                  # versions checked; Inconsistency(epoch, problem) list
    tally = exactly_once(produced_keys, keys_in_the_sink)   # ExactlyOnce(duplicates, losses)

The invariant is the pipeline's own rule (a derived table is a function of its sources at the
same epoch); the checker resolves the ``consistent`` level (the newest epoch every managed table
holds, each table at its snapshot of that epoch), reads exactly those snapshots and applies it.
``make demo`` and the fault suite (``make test-faults``) both use it.

Every version is checked once per epoch, also one older than a version checked before, which
the resolver should never answer (a table's record moving from ZooKeeper to Iceberg is covered by
the release and the read floor, "When ZooKeeper loses its state" in docs/design.md): that older
version must be consistent all the same, and the step back is counted in ``stepped_back`` for the
caller to judge (the fault suite fails a run that has one).

Failure behaviour: ``observe`` returns None while no consistent version exists
(``VersionNotFound``: none yet, or the tables share no epoch right now); every other error of the
resolver or the catalog propagates, and the caller decides whether it is a fault it injected (an
outage) or a failure.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from coordinator.errors import VersionNotFound
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.protocol.pipelines import SET
from coordinator.records import ConsistentVersion

if TYPE_CHECKING:
    import pyarrow as pa

Invariant = Callable[[Mapping[str, "pa.Table"]], Optional[str]]


@dataclass(frozen=True)
class Inconsistency:
    """A version that broke the invariant: its epoch and what the invariant said is wrong."""

    epoch: Optional[int]
    problem: str


@dataclass(frozen=True)
class ExactlyOnce:
    """How a sink's rows differ from what was produced: extra copies (duplicates) and rows missing (losses)."""

    duplicates: int
    losses: int

    @property
    def holds(self) -> bool:
        """No duplicates and no losses."""
        return self.duplicates == 0 and self.losses == 0


def exactly_once(produced: Iterable[Hashable], found: Iterable[Hashable]) -> ExactlyOnce:
    """Compare two multisets of row keys: every produced key must be found exactly as often as it was produced."""
    want, have = Counter(produced), Counter(found)
    return ExactlyOnce(duplicates=sum((have - want).values()), losses=sum((want - have).values()))


@dataclass
class ConsistencyChecker:
    """Checks every consistent version of ``tables`` with ``invariant`` while a pipeline runs, once per epoch,
    counting what it checked and keeping what failed (module docstring).

        checker = ConsistencyChecker(Resolver(catalog, settings, tm), ["db.words", "db.word_counts"], invariant)
        while running:
            checker.observe()
        assert checker.failures == [], checker.failures

    ``checked`` counts the versions read, ``last_checked`` is the epoch of the last one, ``newest`` the newest epoch
    resolved, and ``stepped_back`` each time the resolver answered an epoch older than ``newest``
    (``(newest, older)``), which is checked all the same and is not in ``failures``.

    Failure behaviour: a version the invariant rejects is an ``Inconsistency`` in ``failures``, never raised;
    ``observe`` returns None while no consistent version exists (``VersionNotFound``); every other error of the
    resolver, the catalog or the invariant propagates.
    """

    resolver: Resolver
    tables: list[str]
    invariant: Invariant
    checked: int = 0
    failures: list[Inconsistency] = field(default_factory=list)
    last_checked: Optional[int] = None
    newest: Optional[int] = None                                            # the newest epoch resolved
    stepped_back: list[tuple[int, int]] = field(default_factory=list)      # (newest before, older epoch resolved)
    _seen: set[int] = field(default_factory=set)

    def observe(self) -> Optional[ConsistentVersion]:
        """Resolve the consistent version and check it when its epoch was not checked yet; None while none exists."""
        try:
            version = self.resolver.resolve(self.tables, scope=SET)  # its tables' rule, however wide their pipeline
        except VersionNotFound:
            return None
        if version.epoch is None:
            return None
        if self.newest is not None and version.epoch < self.newest:
            self.stepped_back.append((self.newest, version.epoch))
        if version.epoch not in self._seen:
            self.check(version)
        return version

    def check(self, version: ConsistentVersion) -> tuple[dict[str, pa.Table], Optional[str]]:
        """Read ``version`` and apply the invariant (counted in ``checked``; a problem in ``failures``)."""
        frames = read_arrow(self.resolver, version)
        problem = self.invariant(frames)
        self.checked += 1
        self.last_checked = version.epoch
        if version.epoch is not None:
            self._seen.add(version.epoch)
            self.newest = max(version.epoch, self.newest if self.newest is not None else version.epoch)
        if problem is not None:
            self.failures.append(Inconsistency(version.epoch, problem))
        return frames, problem
