"""The Iceberg side: resolution latency for lakes of 100 and 1,000 tables at mixed epochs (with the watch
cache, cold, and from Iceberg metadata alone beside loading the same tables' metadata), publish latency
next to a plain pyiceberg ``set_current_snapshot``, the two ways to mark an empty epoch (a
table-property commit vs an empty snapshot), and a pure-Python writer's epoch against a plain append of
the same rows (10,000 and 1,000,000).

    python -m bench iceberg [--tables 100 1000] [--ahead 1] [--rows 10000 1000000] [--stack embedded|lakehouse]

``--stack lakehouse`` runs it all on a real S3 object store and Iceberg REST catalog on loopback (SeaweedFS).

The lake is the user's case: jobs of 50 tables in pairs, an upstream job ahead of the downstream job that
reads it (``--ahead`` epochs), so half the tables sit past the consistent epoch. Each table's tidemark
lists its recent epochs, and Iceberg records the epochs that published a snapshot. Resolution is checked
to give the same version from ZooKeeper and from Iceberg alone before it is timed.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import pyarrow as pa

from coordinator import CatalogSettings, EpochWriter, Tidemark
from coordinator.history.resolve import Resolver
from coordinator.iceberg.publish import advance_committed_epoch, publish_staged
from coordinator.iceberg.snapshots import summary_properties
from coordinator.records import EpochProgress

from .common import (
    EPOCH_RATIO_HEADER,
    PYTHON_EPOCH_RATIO_GOALS,
    STACKS,
    bench_lake,
    epoch_ratio_line,
    header,
    interleaved,
    ms,
    timed,
    verdict,
    zookeeper,
)

SCHEMA = pa.schema([pa.field("epoch", pa.int64(), nullable=False)])
TABLES_PER_JOB = 50
HISTORY = 20  # idle epochs before the data epochs: each tidemark lists about as many as a running job's
GOALS_MS = {100: (2.0, 15.0), 1000: (10.0, 100.0)}  # tables: (with the watch cache, cold), issue 21
ICEBERG_RATIO_GOAL = 1.5
EPOCH_WARMUP = 2  # epochs and appends not counted: the first writes of a table plan and load more


def stage(table, epoch: int) -> int:
    """A staged snapshot of ``epoch`` on main's head (a branch append, then the branch dropped)."""
    table.refresh()
    branch = f"stage-{uuid.uuid4().hex[:8]}"
    table.manage_snapshots().create_branch(table.current_snapshot().snapshot_id, branch).commit()
    table.append(pa.table({"epoch": pa.array([epoch], pa.int64())}, schema=SCHEMA),
                 snapshot_properties=summary_properties(epoch, "bench", 1), branch=branch)
    staged = table.metadata.refs[branch].snapshot_id
    table.manage_snapshots().remove_branch(branch).commit()
    return staged


def build_mixed_lake(tm: Tidemark, settings: CatalogSettings, catalog, count: int, namespace: str,
                     ahead: int) -> tuple[list[str], int]:
    """``count`` tables in jobs of 50 sinks on a 1 s grid, half of them ``ahead`` epochs ahead of the other half:
    each upstream job (root) is read by a downstream job, which took only the epochs up to ``D``. Every job
    first commits ``HISTORY`` idle epochs (ZooKeeper only: the tidemarks list them), then publishes one row
    to each sink at ``D``; the upstream jobs publish again at each of the ``ahead`` epochs after ``D``.
    Returns the tables and ``D``, the consistent epoch of the whole lake."""
    catalog.create_namespace_if_not_exists(namespace)
    names = [f"{namespace}.t{i:04d}" for i in range(count)]
    for name in names:
        catalog.create_table(name, schema=SCHEMA)
    tm.barriers.ensure_grid(1000)
    pairs = []
    for start in range(0, count, 2 * TABLES_PER_JOB):
        up_tables = names[start:start + TABLES_PER_JOB]
        down_tables = names[start + TABLES_PER_JOB:start + 2 * TABLES_PER_JOB]
        up = EpochWriter(tm, f"{namespace}-up{start}", sources=[], sinks=up_tables, catalog=settings,
                         interval_ms=1000, grace_ms=0, always_run=True)  # a root job: its data epochs compute
        down = EpochWriter(tm, f"{namespace}-down{start}", sources=up_tables, sinks=down_tables,
                           catalog=settings, interval_ms=1000, grace_ms=0)
        for writer in (up, down):
            writer.open(leader_timeout=60)
        pairs.append((up, down))
    first = (int(time.time()) + 1) * 1000  # after every downstream job opened: a job's first epoch is after then
    final = first + HISTORY * 1000
    try:
        for epoch in range(first, final + (ahead + 1) * 1000, 1000):
            for up, down in pairs:
                if epoch < final:
                    up.commit_idle(epoch)
                else:
                    up.process(epoch, _one_row, inputs=up.inputs_for(epoch))
                if epoch <= final:  # idle until up publishes at ``final``
                    taken = down.next_barrier()  # the real loop's wait: up's tidemark arrives by its watch
                    assert taken == epoch, (taken, epoch)
                    down.process(epoch, _one_row, inputs=down.inputs_for(epoch))
    finally:
        for up, down in pairs:
            up.close()
            down.close()
    return names, final


def _one_row(ctx) -> None:
    """An epoch's function: one row in each sink (only the data epochs call it; the others are idle)."""
    for sink in ctx.writer.sinks:
        ctx.append(sink, pa.table({"epoch": pa.array([ctx.epoch], pa.int64())}, schema=SCHEMA))


def load_metadata(catalog, names: list[str]) -> None:
    """The baseline of Iceberg-only resolution: load the same tables' metadata, one after another."""
    for name in names:
        catalog.load_table(name)


def resolution(server, settings: CatalogSettings, sizes: list[int], ahead: int) -> None:
    header(f"resolution latency, consistent level, half the tables {ahead} epoch(s) ahead of the other half")
    catalog = settings.load()
    tm = Tidemark.connect(server.connect_string + "/bench-resolve", operation_timeout=120)
    print("watch cache: tidemarks kept fresh by watches; cold: a new Resolver, one pipelined read of the "
          "tidemarks; Iceberg-only: no ZooKeeper, every table's metadata loaded; baseline: loading the same "
          "tables' metadata (pyiceberg load_table, one after another)")
    try:
        for count in sizes:
            start = time.perf_counter()
            names, consistent = build_mixed_lake(tm, settings, catalog, count, f"r{count}", ahead)
            built = time.perf_counter() - start
            cache = tm.tidemark_cache()
            warm_resolver = Resolver(catalog, settings, tm, cache)
            version = warm_resolver.resolve(names)
            if version.epoch != consistent or Resolver(catalog, settings, None).resolve(names) != version:
                raise RuntimeError(f"{count} tables resolved to {version.epoch}, not {consistent} (or Iceberg "
                                   "alone resolved another version)")
            loads = _LoadCount(catalog)
            warm = timed(lambda: warm_resolver.resolve(names), 50)
            warm_loads = loads.pop()
            cold_samples = timed(lambda: Resolver(catalog, settings, tm).resolve(names), 10)
            cold_loads = loads.pop() / len(cold_samples)
            repeat = 3 if count >= 1000 else 5
            iceberg_only = timed(lambda: Resolver(catalog, settings, None).resolve(names), repeat)
            baseline = timed(lambda: load_metadata(catalog, names), repeat)
            cache.close()
            warm_goal, cold_goal = GOALS_MS.get(count, (None, None))
            ratio = statistics.median(iceberg_only) / statistics.median(baseline)
            print(f"{count:>6} tables in {count // TABLES_PER_JOB} jobs (lake built in {built:.0f} s; consistent epoch "
                  f"{version.epoch}; tables' metadata loaded per resolution with ZooKeeper: watch cache "
                  f"{warm_loads / len(warm):g}, cold {cold_loads:g}, to check each job's tidemarks)")
            print(f"  watch cache   {ms(warm)}   {_goal(warm, warm_goal)}")
            print(f"  cold          {ms(cold_samples)}   {_goal(cold_samples, cold_goal)}")
            print(f"  Iceberg-only  {ms(iceberg_only)}")
            print(f"  baseline      {ms(baseline)}   Iceberg-only / baseline = {ratio:.3f} "
                  f"(goal <= {ICEBERG_RATIO_GOAL}): {verdict(ratio <= ICEBERG_RATIO_GOAL)}", flush=True)
    finally:
        tm.close()


class _LoadCount:
    """Counts the tables a catalog loads, from one ``pop`` to the next."""

    def __init__(self, catalog) -> None:
        self.count, self._load = 0, catalog.load_table
        catalog.load_table = self._counted

    def _counted(self, identifier):
        self.count += 1
        return self._load(identifier)

    def pop(self) -> int:
        count, self.count = self.count, 0
        return count


def _goal(samples: list[float], goal_ms: Optional[float]) -> str:
    if goal_ms is None:
        return ""
    return f"(goal <= {goal_ms:g} ms): {verdict(statistics.median(samples) * 1000 <= goal_ms)}"


def publishing(settings: CatalogSettings) -> None:
    header(f"publish latency per table ({settings.describe()})")
    catalog = settings.load()
    catalog.create_namespace_if_not_exists("pub")
    table = catalog.create_table("pub.t", schema=SCHEMA)
    table.append(SCHEMA.empty_table())
    tidemark_samples, plain_samples = [], []
    for k in range(1, 21):
        staged = stage(table, k * 1000)
        start = time.perf_counter()
        publish_staged(table, staged, k * 1000, 1)
        tidemark_samples.append(time.perf_counter() - start)
    baseline = catalog.create_table("pub.plain", schema=SCHEMA)
    baseline.append(SCHEMA.empty_table())
    for k in range(1, 21):
        staged = stage(baseline, k * 1000)
        start = time.perf_counter()
        baseline.manage_snapshots().set_current_snapshot(staged).commit()
        plain_samples.append(time.perf_counter() - start)
    print(f"Tidemark publish_staged (checks + commit):  {ms(tidemark_samples)}")
    print(f"baseline: pyiceberg set_current_snapshot:   {ms(plain_samples)}")

    header("marking an empty epoch")
    empty = catalog.create_table("pub.empty", schema=SCHEMA)
    counter = iter(range(1, 10_000))
    as_property = timed(lambda: advance_committed_epoch(empty, EpochProgress("bench", next(counter) * 1000, 1), 1), 20)
    as_snapshot = timed(lambda: empty.append(SCHEMA.empty_table(), snapshot_properties=summary_properties(
        next(counter) * 1000, "bench", 1)), 20)
    print(f"table property tidemark.committed-epoch (chosen):  {ms(as_property)}")
    print(f"empty snapshot with the epoch in its summary:      {ms(as_snapshot)}")


def epoch_overhead(settings: CatalogSettings, connect: str, rows: int, repeat: int) -> dict[str, float]:
    """A pure-Python writer's epoch (choose the barrier, stage the append, precommit, publish, commit) against
    pyiceberg's plain append of the same Arrow table, interleaved; on a 1 ms grid, so no clock waits."""
    catalog = settings.load()
    catalog.create_namespace_if_not_exists("e")
    schema = pa.schema([pa.field("id", pa.int64()), pa.field("word", pa.string())])
    sink, plain_table = (catalog.create_table(f"e.{kind}{rows}", schema=schema) for kind in ("job", "plain"))
    data = pa.table({"id": pa.array(range(rows), pa.int64()), "word": [str(i % 1000) for i in range(rows)]},
                    schema=schema)
    tm = Tidemark.connect(f"{connect}/overhead-{rows}")
    writer = EpochWriter(tm, f"bench{rows}", sources=[], sinks=[f"e.job{rows}"], catalog=settings, interval_ms=1,
                         grace_ms=0)
    write_s: list[float] = []

    def append(ctx) -> None:
        start = time.perf_counter()
        ctx.append(f"e.job{rows}", data)
        write_s.append(time.perf_counter() - start)

    def epoch() -> None:
        target = writer.next_barrier()  # at once: the clock passed a new 1 ms grid point
        assert target is not None  # None only once the writer is stopped
        writer.process(target, append, inputs=writer.inputs_for(target))
    writer.open()
    try:
        epochs, plain = interleaved(epoch, lambda: plain_table.append(data), EPOCH_WARMUP, repeat)
    finally:
        writer.close()
        tm.close()
    assert sink.refresh().scan().count() == rows * (EPOCH_WARMUP + repeat), "an epoch lost or doubled rows"
    return {"epoch": statistics.median(epochs), "write": statistics.median(write_s[EPOCH_WARMUP:]),
            "plain": statistics.median(plain)}


def epochs(settings: CatalogSettings, connect: str, sizes: list[int], repeat: int, stack: str) -> None:
    header(f"epoch wall time, pure Python ({stack}): Tidemark epoch vs pyiceberg's plain append of the same rows")
    print(f"median of {repeat} each, interleaved, after {EPOCH_WARMUP} warm-up writes; 'staged write' is the "
          "append inside the epoch")
    print(EPOCH_RATIO_HEADER)
    for rows in sizes:
        r = epoch_overhead(settings, connect, rows, repeat)
        print(epoch_ratio_line(rows, r["epoch"], r["write"], r["plain"], PYTHON_EPOCH_RATIO_GOALS.get(rows)),
              flush=True)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench iceberg", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, nargs="+", default=[100, 1000],
                        help="lake sizes to resolve (multiples of 100: pairs of 50-table jobs)")
    parser.add_argument("--ahead", type=int, default=1, help="epochs the upstream half is ahead")
    parser.add_argument("--rows", type=int, nargs="+", default=list(PYTHON_EPOCH_RATIO_GOALS),
                        help="epoch vs plain append: rows per write")
    parser.add_argument("--repeat", type=int, default=7, help="epochs (and plain appends) measured per size")
    parser.add_argument("--stack", choices=STACKS, default="embedded",
                        help="where the tables live: embedded (SQLite, local files) or lakehouse (S3 and a REST "
                             "catalog, SeaweedFS)")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-lake-") as home, zookeeper() as server, \
            bench_lake(Path(home), opts.stack) as settings:
        publishing(settings)
        epochs(settings, server.connect_string, opts.rows, opts.repeat, opts.stack)
        resolution(server, settings, opts.tables, opts.ahead)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
