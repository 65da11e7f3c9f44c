"""An exactly-once Spark job: one call of your function per barrier, committed through Tidemark.

    tm = Tidemark.connect()
    job = EpochJob(spark, tm, "word_counts", sources=["lake.db.words"], sinks=["lake.db.word_counts"])

    @job.epoch
    def step(ctx):
        delta = ctx.changes("lake.db.words").groupBy("word").count().withColumnRenamed("count", "cnt")
        ctx.merge("lake.db.word_counts", delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")

    job.run(max_epochs=10)     # or run() until stop() / SIGTERM; standbys wait for leadership

What ``run`` does: registers the job, waits for leadership (a standby replica blocks
here), recovers the last epoch (rolls a precommitted one forward, recomputes an earlier
one from its recorded inputs) and then, barrier after barrier, in order:

1. waits until the barrier is reached: every Tidemark source's tidemark is ``>= T`` (a
   watch, not polling); for a root source (written outside Tidemark) the clock passed
   ``T`` plus ``grace_ms`` and the barrier is agreed in ZooKeeper;
2. records the inputs: per source, the snapshot range ``(previous, T]``;
3. calls your function; each write is staged (Iceberg WAP) with the epoch in its summary;
4. precommits, publishes each staged snapshot, commits every sink's tidemark at once.

An epoch whose function writes nothing to a sink still commits (the sink's committed
epoch advances), so idle tables never hold readers back. Every epoch is committed before
the next begins, so a bounded run leaves nothing uncommitted when it returns (FLIP-147).
One job per SparkSession: ``spark.wap.id`` is a session setting.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable, Iterable, Optional, Sequence

from coordinator.catalog import CatalogSettings, load_table
from coordinator.client import Tidemark
from coordinator.commit import EpochCommitter
from coordinator.epochs import EpochCoordinator, RecoveryAction
from coordinator.errors import ConfigurationError, EpochOrderError, TidemarkError
from coordinator.names import validate_names
from coordinator.records import EpochRecord, EpochState, now_ms
from coordinator.snapshots import snapshot_at_epoch, snapshot_at_time, summary_properties, wap_id

log = logging.getLogger(__name__)


class EpochContext:
    """What one epoch's function sees: its inputs, as DataFrames, and staged writes to its sinks."""

    def __init__(self, job: "EpochJob", record: EpochRecord) -> None:
        self.job, self.record = job, record
        self.epoch: int = record.epoch
        self.staged: dict[str, Optional[int]] = {}

    def _range(self, source: str) -> tuple[Optional[int], Optional[int]]:
        if source not in self.job.sources:
            raise ConfigurationError(f"{source!r} is not a declared source of job {self.job.name!r}")
        bounds = self.record.inputs[source]
        return bounds.get("from"), bounds.get("to")

    def changes(self, source: str):
        """Rows appended to ``source`` in ``(previous barrier, T]`` (the source must be append-only)."""
        start, end = self._range(source)
        reader = self.job.spark.read.format("iceberg")
        if end is None or start == end:
            return self.job.spark.table(source).limit(0)
        if start is None:
            return reader.option("snapshot-id", end).load(source)
        return reader.option("start-snapshot-id", start).option("end-snapshot-id", end).load(source)

    def table(self, source: str):
        """All of ``source`` as of barrier ``T``."""
        _, end = self._range(source)
        if end is None:
            return self.job.spark.table(source).limit(0)
        return self.job.spark.read.format("iceberg").option("snapshot-id", end).load(source)

    def append(self, sink: str, df) -> None:
        self._write(sink, lambda props: _with_options(df.writeTo(sink), props).append())

    def overwrite(self, sink: str, df) -> None:
        """Replace the whole table with ``df``."""
        from pyspark.sql import functions as F
        self._write(sink, lambda props: _with_options(df.writeTo(sink), props).overwrite(F.lit(True)))

    def merge(self, sink: str, df, on: Sequence[str], matched: Optional[str] = None) -> None:
        """``MERGE INTO sink t USING df s ON t.k = s.k``: update matches (``matched``, default ``*``), insert others."""
        view = f"tidemark_merge_{self.job.name.replace('.', '_').replace('-', '_')}_{self.epoch}"
        df.createOrReplaceTempView(view)
        condition = " AND ".join(f"t.{k} = s.{k}" for k in on)
        update = f"UPDATE SET {matched}" if matched else "UPDATE SET *"
        sql = (f"MERGE INTO {sink} t USING {view} s ON {condition} "
               f"WHEN MATCHED THEN {update} WHEN NOT MATCHED THEN INSERT *")
        try:
            self._write(sink, lambda props: self.job.spark.sql(sql))
        finally:
            self.job.spark.catalog.dropTempView(view)

    def _write(self, sink: str, write: Callable[[dict], object]) -> None:
        if sink not in self.job.sinks:
            raise ConfigurationError(f"{sink!r} is not a declared sink of job {self.job.name!r}")
        if sink in self.staged:
            raise EpochOrderError(f"job {self.job.name!r} wrote {sink!r} twice in epoch {self.epoch}: "
                                  "combine the DataFrames into one write per sink and epoch")
        table = self.job.iceberg_table(sink)
        before = {s.snapshot_id for s in table.snapshots()}
        term = self.job.leadership.term
        wap = wap_id(self.epoch, self.job.name, term)  # type: ignore[arg-type]
        props = {f"snapshot-property.{k}": v for k, v in summary_properties(self.epoch, self.job.name, term).items()}  # type: ignore[arg-type]
        spark = self.job.spark
        spark.conf.set("spark.wap.id", wap)
        try:
            write(props)
        finally:
            spark.conf.unset("spark.wap.id")
        table.refresh()
        new = [s for s in table.snapshots() if s.snapshot_id not in before and s.summary.get("wap.id") == wap]
        self.staged[sink] = max(new, key=lambda s: s.sequence_number or 0).snapshot_id if new else None


def _with_options(writer, options: dict):
    for key, value in options.items():
        writer = writer.option(key, value)
    return writer


class EpochJob:
    def __init__(self, spark, tm: Tidemark, name: str, *, sources: Iterable[str], sinks: Iterable[str],
                 catalog: Optional[CatalogSettings] = None, interval_ms: int = 5000, grace_ms: int = 1000,
                 history: int = 100, source_timeout: float = 3600.0) -> None:
        self.spark, self.tm, self.name = spark, tm, name
        self.sources, self.sinks = validate_names(sources, "source table"), validate_names(sinks, "sink table")
        self.catalog_settings = catalog or CatalogSettings.from_env()
        self.catalog = self.catalog_settings.load()
        self.interval_ms, self.grace_ms, self.history = interval_ms, grace_ms, history
        self.source_timeout = source_timeout
        self.leadership = tm.leadership(name)
        self.committed: list[int] = []
        self._function: Optional[Callable[[EpochContext], None]] = None
        self._stop = threading.Event()
        self._tables: dict = {}
        self._epochs: Optional[EpochCoordinator] = None
        self._committer: Optional[EpochCommitter] = None
        self._cache = None
        self._grid = None

    def epoch(self, function: Callable[[EpochContext], None]) -> Callable[[EpochContext], None]:
        """Decorator: the function run once per barrier."""
        self._function = function
        return function

    def stop(self) -> None:
        """Finish the epoch in flight, commit it, and return from ``run``."""
        self._stop.set()

    def iceberg_table(self, name: str):
        table = self._tables.get(name)
        if table is None:
            table = self._tables[name] = load_table(self.catalog, self.catalog_settings, name)
        table.refresh()
        return table

    # -- the loop ----------------------------------------------------------------------------------

    def open(self, leader_timeout: Optional[float] = None, recompute: bool = True) -> None:
        """Register, wait for leadership and recover the last epoch (``run`` and streaming call it)."""
        if self._epochs is not None:
            return
        self.tm.register_job(self.name, sources=self.sources, sinks=self.sinks)
        self._grid = self.tm.barriers.ensure_grid(self.interval_ms)
        self._prepare_sinks()
        self.leadership.acquire(timeout=leader_timeout)
        epochs = EpochCoordinator(self.leadership, self.sinks, self._grid, self.history)
        self._committer = EpochCommitter(epochs, self.iceberg_table)
        self._cache = self.tm.tidemark_cache()
        self._epochs = epochs
        try:
            self._recover(epochs, self._committer, recompute)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Step down (a standby takes over). Nothing is left half-committed: every epoch finished or recovers."""
        if self._cache is not None:
            self._cache.close()
        self.leadership.release()
        self._epochs = self._committer = self._cache = None
        self.leadership = self.tm.leadership(self.name)

    def run(self, max_epochs: Optional[int] = None, until: Optional[int] = None,
            leader_timeout: Optional[float] = None, stop_on_sigterm: bool = True) -> list[int]:
        """Process barriers in order until ``max_epochs`` epochs, barrier ``until``, or ``stop()``.

        Returns the epochs this call committed. Every one of them is committed before it returns.
        """
        if self._function is None:
            raise ConfigurationError(f"job {self.name!r} has no epoch function: decorate one with @job.epoch")
        if stop_on_sigterm and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, lambda *_: self.stop())
        start = len(self.committed)
        self._stop.clear()
        self.open(leader_timeout)
        epochs = self._epochs
        try:
            while not self._stop.is_set():
                if max_epochs is not None and len(self.committed) - start >= max_epochs:
                    break
                managed = self._managed_sources()
                target = epochs.expected_next() or self._first_barrier(managed)
                if until is not None and target > until:
                    break
                if not self._wait_for_barrier(target, managed):
                    break
                self._process(epochs, epochs.begin(target, self._inputs(epochs, target, managed)))
        finally:
            self.close()
        return self.committed[start:]

    def foreach_batch(self, function: Callable[[EpochContext, object], None]) -> Callable[[object, int], None]:
        """A ``foreachBatch`` handler: each micro-batch is one epoch; a re-run batch id is never committed twice.

            query = stream.writeStream.foreachBatch(job.foreach_batch(lambda ctx, df: ctx.append(sink, df)))

        The batch id is recorded in the epoch's inputs. After a crash Spark re-runs the batch
        that was not committed to its checkpoint with the same id and data: if Tidemark
        already committed it, the batch is skipped; if it was in flight, the same epoch is
        recomputed (or rolled forward when it was precommitted).
        """
        def handle(batch, batch_id: int) -> None:
            self.open(recompute=False)
            epochs = self._epochs
            current = epochs.current
            if current is not None and current.inputs.get("batch_id") is not None:
                recorded = current.inputs["batch_id"]
                if batch_id < recorded or (batch_id == recorded and current.state == EpochState.COMMITTED):
                    log.info("job %s: batch %s already committed, skipped", self.name, batch_id)
                    return
                if batch_id == recorded:  # re-run of the batch in flight at the crash: same epoch
                    self._process(epochs, epochs.begin(current.epoch, {"batch_id": batch_id}), function, batch)
                    return
            target = epochs.expected_next() or self._grid.floor(now_ms())
            self._process(epochs, epochs.begin(target, {"batch_id": batch_id}), function, batch)
        return handle

    def _prepare_sinks(self) -> None:
        for sink in self.sinks:
            table = self.iceberg_table(sink)  # TableNotFound says which one is missing
            if table.properties.get("write.wap.enabled") != "true":
                # Without it Spark silently writes straight to main instead of staging.
                self.spark.sql(f"ALTER TABLE {sink} SET TBLPROPERTIES ('write.wap.enabled'='true')")

    def _recover(self, epochs: EpochCoordinator, committer: EpochCommitter, recompute: bool) -> None:
        plan = epochs.recover()
        if plan.action == RecoveryAction.ROLL_FORWARD:
            log.info("job %s: rolling precommitted epoch %s forward", self.name, plan.epoch.epoch)
            committer.roll_forward(plan.epoch)
            self.committed.append(plan.epoch.epoch)
        elif plan.action == RecoveryAction.RECOMPUTE and recompute:
            log.info("job %s: recomputing epoch %s from its recorded inputs", self.name, plan.epoch.epoch)
            self._process(epochs, epochs.begin(plan.epoch.epoch))
        elif plan.action == RecoveryAction.NEXT:
            committer.mark_committed(plan.epoch.epoch)  # in case the last run died before marking Iceberg

    def _process(self, epochs: EpochCoordinator, record: EpochRecord, function=None, *args) -> None:
        ctx = EpochContext(self, record)
        (function or self._function)(ctx, *args)  # type: ignore[misc]
        self._committer.finish(record.epoch, {sink: ctx.staged.get(sink) for sink in self.sinks})  # type: ignore[union-attr]
        self.committed.append(record.epoch)

    def _first_barrier(self, managed: list[str]) -> int:
        """A new job starts where its Tidemark sources are now (derived), or at the current barrier (root)."""
        if managed and len(managed) == len(self.sources):
            epochs = [mark.epoch if mark else None for mark in self._cache.get(managed).values()]
            if all(e is not None for e in epochs):
                return min(epochs)  # type: ignore[type-var]
        return self._grid.floor(now_ms())

    def _managed_sources(self) -> list[str]:
        """The sources some Tidemark job writes; the others are root tables."""
        writers = self.tm.topology().writers
        return [s for s in self.sources if s in writers]

    def _wait_for_barrier(self, target: int, managed: list[str]) -> bool:
        """Block until barrier ``target`` may be processed; False when stopped meanwhile."""
        if len(managed) < len(self.sources) or not managed:
            while now_ms() < target + self.grace_ms:
                if self._stop.wait(min(1.0, (target + self.grace_ms - now_ms()) / 1000)):
                    return False
            self.tm.barriers.agree(target, proposed_by=self.name)
        deadline = time.monotonic() + self.source_timeout
        while managed:
            try:
                self._cache.wait_for(managed, target, timeout=1.0)
                break
            except TidemarkError:  # the 1 s slice passed: check stop(), then wait again
                if self._stop.is_set():
                    return False
                if time.monotonic() > deadline:
                    raise
        return True

    def _inputs(self, epochs: EpochCoordinator, target: int, managed: list[str]) -> dict:
        previous = epochs.current.inputs if epochs.current and epochs.current.state == EpochState.COMMITTED else {}
        inputs = {}
        for source in self.sources:
            table = self.iceberg_table(source)
            at = snapshot_at_epoch(table, target) if source in managed else snapshot_at_time(table, target)
            before = previous.get(source, {}).get("to")
            inputs[source] = {"from": before, "to": at.snapshot_id if at else None}
        return inputs

