"""A Spark driver process for kill -9 tests: the word-count job over a root table, optionally crashing.

    TIDEMARK_CRASH_AT=staged:2 python -m tests.helpers.spark_driver HOME ZK MAX_EPOCHS

``TIDEMARK_CRASH_AT`` (tests/helpers/crash.py sets it) is where the process kills itself with
SIGKILL during its second computed epoch (idle epochs, where no word was appended, do not call
the function and reach none of these steps): ``staged`` (sinks staged, nothing precommitted),
``precommitted`` (before any publish), ``published-one`` (one of the two sinks published),
``committed`` (ZooKeeper commit done, Iceberg not yet marked); unset, it runs to the end.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from coordinator import CatalogSettings, Tidemark
from coordinator.crashpoints import ENV as CRASH_ENV
from spark_hooks import EpochJob, build_spark_session

WORDS, COUNTS, LOG = "lake.kill.words", "lake.kill.counts", "lake.kill.log"


def main() -> None:
    home, zk, max_epochs = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    crash_at = os.environ.get(CRASH_ENV)
    settings = CatalogSettings.embedded(home)
    spark = build_spark_session(settings, app_name="kill-test", extra_conf={"spark.ui.enabled": "false"})
    tm = Tidemark.connect(zk, session_timeout=3)
    # marker_every=None: a marker at every epoch that leaves a sink unchanged, so Iceberg alone records every
    # epoch and the test can compare it with ZooKeeper's (the default marks once a minute).
    job = EpochJob(spark, tm, "counter", sources=[WORDS], sinks=[COUNTS, LOG], catalog=settings,
                   interval_ms=1000, grace_ms=200, marker_every=None)
    epochs_seen = []

    @job.epoch
    def step(ctx):
        epochs_seen.append(ctx.epoch)
        changes = ctx.changes(WORDS)
        ctx.append(LOG, changes)
        delta = changes.groupBy("word").count().withColumnRenamed("count", "cnt")
        ctx.merge(COUNTS, delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")

    committed = job.run(max_epochs=max_epochs)
    print(json.dumps({"committed": committed}), flush=True)
    if crash_at:  # exit code 3, not -9: the test says the crash point was never reached
        print(f"crash point {crash_at!r} never reached: computed epochs {epochs_seen}, committed {committed}",
              file=sys.stderr, flush=True)
        sys.exit(3)
    tm.close()
    spark.stop()


if __name__ == "__main__":
    main()
