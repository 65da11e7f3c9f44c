"""An exactly-once Spark job: one call of your function per epoch, committed through Tidemark.

    tm = Tidemark.connect()
    job = EpochJob(spark, tm, "word_counts", sources=["lake.db.words"], sinks=["lake.db.word_counts"])

    @job.epoch
    def step(ctx):
        delta = ctx.changes("lake.db.words").groupBy("word").count().withColumnRenamed("count", "cnt")
        ctx.merge("lake.db.word_counts", delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")

    job.run(max_epochs=10)     # or run() until stop() / SIGTERM; standbys wait for leadership, warm
    job.run(once=True)         # a batch run: one epoch, covering every root commit made before the call
    EpochJob(..., every="1h")  # a job at its own cadence (a multiple of the grid interval)

The loop is ``coordinator.job.writer.EpochWriter`` (register, lead, recover, pick the next
epoch, record inputs, compute, stage, precommit, publish, commit; see there for the
barrier and failure rules). This module adds Spark: ``ctx.changes``/``ctx.table`` return
DataFrames at the recorded snapshot range, and ``append``/``overwrite``/``merge`` write
staged snapshots through Iceberg's write-audit-publish (``spark.wap.id``), with the
epoch's progress record (job, epoch, term, input ranges: ``coordinator.iceberg.snapshots``) in
each snapshot's summary. The summary keys go through Iceberg's
``CommitMetadata.withCommitProperties``, which Iceberg's Spark writes (DataFrame writes and
SQL ``MERGE INTO`` alike, which has no write options) add to the snapshot they commit on
the calling thread: the write runs inside a ``java.util.concurrent.Callable`` that calls
back into Python over py4j (PySpark's pinned-thread mode keeps it on the same JVM thread).
While a replica is a standby it keeps its SparkSession warm (the tables loaded and a query run
every minute), so a takeover costs about one session timeout plus one epoch. One job per
SparkSession: ``spark.wap.id`` is a session setting.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Callable, ClassVar, Optional, Union

from coordinator.errors import ConfigurationError, NotLeader
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.iceberg.snapshots import summary_properties, wap_id
from coordinator.job.commit import DEFAULT_MARKER_EVERY
from coordinator.job.writer import EpochContext, EpochWriter
from coordinator.protocol.pacing import DEFAULT_GRACE_MS
from coordinator.records import EpochInputs, EpochRecord, EpochState
from coordinator.tidemark import Tidemark
from spark_hooks.reads import snapshot_frame

log = logging.getLogger(__name__)


class SparkEpochContext(EpochContext):
    """What one epoch's function sees: its inputs as DataFrames, and staged Spark writes to its sinks."""

    def __init__(self, job: EpochJob, writer: EpochWriter, record: EpochRecord) -> None:
        super().__init__(writer, record)
        self.spark = job.spark

    def changes(self, source: str):
        """Rows appended to ``source`` in ``(previous barrier, T]`` (the source must be append-only)."""
        bounds = self.range_of(source)
        if bounds.end is None or bounds.is_empty:
            return self.spark.table(source).limit(0)
        if bounds.start is None:
            return snapshot_frame(self.spark, source, bounds.end)
        return (self.spark.read.format("iceberg").option("start-snapshot-id", bounds.start)
                .option("end-snapshot-id", bounds.end).load(source))

    def table(self, source: str):
        """All of ``source`` as of barrier ``T``."""
        return snapshot_frame(self.spark, source, self.range_of(source).end)

    def append(self, sink: str, df) -> None:
        """Stage the rows of ``df`` (a DataFrame) appended to ``sink``.

        :raises ConfigurationError: ``sink`` is not a declared sink of the job.
        :raises EpochOrderError: ``sink`` was already written in this epoch (one write per sink and epoch).
        :raises NotLeader: this replica holds no term.
        """
        self._write(sink, df.sparkSession, lambda: df.writeTo(sink).append())

    def overwrite(self, sink: str, df) -> None:
        """Replace the whole table with ``df``."""
        from pyspark.sql import functions as F
        self._write(sink, df.sparkSession, lambda: df.writeTo(sink).overwrite(F.lit(True)))

    def merge(self, sink: str, df, on: Sequence[str], matched: Optional[str] = None) -> None:
        """``MERGE INTO sink t USING df s ON t.k = s.k``: update matches (``matched``, default ``*``), insert others."""
        view = f"tidemark_merge_{self.writer.name.replace('.', '_').replace('-', '_')}_{self.epoch}"
        session = df.sparkSession  # the view is registered there, and the MERGE must see it
        checkpointed = session.version.startswith("4.1.")
        if checkpointed:
            # Spark 4.1 cannot plan a MERGE whose source view reads a table at its current or an incremental
            # snapshot: the view keeps a table reference the planner never resolves ("No plan for
            # TableReference", SPARK-57539, fixed in 4.2). The source is computed first, so the view holds rows.
            # Those rows live on the executors: one lost before the MERGE has read them fails the epoch, which the
            # job then runs again.
            df = df.localCheckpoint()
        df.createOrReplaceTempView(view)
        condition = " AND ".join(f"t.{k} = s.{k}" for k in on)
        update = f"UPDATE SET {matched}" if matched else "UPDATE SET *"
        sql = (f"MERGE INTO {sink} t USING {view} s ON {condition} "
               f"WHEN MATCHED THEN {update} WHEN NOT MATCHED THEN INSERT *")
        try:
            self._write(sink, session, lambda: session.sql(sql))
        finally:
            session.catalog.dropTempView(view)
            if checkpointed:
                df.unpersist()

    def _write(self, sink: str, session, write: Callable[[], object]) -> None:
        """Stage ``write`` in ``sink``: ``session`` is the one that runs it, the written DataFrame's. A
        ``foreachBatch`` micro-batch belongs to the streaming query's own session (a clone of the job's), which
        does not see a ``spark.wap.id`` set on the job's session: the write would go straight to ``main``."""
        with self.staging(sink) as term:
            wap = wap_id(self.epoch, self.writer.name, term)
            session.conf.set("spark.wap.id", wap)
            try:
                with_commit_properties(self.spark, summary_properties(self.epoch, self.writer.name, term, self.inputs),
                                       write)
            finally:
                session.conf.unset("spark.wap.id")
        table = self.writer.table(sink)
        table.refresh()
        # The newest snapshot of this (job, epoch, term): a retried write in the same term leaves an
        # older staged snapshot with the same wap.id, never published.
        new = [s for s in table.snapshots() if s.summary is not None and s.summary.get("wap.id") == wap]
        self.stage(sink, max(new, key=lambda s: s.sequence_number or 0).snapshot_id if new else None)


class _JavaCallable:
    """A ``java.util.concurrent.Callable`` implemented in Python (py4j calls ``call`` back on this thread)."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.action = action
        self.error: Optional[BaseException] = None

    def call(self) -> None:
        try:
            self.action()
        except BaseException as exc:  # re-raised in Python once the JVM call returns
            self.error = exc
            raise
        return None

    class Java:
        implements: ClassVar[list[str]] = ["java.util.concurrent.Callable"]


def with_commit_properties(spark, properties: dict[str, str], action: Callable[[], object]) -> None:
    """Run ``action`` (a Spark write to an Iceberg table) so that every snapshot it commits carries ``properties``
    in its summary, through ``org.apache.iceberg.spark.CommitMetadata.withCommitProperties``."""
    from py4j.protocol import Py4JJavaError
    from pyspark.java_gateway import ensure_callback_server_started
    gateway = spark.sparkContext._gateway
    ensure_callback_server_started(gateway)
    jvm = spark.sparkContext._jvm
    java_properties = jvm.java.util.HashMap()
    for key, value in properties.items():
        java_properties.put(key, value)
    callable_ = _JavaCallable(action)
    try:
        jvm.org.apache.iceberg.spark.CommitMetadata.withCommitProperties(
            java_properties, callable_, jvm.java.lang.Class.forName("java.lang.RuntimeException"))
    except Py4JJavaError:
        if callable_.error is not None:
            raise callable_.error from None  # the write's own error (say an AnalysisException), not py4j's wrapper
        raise


class EpochJob:
    """An exactly-once Spark job: an ``EpochWriter`` whose function gets a ``SparkEpochContext`` (DataFrames in,
    staged Spark writes out), run as a loop (``run``) or as a Structured Streaming sink (``foreach_batch``).

        job = EpochJob(spark, tm, "word_counts", sources=["lake.db.words"], sinks=["lake.db.word_counts"])

        @job.epoch
        def step(ctx: SparkEpochContext) -> None:
            delta = ctx.changes("lake.db.words").groupBy("word").count().withColumnRenamed("count", "cnt")
            ctx.merge("lake.db.word_counts", delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")

        job.run(max_epochs=10)

    Lifecycle: ``run`` (and ``open``, which each streaming batch calls) first makes every sink stage Spark's
    writes (the table property ``write.wap.enabled=true``, set once), then it is ``EpochWriter.run``: register,
    lead, recover, then one epoch at a time until stopped; in ``run`` a standby calls ``warm_up`` every minute. The
    parameters are ``EpochWriter``'s, with ``spark`` the SparkSession the job runs in (one job per SparkSession:
    ``spark.wap.id`` is a session setting).

    Failure behaviour: as ``EpochWriter.run`` (a fenced leader steps down and contends again; any other error
    while it leads is raised, and the next leader recovers the epoch; a rebuilt ZooKeeper exits the process with
    status 75 by default). ``run`` raises ``ConfigurationError`` when no function was decorated with ``epoch``; the
    constructor raises what ``EpochWriter``'s does. A ``foreach_batch`` handler that fails steps down (``close``)
    and re-raises, so Spark does not checkpoint the batch and runs it again when the query restarts.
    """

    def __init__(self, spark, tm: Tidemark, name: str, *, sources: Iterable[str], sinks: Iterable[str],
                 catalog: Optional[CatalogSettings] = None, interval_ms: int = 5000,
                 every: Union[str, int, None] = None, grace_ms: int = DEFAULT_GRACE_MS, always_run: bool = False,
                 history: int = 100, marker_every: Union[str, int, None] = DEFAULT_MARKER_EVERY,
                 metrics_port: Optional[int] = None) -> None:
        self.spark = spark
        self.writer = EpochWriter(tm, name, sources=sources, sinks=sinks, catalog=catalog, interval_ms=interval_ms,
                                  every=every, grace_ms=grace_ms, always_run=always_run, history=history,
                                  marker_every=marker_every, metrics_port=metrics_port,
                                  context=lambda writer, record: SparkEpochContext(self, writer, record))
        self.name, self.sources, self.sinks = self.writer.name, self.writer.sources, self.writer.sinks
        self._function: Optional[Callable[[SparkEpochContext], None]] = None
        self._sinks_prepared = False

    @property
    def committed(self) -> list[int]:
        """Every epoch this job object committed, oldest first."""
        return self.writer.committed

    def epoch(self, function: Callable[[SparkEpochContext], None]) -> Callable[[SparkEpochContext], None]:
        """Decorator: the function run once per barrier."""
        self._function = function
        return function

    def stop(self) -> None:
        """Finish the epoch in flight, commit it, and return from ``run``."""
        self.writer.stop()

    def run(self, max_epochs: Optional[int] = None, until: Optional[int] = None, once: bool = False,
            leader_timeout: Optional[float] = None, stop_on_sigterm: bool = True,
            exit_on_rebuilt: bool = True) -> list[int]:
        """Process epochs until ``max_epochs`` epochs, barrier ``until``, or ``stop()``; ``once``: one epoch
        covering every root commit made before the call (``EpochWriter.run``). A ZooKeeper server found behind
        the session (rebuilt or restored) makes the driver start over on a new session, in this process; where it
        cannot, it ends with one line and status 75 for its supervisor to restart it (``exit_on_rebuilt=False``:
        ``ZooKeeperRebuilt`` is raised instead).

        Returns the epochs this call committed. Every one of them is committed before it returns.

        :raises ConfigurationError: no function was decorated with ``epoch``.
        :raises TableNotFound: a sink does not exist.
        """
        if self._function is None:
            raise ConfigurationError(f"job {self.name!r} has no epoch function: decorate one with @job.epoch")
        self._prepare_sinks()
        return self.writer.run(self._function, max_epochs=max_epochs, until=until, once=once,
                               leader_timeout=leader_timeout,
                               while_standby=self.warm_up, stop_on_sigterm=stop_on_sigterm,
                               exit_on_rebuilt=exit_on_rebuilt)

    def warm_up(self) -> None:
        """Load every table in Spark and plan a scan of each, so the first epoch after a takeover is not cold."""
        for table in (*self.sources, *self.sinks):
            self.spark.read.format("iceberg").load(table).limit(0).collect()

    def open(self) -> None:
        """Register, lead and roll a precommitted epoch forward (streaming calls it; ``run`` does too).

        :raises TableNotFound: a sink does not exist; otherwise what ``EpochWriter.open`` raises.
        """
        self._prepare_sinks()
        self.writer.open()

    def close(self) -> None:
        """Step down (a standby takes over)."""
        self.writer.close()

    def foreach_batch(self, function: Callable[[SparkEpochContext, object], None]) -> Callable[[object, int], None]:
        """A ``foreachBatch`` handler: each micro-batch is one epoch; a re-run batch id is never committed twice.

            query = stream.writeStream.foreachBatch(job.foreach_batch(lambda ctx, df: ctx.append(sink, df)))

        The batch id is recorded in the epoch's inputs (``ctx.inputs.batch_id``). After a
        crash Spark re-runs the batch that was not committed to its checkpoint with the same
        id and data: if Tidemark already committed it, the batch is skipped; if it was in
        flight, the same epoch is recomputed (it was rolled forward if precommitted). A batch
        takes the newest barrier the clock has passed (waiting for the next one when the last
        epoch is already the newest): barriers that passed with no batch are coalesced, never
        committed one by one.
        """
        def handle(batch, batch_id: int) -> None:
            try:
                self._handle(function, batch, batch_id)
            except BaseException:
                self.writer.close()  # the next batch (or a restarted query) reopens and recovers
                raise
        return handle

    def _handle(self, function, batch, batch_id: int) -> None:
        self.open()
        writer = self.writer
        current = writer.epochs.current
        if current is not None and current.inputs.batch_id is not None:
            recorded = current.inputs.batch_id
            if batch_id < recorded or (batch_id == recorded and current.state == EpochState.COMMITTED):
                log.info("job %s: batch %s already committed, skipped", self.name, batch_id)
                return
            if batch_id == recorded:  # re-run of the batch in flight at the crash: same epoch, same inputs
                writer.process(current.epoch, function, batch)
                return
        target = writer.next_barrier()
        if target is None:
            # Returning would let Spark checkpoint a batch that was never written.
            raise NotLeader(f"job {self.name!r} was stopped before batch {batch_id} could be committed; "
                            "Spark re-runs the batch when the query restarts")
        writer.process(target, function, batch, inputs=EpochInputs(batch_id=batch_id))

    def _prepare_sinks(self) -> None:
        if self._sinks_prepared:
            return
        for sink in self.sinks:
            table = self.writer.table(sink)  # TableNotFound says which one is missing
            if table.properties.get("write.wap.enabled") != "true":
                # Without it Spark silently writes straight to main instead of staging.
                self.spark.sql(f"ALTER TABLE {sink} SET TBLPROPERTIES ('write.wap.enabled'='true')")
                table.refresh()
        self._sinks_prepared = True
