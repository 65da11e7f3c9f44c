"""Retention: 10,000 epochs of one job with two sinks (pure-Python ``EpochWriter``), with ``tidemark gc``
running as configured, and the same job without GC as the baseline, interleaved in the same run.

    python -m bench retention [--epochs 10000] [--gc-every 25] [--baseline-budget-s 600] [--max-seconds S]
                              [--policy SPEC]

Each epoch the job overwrites both sinks with one row (state tables, like a MERGE-maintained
``word_counts``: the live data stays the same size, so what grows is history alone, which is
what GC is for). The function's work is the same every epoch; what is timed is the whole
``EpochWriter.process`` (stage, precommit, publish, commit of both sinks). Barriers are on a
simulated 5 s grid and GC's clock follows them, so the policy's windows see 10,000 epochs as
the 14 hours they stand for. Printed: the per-epoch commit time (median of the 25 epochs up to
epochs 100, 1,000, 5,000 and 10,000), the size of a sink's metadata file, its snapshot count
and the number of files in the warehouse, for both lakes. The baseline's commits grow with its
history; it stops when its own time exceeds ``--baseline-budget-s`` (its remaining checkpoints
are then reported as not reached), and ``--max-seconds`` stops the whole run the same way.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pyarrow as pa

from coordinator import CatalogSettings, EpochWriter, Tidemark
from coordinator.history.gc import GarbageCollector
from coordinator.history.retention import RetentionPolicy

from .common import header, zookeeper

SCHEMA = pa.schema([pa.field("epoch", pa.int64(), nullable=False), pa.field("n", pa.int64(), nullable=False)])
INTERVAL_MS = 5000
START = 1_767_225_600_000  # 2026-01-01T00:00Z
CHECKPOINTS = (100, 1000, 5000, 10000)
WINDOW = 25
BENCH_POLICY = "all:5m,hourly:48h,daily:30d,weekly:52w,monthly:24mo"


@dataclass
class Lake:
    """One warehouse with one job writing two sinks; GC runs every ``gc_every`` epochs unless None."""

    label: str
    home: Path
    tm: Tidemark
    gc_every: Optional[int]
    policy: RetentionPolicy
    now: int = START
    samples: dict = field(default_factory=dict)      # epoch number -> seconds of process()
    figures: dict = field(default_factory=dict)      # checkpoint -> (metadata bytes, snapshots, files)
    gc_seconds: list = field(default_factory=list)
    spent: float = 0.0
    stopped_at: Optional[int] = None

    def open(self) -> None:
        self.settings = CatalogSettings.embedded(self.home)
        catalog = self.settings.load()
        catalog.create_namespace_if_not_exists("bench")
        self.sinks = ["bench.totals", "bench.latest"]
        for sink in self.sinks:
            catalog.create_table(sink, schema=SCHEMA).append(SCHEMA.empty_table())
        self.writer = EpochWriter(self.tm, "job", sources=[], sinks=self.sinks, catalog=self.settings,
                                  interval_ms=INTERVAL_MS, grace_ms=0)
        self.writer.open(leader_timeout=60)
        self.collector = GarbageCollector(self.tm, self.settings, policy=self.policy, clock=lambda: self.now)

    def epoch(self, k: int) -> None:
        epoch = START + k * INTERVAL_MS
        self.tm.barriers.agree(epoch, proposed_by="bench")
        rows = pa.table({"epoch": [epoch], "n": [k]}, schema=SCHEMA)

        def step(ctx) -> None:  # the same work every epoch
            for sink in self.sinks:
                ctx.overwrite(sink, rows)
        started = time.perf_counter()
        self.writer.process(epoch, step)
        self.samples[k] = time.perf_counter() - started
        self.spent += self.samples[k]
        self.now = epoch + 1
        if self.gc_every and k % self.gc_every == 0:
            started = time.perf_counter()
            self.collector.run()
            self.gc_seconds.append(time.perf_counter() - started)
        if k in CHECKPOINTS:
            table = self.writer.table(self.sinks[0])
            table.refresh()
            size = os.path.getsize(table.metadata_location.replace("file://", ""))
            files = sum(len(names) for _, _, names in os.walk(self.home / "warehouse"))
            self.figures[k] = (size, len(table.snapshots()), files)

    def commit_time(self, checkpoint: int) -> Optional[float]:
        window = [self.samples[k] for k in range(checkpoint - WINDOW + 1, checkpoint + 1) if k in self.samples]
        return statistics.median(window) if len(window) == WINDOW else None

    def close(self) -> None:
        self.writer.close()


def _row(lake: Lake, checkpoint: int) -> str:
    cost = lake.commit_time(checkpoint)
    if cost is None:
        return (f"  {lake.label:<11} {checkpoint:>6}  not reached (stopped at epoch {lake.stopped_at} after "
                f"{lake.spent:.0f} s of commits)")
    size, snapshots, files = lake.figures[checkpoint]
    return (f"  {lake.label:<11} {checkpoint:>6}  commit {cost * 1000:8.1f} ms/epoch   metadata {size / 1024:9.1f} KiB"
            f"   {snapshots:>6} snapshots   {files:>7} warehouse files")


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench retention")
    parser.add_argument("--epochs", type=int, default=10000)
    parser.add_argument("--gc-every", type=int, default=25, help="epochs between GC runs")
    parser.add_argument("--baseline-budget-s", type=float, default=600.0,
                        help="seconds of commits after which the baseline (no GC) stops")
    parser.add_argument("--max-seconds", type=float, help="stop the whole run after this many seconds")
    parser.add_argument("--policy", default=BENCH_POLICY)
    args = parser.parse_args(argv)
    policy = RetentionPolicy.parse(args.policy)
    header(f"retention: {args.epochs} epochs of one job with two overwritten sinks, GC every {args.gc_every} "
           f"epochs (policy {policy.to_text()}), baseline without GC in the same run")
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-retention-") as home, zookeeper() as server:
        lakes = []
        for label, gc_every in (("with GC", args.gc_every), ("without GC", None)):
            tm = Tidemark.connect(f"{server.connect_string}/{label.replace(' ', '-')}", operation_timeout=120)
            lake = Lake(label, Path(home) / label.replace(" ", "-"), tm, gc_every, policy)
            lake.open()
            lakes.append(lake)
        with_gc, baseline = lakes
        started = time.perf_counter()
        for k in range(1, args.epochs + 1):
            with_gc.epoch(k)
            if baseline.stopped_at is None:
                baseline.epoch(k)
                if baseline.spent > args.baseline_budget_s:
                    baseline.stopped_at = k
            if k % max(1, min(1000, args.epochs // 5)) == 0:
                print(f"  ... epoch {k}: {time.perf_counter() - started:.0f} s", flush=True)
            if args.max_seconds is not None and time.perf_counter() - started > args.max_seconds:
                with_gc.stopped_at = k
                baseline.stopped_at = baseline.stopped_at or k
                print(f"  stopped at epoch {k}: --max-seconds {args.max_seconds:.0f} reached", flush=True)
                break
        print("per-epoch commit time = median of the 25 epochs up to the checkpoint; metadata and snapshots of "
              "one sink; files of the whole warehouse (both sinks)")
        for checkpoint in CHECKPOINTS:
            if checkpoint <= args.epochs:
                for lake in lakes:
                    print(_row(lake, checkpoint))
        reached = [c for c in CHECKPOINTS if with_gc.commit_time(c) is not None]
        if len(reached) > 1:
            ratio = with_gc.commit_time(reached[-1]) / with_gc.commit_time(reached[0])  # type: ignore[operator]
            print(f"with GC: cost at epoch {reached[-1]} / cost at epoch {reached[0]} = {ratio:.2f} (goal at 10000: "
                  f"<= 1.2; {'met' if ratio <= 1.2 else 'MISSED'} at {reached[-1]})")
        if with_gc.gc_seconds:
            print(f"GC runs: {len(with_gc.gc_seconds)}, median {statistics.median(with_gc.gc_seconds) * 1000:.0f} ms, "
                  f"max {max(with_gc.gc_seconds) * 1000:.0f} ms")
        for lake in lakes:
            lake.close()
            lake.tm.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
