"""A three-job cascade against the wall clock: freshness, overload (coalescing) and catch-up after a pause.

    producer (plain pyiceberg appends to the root table ``events`` every ~250 ms, outside Tidemark)
      -> job "ingest"     (root job):  clean    = each epoch's new events, tagged with the epoch
      -> job "aggregate":              by_key   = count and sum of value per key (incremental)
      -> job "summary":                totals   = one row per epoch: keys, count and sum over by_key

Each job is its own driver process (``python -m bench.pipeline --driver NAME``), with
``EpochWriter`` and pyarrow (``--engine python``) or ``EpochJob`` and a SparkSession
(``--engine spark``). They share a private ZooKeeper and a private SQLite catalog. The
bench samples ``now - T*`` every 200 ms, ``T*`` being the consistent epoch of the three
sinks and the root table (``held_epochs.newest_common_epoch`` of the sinks' tidemarks: the newest
epoch all three hold; a root table does not hold it back), and checks the final consistent
version (every event counted exactly once).

A job's next epoch is the newest barrier its sources all hold, so a slow job coalesces
(``overload``: no backpressure, nothing queues) and a job back from a pause catches up in one
epoch (``catchup``; with ``--engine spark`` this is the Spark catch-up).

    python -m bench pipeline [--engine python|spark] [--scenario freshness|overload|catchup|readers]
                             [--minutes 3] [--interval-ms 5000] [--pause 300] [--readers 200 --read-every 5]

``readers`` (only when named): the cascade alone, then beside ``--readers`` readers (threads in 4
processes) that each resolve the three sinks' consistent version and read ``totals`` at it every
``--read-every`` seconds, with the watch cache and then without. Prints the writers' lag, the
readers' resolution latency and ZooKeeper's requests per second of each run. Goals: the writers'
lag p95 within 1.2x of the run without readers; resolution p95 under 50 ms with the watch cache.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from .common import (
    STACKS,
    bench_catalog,
    bench_lake,
    header,
    log_each_epoch,
    percentile,
    remove_run_dir,
    run_until_stopped,
    stop_drivers,
    verdict,
    zookeeper,
)

ROOT, CLEAN, BY_KEY, TOTALS = "lake.p.events", "lake.p.clean", "lake.p.by_key", "lake.p.totals"
SINKS = (CLEAN, BY_KEY, TOTALS)
JOBS = {"ingest": ((ROOT,), (CLEAN,)), "aggregate": ((CLEAN,), (BY_KEY,)), "summary": ((BY_KEY,), (TOTALS,))}
ORDER = ("ingest", "aggregate", "summary")
KEYS = 100
SAMPLE_EVERY_S = 0.2
FRESHNESS_RATIO_GOAL = 1.2  # the lakehouse's freshness p50 against the embedded stack's, in the same run
SETTLE_S = 30.0  # freshness also reported without the first seconds (drivers still draining their start-up)
READER_PROCESSES = 4  # the readers scenario's processes, each with readers / 4 threads
READERS_LAG_GOAL = 1.2  # the writers' lag p95 with readers against without, in the same run
READERS_RESOLVE_GOAL_MS = 50.0  # resolution p95 with the watch cache
REPO = Path(__file__).resolve().parent.parent


def schemas():
    import pyarrow as pa
    events = [pa.field("id", pa.int64()), pa.field("key", pa.string()), pa.field("value", pa.int64()),
              pa.field("ts", pa.int64())]
    return {ROOT: pa.schema(events), CLEAN: pa.schema([*events, pa.field("epoch", pa.int64())]),
            BY_KEY: pa.schema([pa.field("key", pa.string()), pa.field("cnt", pa.int64()),
                               pa.field("total", pa.int64())]),
            TOTALS: pa.schema([pa.field("epoch", pa.int64()), pa.field("keys", pa.int64()),
                               pa.field("cnt", pa.int64()), pa.field("total", pa.int64())])}


# -- the jobs' functions ----------------------------------------------------------------------------

def python_functions() -> dict[str, Callable]:
    import pyarrow as pa
    import pyarrow.compute as pc
    schema = schemas()

    def ingest(ctx) -> None:
        new = ctx.changes(ROOT)
        new = pa.table({**{c: new[c] for c in ("id", "key", "value", "ts")},
                        "epoch": pa.array([ctx.epoch] * new.num_rows, pa.int64())})
        ctx.append(CLEAN, new.cast(schema[CLEAN]))

    def aggregate(ctx) -> None:
        grouped = ctx.changes(CLEAN).group_by("key").aggregate([("value", "count"), ("value", "sum")])
        delta = pa.table({"key": grouped["key"], "cnt": grouped["value_count"],
                          "total": grouped["value_sum"]}).cast(schema[BY_KEY])
        sink = ctx.writer.table(BY_KEY)
        sink.refresh()  # main holds the previous epoch's committed state until this epoch publishes
        current = sink.scan().to_arrow().select(["key", "cnt", "total"]).cast(schema[BY_KEY])
        merged = pa.concat_tables([current, delta]).group_by("key").aggregate([("cnt", "sum"), ("total", "sum")])
        ctx.overwrite(BY_KEY, pa.table({"key": merged["key"], "cnt": merged["cnt_sum"],
                                        "total": merged["total_sum"]}).cast(schema[BY_KEY]))

    def summary(ctx) -> None:
        by_key = ctx.table(BY_KEY)
        row = {"epoch": [ctx.epoch], "keys": [by_key.num_rows], "cnt": [pc.sum(by_key["cnt"]).as_py() or 0],
               "total": [pc.sum(by_key["total"]).as_py() or 0]}
        ctx.append(TOTALS, pa.table(row, schema=schema[TOTALS]))

    return {"ingest": ingest, "aggregate": aggregate, "summary": summary}


def spark_functions() -> dict[str, Callable]:
    from pyspark.sql import functions as F

    def ingest(ctx) -> None:
        new = ctx.changes(ROOT).select("id", "key", "value", "ts", F.lit(ctx.epoch).cast("bigint").alias("epoch"))
        ctx.append(CLEAN, new)

    def aggregate(ctx) -> None:
        delta = ctx.changes(CLEAN).groupBy("key").agg(F.count(F.lit(1)).alias("cnt"), F.sum("value").alias("total"))
        ctx.merge(BY_KEY, delta, on=["key"], matched="t.cnt = t.cnt + s.cnt, t.total = t.total + s.total")

    def summary(ctx) -> None:
        row = ctx.table(BY_KEY).agg(F.lit(ctx.epoch).cast("bigint").alias("epoch"), F.count(F.lit(1)).alias("keys"),
                                    F.coalesce(F.sum("cnt"), F.lit(0)).cast("bigint").alias("cnt"),
                                    F.coalesce(F.sum("total"), F.lit(0)).cast("bigint").alias("total"))
        ctx.append(TOTALS, row)

    return {"ingest": ingest, "aggregate": aggregate, "summary": summary}


# -- the processes: one driver per job, and the producer ----------------------------------------------

def run_driver(args) -> int:
    """One job's driver: run epochs until SIGTERM; one JSON line per committed epoch into ``--events``."""
    from coordinator import EpochWriter, Tidemark

    settings = bench_catalog(Path(args.home))
    tm = Tidemark.connect(args.zk)
    sources, sinks = JOBS[args.driver]
    options = dict(sources=sources, sinks=sinks, catalog=settings, interval_ms=args.interval_ms,
                   grace_ms=args.grace_ms)
    spark = None
    if args.engine == "spark":
        from spark_hooks import EpochJob, build_spark_session
        spark = build_spark_session(settings, app_name=f"tidemark-bench-{args.driver}", master="local[1]",
                                    extra_conf={"spark.ui.enabled": "false", "spark.driver.memory": "768m",
                                                "spark.sql.shuffle.partitions": "1"})  # 100 keys, one core
        job = EpochJob(spark, tm, args.driver, **options)
        writer, function = job.writer, spark_functions()[args.driver]
    else:
        writer, function = EpochWriter(tm, args.driver, **options), python_functions()[args.driver]
    ran: set[int] = set()

    def step(ctx) -> None:
        ran.add(ctx.epoch)
        function(ctx)
        if args.sleep_s:
            time.sleep(args.sleep_s)  # the overloaded job: each epoch takes longer than the interval

    events = open(args.events, "a", buffering=1)  # noqa: SIM115 - written by every epoch until the driver exits
    log_each_epoch(writer, ran, events)
    if spark is not None:
        job.epoch(step)
        committed = job.run()
    else:
        committed = writer.run(step)
    events.close()
    print(json.dumps({"job": args.driver, "committed": len(committed)}), flush=True)
    tm.close()
    if spark is not None:
        spark.stop()
    return 0


def run_producer(args) -> int:
    """Append ``--rows`` random events to the root table every ``--every`` seconds until SIGTERM."""
    import pyarrow as pa

    from coordinator.records import now_ms

    table = bench_catalog(Path(args.home)).load().load_table("p.events")
    schema = schemas()[ROOT]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    rng = random.Random(11)
    next_id, due = 0, time.monotonic()
    while not stop.is_set():
        ids = list(range(next_id, next_id + args.rows))
        table.append(pa.table({"id": ids, "key": [f"k{rng.randrange(KEYS):03d}" for _ in ids],
                               "value": [rng.randrange(1000) for _ in ids], "ts": [now_ms()] * len(ids)},
                              schema=schema))
        next_id += args.rows
        due += args.every
        stop.wait(max(0.0, due - time.monotonic()))
        due = max(due, time.monotonic() - args.every)  # after a slow append, do not burst to catch up
    return 0


# -- the bench side -----------------------------------------------------------------------------------

class Cascade:
    """The producer and the three drivers of one scenario, on a fresh catalog and a ZooKeeper chroot."""

    def __init__(self, opts, zk_connect: str, name: str, slow: Optional[str] = None,
                 stack: Optional[str] = None) -> None:
        from coordinator import Tidemark
        self.opts, self.name, self.slow = opts, name, slow
        self.home = Path(tempfile.mkdtemp(prefix=f"tidemark-bench-pipeline-{name}-"))
        self.stack = stack or opts.stack[0]
        self.zk = f"{zk_connect}/{name}-{self.stack}"
        self._servers = contextlib.ExitStack()  # the lakehouse's server, when the stack has one
        self.settings = self._servers.enter_context(bench_lake(self.home, self.stack))
        self.catalog = self.settings.load()
        self.catalog.create_namespace("p")
        for table, schema in schemas().items():
            properties = {"commit.manifest-merge.enabled": "true"} if table == ROOT else {}  # Java's default
            self.catalog.create_table(self.settings.identifier(table), schema=schema, properties=properties)
        self.tm = Tidemark.connect(self.zk)
        for job in ORDER:  # before any driver opens: each one then knows which of its sources are managed
            sources, sinks = JOBS[job]
            self.tm.register_job(job, sources=sources, sinks=sinks)
        self.cache = self.tm.tidemark_cache()
        self.producer: Optional[subprocess.Popen] = None
        self.drivers: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1",
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    def _spawn(self, argv: list[str], log: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "bench.pipeline", *argv], cwd=REPO, env=self.env,
                                stdout=subprocess.DEVNULL, stderr=open(self.home / log, "a"), start_new_session=True)

    def start_producer(self) -> None:
        self.producer = self._spawn(["--producer", "--home", str(self.home), "--rows", str(self.opts.rows),
                                     "--every", str(self.opts.every)], "producer.log")

    def start_drivers(self, jobs: tuple[str, ...] = ORDER) -> float:
        """Start the drivers of ``jobs``; returns the wall time (s) they were started."""
        started = time.time()
        for job in jobs:
            sleep_s = 1.5 * self.opts.interval_ms / 1000 if job == self.slow else 0.0
            self.drivers[job] = self._spawn(
                ["--driver", job, "--engine", self.opts.engine, "--zk", self.zk, "--home", str(self.home),
                 "--interval-ms", str(self.opts.interval_ms), "--grace-ms", str(self.opts.grace_ms),
                 "--sleep-s", str(sleep_s),
                 "--events", str(self.home / f"epochs-{job}.jsonl")], f"{job}.log")
        return started

    def stop_drivers(self, jobs: tuple[str, ...] = ORDER, timeout: float = 300) -> float:
        """SIGTERM the drivers of ``jobs`` (each finishes its epoch) and wait for them; returns the wall time they
        all ended."""
        stop_drivers({job: self.drivers.pop(job) for job in jobs if job in self.drivers}, timeout, self.tail)
        return time.time()

    def tail(self, job: str, lines: int = 25) -> str:
        text = (self.home / f"{job}.log").read_text(errors="replace").splitlines()
        return "\n".join("    " + line for line in text[-lines:])

    def check_alive(self) -> None:
        for job, proc in self.drivers.items():
            if proc.poll() is not None:
                raise RuntimeError(f"driver {job} exited with {proc.returncode}:\n{self.tail(job)}")
        if self.producer is not None and self.producer.poll() is not None:
            raise RuntimeError(f"the producer exited with {self.producer.returncode}:\n{self.tail('producer')}")

    def marks(self) -> dict[str, Optional[int]]:
        return {t: (m.epoch if m is not None else None) for t, m in self.cache.get(SINKS).items()}

    def consistent(self, tables=SINKS) -> Optional[int]:
        """The newest epoch every one of ``tables`` holds (None while they share none)."""
        from coordinator.protocol.held_epochs import newest_common_epoch
        return newest_common_epoch(self.cache.get(tables).values())

    def lag_ms(self, tables=SINKS) -> Optional[int]:
        """``now - T*`` over ``tables`` (None while they share no committed epoch)."""
        from coordinator.records import now_ms
        epoch = self.consistent(tables)
        return None if epoch is None else now_ms() - epoch

    def wait_consistent(self, timeout: float = 600) -> float:
        """Wait until every sink has a committed epoch; returns the wall time it happened."""
        deadline = time.monotonic() + timeout
        while self.lag_ms() is None:
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"no consistent epoch after {timeout:.0f} s: {self.marks()}")
            time.sleep(SAMPLE_EVERY_S)
        return time.time()

    def sample(self, seconds: float,
               until: Optional[Callable[[float], bool]] = None) -> list[tuple[float, float, float]]:
        """``(wall s, lag s, ingest-only lag s)`` every 200 ms for ``seconds`` (or until ``until(lag)``)."""
        samples: list[tuple[float, float, float]] = []
        due = time.monotonic()
        end = due + seconds
        while time.monotonic() < end:
            self.check_alive()
            lag, first = self.lag_ms(), self.lag_ms((CLEAN,))
            if lag is not None and first is not None:
                samples.append((time.time(), lag / 1000, first / 1000))
                if until is not None and until(lag / 1000):
                    break
            due += SAMPLE_EVERY_S
            time.sleep(max(0.0, due - time.monotonic()))
        return samples

    def epochs(self, job: str) -> list[dict]:
        path = self.home / f"epochs-{job}.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def committed(self, job: str, start_s: float, end_s: float) -> list[int]:
        """The epochs ``job`` committed between ``start_s`` and ``end_s`` (wall seconds)."""
        return [e["epoch"] for e in self.epochs(job) if start_s * 1000 <= e["end_ms"] <= end_s * 1000]

    def producer_rate(self, start_s: float, end_s: float) -> str:
        """How often the producer really appended (it cannot go faster than one commit at a time)."""
        stamps = [s.timestamp_ms for s in self.catalog.load_table("p.events").snapshots()
                  if start_s * 1000 <= s.timestamp_ms <= end_s * 1000]
        every = (end_s - start_s) / len(stamps) * 1000 if stamps else float("nan")
        return f"producer: {len(stamps)} appends of {self.opts.rows} rows, one every {every:.0f} ms " \
               f"(target {self.opts.every * 1000:.0f} ms)"

    def check(self) -> str:
        """The final consistent version: every event counted exactly once by all three jobs?"""
        import pyarrow.compute as pc

        from coordinator.history.resolve import Resolver, read_arrow
        resolver = Resolver(self.catalog, self.settings, self.tm)
        version = resolver.resolve([ROOT, *SINKS])
        frames = read_arrow(resolver, version)
        events, clean, by_key, totals = (frames[t] for t in (ROOT, *SINKS))

        def total(table, column: str) -> int:
            return pc.sum(table[column]).as_py() or 0
        problems = []
        if sorted(clean["id"].to_pylist()) != sorted(events["id"].to_pylist()):
            problems.append(f"clean has {clean.num_rows} rows, events at T* {events.num_rows}")
        if (total(by_key, "cnt"), total(by_key, "total")) != (clean.num_rows, total(clean, "value")):
            problems.append(f"by_key counts {total(by_key, 'cnt')} events, clean has {clean.num_rows}")
        if totals.num_rows:
            last = totals.sort_by([("epoch", "descending")]).slice(0, 1).to_pylist()[0]
            if (last["keys"], last["cnt"], last["total"]) != (by_key.num_rows, total(by_key, "cnt"),
                                                               total(by_key, "total")):
                problems.append(f"totals' last row {last} does not match by_key")
        verdict = "OK" if not problems else "INCONSISTENT: " + "; ".join(problems)
        return f"final consistent epoch {version.epoch}: {events.num_rows} events, exactly once: {verdict}"

    def close(self) -> None:
        for proc in self.drivers.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.producer is not None and self.producer.poll() is None:
            self.producer.send_signal(signal.SIGTERM)
            try:
                self.producer.wait(30)
            except subprocess.TimeoutExpired:
                self.producer.kill()
                self.producer.wait()
        self.cache.close()
        self.tm.close()
        self._servers.close()
        remove_run_dir(self.home)

    def __enter__(self) -> Cascade:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def epoch_counts(cascade: Cascade, start_s: float, end_s: float) -> str:
    parts = []
    for job in ORDER:
        done = [e for e in cascade.epochs(job) if start_s * 1000 <= e["end_ms"] <= end_s * 1000]
        idle = sum(not e["ran"] for e in done)
        parts.append(f"{job} {len(done)} ({idle} idle)")
    return ", ".join(parts)


def phase_means(cascade: Cascade, start_s: float, end_s: float) -> str:
    """Where each job's computed epochs spent their time, between ``start_s`` and ``end_s``: the mean ms per
    phase of the loop (``wait`` is the wait before the epoch, for its barrier and its inputs)."""
    from coordinator.job.driver_metrics import PHASES
    lines = ["mean ms per computed epoch, by phase: " + " ".join(f"{p:>9}" for p in PHASES)]
    for job in ORDER:
        ran = [e["phases_ms"] for e in cascade.epochs(job)
               if e["ran"] and start_s * 1000 <= e["end_ms"] <= end_s * 1000]
        if ran:
            lines.append(f"  {job:<36}" + " ".join(f"{sum(e[p] for e in ran) / len(ran):9.1f}" for p in PHASES))
    return "\n".join(lines)


def mean_gap_s(epochs: list[int]) -> float:
    """The mean time between consecutive epochs (one grid interval when a job takes every barrier)."""
    return (epochs[-1] - epochs[0]) / (len(epochs) - 1) / 1000 if len(epochs) > 1 else float("nan")


def freshness(opts, server) -> None:
    """Freshness on each ``--stack`` in turn; with more than one, each one's p50 and p95 against the first's."""
    lags = {stack: freshness_on(opts, server.connect_string, stack) for stack in opts.stack}
    if len(lags) > 1:
        first, baseline = next(iter(lags.items()))
        header(f"freshness by stack, baseline {first} (same run)")
        for stack, (p50, p95) in lags.items():
            print(f"  {stack:<10} p50 {p50:6.2f} s ({p50 / baseline[0]:.2f}x)  p95 {p95:6.2f} s "
                  f"({p95 / baseline[1]:.2f}x)  goal p50 <= {FRESHNESS_RATIO_GOAL:g}x {first}'s: "
                  f"{verdict(p50 <= FRESHNESS_RATIO_GOAL * baseline[0])}")


def freshness_on(opts, zk: str, stack: str) -> tuple[float, float]:
    """One freshness run on ``stack``; returns the cascade's lag p50 and p95 (s)."""
    interval_s = opts.interval_ms / 1000
    header(f"freshness ({opts.engine} engine, {stack}): producer -> ingest -> aggregate -> summary, "
           f"{opts.interval_ms} ms barriers, {opts.minutes:g} min")
    with Cascade(opts, zk, "freshness", stack=stack) as cascade:
        cascade.start_producer()
        started = cascade.start_drivers()
        first = cascade.wait_consistent()
        print(f"first consistent epoch {first - started:.1f} s after the drivers started (not sampled)")
        samples = cascade.sample(opts.minutes * 60)
        end = time.time()
        cascade.stop_drivers()
        lags, ingest_lags = [s[1] for s in samples], [s[2] for s in samples]
        grace_s = opts.grace_ms / 1000
        floor = [((s[0] - grace_s) % interval_s) + grace_s for s in samples]  # now - the newest agreeable barrier
        p50, p95 = percentile(lags, 0.5), percentile(lags, 0.95)
        print(f"lag now - T* (T* = consistent epoch of the 3 sinks + root), {len(lags)} samples every 200 ms:")
        print(f"  cascade (3 jobs):               p50 {p50:6.2f} s  p95 {p95:6.2f} s  max {max(lags):6.2f} s")
        settled = [s[1] for s in samples if s[0] >= samples[0][0] + SETTLE_S]
        if settled:
            print(f"  cascade, after the first {SETTLE_S:.0f} s: p50 {percentile(settled, 0.5):6.2f} s  "
                  f"p95 {percentile(settled, 0.95):6.2f} s  max {max(settled):6.2f} s  (start-up backlog drained)")
        print(f"  baseline, ingest job alone:     p50 {percentile(ingest_lags, 0.5):6.2f} s  "
              f"p95 {percentile(ingest_lags, 0.95):6.2f} s  max {max(ingest_lags):6.2f} s")
        print(f"  baseline, zero-cost jobs:       p50 {percentile(floor, 0.5):6.2f} s  "
              f"p95 {percentile(floor, 0.95):6.2f} s  (now - newest grid point <= now - grace)")
        print(f"goal p50 <= interval + 3 s = {interval_s + 3:g} s: {verdict(p50 <= interval_s + 3)}; "
              f"p95 <= 2 x interval + 3 s = {2 * interval_s + 3:g} s: {verdict(p95 <= 2 * interval_s + 3)}")
        summary_epochs = cascade.committed("summary", samples[0][0], end)
        print(cascade.producer_rate(samples[0][0], end))
        print(f"epochs committed (whole run): {epoch_counts(cascade, started, time.time())}; "
              f"summary's mean gap between epochs {mean_gap_s(summary_epochs):.2f} s")
        print(phase_means(cascade, samples[0][0], end))
        print(cascade.check())
    return p50, p95


def overload_run(opts, zk: str, name: str, slow: Optional[str]) -> dict:
    with Cascade(opts, zk, name, slow=slow) as cascade:
        cascade.start_producer()
        cascade.start_drivers()
        cascade.wait_consistent()
        samples = cascade.sample(opts.minutes * 60)
        end = time.time()
        cascade.stop_drivers()
        middle = samples[0][0] + (end - samples[0][0]) / 2
        first = [s[1] for s in samples if s[0] < middle]
        second = [s[1] for s in samples if s[0] >= middle]
        timed = [(e["end_ms"] - e["start_ms"]) / 1000 for e in cascade.epochs(slow or "aggregate") if e["ran"]]
        return {"first": percentile(first, 0.95), "second": percentile(second, 0.95),
                "p95": percentile([s[1] for s in samples], 0.95), "max": max(s[1] for s in samples),
                "end": samples[-1][1], "gap": mean_gap_s(cascade.committed("summary", samples[0][0], end)),
                "epoch_s": statistics.median(timed) if timed else float("nan"),
                "epochs": epoch_counts(cascade, samples[0][0], end), "check": cascade.check()}


def overload(opts, server) -> None:
    zk = server.connect_string
    interval_s = opts.interval_ms / 1000
    slow_s = 1.5 * interval_s
    header(f"overload ({opts.engine} engine): job aggregate sleeps {slow_s:g} s per epoch, "
           f"{opts.interval_ms} ms grid, {opts.minutes:g} min each")
    print("no backpressure: the slow job coalesces (its next epoch is the newest barrier its source holds), "
          "summary follows it")
    runs = [("aggregate slower than the interval", overload_run(opts, zk, "overload", "aggregate")),
            ("baseline: no slow job", overload_run(opts, zk, "overload-base", None))]
    print(f"{'':36} {'lag p95 1st half':>16} {'2nd half':>9} {'max':>7} {'at end':>7} {'epoch gap':>10} "
          f"{'aggregate epoch':>16}")
    for label, r in runs:
        print(f"{label:36} {r['first']:>14.2f} s {r['second']:>7.2f} s {r['max']:>5.1f} s {r['end']:>5.1f} s "
              f"{r['gap']:>8.2f} s {r['epoch_s']:>14.2f} s")
    loaded = runs[0][1]
    bound = 2 * loaded["epoch_s"] + interval_s
    print(f"goal: lag p95 <= 2 x the slow job's epoch time + interval = {bound:.2f} s: {loaded['p95']:.2f} s, "
          f"{verdict(loaded['p95'] <= bound)}; flat, 2nd-half p95 no worse than the 1st (10% margin for noise): "
          f"{verdict(loaded['second'] <= 1.1 * loaded['first'])} (ratio {loaded['second'] / loaded['first']:.2f}; "
          f"baseline {runs[1][1]['second'] / runs[1][1]['first']:.2f})")
    for label, r in runs:
        print(f"{label}: epochs {r['epochs']}\n  {r['check']}")


def catchup(opts, server) -> None:
    zk = server.connect_string
    """Stop ``--stop`` (every driver, or one derived job while its upstream runs) for ``--pause`` seconds, restart
    it, and count the epochs each job runs until the consistent epoch covers the downtime (it passes the
    restart) and until it is within one interval of the clock."""
    interval_s = opts.interval_ms / 1000
    stop = ORDER if opts.stop == "all" else (opts.stop,)
    header(f"catch-up ({opts.engine} engine): {'every driver' if opts.stop == 'all' else opts.stop} stopped for "
           f"{opts.pause:g} s while the producer writes, {opts.interval_ms} ms grid")
    with Cascade(opts, zk, "catchup") as cascade:
        cascade.start_producer()
        cascade.start_drivers()
        cascade.wait_consistent()
        cascade.sample(opts.warmup)
        stopped = cascade.stop_drivers(stop)
        last = cascade.consistent()
        before = {job: (cascade.epochs(job) or [{"epoch": None}])[-1]["epoch"] for job in ORDER}
        print(f"{', '.join(stop)} stopped (SIGTERM, epoch finished) at consistent epoch {last}; "
              f"pausing {opts.pause:g} s")
        time.sleep(opts.pause)
        restarted = cascade.start_drivers(stop)
        samples = cascade.sample(opts.catchup_timeout, until=lambda lag: lag <= interval_s)
        caught = samples[-1][0] if samples and samples[-1][1] <= interval_s else None
        if caught is None:
            print(f"NOT caught up within {opts.catchup_timeout:g} s (lag {samples[-1][1] if samples else '?'} s)")
            cascade.stop_drivers()
            return
        barrier = int(restarted * 1000) // opts.interval_ms * opts.interval_ms / 1000  # the grid point of the restart
        covered = next((wall for wall, lag, _ in samples if wall - lag >= barrier), caught)
        cascade.sample(2 * interval_s)  # a little steady state after it, then a clean stop
        cascade.stop_drivers()

        def runs(until_s: float) -> dict[str, list[dict]]:
            return {job: [e for e in cascade.epochs(job) if e["start_ms"] >= restarted * 1000
                          and e["end_ms"] <= until_s * 1000 + 1] for job in stop}

        def counts(found: dict[str, list[dict]]) -> str:
            return ", ".join(f"{j} {len(r)}" + (f" (first started +{r[0]['start_ms'] / 1000 - restarted:.0f} s)"
                                                if r else "") for j, r in found.items())
        own = {job: [e for e in cascade.epochs(job) if e["start_ms"] >= restarted * 1000] for job in stop}
        to_cover = {job: next((i + 1 for i, e in enumerate(r) if e["epoch"] >= barrier * 1000), None)
                    for job, r in own.items()}
        goal = 1 if opts.stop != "all" else 2
        print("epochs each restarted job ran until its own epoch covered the downtime (reached the restart's grid "
              "point): " + ", ".join(f"{j} {n}" for j, n in to_cover.items()) + f"; goal <= {goal} per job: "
              f"{verdict(all(n is not None and n <= goal for n in to_cover.values()))}")
        print(f"the consistent epoch covered the downtime {covered - restarted:.1f} s after the restart (each "
              f"restarted job ran {counts(runs(covered))} epochs by then, the root keeping its cadence meanwhile)")
        print(f"within one interval of the clock (now - T* <= {interval_s:g} s) {caught - restarted:.1f} s after "
              f"the restart (stopped {restarted - stopped:.0f} s); epochs each restarted job ran by then: "
              f"{counts(runs(caught))}")
        print("each job's first epoch after the restart covered: " + ", ".join(
            f"{j} {(r[0]['epoch'] - before[j]) / 1000:.0f} s of input ({before[j]} -> {r[0]['epoch']})"
            for j, r in runs(caught).items() if r and before[j] is not None))
        first = next((e["epoch"] for e in cascade.epochs(stop[0]) if e["start_ms"] >= restarted * 1000), None)
        missed = (first - before[stop[0]]) // opts.interval_ms - 1 if first and before[stop[0]] else 0
        print(f"baseline: grid points {stop[0]} missed during the pause: {missed} (a replay-every-grid-point design "
              f"runs {missed + 1} epochs per job to catch up)")
        print(cascade.check())


def run_readers(args) -> int:
    """``--threads`` readers in this process until SIGTERM, each resolving the three sinks' consistent version and
    reading ``totals`` at it every ``--read-every`` seconds (staggered), with the watch cache or without; writes
    each resolution's latency (s) to ``--out``."""
    from coordinator import Tidemark
    from coordinator.history.resolve import Resolver

    settings = bench_catalog(Path(args.home))
    tm = Tidemark.connect(args.zk)
    cache = tm.tidemark_cache() if args.cache else None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    latencies: list[float] = []
    failures: list[str] = []

    def reader(index: int) -> None:
        resolver = Resolver(settings.load(), settings, tm, cache)
        stop.wait(args.read_every * index / args.threads)
        while not stop.is_set():
            due = time.monotonic() + args.read_every
            try:
                started = time.perf_counter()
                version = resolver.resolve(list(SINKS))
                latencies.append(time.perf_counter() - started)
                snapshot = version.snapshots[TOTALS]
                if snapshot is not None:
                    resolver.table(TOTALS).scan(snapshot_id=snapshot).to_arrow()
            except Exception as exc:  # noqa: BLE001 - counted and reported; a reader keeps reading
                failures.append(f"{type(exc).__name__}: {exc}")
            stop.wait(max(0.0, due - time.monotonic()))
    threads = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(args.threads)]
    run_until_stopped(threads, stop, 30)
    Path(args.out).write_text(json.dumps({"latencies": latencies, "failures": failures[:20],
                                          "failed": len(failures)}))
    if cache is not None:
        cache.close()
    tm.close()
    return 0


def readers(opts, server) -> None:
    """The freshness cascade three times, in turn: alone (the baseline), then with ``--readers`` readers (in
    ``READER_PROCESSES`` processes of threads) resolving and reading, with the watch cache and without it.
    Prints the writers' lag, the readers' resolution latency and ZooKeeper's requests per second of each."""
    from .common import RoundTrips
    header(f"readers under load: {opts.readers} readers, each resolving the 3 sinks and reading totals every "
           f"{opts.read_every:g} s, beside the cascade ({opts.interval_ms} ms barriers, {opts.minutes:g} min each)")
    rows = []
    for mode in ("none", "watch cache", "no cache"):
        with Cascade(opts, server.connect_string, f"readers-{mode.replace(' ', '-')}") as cascade:
            cascade.start_producer()
            cascade.start_drivers()
            cascade.wait_consistent()
            procs, outs = [], []
            if mode != "none":
                for i in range(READER_PROCESSES):
                    outs.append(cascade.home / f"readers-{i}.json")
                    procs.append(cascade._spawn(
                        ["--readers-proc", "--zk", cascade.zk, "--home", str(cascade.home), "--threads",
                         str(opts.readers // READER_PROCESSES), "--read-every", str(opts.read_every),
                         "--out", str(outs[-1]), *(["--cache"] if mode == "watch cache" else [])],
                        f"readers-{i}.log"))
                time.sleep(opts.read_every)  # every reader has started its rhythm
            trips = RoundTrips(server)
            started = time.monotonic()
            samples = cascade.sample(opts.minutes * 60)
            per_s = trips.take() / (time.monotonic() - started)
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            latencies: list[float] = []
            failed = 0
            for proc, out in zip(procs, outs):
                proc.wait(120)
                found = json.loads(out.read_text())
                latencies += found["latencies"]
                failed += found["failed"]
            cascade.stop_drivers()
            lags = [s[1] for s in samples]
            rows.append((mode, percentile(lags, 0.5), percentile(lags, 0.95), per_s, latencies, failed,
                         cascade.check()))
    base_p95 = rows[0][2]
    for mode, p50, p95, per_s, latencies, failed, check in rows:
        resolved = (f"resolution p50 {percentile(latencies, 0.5) * 1000:6.1f} ms  p95 "
                    f"{percentile(latencies, 0.95) * 1000:6.1f} ms ({len(latencies)} resolutions, {failed} failed)"
                    if latencies else "no readers")
        print(f"  {mode:<12} writers' lag p50 {p50:5.2f} s  p95 {p95:5.2f} s ({p95 / base_p95:.2f}x the run without "
              f"readers)  ZooKeeper {per_s:6.0f} requests/s  {resolved}")
        print(f"               {check}")
    cached = rows[1]
    print(f"goal: writers' lag p95 within {READERS_LAG_GOAL:g}x of the run without readers: "
          f"{verdict(all(r[2] <= READERS_LAG_GOAL * base_p95 for r in rows[1:]))}; resolution p95 with the watch "
          f"cache under {READERS_RESOLVE_GOAL_MS:g} ms: "
          f"{verdict(bool(cached[4]) and percentile(cached[4], 0.95) * 1000 < READERS_RESOLVE_GOAL_MS)}")


SCENARIOS = {"freshness": freshness, "overload": overload, "catchup": catchup, "readers": readers}
DEFAULT_SCENARIOS = ["freshness", "overload", "catchup"]  # readers only when asked: it runs the cascade three times


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench pipeline", description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["python", "spark"], default="python")
    p.add_argument("--stack", choices=STACKS, nargs="+", default=["embedded"],
                   help="where the tables live: embedded (SQLite, local files), lakehouse (S3 and a REST catalog, "
                        "SeaweedFS); freshness runs once on each, in turn")
    p.add_argument("--scenario", action="append", choices=list(SCENARIOS),
                   help="run only this scenario (repeatable; default: freshness, overload and catchup)")
    p.add_argument("--minutes", type=float, default=3.0, help="sampled duration of the freshness and each overload run")
    p.add_argument("--interval-ms", type=int, default=5000, help="the barrier interval")
    p.add_argument("--grace-ms", type=int, default=1000)
    p.add_argument("--pause", type=float, default=300.0, help="catch-up: seconds the drivers stay stopped")
    p.add_argument("--stop", choices=["all", *ORDER[1:]], default="all",
                   help="catch-up: stop every driver (default) or one derived job while its upstream runs")
    p.add_argument("--warmup", type=float, default=30.0, help="catch-up: seconds the cascade runs before the stop")
    p.add_argument("--catchup-timeout", type=float, default=600.0)
    p.add_argument("--rows", type=int, default=20, help="events per producer append")
    p.add_argument("--every", type=float, default=0.25, help="seconds between producer appends")
    p.add_argument("--readers", type=int, default=200, help="readers: how many resolve and read beside the cascade")
    p.add_argument("--read-every", type=float, default=5.0, help="readers: seconds between one reader's reads")
    # the processes the bench starts
    p.add_argument("--driver", choices=ORDER, help=argparse.SUPPRESS)
    p.add_argument("--producer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--zk", help=argparse.SUPPRESS)
    p.add_argument("--home", help=argparse.SUPPRESS)
    p.add_argument("--sleep-s", type=float, default=0.0, help=argparse.SUPPRESS)
    p.add_argument("--events", help=argparse.SUPPRESS)
    p.add_argument("--readers-proc", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--cache", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    opts = parser().parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    if opts.driver:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        logging.getLogger("kazoo").setLevel(logging.WARNING)
        return run_driver(opts)
    if opts.producer:
        return run_producer(opts)
    if opts.readers_proc:
        return run_readers(opts)
    with zookeeper() as server:
        for name in opts.scenario or DEFAULT_SCENARIOS:
            start = time.monotonic()
            SCENARIOS[name](opts, server)
            print(f"({name} took {(time.monotonic() - start) / 60:.1f} min)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
