"""The Iceberg side: resolution latency for 10, 100 and 1,000 tables (cold, with the watch cache, and from
Iceberg metadata alone), publish latency next to a plain pyiceberg ``set_current_snapshot``, and the two
ways to mark an empty epoch (a table-property commit vs an empty snapshot).

    python -m bench iceberg [--tables 10 100 1000]
"""
from __future__ import annotations

import argparse
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

from .common import header, ms, timed, zookeeper

SCHEMA = pa.schema([pa.field("epoch", pa.int64(), nullable=False)])
TABLES_PER_JOB = 50


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


def build_lake(tm: Tidemark, settings: CatalogSettings, catalog, count: int, namespace: str) -> list[str]:
    """``count`` tables, each committed at epoch 1000 (an idle epoch, a barrier of the 1 s grid) by one of
    ``count / 50`` jobs."""
    catalog.create_namespace_if_not_exists(namespace)
    names = [f"{namespace}.t{i:04d}" for i in range(count)]
    for name in names:
        catalog.create_table(name, schema=SCHEMA)
    tm.barriers.ensure_grid(1000)
    for start in range(0, count, TABLES_PER_JOB):
        writer = EpochWriter(tm, f"{namespace}-j{start}", sources=[], sinks=names[start:start + TABLES_PER_JOB],
                             catalog=settings, interval_ms=1000)
        writer.open(leader_timeout=60)
        try:
            writer.commit_idle(1000)  # one ZooKeeper multi, then (the writer's first epoch) every sink's marker
        finally:
            writer.close()
    return names


def resolution(server, settings: CatalogSettings, sizes: list[int]) -> None:
    header("resolution latency (consistent level)")
    catalog = settings.load()
    tm = Tidemark.connect(server.connect_string + "/bench-resolve", operation_timeout=120)
    print("cold: a new resolver reading ZooKeeper; watch cache: tidemarks kept fresh by watches; "
          "Iceberg-only: no ZooKeeper, every table's metadata loaded")
    try:
        for count in sizes:
            start = time.perf_counter()
            names = build_lake(tm, settings, catalog, count, f"r{count}")
            built = time.perf_counter() - start
            cold = timed(lambda: Resolver(catalog, settings, tm).resolve(names), 5)
            cache = tm.tidemark_cache()
            warm_resolver = Resolver(catalog, settings, tm, cache)
            warm_resolver.resolve(names)
            warm = timed(lambda: warm_resolver.resolve(names), 20)
            iceberg_only = timed(lambda: Resolver(catalog, settings, None).resolve(names), 2 if count == 1000 else 5)
            cache.close()
            print(f"{count:>7}  cold          {ms(cold)}")
            print(f"{'':>7}  watch cache   {ms(warm)}")
            print(f"{'':>7}  Iceberg-only  {ms(iceberg_only)}   (lake built in {built:.1f} s)")
    finally:
        tm.close()


def publishing(settings: CatalogSettings) -> None:
    header("publish latency per table (SQLite catalog)")
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


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench iceberg", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tables", type=int, nargs="+", default=[10, 100, 1000], help="lake sizes to resolve")
    opts = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-lake-") as home, zookeeper() as server:
        settings = CatalogSettings.embedded(Path(home))
        publishing(settings)
        resolution(server, settings, opts.tables)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
