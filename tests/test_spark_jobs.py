"""Spark hooks on real Spark, Iceberg and ZooKeeper: epoch jobs, kill -9 at every step, streaming, reads, demo."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from coordinator import CatalogSettings, EmbeddedZooKeeper, EpochOrderError, Tidemark
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.snapshots import main_lineage, snapshot_progress
from coordinator.operations.zookeeper_server import free_port
from spark_hooks import EpochJob, read_consistent
from tests.helpers.crash import crash_env
from tests.helpers.present import present
from tests.helpers.wait import wait_for

REPO = Path(__file__).resolve().parents[1]
# Every test here runs Spark, in this process or in driver subprocesses: none belongs in `make test-fast`.
pytestmark = pytest.mark.spark


def create(catalog, identifier: str, schema: pa.Schema):
    catalog.create_namespace_if_not_exists(identifier.rsplit(".", 1)[0])
    return catalog.create_table(identifier, schema=schema)


WORD = pa.schema([pa.field("word", pa.string())])
COUNT = pa.schema([pa.field("word", pa.string()), pa.field("cnt", pa.int64())])


def barrier_after(snapshot, interval_ms: int = 1000) -> int:
    """The first grid point at or after a root table's snapshot: the barrier by which a job has read it."""
    return -(-snapshot.timestamp_ms // interval_ms) * interval_ms


def epoch_holding(committed: list[int], snapshot) -> int:
    """The epoch that read a root table's snapshot: the first committed barrier at or after its timestamp."""
    return min(e for e in committed if e >= snapshot.timestamp_ms)


def test_epoch_job_appends_overwrites_merges_and_commits_empty_epochs(spark, tm, catalog_settings, namespace):
    catalog = catalog_settings.load()
    words = create(catalog, f"{namespace}.words", WORD)
    for name in ("log", "snapshot"):
        create(catalog, f"{namespace}.{name}", WORD)
    create(catalog, f"{namespace}.counts", COUNT)
    t = {n: f"lake.{namespace}.{n}" for n in ("words", "log", "snapshot", "counts")}
    job = EpochJob(spark, tm, "multi", sources=[t["words"]], sinks=[t["log"], t["snapshot"], t["counts"]],
                   catalog=catalog_settings, interval_ms=1000, grace_ms=100, marker_every=None)
    computed = []

    @job.epoch
    def step(ctx):
        computed.append(ctx.epoch)
        changes = ctx.changes(t["words"])
        ctx.append(t["log"], changes)
        ctx.overwrite(t["snapshot"], ctx.table(t["words"]).distinct())
        ctx.merge(t["counts"], changes.groupBy("word").count().withColumnRenamed("count", "cnt"), on=["word"],
                  matched="t.cnt = t.cnt + s.cnt")

    words.append(pa.table({"word": ["a", "b", "a"]}))
    first_append = words.current_snapshot()
    first = job.run(max_epochs=1)                        # a new job's first epoch is after it opened: it holds it
    words.append(pa.table({"word": ["b", "c"]}))
    second_append = words.current_snapshot()
    later = job.run(until=barrier_after(second_append))
    idle = job.run(until=later[-1] + 2000)                # no new words: every epoch idle
    assert first[-1] >= barrier_after(first_append) and later[-1] == barrier_after(second_append)
    assert idle and idle[-1] == later[-1] + 2000
    # the epochs are barriers, increasing, never repeated (a root job may coalesce barriers it was late for)
    assert job.committed == first + later + idle == sorted(set(job.committed))
    assert all(e % 1000 == 0 for e in job.committed)
    # the function ran exactly for the two epochs with new words; the others committed idle
    assert computed == [epoch_holding(first, first_append), epoch_holding(later, second_append)]
    # the driver's metrics count them, and time the Spark writes (3 sinks, 2 epochs) as staging
    metric = job.writer.metrics.registry.get_sample_value
    assert metric("tidemark_driver_epochs_idle_total", {"tidemark_job": "multi"}) == len(job.committed) - 2
    stage = {"tidemark_job": "multi", "phase": "stage"}
    assert metric("tidemark_driver_epoch_phase_duration_seconds_count", stage) == 6
    version = Resolver(catalog, catalog_settings, tm).resolve(t.values())
    assert version.epoch == idle[-1]
    data = read_arrow(Resolver(catalog, catalog_settings), version)
    assert sorted(data[t["log"]].column("word").to_pylist()) == ["a", "a", "b", "b", "c"]
    assert sorted(data[t["snapshot"]].column("word").to_pylist()) == ["a", "b", "c"]
    assert dict(zip(*[data[t["counts"]].column(c).to_pylist() for c in ("word", "cnt")])) == {"a": 2, "b": 2, "c": 1}
    for sink in ("log", "snapshot", "counts"):
        assert EpochLineage(catalog.load_table(f"{namespace}.{sink}")).committed_epoch == idle[-1]
        # every published snapshot, the MERGE ones included, carries the epoch's whole progress record
        records = [snapshot_progress(s) for s in main_lineage(catalog.load_table(f"{namespace}.{sink}"))]
        published = [r for r in records if r is not None]
        assert [r.epoch for r in reversed(published)] == computed, sink
        for record, epoch in zip(reversed(published), (first_append, second_append)):
            assert record.job == "multi" and record.term >= 1
            assert present(record.inputs).sources[t["words"]].end == epoch.snapshot_id


def test_merge_job_unregistered_and_registered_again_counts_every_word_once(spark, tm, catalog_settings,
                                                                           namespace):
    """The issue's double counting: unregister, then run the MERGE job again; it resumes from its sink's
    Iceberg progress (MERGE snapshots carry it) instead of MERGEing every source row again."""
    catalog = catalog_settings.load()
    words = create(catalog, f"{namespace}.words", WORD)
    create(catalog, f"{namespace}.counts", COUNT)
    source, sink = f"lake.{namespace}.words", f"lake.{namespace}.counts"

    def counting_job() -> EpochJob:
        job = EpochJob(spark, tm, "counter", sources=[source], sinks=[sink], catalog=catalog_settings,
                       interval_ms=1000, grace_ms=100)

        @job.epoch
        def step(ctx):
            delta = ctx.changes(source).groupBy("word").count().withColumnRenamed("count", "cnt")
            ctx.merge(sink, delta, on=["word"], matched="t.cnt = t.cnt + s.cnt")
        return job

    words.append(pa.table({"word": ["a", "b", "a"]}))
    counting_job().run(max_epochs=1)  # a new job's first epoch is after it opened, so after the append
    plan = tm.unregister_job("counter", confirm=True, catalog=catalog_settings)
    assert plan.resume.committed is not None and plan.resume.committed.inputs.sources[source].end == \
        words.current_snapshot().snapshot_id
    words.append(pa.table({"word": ["b", "c"]}))
    # The job registered again resumes at the newest barrier already passed: one must have passed since the append
    # for its epoch to read it (within the same second the barrier is before it, and the epoch is rightly idle).
    appended_ms = present(words.current_snapshot()).timestamp_ms
    wait_for(lambda: time.time() * 1000 >= (appended_ms // 1000 + 1) * 1000, "a barrier after the append", timeout=5)
    counting_job().run(max_epochs=1)
    counts = catalog.load_table(f"{namespace}.counts").scan().to_arrow()
    assert dict(zip(counts["word"].to_pylist(), counts["cnt"].to_pylist())) == {"a": 2, "b": 2, "c": 1}


def test_a_sink_written_twice_in_one_epoch_is_refused(spark, tm, catalog_settings, namespace):
    catalog = catalog_settings.load()
    source = create(catalog, f"{namespace}.src", WORD)
    source.append(pa.table({"word": ["x"]}))
    create(catalog, f"{namespace}.dst", WORD)
    job = EpochJob(spark, tm, "twice", sources=[f"lake.{namespace}.src"], sinks=[f"lake.{namespace}.dst"],
                   catalog=catalog_settings, interval_ms=1000, grace_ms=0)

    @job.epoch
    def step(ctx):
        ctx.append(f"lake.{namespace}.dst", ctx.changes(f"lake.{namespace}.src"))
        ctx.append(f"lake.{namespace}.dst", ctx.changes(f"lake.{namespace}.src"))
    with pytest.raises(EpochOrderError, match="twice"):
        job.run(max_epochs=1)  # the first computed epoch raises


@pytest.fixture
def kill_lake(tmp_path):
    settings = CatalogSettings.embedded(tmp_path)
    catalog = settings.load()
    words = create(catalog, "kill.words", WORD)
    create(catalog, "kill.counts", COUNT)
    create(catalog, "kill.log", WORD)
    with EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path / "zk") as zk:
        yield tmp_path, zk, settings, catalog, words


def run_driver(home: Path, zk: str, max_epochs: int, crash_at: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.helpers.spark_driver", str(home), zk, str(max_epochs)],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=crash_env(crash_at))


KILL_STEPS = ("staged", "precommitted", "published-one", "committed")  # an epoch's steps, in order


def consistent_counts(catalog, settings: CatalogSettings, tm: Tidemark) -> tuple[Counter, dict, Counter]:
    """The words, the counts and the log at the newest consistent version."""
    tables = ["lake.kill.words", "lake.kill.counts", "lake.kill.log"]
    data = read_arrow(Resolver(catalog, settings), Resolver(catalog, settings, tm).resolve(tables))
    words_at = Counter(data["lake.kill.words"].column("word").to_pylist())
    counts = dict(zip(*[data["lake.kill.counts"].column(c).to_pylist() for c in ("word", "cnt")]))
    return words_at, counts, Counter(data["lake.kill.log"].column("word").to_pylist())


@pytest.mark.fault
def test_drivers_killed_at_each_step_in_turn_recover_every_epoch_exactly_once(kill_lake):
    """A driver per step (``KILL_STEPS``), each killed with SIGKILL at that step of its second computed epoch and
    each started on what the one before left (an epoch to recompute, to roll forward, half published, committed in
    ZooKeeper alone), while a producer keeps appending; then one that runs to the end. After each kill the newest
    consistent version holds every word exactly once, and at the end ZooKeeper and Iceberg alone agree on it. (One
    chain of five drivers, not a pair per step: a Spark driver's start is most of such a test.)"""
    home, zk, settings, catalog, words = kill_lake
    stop = threading.Event()

    def produce() -> None:
        i = 0
        while not stop.wait(0.25):
            words.append(pa.table({"word": [f"w{(i + k) % 7}" for k in range(3)]}))
            i += 1
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        with Tidemark.connect(zk.connect_string) as tm:
            for crash_at in KILL_STEPS:
                # the producer keeps every epoch computed; the bound leaves room for idle epochs should it stall
                crashed = run_driver(home, zk.connect_string, 10, crash_at)
                assert crashed.returncode == -9, f"the driver to be killed at {crash_at!r} exited " \
                                                 f"{crashed.returncode}: {crashed.stderr[-2000:]}"
                words_at, counts, logged = consistent_counts(catalog, settings, tm)
                assert counts == dict(words_at), f"after the kill at {crash_at!r} an epoch was lost or counted twice"
                assert logged == words_at, f"after the kill at {crash_at!r} an appended epoch was lost or duplicated"
    finally:
        stop.set()
        producer.join()
    recovered = run_driver(home, zk.connect_string, 2, "none")
    assert recovered.returncode == 0, recovered.stderr[-3000:]
    committed = json.loads(recovered.stdout.strip().splitlines()[-1])["committed"]
    assert committed, "the restarted driver committed nothing"

    tables = ["lake.kill.words", "lake.kill.counts", "lake.kill.log"]
    with Tidemark.connect(zk.connect_string) as tm:
        version = Resolver(catalog, settings, tm).resolve(tables)
        assert version == Resolver(catalog, settings, None).resolve(tables)
        marks = tm.tidemarks(["lake.kill.counts", "lake.kill.log"])
        words_at, counts, logged = consistent_counts(catalog, settings, tm)
    assert version.epoch == committed[-1] and all(present(m).epoch == committed[-1] for m in marks.values())
    assert counts == dict(words_at), "an epoch was lost or counted twice"
    assert logged == words_at, "an appended epoch was lost or duplicated"
    assert sum(words_at.values()) > 0


def test_structured_streaming_batches_are_epochs_and_reruns_are_not_committed_twice(spark, tm, catalog_settings,
                                                                                   namespace, tmp_path):
    catalog = catalog_settings.load()
    create(catalog, f"{namespace}.events", WORD)
    sink = f"lake.{namespace}.events"
    incoming = tmp_path / "incoming"
    incoming.mkdir()
    for i, batch in enumerate([["a", "b"], ["c"]]):
        (incoming / f"{i}.json").write_text("\n".join(json.dumps({"word": w}) for w in batch))
    job = EpochJob(spark, tm, "stream", sources=[], sinks=[sink], catalog=catalog_settings, interval_ms=1000)
    handler = job.foreach_batch(lambda ctx, df: ctx.append(sink, df))
    stream = spark.readStream.schema("word string").option("maxFilesPerTrigger", 1).json(str(incoming))
    query = stream.writeStream.foreachBatch(handler).option("checkpointLocation", str(tmp_path / "ckpt")) \
        .trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert len(job.committed) == 2 and job.committed == sorted(set(job.committed)), "one barrier per batch"
    handler(spark.createDataFrame([("c",)], "word string"), 1)  # Spark re-running batch 1 after a crash
    assert len(job.committed) == 2
    handler(spark.createDataFrame([("d",)], "word string"), 2)
    job.close()
    assert len(job.committed) == 3 and job.committed == sorted(set(job.committed))
    version = Resolver(catalog, catalog_settings, tm).resolve([sink])
    assert version.epoch == job.committed[-1]
    words = read_arrow(Resolver(catalog, catalog_settings), version)[sink].column("word").to_pylist()
    assert sorted(words) == ["a", "b", "c", "d"]
    # each batch was staged (in the streaming query's own session) before Tidemark published it
    assert all(present(s.summary).get("wap.id") for s in main_lineage(catalog.load_table(f"{namespace}.events")))


def test_read_consistent_frames_and_sql_version_as_of(spark, tm, catalog_settings, namespace):
    catalog = catalog_settings.load()
    source = create(catalog, f"{namespace}.src", WORD)
    create(catalog, f"{namespace}.copy", WORD)
    src, copy = f"lake.{namespace}.src", f"lake.{namespace}.copy"
    job = EpochJob(spark, tm, "copier", sources=[src], sinks=[copy], catalog=catalog_settings, interval_ms=1000,
                   grace_ms=100)
    job.epoch(lambda ctx: ctx.append(copy, ctx.changes(src)))
    source.append(pa.table({"word": ["x", "y"]}))
    job.run(max_epochs=1)
    source.append(pa.table({"word": ["late"]}))  # after the barrier: not in the consistent version
    frames = read_consistent(spark, tm, [src, copy], catalog=catalog_settings, register_views=True)
    assert sorted(r.word for r in frames[copy].collect()) == ["x", "y"]
    assert sorted(r.word for r in frames[src].collect()) == ["x", "y"]
    assert spark.sql("SELECT count(*) AS n FROM copy").first().n == 2
    assert spark.sql(f"SELECT count(*) AS n FROM ({frames.sql[src]})").first().n == 2
    latest = read_consistent(spark, tm, [src, copy], level="latest", catalog=catalog_settings)
    assert latest[src].count() == 3


def test_demo_runs_and_its_check_passes(spark, tmp_path):
    result = subprocess.run([sys.executable, "-m", "examples.demo", "--seconds", "12", "--interval-ms", "2000",
                             "--timeout", "540", "--home", str(tmp_path / "demo")], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "RESULT: PASS" in result.stdout
    checked = re.search(r"^consistent versions checked.*: (\d+), inconsistent: (\d+)$", result.stdout, re.M)
    assert checked and int(checked[1]) >= 1 and int(checked[2]) == 0, result.stdout[-3000:]
    assert "every produced word counted exactly once: True" in result.stdout
    served = re.search(r"^reads through tidemark serve .*: (\d+), of which inconsistent: (\d+)$", result.stdout, re.M)
    assert served and int(served[1]) >= 1 and int(served[2]) == 0, result.stdout[-3000:]
