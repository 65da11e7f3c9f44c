"""``make demo``: FLIP-276's word-count cascade, for real, and a reader that checks every consistent version.

    words (root table, appended by a producer outside Tidemark)
      -> job "word_counts":     word_counts(word, cnt)       MERGE by word of each epoch's new words
      -> job "count_histogram": count_histogram(cnt, num_words)  recomputed from word_counts as of T

The two jobs run as separate Spark driver processes on a shared barrier grid, both bounded:
``run(until=F)`` for a final barrier ``F`` a little after the producer stops, chosen once both
drivers lead their jobs (Spark's start-up is not part of the run). While they
run, a reader resolves consistent versions and checks at every one that word_counts is
``GROUP BY word`` over words and count_histogram is ``GROUP BY cnt`` over word_counts,
shows what naive reads of each table's latest snapshot would have got, reads through ``tidemark serve`` (an
Iceberg REST catalog of consistent versions, in this process) with pyiceberg's ``RestCatalog`` configured with its
URI alone, checking each read by the same rule, and samples the
freshness of the consistent version against the wall clock. The demo ends when both jobs
have committed ``F``; the version at ``F`` is always checked, and must hold every produced
word exactly once. An overall deadline (``--timeout``) or any Tidemark error ends it with
one ``demo: error: ...`` line and exit code 1.

    python -m examples.demo [--seconds 45] [--interval-ms 3000] [--timeout 900] [--home DIR]
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

from coordinator.errors import TidemarkError

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pyarrow as pa
    from pyiceberg.catalog import Catalog

    from coordinator.history.checker import ConsistencyChecker

REPO = Path(__file__).resolve().parent.parent  # where `python -m examples.demo` runs the drivers from
WORDS_TABLE, COUNTS_TABLE, HIST_TABLE = "lake.demo.words", "lake.demo.word_counts", "lake.demo.count_histogram"
TABLES = [WORDS_TABLE, COUNTS_TABLE, HIST_TABLE]
JOB_TABLES = {"word_counts": ([WORDS_TABLE], [COUNTS_TABLE]), "count_histogram": ([COUNTS_TABLE], [HIST_TABLE])}
JOB_SINKS = {name: sinks[0] for name, (_, sinks) in JOB_TABLES.items()}
VOCABULARY = ["tide", "mark", "epoch", "barrier", "iceberg", "spark", "zoo", "keeper", "snapshot", "commit",
              "leader", "term", "fence", "stage", "publish", "reader", "version", "table"]
DEFAULT_TIMEOUT_S = 900.0
FRESHNESS_EVERY_S = 0.2
PRODUCE_EVERY_S = 0.4
FINAL_BARRIER_FILE = "final-barrier"  # written by the demo once both drivers are ready, read by the drivers
DRIVER_STOP_S = 60.0  # how long a driver told to stop (SIGTERM) may take before it is killed


class DemoError(Exception):
    """Why the demo could not finish (one line, printed as ``demo: error: ...``)."""


def run_job(args) -> int:
    """One driver process: the word_counts or the count_histogram job, until the final barrier the demo chooses
    once both drivers are ready."""
    from coordinator import CatalogSettings, Tidemark
    from spark_hooks import EpochJob, build_spark_session

    settings = CatalogSettings.embedded(Path(args.home))
    spark = build_spark_session(settings, app_name=f"tidemark-demo-{args.job}",
                                extra_conf={"spark.ui.enabled": "false", "spark.driver.memory": "1g"})
    tm = Tidemark.connect(args.zk)
    sources, sinks = JOB_TABLES[args.job]
    job = EpochJob(spark, tm, args.job, sources=sources, sinks=sinks, catalog=settings, interval_ms=args.interval_ms)
    if args.job == "word_counts":
        @job.epoch
        def count_words(ctx):
            delta = ctx.changes(WORDS_TABLE).groupBy("word").count().withColumnRenamed("count", "cnt")
            ctx.merge(COUNTS_TABLE, delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")
    else:
        @job.epoch
        def histogram(ctx):
            counts = ctx.table(COUNTS_TABLE)
            ctx.overwrite(HIST_TABLE, counts.groupBy("cnt").count().withColumnRenamed("count", "num_words"))
    _stop_when_orphaned(job)
    job.open()  # registered and leading before the final barrier is chosen: both jobs then start before it
    (Path(args.home) / f"{args.job}.ready").touch()
    until = _await_final_barrier(Path(args.home) / FINAL_BARRIER_FILE, args.timeout)
    committed = job.run(until=until) if until is not None else []
    print(json.dumps({"job": args.job, "committed": committed}), flush=True)
    tm.close()
    spark.stop()
    return 0


def _await_final_barrier(path: Path, timeout: float) -> Optional[int]:
    """The final barrier, once the demo has written it; None if the demo process died meanwhile."""
    parent, deadline = os.getppid(), time.monotonic() + timeout
    while not path.exists():
        if os.getppid() != parent:
            return None
        if time.monotonic() > deadline:
            raise DemoError(f"no final barrier in {path} after {timeout:.0f} s")
        time.sleep(0.1)
    return int(path.read_text())


def _stop_when_orphaned(job) -> None:
    """If the demo process dies, stop the job (finishing the epoch in flight) instead of running on."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                job.stop()  # repeated: a stop() before run() starts would be cleared by run()
    threading.Thread(target=watch, daemon=True, name="orphan-watch").start()


def create_tables(catalog) -> None:
    import pyarrow as pa
    catalog.create_namespace_if_not_exists("demo")
    catalog.create_table("demo.words", schema=pa.schema([pa.field("word", pa.string())]))
    catalog.create_table("demo.word_counts", schema=pa.schema([pa.field("word", pa.string()),
                                                                pa.field("cnt", pa.int64())]))
    catalog.create_table("demo.count_histogram", schema=pa.schema([pa.field("cnt", pa.int64()),
                                                                   pa.field("num_words", pa.int64())]))


def check(frames: Mapping[str, pa.Table]) -> Optional[str]:
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
    interval_ms: int
    committed: dict
    produced: Counter
    checked: int               # consistent versions checked, the final one included
    failures: list
    naive_total: int
    naive_bad: int
    served_total: int          # reads through `tidemark serve` by a reader that knows nothing of Tidemark
    served_bad: int
    freshness_ms: list         # now - consistent epoch, sampled while the producer ran
    final_epoch: Optional[int]
    final_problem: Optional[str]
    exactly_once: bool

    @property
    def passed(self) -> bool:
        return (not self.failures and self.final_problem is None and self.exactly_once
                and self.served_total > 0 and self.served_bad == 0
                and self.final_epoch == self.final_barrier and self.checked > 0
                and all(epochs and epochs[-1] == self.final_barrier for epochs in self.committed.values()))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.demo")
    parser.add_argument("--seconds", type=float, default=45.0, help="how long the producer writes words")
    parser.add_argument("--interval-ms", type=int, default=3000, help="the shared barrier interval")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                        help="give up (exit code 1) if the jobs have not committed the final barrier by then (s)")
    parser.add_argument("--home", help="data directory (default: a fresh temporary one)")
    parser.add_argument("--job", choices=sorted(JOB_SINKS), help=argparse.SUPPRESS)
    parser.add_argument("--zk", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.getLogger("kazoo").setLevel(logging.ERROR)  # reconnection chatter; outcomes are reported below
    if args.job:
        from coordinator.operations.logs import log_to_stderr
        log_to_stderr()  # the driver's log (<home>/<job>.log) shows what it waits for and when it takes over
        return run_job(args)
    try:
        report = run_demo(args.seconds, args.interval_ms, Path(args.home) if args.home else None, verbose=True,
                          timeout=args.timeout)
    except (DemoError, TidemarkError) as exc:
        print(f"demo: error: {_one_line(exc)}", file=sys.stderr, flush=True)
        return 1
    print_report(report)
    return 0 if report.passed else 1


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text if isinstance(exc, DemoError) else f"{type(exc).__name__}: {text}"


class Deadline:
    def __init__(self, seconds: float, describe: Callable[[], str]) -> None:
        self.seconds, self.at, self.describe = seconds, time.monotonic() + seconds, describe

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def check(self) -> None:
        if self.remaining() <= 0:
            raise DemoError(f"timed out after {self.seconds:.0f} s: {self.describe()}")


@dataclass
class _Reader:
    """The reader's findings: consistent versions checked (by ``coordinator.history.checker``), naive reads,
    freshness."""

    checker: Optional[ConsistencyChecker] = None   # made once the catalog is opened
    naive_total: int = 0
    naive_bad: int = 0
    endpoint: Optional[Catalog] = None             # pyiceberg's RestCatalog on `tidemark serve`, the URI alone
    served_total: int = 0
    served_bad: int = 0
    freshness_ms: list = field(default_factory=list)

    @property
    def checked(self) -> int:
        return self.checker.checked if self.checker is not None else 0

    @property
    def failures(self) -> list:
        return [(f.epoch, f.problem) for f in self.checker.failures] if self.checker is not None else []


def run_demo(seconds: float, interval_ms: int, home: Optional[Path] = None, verbose: bool = False,
             timeout: float = DEFAULT_TIMEOUT_S) -> DemoReport:
    """Run the cascade with ``seconds`` of produced words on a fresh data directory, until both jobs committed the
    final barrier, and check it; returns the figures. ``DemoError`` after ``timeout`` seconds or a failed driver."""
    from pyiceberg.catalog.rest import RestCatalog

    from coordinator import CatalogSettings, EmbeddedZooKeeper, Tidemark
    from coordinator.operations.zookeeper_server import free_port
    from coordinator.serving.served_versions import ServedVersions
    from coordinator.serving.server import CatalogServer

    home = home or Path(tempfile.mkdtemp(prefix="tidemark-demo-"))
    if home.exists():
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    say = print if verbose else (lambda *a, **k: None)
    deadline = Deadline(timeout, lambda: "starting")
    settings = CatalogSettings.embedded(home)
    create_tables(settings.load())
    say(f"demo: data in {home}")
    with EmbeddedZooKeeper(port=free_port(), data_dir=home / "zookeeper") as zk:
        say(f"demo: ZooKeeper serving on {zk.connect_string}")
        tm = Tidemark.connect(zk.connect_string)
        cache = tm.tidemark_cache()
        endpoint = CatalogServer(ServedVersions(settings, lambda: Tidemark.connect(zk.connect_string, read_only=True)),
                                 port=0).start()
        say(f"demo: tidemark serve (an Iceberg REST catalog of consistent versions) on {endpoint.url}")
        try:
            grid = tm.barriers.ensure_grid(interval_ms)
            reader = _Reader(endpoint=RestCatalog("served", uri=endpoint.url))
            produced: Counter = Counter()
            until, committed = _run_cascade(home, zk.connect_string, settings, tm, cache, grid, seconds, deadline,
                                            reader, produced, say)
            final, final_problem, counted = _check_final(settings, tm, cache, until, reader, deadline, say)
        finally:
            endpoint.stop()
            cache.close()
            tm.close()
    return DemoReport(home, until, interval_ms, committed, produced, reader.checked, reader.failures,
                      reader.naive_total, reader.naive_bad, reader.served_total, reader.served_bad,
                      reader.freshness_ms, final, final_problem,
                      counted == dict(produced))


def _run_cascade(home: Path, zk: str, settings, tm, cache, grid, seconds: float, deadline: Deadline,
                 reader: _Reader, produced: Counter, say) -> tuple[int, dict]:
    """Start both drivers; once both lead their jobs, choose the final barrier, produce words and read until both
    drivers ended. Returns the final barrier and each job's committed epochs."""
    from coordinator.records import now_ms

    interval_ms = grid.interval_ms
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    drivers: dict[str, subprocess.Popen] = {}
    stop_producing, produced_all = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:  # its own catalog: the reader's is used from the main thread
        import pyarrow as pa
        try:
            words = settings.load().load_table("demo.words")
            rng = random.Random(7)
            while not stop_producing.wait(PRODUCE_EVERY_S):
                if now_ms() >= until - interval_ms:  # stop a whole interval before: the final barrier holds all
                    return
                batch = [rng.choice(VOCABULARY) for _ in range(rng.randint(1, 12))]
                words.append(pa.table({"word": batch}))
                produced.update(batch)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            produced_all.set()

    def sample_freshness() -> None:
        while not produced_all.wait(FRESHNESS_EVERY_S):
            try:
                marks = cache.get([COUNTS_TABLE, HIST_TABLE])
            except TidemarkError:
                continue  # connection trouble: no sample this time
            epochs = [m.epoch for m in marks.values() if m is not None and m.epoch is not None]
            if len(epochs) == len(marks):  # both jobs have committed: a consistent version exists
                reader.freshness_ms.append(now_ms() - min(epochs))

    def describe() -> str:
        try:
            marks = tm.tidemarks(list(JOB_SINKS.values()))
            at = ", ".join(f"{job} at epoch {marks[sink].epoch if marks[sink] else None}"
                           for job, sink in JOB_SINKS.items())
        except TidemarkError:
            at = "their epochs unknown"
        return f"waiting for both jobs to commit the final barrier {until} ({at})"

    producer = threading.Thread(target=produce, daemon=True, name="producer")
    sampler = threading.Thread(target=sample_freshness, daemon=True, name="freshness")
    try:
        # Deploy the pipeline before starting it: a job whose source has no registered writer yet reads that
        # source as a root table (by commit time), so count_histogram started before word_counts registers
        # would commit epochs over an empty word_counts that no reader can check against the words.
        for name, (sources, sinks) in JOB_TABLES.items():
            tm.register_job(name, sources=sources, sinks=sinks)
        for name in JOB_SINKS:
            with open(home / f"{name}.out", "w") as out, open(home / f"{name}.log", "w") as err:
                drivers[name] = subprocess.Popen(
                    [sys.executable, "-m", "examples.demo", "--job", name, "--zk", zk, "--home", str(home),
                     "--interval-ms", str(interval_ms), "--timeout", str(deadline.seconds)],
                    stdout=out, stderr=err, env=env, text=True, cwd=REPO)
        # Spark's start-up can take longer than the whole production on a busy machine: the clock of the run
        # starts only when both jobs lead (a new job's first epoch is after the time it opened).
        deadline.describe = lambda: f"waiting for both drivers to start (driver logs: {home}/<job>.log)"
        while not all((home / f"{name}.ready").exists() for name in drivers):
            _raise_if_failed(drivers, home, "while starting")
            deadline.check()
            time.sleep(0.2)
        until = grid.next_candidate(now_ms() + int(seconds * 1000))
        (home / f"{FINAL_BARRIER_FILE}.tmp").write_text(str(until))
        os.replace(home / f"{FINAL_BARRIER_FILE}.tmp", home / FINAL_BARRIER_FILE)
        say(f"demo: 2 driver processes ready, barrier every {interval_ms} ms, producing words for "
            f"{seconds:.0f} s, final barrier {until}")
        producer.start()
        sampler.start()
        deadline.describe = lambda: describe() + f" (driver logs: {home}/<job>.log)"
        while True:
            _raise_if_failed(drivers, home, f"before the final barrier {until}")
            if errors:
                raise DemoError(f"the producer failed: {_one_line(errors[0])}")
            if all(d.returncode == 0 for d in drivers.values()):
                break
            deadline.check()
            generation = cache.generation
            if reader.checker is None:
                from coordinator.history.checker import ConsistencyChecker
                from coordinator.history.resolve import Resolver
                reader.checker = ConsistencyChecker(Resolver(settings.load(), settings, tm, cache), TABLES, check)
            _observe(reader, say)
            cache.wait_changed(generation, 0.5)
        producer.join(max(0.0, deadline.remaining()))
        if producer.is_alive():
            deadline.check()
        if errors:
            raise DemoError(f"the producer failed: {_one_line(errors[0])}")
    finally:
        stop_producing.set()
        _stop_drivers(drivers)
    committed = {}
    for name in JOB_SINKS:
        lines = [line for line in (home / f"{name}.out").read_text().splitlines() if line.startswith("{")]
        committed[name] = json.loads(lines[-1])["committed"] if lines else []
    return until, committed


def _raise_if_failed(drivers: dict, home: Path, when: str) -> None:
    failed = {n: d.returncode for n, d in drivers.items() if d.poll() not in (None, 0)}
    if failed:
        name, code = next(iter(failed.items()))
        raise DemoError(f"job {name}'s driver exited with code {code} {when}: "
                        f"{_last_line(home / f'{name}.log')} (log: {home / (name + '.log')})")


def _observe(reader: _Reader, say) -> None:
    """Check the consistent version if it is new, and count a naive latest-snapshot read."""
    from coordinator.history.resolve import read_arrow
    checker = reader.checker
    if checker is None:
        return  # the reader has no resolver yet
    before = checker.checked
    version = checker.observe()
    if version is None:
        return  # no consistent version yet: the jobs have not registered, or not committed a first epoch
    if checker.checked > before:
        _say_checked(checker, version, say)
    naive = checker.resolver.resolve(TABLES, level="latest")
    reader.naive_total += 1
    reader.naive_bad += check(read_arrow(checker.resolver, naive)) is not None
    _read_through_endpoint(reader)


def _read_through_endpoint(reader: _Reader) -> None:
    """One read of the three tables through `tidemark serve`, as an engine that knows nothing of Tidemark reads them
    (table names, no version), checked by the same rule."""
    from pyiceberg.exceptions import ServiceUnavailableError
    if reader.endpoint is None:
        return
    try:
        frames = {t: reader.endpoint.load_table(t.split(".", 1)[1]).scan().to_arrow() for t in TABLES}
    except ServiceUnavailableError:
        return  # no consistent version yet
    reader.served_total += 1
    reader.served_bad += check(frames) is not None


def _say_checked(checker, version, say) -> None:
    failed = checker.failures[-1] if checker.failures and checker.failures[-1].epoch == version.epoch else None
    say(f"  consistent epoch {version.epoch}: {'OK' if failed is None else 'INCONSISTENT: ' + failed.problem}")


def _check_final(settings, tm, cache, until: int, reader: _Reader, deadline: Deadline, say):
    """Both jobs ended: the consistent version must be the final barrier; check it (always) and count the words."""
    from coordinator.history.checker import ConsistencyChecker
    from coordinator.history.resolve import Resolver, read_arrow
    marks = tm.tidemarks(list(JOB_SINKS.values()))
    behind = [f"job {job} ended at epoch {marks[sink].epoch if marks[sink] else None}"
              for job, sink in JOB_SINKS.items() if marks[sink] is None or marks[sink].epoch != until]
    if behind:
        raise DemoError(f"the drivers exited but not every job committed the final barrier {until}: "
                        + ", ".join(behind))
    cache.wait_for(list(JOB_SINKS.values()), until, timeout=max(1.0, deadline.remaining()))
    resolver = Resolver(settings.load(), settings, tm, cache)
    if reader.checker is None:
        reader.checker = ConsistencyChecker(resolver, TABLES, check)
    checker = reader.checker
    final = resolver.resolve(TABLES)
    if final.epoch == checker.last_checked:  # checked (and counted) while the drivers ran
        frames = read_arrow(resolver, final)
        problem = check(frames)
    else:
        checker.resolver = resolver
        frames, problem = checker.check(final)
        _say_checked(checker, final, say)
    counted = dict(zip(frames[COUNTS_TABLE].column("word").to_pylist(),
                       frames[COUNTS_TABLE].column("cnt").to_pylist()))
    return final.epoch, problem, counted


def _stop_drivers(drivers: dict) -> None:
    """Stop drivers still running: SIGTERM (each finishes its epoch in flight), then SIGKILL if it lingers."""
    running = [d for d in drivers.values() if d.poll() is None]
    for driver in running:
        driver.send_signal(signal.SIGTERM)
    for driver in running:
        try:
            driver.wait(DRIVER_STOP_S)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait(30)


def _last_line(path: Path) -> str:
    try:
        lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    return lines[-1][:300] if lines else "(empty log)"


def print_report(report: DemoReport) -> None:
    print("\n=== Tidemark demo report ===")
    for name, epochs in report.committed.items():
        print(f"job {name}: {len(epochs)} epochs committed"
              + (f" ({epochs[0]} .. {epochs[-1]})" if epochs else f" (see {report.home / (name + '.log')})"))
    print(f"words produced: {sum(report.produced.values())} in {len(report.produced)} distinct words")
    print(f"consistent versions checked (the final one included): {report.checked}, "
          f"inconsistent: {len(report.failures)}")
    for epoch, problem in report.failures:
        print(f"  epoch {epoch}: {problem}")
    print(f"naive latest-snapshot reads: {report.naive_total}, of which inconsistent: {report.naive_bad}")
    print(f"reads through tidemark serve (pyiceberg's RestCatalog, the URI alone): {report.served_total}, of which "
          f"inconsistent: {report.served_bad}")
    fresh = report.freshness_ms
    if fresh:
        print(f"freshness (now - consistent epoch, every {FRESHNESS_EVERY_S * 1000:.0f} ms while producing): "
              f"p50 {percentile(fresh, 0.5)} ms, p95 {percentile(fresh, 0.95)} ms, max {max(fresh)} ms "
              f"over {len(fresh)} samples; barrier interval {report.interval_ms} ms")
    else:
        print(f"freshness: no samples (no consistent version existed while the producer ran); "
              f"barrier interval {report.interval_ms} ms")
    print(f"final consistent epoch {report.final_epoch} (final barrier {report.final_barrier}): "
          f"{'consistent' if report.final_problem is None else report.final_problem}; every produced word counted "
          f"exactly once: {report.exactly_once}")
    print("RESULT:", "PASS" if report.passed else "FAIL")


if __name__ == "__main__":
    sys.exit(main())
