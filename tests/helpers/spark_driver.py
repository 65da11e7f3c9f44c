"""A Spark driver process for kill -9 tests: the word-count job over a root table, optionally crashing.

    python -m tests.helpers.spark_driver HOME ZK MAX_EPOCHS CRASH_AT

CRASH_AT is where the process kills itself with SIGKILL during its second computed epoch (idle
epochs, where no word was appended, do not call the function and are not counted):
``staged`` (sinks staged, nothing precommitted), ``precommitted`` (before any publish),
``published-one`` (one of the two sinks published), ``committed`` (ZooKeeper commit done,
Iceberg not yet marked), or ``none``.
"""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import coordinator.commit as commit_module
from coordinator import CatalogSettings, Tidemark
from spark_hooks import EpochJob, build_spark_session

WORDS, COUNTS, LOG = "lake.kill.words", "lake.kill.counts", "lake.kill.log"


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    home, zk, max_epochs, crash_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    settings = CatalogSettings.embedded(home)
    spark = build_spark_session(settings, app_name="kill-test", extra_conf={"spark.ui.enabled": "false"})
    tm = Tidemark.connect(zk, session_timeout=3)
    job = EpochJob(spark, tm, "counter", sources=[WORDS], sinks=[COUNTS, LOG], catalog=settings,
                   interval_ms=1000, grace_ms=200)
    epochs_seen = []

    @job.epoch
    def step(ctx):
        epochs_seen.append(ctx.epoch)
        changes = ctx.changes(WORDS)
        ctx.append(LOG, changes)
        delta = changes.groupBy("word").count().withColumnRenamed("count", "cnt")
        ctx.merge(COUNTS, delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")

    crashing = lambda: crash_at != "none" and len(epochs_seen) == 2  # noqa: E731
    committer_cls = commit_module.EpochCommitter
    original_finish, original_publish = committer_cls.finish, commit_module.publish_staged
    published = []

    def finish(self, epoch, staged):
        if crashing() and crash_at == "staged":
            die()
        return original_finish(self, epoch, staged)

    def publish(table, snapshot_id, epoch, term):
        if crashing() and crash_at == "precommitted":
            die()
        result = original_publish(table, snapshot_id, epoch, term)
        published.append(epoch)
        if crashing() and crash_at == "published-one":
            die()
        return result
    committer_cls.finish = finish
    commit_module.publish_staged = publish
    if crash_at == "committed":
        from coordinator.epochs import EpochCoordinator
        original_commit = EpochCoordinator.commit

        def commit(self, epoch, published_ids):
            record = original_commit(self, epoch, published_ids)
            if crashing():
                die()
            return record
        EpochCoordinator.commit = commit
    committed = job.run(max_epochs=max_epochs)
    print(json.dumps({"committed": committed}), flush=True)
    if crash_at != "none":  # exit code 3, not -9: the test says the crash point was never reached
        print(f"crash point {crash_at!r} never reached: computed epochs {epochs_seen}, committed {committed}",
              file=sys.stderr, flush=True)
        sys.exit(3)
    tm.close()
    spark.stop()


if __name__ == "__main__":
    main()
