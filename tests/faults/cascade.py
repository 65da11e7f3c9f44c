"""The fault suite's pipeline: a small cascade whose every table can be checked against its sources.

    src     root table, appended by the producer (rows ``id``, ``k``, ``batch``), which logs what it wrote
      -> job "counter":    ids     the rows of each epoch, appended            (per-row exactly-once record)
                           counts  running ``cnt`` and ``id_sum`` per ``k``: the previous counts plus the
                                   epoch's, as an overwrite (MERGE-like, so a replayed epoch counts twice)
      -> job "totals":     totals  one row summing ``counts`` as of the epoch (a downstream job)

``invariant`` is what every consistent version must satisfy; ``counts_of`` and ``totals_of`` are
the jobs' own logic, shared with it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa

SRC_SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("k", pa.string()), pa.field("batch", pa.int64())])
IDS_SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("k", pa.string())])
COUNTS_SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("cnt", pa.int64()), pa.field("id_sum", pa.int64())])
TOTALS_SCHEMA = pa.schema([pa.field("rows", pa.int64()), pa.field("keys", pa.int64()),
                           pa.field("id_sum", pa.int64())])
COUNTER, TOTALS = "counter", "totals"
JOBS = (COUNTER, TOTALS)


@dataclass(frozen=True)
class Tables:
    """The cascade's table names in catalog ``catalog``, namespace ``namespace``."""

    catalog: str
    namespace: str

    def name(self, table: str) -> str:
        return f"{self.catalog}.{self.namespace}.{table}"

    @property
    def src(self) -> str:
        return self.name("src")

    @property
    def ids(self) -> str:
        return self.name("ids")

    @property
    def counts(self) -> str:
        return self.name("counts")

    @property
    def totals(self) -> str:
        return self.name("totals")

    @property
    def all(self) -> list[str]:
        return [self.src, self.ids, self.counts, self.totals]

    def job(self, job: str) -> tuple[list[str], list[str]]:
        """``job``'s sources and sinks."""
        return {COUNTER: ([self.src], [self.ids, self.counts]), TOTALS: ([self.counts], [self.totals])}[job]

    def create(self, catalog) -> None:
        catalog.create_namespace_if_not_exists(self.namespace)
        for table, schema in (("src", SRC_SCHEMA), ("ids", IDS_SCHEMA), ("counts", COUNTS_SCHEMA),
                              ("totals", TOTALS_SCHEMA)):
            catalog.create_table(f"{self.namespace}.{table}", schema=schema)


def counts_of(rows: pa.Table) -> pa.Table:
    """``cnt`` and ``id_sum`` per ``k`` of ``rows`` (``id``, ``k``)."""
    grouped = rows.group_by("k").aggregate([("id", "count"), ("id", "sum")])
    return _counts(grouped, "id_count", "id_sum")


def _counts(grouped: pa.Table, cnt: str, id_sum: str) -> pa.Table:
    """Columns ``k``, ``cnt``, ``id_sum`` of an aggregate (pyarrow names aggregates ``<column>_<function>``)."""
    return pa.table([grouped.column("k"), grouped.column(cnt), grouped.column(id_sum)],
                    names=["k", "cnt", "id_sum"]).cast(COUNTS_SCHEMA)


def add_counts(previous: pa.Table, delta: pa.Table) -> pa.Table:
    both = pa.concat_tables([previous.select(["k", "cnt", "id_sum"]).cast(COUNTS_SCHEMA), delta])
    return _counts(both.group_by("k").aggregate([("cnt", "sum"), ("id_sum", "sum")]), "cnt_sum", "id_sum_sum")


def totals_of(counts: pa.Table) -> pa.Table:
    cnt, id_sum = counts.column("cnt").to_pylist(), counts.column("id_sum").to_pylist()
    return pa.table({"rows": [sum(cnt)], "keys": [len(cnt)], "id_sum": [sum(id_sum)]}, schema=TOTALS_SCHEMA)


def count_epoch(ctx, tables: Tables) -> None:
    """Job "counter": append the epoch's rows to ``ids``; ``counts`` = the counts in ``main`` (the last
    committed epoch's, as a MERGE would read them) plus the epoch's."""
    new = ctx.changes(tables.src).select(["id", "k"]).cast(IDS_SCHEMA)
    ctx.append(tables.ids, new)
    counts = ctx.writer.table(tables.counts)
    counts.refresh()
    previous = counts.scan().to_arrow() if counts.current_snapshot() is not None else COUNTS_SCHEMA.empty_table()
    ctx.overwrite(tables.counts, add_counts(previous, counts_of(new)))


def total_epoch(ctx, tables: Tables) -> None:
    """Job "totals": one row summing ``counts`` as of the epoch."""
    ctx.overwrite(tables.totals, totals_of(ctx.table(tables.counts)))


def _sorted_rows(table: pa.Table, columns: list[str]) -> list[tuple]:
    return sorted(zip(*(table.column(c).to_pylist() for c in columns)))


def invariant(tables: Tables):
    """What every consistent version of the cascade must satisfy, as a ``ConsistencyChecker`` invariant."""
    def check(frames: Mapping[str, pa.Table]) -> Optional[str]:
        src, ids, counts, totals = (frames[t] for t in tables.all)
        source_rows, id_rows = _sorted_rows(src, ["id", "k"]), _sorted_rows(ids, ["id", "k"])
        if source_rows != id_rows:
            extra = len(id_rows) - len(set(id_rows))
            return (f"ids holds {len(id_rows)} rows ({extra} repeated), src {len(source_rows)}: "
                    f"{len(set(source_rows) - set(id_rows))} src rows missing")
        if _sorted_rows(counts, ["k", "cnt", "id_sum"]) != _sorted_rows(counts_of(ids), ["k", "cnt", "id_sum"]):
            return f"counts sums to {sum(counts.column('cnt').to_pylist())} rows, ids holds {ids.num_rows}"
        want = _sorted_rows(totals_of(counts), ["rows", "keys", "id_sum"])
        have = _sorted_rows(totals, ["rows", "keys", "id_sum"])
        if have != want:
            return f"totals is {have}, counts sums to {want}"
        return None
    return check
