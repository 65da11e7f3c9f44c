"""A Spark driver process for kill -9 tests: the word-count job over a root table, optionally crashing.

    TIDEMARK_CRASH_AT=staged:2 python -m tests.helpers.spark_driver HOME ZK MAX_EPOCHS
    python -m tests.helpers.spark_driver HOME ZK --member b          # until SIGTERM, as ZooKeeper member b
    python -m tests.helpers.spark_driver HOME ZK --task-gate DIR     # hold the tasks of its first epoch
    python -m tests.helpers.spark_driver HOME ZK --stream DIR        # foreachBatch over DIR's JSON files

``TIDEMARK_CRASH_AT`` (tests/helpers/crash.py sets it) is where the process kills itself with
SIGKILL during its second computed epoch (idle epochs, where no word was appended, do not call
the function and reach none of these steps): ``staged`` (sinks staged, nothing precommitted),
``precommitted`` (before any publish), ``published-one`` (one of the two sinks published),
``committed`` (ZooKeeper commit done, Iceberg not yet marked); unset, it runs to the end: MAX_EPOCHS
epochs, or until SIGTERM (the epoch in flight is finished) without it.

Spark's master and settings are ``build_spark_session``'s: ``TIDEMARK_SPARK_MASTER`` (default
``local[2]``), or with ``SPARK_HOME`` set, as in the image, the ``spark-defaults.conf`` of
``SPARK_CONF_DIR``. ``--member`` names the Spark application and the driver's ZooKeeper member, so a
test can tell which driver leads and which executors are its. With ``--task-gate``, every task that
reads an epoch's new words first creates ``DIR/task-<stage>-<partition>-<attempt>-<task attempt
id>-<pid>`` (pid: its Python worker's) and waits for ``DIR/release``, so a test can kill an executor
while it runs a task of an epoch. ``--stream`` runs a Structured Streaming query instead
(``EpochJob.foreach_batch``, one file per batch, until the files run out) that appends every batch
to the log table.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Optional

from coordinator import CatalogSettings, Tidemark
from coordinator.crashpoints import ENV as CRASH_ENV
from spark_hooks import EpochJob, build_spark_session

WORDS, COUNTS, LOG = "lake.kill.words", "lake.kill.counts", "lake.kill.log"
GATE_TIMEOUT = 120.0  # a gated task goes on by itself after this, so a test that failed early never hangs Spark


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.helpers.spark_driver")
    parser.add_argument("home", type=Path)
    parser.add_argument("zk")
    parser.add_argument("max_epochs", type=int, nargs="?")
    parser.add_argument("--member")
    parser.add_argument("--task-gate", type=Path)
    parser.add_argument("--stream", type=Path)
    args = parser.parse_args()
    crash_at = os.environ.get(CRASH_ENV)
    settings = CatalogSettings.embedded(args.home)
    spark = build_spark_session(settings, app_name=args.member or "kill-test",
                                extra_conf={"spark.ui.enabled": "false"})
    tm = Tidemark.connect(args.zk, session_timeout=3, member=args.member)
    if args.stream:
        committed = stream(spark, tm, settings, args.stream, args.home / "checkpoint")
    else:
        committed = count_words(spark, tm, settings, args.max_epochs, args.task_gate, crash_at)
    print(json.dumps({"committed": committed}), flush=True)
    tm.close()
    spark.stop()


def count_words(spark, tm: Tidemark, settings: CatalogSettings, max_epochs: Optional[int], gate: Optional[Path],
                crash_at: Optional[str]) -> list[int]:
    # marker_every=None: a marker at every epoch that leaves a sink unchanged, so Iceberg alone records every
    # epoch and the test can compare it with ZooKeeper's (the default marks once a minute).
    job = EpochJob(spark, tm, "counter", sources=[WORDS], sinks=[COUNTS, LOG], catalog=settings,
                   interval_ms=1000, grace_ms=200, marker_every=None)
    epochs_seen = []

    @job.epoch
    def step(ctx):
        epochs_seen.append(ctx.epoch)
        changes = ctx.changes(WORDS)
        if gate is not None:
            changes = changes.mapInPandas(gated(str(gate)), schema=changes.schema)
        ctx.append(LOG, changes)
        delta = changes.groupBy("word").count().withColumnRenamed("count", "cnt")
        ctx.merge(COUNTS, delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")

    committed = job.run(max_epochs=max_epochs)
    if crash_at:  # exit code 3, not -9: the test says the crash point was never reached
        print(f"crash point {crash_at!r} never reached: computed epochs {epochs_seen}, committed {committed}",
              file=sys.stderr, flush=True)
        sys.exit(3)
    return committed


def gated(directory: str):
    """A ``mapInPandas`` function that marks its task as running and holds it until ``directory/release`` exists
    (this module runs as ``__main__``, so Spark ships the function itself to the executors' Python workers)."""
    def hold(batches):
        from pyspark import TaskContext
        task = TaskContext.get()
        assert task is not None  # always set in a task's Python worker
        Path(directory, f"task-{task.stageId()}-{task.partitionId()}-{task.attemptNumber()}-"
                        f"{task.taskAttemptId()}-{os.getpid()}").touch()
        release, deadline = Path(directory, "release"), time.monotonic() + GATE_TIMEOUT
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        yield from batches
    return hold


def stream(spark, tm: Tidemark, settings: CatalogSettings, incoming: Path, checkpoint: Path) -> list[int]:
    job = EpochJob(spark, tm, "stream", sources=[], sinks=[LOG], catalog=settings, interval_ms=1000)
    handler = job.foreach_batch(lambda ctx, df: ctx.append(LOG, df))
    query = (spark.readStream.schema("word string").option("maxFilesPerTrigger", 1).json(str(incoming))
             .writeStream.foreachBatch(handler).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    job.close()
    return job.committed


if __name__ == "__main__":
    main()
