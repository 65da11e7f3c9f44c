"""A job's progress as its sinks' Iceberg metadata records it: where a job with no ZooKeeper history resumes.

    point = resume_point("counts", {"lake.db.counts": table, "lake.db.log": table2})
    point.committed       # EpochProgress: the epoch every sink holds, with its term and input ranges
    point.in_flight       # EpochProgress of a higher epoch only some sinks published (precommitted), or None
    point.term            # the highest term any sink records: the next leader's term must be above it
    print(point.describe())

**Committed in Iceberg.** Each sink's progress follows the one rule of ``lineage.py``
(the newer of ``main``'s newest epoch snapshot and the committed-epoch marker). A job is
committed in Iceberg up to the *lowest* progress among its sinks (``committed``,
``records.job_committed_epoch``: None as soon as one sink records nothing of this job). A
sink can be ahead of that only by the epoch that was in flight when the history was lost:
it was precommitted (a snapshot of it is published, which happens only after the precommit) but the ZooKeeper commit, or
the other sinks' publishes or markers, did not all land. That epoch is ``in_flight``: a
resuming leader recomputes it from the input ranges its snapshot records; sinks that
already hold it keep their snapshot (publishing is idempotent per epoch) and the others
get theirs, so the epoch ends up in every sink exactly once. Only progress written by
``job`` counts: a table written by another job before is a fresh start for this one.

Failure behaviour: ``CorruptState`` when the progress needed to resume exactly has no
input ranges (snapshots written by a Tidemark release before format 1); the operator
then decides (see README, "What survives a ZooKeeper wipe").
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable, Optional

from pyiceberg.table import Table

from coordinator.errors import CorruptState
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.snapshots import recorded_term
from coordinator.records import EpochProgress, SourceRange, job_committed_epoch


@dataclass(frozen=True)
class ResumePoint:
    """Where ``job`` resumes according to its sinks (see the module docstring)."""

    job: str
    committed: Optional[EpochProgress]
    in_flight: Optional[EpochProgress]
    sinks: Mapping[str, Optional[EpochProgress]]
    snapshots: Mapping[str, Optional[int]]    # each sink's snapshot at ``committed`` (None: empty then)
    recorded: Mapping[str, tuple[tuple[int, Optional[int]], ...]]  # per sink, epochs up to ``committed`` it records
    term: int
    first_epoch: Optional[int]

    @property
    def newest_epoch(self) -> Optional[int]:
        """The newest epoch of this job any sink records (``in_flight``'s, else ``committed``'s)."""
        newest = self.in_flight or self.committed
        return newest.epoch if newest is not None else None

    @property
    def is_fresh(self) -> bool:
        """True when no sink records anything of this job: it starts like a new job."""
        return self.committed is None and self.in_flight is None

    def describe(self) -> str:
        """One paragraph for operators: what a (re-)registered job will resume from."""
        if self.is_fresh:
            return (f"job {self.job}: its sinks record no epoch of it; a re-registration starts it as a new job "
                    f"(at the newest barrier), above term {self.term}")
        parts = []
        if self.committed is not None:
            parts.append(f"committed epoch {self.committed.epoch} (term {self.committed.term}), input read up to "
                         f"{_inputs_text(self.committed, lambda t, r: f'{t} snapshot {r.end}')}")
        if self.in_flight is not None:
            published = (s for s, p in sorted(self.sinks.items()) if p and p.epoch == self.in_flight.epoch)
            parts.append(f"epoch {self.in_flight.epoch} is in flight (published in {', '.join(published)}"
                         f") and is recomputed from its recorded inputs "
                         f"({_inputs_text(self.in_flight, lambda t, r: f'{t}: {r.start}..{r.end}')})")
        return f"job {self.job} resumes from its sinks' Iceberg metadata: " + "; ".join(parts) + \
            f"; its next term is above {self.term}"


def _inputs_text(progress: EpochProgress, each: Callable[[str, SourceRange], str]) -> str:
    inputs = progress.inputs
    if inputs is None:
        return "(input ranges not recorded)"
    if inputs.batch_id is not None:
        return f"streaming batch {inputs.batch_id}"
    if not inputs.sources:
        return "no source"
    return ", ".join(each(t, r) for t, r in sorted(inputs.sources.items()))


def resume_point(job: str, tables: Mapping[str, Table], committed: Optional[EpochProgress] = None) -> ResumePoint:
    """Read ``job``'s progress from its sinks ``tables`` (name -> pyiceberg table; refreshed here).

    ``committed``: an epoch of ``job`` known to be committed (ZooKeeper's newest) that is about to be
    recorded in every sink whose progress is behind it (``unregister`` does); the point is read as
    if it were.
    """
    lineages = {}
    for name, table in tables.items():
        table.refresh()
        lineages[name] = EpochLineage(table)
    sinks: dict[str, Optional[EpochProgress]] = {}
    for name, lineage in lineages.items():
        recorded = lineage.committed_progress()
        own = recorded if recorded is not None and recorded.job == job else None
        sinks[name] = committed if committed is not None and (own is None or own.epoch < committed.epoch) else own
    known = [p for p in sinks.values() if p is not None]
    newest = max(known, key=lambda p: p.epoch) if known else None
    lowest = job_committed_epoch(p.epoch if p is not None else None for p in sinks.values())
    committed = next((p for p in known if p.epoch == lowest), None)
    in_flight = newest if newest is not None and (committed is None or newest.epoch > committed.epoch) else None
    for progress, what in ((committed, "committed"), (in_flight, "in-flight")):
        if progress is not None and progress.inputs is None:
            raise CorruptState(
                f"job {job}: its {what} epoch {progress.epoch} in Iceberg records no input ranges (written by a "
                "Tidemark release before format 1), so it cannot resume exactly from Iceberg alone")
    snapshots: dict[str, Optional[int]] = {}
    recorded_epochs: dict[str, tuple[tuple[int, Optional[int]], ...]] = {}
    if committed is not None:
        for name, lineage in lineages.items():
            at_epoch = lineage.at_epoch(committed.epoch)
            snapshots[name] = at_epoch.snapshot_id if at_epoch else None
            # the epochs a resumed tidemark lists again (``TableTidemark`` keeps the recent ones, and aligned ones
            # further back), so downstream jobs and readers find common epochs
            recorded_epochs[name] = (*lineage.recorded_epochs(committed.epoch), (committed.epoch, snapshots[name]))
    firsts = [e for e in (lineage.first_epoch for lineage in lineages.values()) if e is not None]
    term = max([0, *(recorded_term(t) for t in tables.values())])
    return ResumePoint(job, committed, in_flight, sinks, snapshots, recorded_epochs, term,
                       min(firsts) if firsts else None)
