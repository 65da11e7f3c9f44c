"""A two-job pipeline on real ZooKeeper and Iceberg, driven barrier by barrier on a simulated clock.

    pipeline = Pipeline(tm, settings, namespace)
    pipeline.epoch(T, rows=3)        # ingest appends 3 rows at T, rollup recomputes its total
    pipeline.epoch(T)                # an idle barrier: both jobs commit it in one ZooKeeper multi each
    pipeline.check(version)          # the version is consistent: totals.rows == rows of events
    naive_keep(DEFAULT_POLICY, epochs, now)   # the default retention policy, written out with datetime
    naive_keep(DEFAULT_POLICY, epochs, now, tagged=True)   # ... the versions it tags

``ingest`` (no source) appends ``rows`` rows to ``events``; ``rollup`` reads ``events`` and
overwrites ``totals`` with one row, the running count of events (its previous total plus the
rows of ``ctx.changes``: the input range's start matters, which is what GC must protect).
Each job picks its own epochs among the grid's barriers: ``rollup`` may lag ``ingest``
(``produce`` without ``roll``) and then catch up over several of ``ingest``'s epochs in one
(``roll(T)`` for the newest). Idle barriers take the cheap path of the protocol,
``EpochCoordinator.commit_idle`` (one ZooKeeper multi; the Iceberg-only committed-epoch marker
is skipped), so a simulated year of barriers costs seconds.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa

from coordinator import CatalogSettings, EpochInputs, EpochWriter, SourceRange
from coordinator.history.resolve import Resolver, read_arrow

from .lake import create_table, rows_of

TOTALS = pa.schema([pa.field("epoch", pa.int64(), nullable=False), pa.field("rows", pa.int64(), nullable=False)])
INTERVAL_MS = 5 * 60 * 1000


class Pipeline:
    name = "ingest"  # the pipeline of ingest and rollup is named after its first job by name

    def __init__(self, tm, settings: CatalogSettings, namespace: str, spark_names: bool = False,
                 interval_ms: int = INTERVAL_MS) -> None:
        """``spark_names``: name the tables ``<catalog>.<namespace>.<table>``, as Spark must; ``interval_ms``: the
        grid's interval (the epochs given to ``epoch`` are its barriers)."""
        self.tm, self.settings, self.interval_ms = tm, settings, interval_ms
        self.catalog = settings.load()
        prefix = f"{settings.name}." if spark_names else ""
        self.events, self.totals = f"{prefix}{namespace}.events", f"{prefix}{namespace}.totals"
        create_table(self.catalog, settings.identifier(self.events))
        self.catalog.create_table(settings.identifier(self.totals), schema=TOTALS).append(TOTALS.empty_table())
        self.ingest = self._writer("ingest", [], [self.events])
        self.rollup = self._writer("rollup", [self.events], [self.totals])
        self.committed: list[int] = []      # barriers both jobs committed
        self.rows_at: dict[int, int] = {}   # events rows up to each barrier

    def _writer(self, job: str, sources: list[str], sinks: list[str]) -> EpochWriter:
        writer = EpochWriter(self.tm, job, sources=sources, sinks=sinks, catalog=self.settings,
                             interval_ms=self.interval_ms, grace_ms=0)
        writer.open(leader_timeout=30)
        return writer

    @property
    def tables(self) -> list[str]:
        return [self.events, self.totals]

    def close(self) -> None:
        self.ingest.close()
        self.rollup.close()

    def produce(self, epoch: int, rows: int = 0) -> None:
        """Commit barrier ``epoch`` in ``events`` only (``rollup`` lags until ``roll``)."""
        if rows:
            self.ingest.process(epoch, lambda ctx: ctx.append(self.events, rows_of(epoch, rows)))
        else:
            self.ingest.epochs.commit_idle(epoch, EpochInputs())
        previous = self.rows_at[max(self.rows_at)] if self.rows_at else 0
        self.rows_at[epoch] = previous + rows

    def roll(self, epoch: int) -> None:
        """``rollup`` takes ``epoch`` (one ``events`` holds) as its next epoch: it covers every barrier since its
        last one."""
        inputs = self.rollup.inputs_for(epoch)
        assert inputs is not None
        if inputs.unchanged:
            self.rollup.epochs.commit_idle(epoch, inputs)
        else:
            self.rollup.process(epoch, self._count, inputs=inputs)
        self.committed.append(epoch)

    def epoch(self, epoch: int, rows: int = 0) -> None:
        """Both jobs commit barrier ``epoch``; ``rollup`` idles when ``events`` did not change (``rows=0``)."""
        self.produce(epoch, rows)
        current = self.rollup.epochs.current
        if rows or current is None or not self.committed or current.epoch != self.committed[-1]:
            self.roll(epoch)
            return
        end = current.inputs.sources[self.events].end  # what inputs_for finds, without a metadata load
        self.rollup.epochs.commit_idle(epoch, EpochInputs({self.events: SourceRange(end, end)}))
        self.committed.append(epoch)

    def _count(self, ctx) -> None:
        previous = 0
        mark = self.rollup.epochs.mark(self.totals)
        if mark.snapshot_id is not None:
            table = self.rollup.table(self.totals)
            if table.snapshot_by_id(mark.snapshot_id) is None:
                table.refresh()
            previous = sum(table.scan(snapshot_id=mark.snapshot_id).to_arrow().column("rows").to_pylist())
        total = previous + ctx.changes(self.events).num_rows
        ctx.overwrite(self.totals, pa.table({"epoch": [ctx.epoch], "rows": [total]}, schema=TOTALS))

    def check(self, resolver: Resolver, version) -> None:
        """The version is consistent: ``totals`` counts exactly the rows ``events`` holds, as of its epoch."""
        frames = read_arrow(resolver, version)
        events, totals = frames[self.events].num_rows, sum(frames[self.totals].column("rows").to_pylist())
        assert events == totals == self.rows_at[version.epoch], (
            f"version {version.epoch}: events has {events} rows, totals says {totals}, "
            f"expected {self.rows_at[version.epoch]}")


def naive_keep(policy_text: str, epochs: list[int], now: int, tagged: bool = False) -> set[int]:
    """The policy written out with datetime arithmetic, independently of ``RetentionPolicy``; ``tagged``: only
    what its tiers of an hour or longer keep (those the default ``tags:hourly`` tags)."""
    windows = {"1h": timedelta(hours=1), "48h": timedelta(hours=48), "30d": timedelta(days=30),
               "52w": timedelta(weeks=52), "24mo": timedelta(days=720)}

    def bucket(every: str, moment: datetime):
        if every == "all":
            return moment
        if every == "hourly":
            return moment.replace(minute=0, second=0, microsecond=0)
        if every == "daily":
            return moment.date()
        if every == "weekly":
            return moment.date() - timedelta(days=moment.weekday())
        return (moment.year, moment.month)

    now_dt = datetime.fromtimestamp(now / 1000, tz=timezone.utc)
    kept = set()
    for tier in policy_text.split(","):
        every, keep_for = tier.split(":")
        if every == "tags" or (tagged and every == "all"):
            continue
        firsts: dict = {}
        for epoch in sorted(epochs):
            moment = datetime.fromtimestamp(epoch / 1000, tz=timezone.utc)
            firsts.setdefault(bucket(every, moment), (moment, epoch))
        kept |= {epoch for moment, epoch in firsts.values() if now_dt - moment <= windows[keep_for]}
    return kept
