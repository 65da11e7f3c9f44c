"""``make demo``: FLIP-276's word-count cascade, for real, and a reader that checks every consistent version.

    words (root table, appended by a producer outside Tidemark)
      -> job "word_counts":     word_counts(word, cnt)       MERGE by word of each epoch's new words
      -> job "count_histogram": count_histogram(cnt, num_words)  recomputed from word_counts as of T

The two jobs run as separate Spark driver processes on a shared barrier grid. While they
run, a reader resolves consistent versions and checks at every one that word_counts is
``GROUP BY word`` over words and count_histogram is ``GROUP BY cnt`` over word_counts,
and shows what naive reads of each table's latest snapshot would have got.

    python -m spark_hooks.demo [--seconds 45] [--interval-ms 3000] [--home DIR]
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

WORDS_TABLE, COUNTS_TABLE, HIST_TABLE = "lake.demo.words", "lake.demo.word_counts", "lake.demo.count_histogram"
VOCABULARY = ["tide", "mark", "epoch", "barrier", "iceberg", "spark", "zoo", "keeper", "snapshot", "commit",
              "leader", "term", "fence", "stage", "publish", "reader", "version", "table"]


def run_job(args) -> int:
    """One driver process: the word_counts or the count_histogram job, until barrier ``--until``."""
    from coordinator import CatalogSettings, Tidemark
    from spark_hooks import EpochJob, build_spark_session

    settings = CatalogSettings.embedded(Path(args.home))
    spark = build_spark_session(settings, app_name=f"tidemark-demo-{args.job}",
                                extra_conf={"spark.ui.enabled": "false", "spark.driver.memory": "1g"})
    tm = Tidemark.connect(args.zk)
    if args.job == "word_counts":
        job = EpochJob(spark, tm, "word_counts", sources=[WORDS_TABLE], sinks=[COUNTS_TABLE], catalog=settings,
                       interval_ms=args.interval_ms, grace_ms=500)

        @job.epoch
        def count_words(ctx):
            delta = ctx.changes(WORDS_TABLE).groupBy("word").count().withColumnRenamed("count", "cnt")
            ctx.merge(COUNTS_TABLE, delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")
    else:
        job = EpochJob(spark, tm, "count_histogram", sources=[COUNTS_TABLE], sinks=[HIST_TABLE], catalog=settings,
                       interval_ms=args.interval_ms)

        @job.epoch
        def histogram(ctx):
            counts = ctx.table(COUNTS_TABLE)
            ctx.overwrite(HIST_TABLE, counts.groupBy("cnt").count().withColumnRenamed("count", "num_words"))
    committed = job.run(until=args.until)
    print(json.dumps({"job": args.job, "committed": committed}), flush=True)
    tm.close()
    spark.stop()
    return 0


def create_tables(catalog) -> None:
    import pyarrow as pa
    catalog.create_namespace_if_not_exists("demo")
    catalog.create_table("demo.words", schema=pa.schema([pa.field("word", pa.string())]))
    catalog.create_table("demo.word_counts", schema=pa.schema([pa.field("word", pa.string()),
                                                                pa.field("cnt", pa.int64())]))
    catalog.create_table("demo.count_histogram", schema=pa.schema([pa.field("cnt", pa.int64()),
                                                                   pa.field("num_words", pa.int64())]))


def check(frames: dict) -> Optional[str]:
    """None when the three tables are mutually consistent, else what is wrong."""
    words = Counter(frames[WORDS_TABLE].column("word").to_pylist())
    counts = dict(zip(frames[COUNTS_TABLE].column("word").to_pylist(), frames[COUNTS_TABLE].column("cnt").to_pylist()))
    hist = dict(zip(frames[HIST_TABLE].column("cnt").to_pylist(), frames[HIST_TABLE].column("num_words").to_pylist()))
    if counts != dict(words):
        return f"word_counts has {sum(counts.values())} words, words has {sum(words.values())}"
    if hist != dict(Counter(counts.values())):
        return f"count_histogram covers {sum(hist.values())} words, word_counts has {len(counts)}"
    return None


def percentile(values: list[int], q: float) -> Optional[int]:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class DemoReport:
    home: Path
    final_barrier: int
    committed: dict
    produced: Counter
    checked: int
    failures: list
    naive_total: int
    naive_bad: int
    freshness_ms: list
    final_epoch: Optional[int]
    final_problem: Optional[str]
    exactly_once: bool

    @property
    def passed(self) -> bool:
        return (not self.failures and self.final_problem is None and self.exactly_once
                and self.final_epoch == self.final_barrier and self.checked > 0)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_hooks.demo")
    parser.add_argument("--seconds", type=float, default=45.0, help="how long the producer writes words")
    parser.add_argument("--interval-ms", type=int, default=3000, help="the shared barrier interval")
    parser.add_argument("--home", help="data directory (default: a fresh temporary one)")
    parser.add_argument("--job", choices=["word_counts", "count_histogram"], help=argparse.SUPPRESS)
    parser.add_argument("--zk", help=argparse.SUPPRESS)
    parser.add_argument("--until", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # reconnection chatter; outcomes are reported below
    if args.job:
        return run_job(args)
    report = run_demo(args.seconds, args.interval_ms, Path(args.home) if args.home else None, verbose=True)
    print_report(report)
    return 0 if report.passed else 1


def run_demo(seconds: float, interval_ms: int, home: Optional[Path] = None, verbose: bool = False) -> DemoReport:
    """Run the cascade for ``seconds`` on a fresh data directory and check it; returns the figures."""
    from coordinator import CatalogSettings, EmbeddedZooKeeper, Tidemark, TidemarkError
    from coordinator.resolve import Resolver, read_arrow
    from coordinator.zookeeper_server import free_port

    home = home or Path(tempfile.mkdtemp(prefix="tidemark-demo-"))
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    settings = CatalogSettings.embedded(home)
    catalog = settings.load()
    create_tables(catalog)
    say = print if verbose else (lambda *a, **k: None)
    say(f"demo: data in {home}")
    with EmbeddedZooKeeper(port=free_port(), data_dir=home / "zookeeper") as zk:
        say(f"demo: ZooKeeper serving on {zk.connect_string}")
        tm = Tidemark.connect(zk.connect_string)
        interval = interval_ms
        start = int(time.time() * 1000)
        until = (start + int(seconds * 1000)) // interval * interval + interval
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        drivers = {name: subprocess.Popen([sys.executable, "-m", "spark_hooks.demo", "--job", name, "--zk",
                                           zk.connect_string, "--home", str(home), "--until", str(until),
                                           "--interval-ms", str(interval)],
                                          stdout=subprocess.PIPE, stderr=open(home / f"{name}.log", "w"), env=env,
                                          text=True)
                   for name in ("word_counts", "count_histogram")}
        say(f"demo: 2 driver processes started, barrier every {interval} ms, producing words for "
            f"{seconds:.0f} s, final barrier {until}")

        produced = Counter()
        stop_producing = threading.Event()
        words_table = catalog.load_table("demo.words")

        def produce() -> None:
            import pyarrow as pa
            rng = random.Random(7)
            while not stop_producing.wait(0.4):
                if int(time.time() * 1000) >= until - interval:  # the last barrier then holds every word
                    return
                batch = [rng.choice(VOCABULARY) for _ in range(rng.randint(1, 12))]
                words_table.append(pa.table({"word": batch}))
                produced.update(batch)
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()

        checked, failures, naive_bad, naive_total, freshness = 0, [], 0, 0, []
        last_epoch = None
        resolver = Resolver(catalog, settings, tm, tm.tidemark_cache())
        grid = tm.barriers.ensure_grid(interval)
        try:
            while any(d.poll() is None for d in drivers.values()):
                time.sleep(0.5)
                try:
                    version = resolver.resolve([WORDS_TABLE, COUNTS_TABLE, HIST_TABLE])
                except TidemarkError:
                    continue  # no epoch committed by both jobs yet
                if version.epoch is None:
                    continue  # the jobs have not registered their tables yet
                # freshness: how far the consistent epoch trails the newest barrier the clock has passed
                freshness.append(grid.floor(int(time.time() * 1000)) - version.epoch)
                if version.epoch != last_epoch:
                    last_epoch = version.epoch
                    problem = check(read_arrow(resolver, version))
                    checked += 1
                    if problem:
                        failures.append((version.epoch, problem))
                    say(f"  consistent epoch {version.epoch}: {'OK' if not problem else 'INCONSISTENT: ' + problem}")
                naive = resolver.resolve([WORDS_TABLE, COUNTS_TABLE, HIST_TABLE], level="latest")
                naive_total += 1
                naive_bad += check(read_arrow(resolver, naive)) is not None
        finally:
            stop_producing.set()
            for driver in drivers.values():
                if driver.poll() is None:
                    driver.send_signal(signal.SIGTERM)
            results = {name: d.communicate(timeout=300)[0] for name, d in drivers.items()}
        final = resolver.resolve([WORDS_TABLE, COUNTS_TABLE, HIST_TABLE])
        frames = read_arrow(resolver, final)
        final_problem = check(frames)
        counted = dict(zip(frames[COUNTS_TABLE].column("word").to_pylist(),
                           frames[COUNTS_TABLE].column("cnt").to_pylist()))
        exactly_once = counted == dict(produced)
        tm.close()

    committed = {}
    for name, out in results.items():
        lines = [line for line in out.splitlines() if line.startswith("{")]
        committed[name] = json.loads(lines[-1])["committed"] if lines else []
    return DemoReport(home, until, committed, produced, checked, failures, naive_total, naive_bad, freshness,
                      final.epoch, final_problem, exactly_once)


def print_report(report: DemoReport) -> None:
    print("\n=== Tidemark demo report ===")
    for name, epochs in report.committed.items():
        print(f"job {name}: {len(epochs)} epochs committed"
              + (f" ({epochs[0]} .. {epochs[-1]})" if epochs else f" (see {report.home / (name + '.log')})"))
    print(f"words produced: {sum(report.produced.values())} in {len(report.produced)} distinct words")
    print(f"consistent versions checked while running: {report.checked}, inconsistent: {len(report.failures)}")
    for epoch, problem in report.failures:
        print(f"  epoch {epoch}: {problem}")
    print(f"naive latest-snapshot reads: {report.naive_total}, of which inconsistent: {report.naive_bad}")
    p50, p95 = percentile(report.freshness_ms, 0.5), percentile(report.freshness_ms, 0.95)
    print(f"freshness (newest barrier - consistent epoch): p50 {p50} ms, p95 {p95} ms")
    print(f"final consistent epoch {report.final_epoch} (final barrier {report.final_barrier}): "
          f"{'consistent' if report.final_problem is None else report.final_problem}; every produced word counted "
          f"exactly once: {report.exactly_once}")
    print("RESULT:", "PASS" if report.passed else "FAIL")


if __name__ == "__main__":
    sys.exit(main())
