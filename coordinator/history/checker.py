"""Checking a running pipeline: every consistent version while it runs, and exactly-once at the end.

    def invariant(frames) -> Optional[str]:            # {table: pyarrow.Table} -> None, or what is wrong
        ...
    checker = ConsistencyChecker(Resolver(catalog, settings, tm), ["db.words", "db.word_counts"], invariant)
    while running:
        checker.observe()                              # resolve; read and check the version if its epoch is new
    checker.checked, checker.failures                  # versions checked; Inconsistency(epoch, problem) list
    tally = exactly_once(produced_keys, keys_in_the_sink)   # ExactlyOnce(duplicates, losses)

The invariant is the pipeline's own rule (a derived table is a function of its sources at the
same epoch); the checker resolves the ``consistent`` level, reads exactly those snapshots and
applies it. It also checks that consistent epochs never move backwards (a reader's view is
monotonic). ``make demo`` and the fault suite (``make test-faults``) both use it.

Failure behaviour: ``observe`` returns None while no consistent version exists yet
(``VersionNotFound``); every other error of the resolver or the catalog propagates, and the
caller decides whether it is a fault it injected (an outage) or a failure.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Optional

from coordinator.errors import VersionNotFound
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.records import ConsistentVersion

if TYPE_CHECKING:
    import pyarrow as pa

Invariant = Callable[[Mapping[str, "pa.Table"]], Optional[str]]


@dataclass(frozen=True)
class Inconsistency:
    epoch: Optional[int]
    problem: str


@dataclass(frozen=True)
class ExactlyOnce:
    """How a sink's rows differ from what was produced: extra copies (duplicates) and rows missing (losses)."""

    duplicates: int
    losses: int

    @property
    def holds(self) -> bool:
        return self.duplicates == 0 and self.losses == 0


def exactly_once(produced: Iterable[Hashable], found: Iterable[Hashable]) -> ExactlyOnce:
    """Compare two multisets of row keys: every produced key must be found exactly as often as it was produced."""
    want, have = Counter(produced), Counter(found)
    return ExactlyOnce(duplicates=sum((have - want).values()), losses=sum((want - have).values()))


@dataclass
class ConsistencyChecker:
    resolver: Resolver
    tables: list[str]
    invariant: Invariant
    checked: int = 0
    failures: list[Inconsistency] = field(default_factory=list)
    last_checked: Optional[int] = None

    def observe(self) -> Optional[ConsistentVersion]:
        """Resolve the consistent version and check it when its epoch is new; None while none exists yet."""
        try:
            version = self.resolver.resolve(self.tables)
        except VersionNotFound:
            return None
        if version.epoch is None:
            return None
        if self.last_checked is not None and version.epoch < self.last_checked:
            self.failures.append(Inconsistency(version.epoch, f"the consistent epoch moved backwards from "
                                                              f"{self.last_checked}"))
        elif version.epoch != self.last_checked:
            self.check(version)
        return version

    def check(self, version: ConsistentVersion) -> tuple[dict[str, pa.Table], Optional[str]]:
        """Read ``version`` and apply the invariant (counted in ``checked``; a problem in ``failures``)."""
        frames = read_arrow(self.resolver, version)
        problem = self.invariant(frames)
        self.checked += 1
        self.last_checked = version.epoch
        if problem is not None:
            self.failures.append(Inconsistency(version.epoch, problem))
        return frames, problem
