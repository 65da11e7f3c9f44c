"""Maintenance Tidemark does not run: a catalog's or another engine's compaction, snapshot expiry and orphan removal
(Trino 476's ``optimize``, ``expire_snapshots`` and ``remove_orphan_files`` at a retention of 0 s, and pyiceberg's
``expire_snapshots``), on the real lakehouse (SeaweedFS's REST catalog and S3, ``tests/helpers/trino.py``).

What Tidemark needs survives it as long as a tag protects it (README, "Maintenance run by your catalog or other
engines"): GC tags the retained versions of the tagged tiers, the newest consistent version and every pinned one.
A compaction changes no row: a job reading a compacted source copies nothing twice, and a compaction landing between
an epoch's staging and its publish is published over (the write is built again on top of it from the same files: the
compaction stays). A job whose inputs were expired stops with ``InputsExpired``
instead of reading its source again."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pyiceberg.table.snapshots import Operation

from coordinator import InputsExpired, ReaderSession, Resolver, VersionReader
from coordinator.history.gc import GarbageCollector
from coordinator.history.versions import RetainedVersions, tag_name
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.snapshots import snapshot_epoch
from tests.helpers.present import present
from tests.helpers.spark_cascade import WORD
from tests.helpers.trino import TrinoServer
from tests.helpers.wait import wait_for
from tests.test_lakehouse import CopyPipeline, create
from tests.test_writer_flow import DEADLINE, Fleet, Runner, copy

MAINTAINED = "maintained"  # the run's Trino's catalog with no retention floor (tests/conftest.py)


@pytest.fixture
def lakehouse(trino_lakehouse):
    """The lakehouse the run's one Trino reads."""
    return trino_lakehouse


def compact(trino: TrinoServer, table: str) -> None:
    trino.query(f"ALTER TABLE {MAINTAINED}.{table} EXECUTE optimize")


def trino_maintenance(trino: TrinoServer, catalog, tables: list[str]) -> None:
    """What a catalog's maintenance does, at its most aggressive: compact every table, then expire every snapshot
    older than now, then remove every file no snapshot references."""
    for table in tables:
        compact(trino, table)
    for table in tables:
        trino.query(f"ALTER TABLE {MAINTAINED}.{table} EXECUTE expire_snapshots(retention_threshold => '0s')")
    for table in tables:
        trino.query(f"ALTER TABLE {MAINTAINED}.{table} EXECUTE remove_orphan_files(retention_threshold => '0s')")


def pyiceberg_maintenance(trino: TrinoServer, catalog, tables: list[str]) -> None:
    """pyiceberg's own maintenance: expire every snapshot older than now (it keeps every ref's head)."""
    for table in tables:
        catalog.load_table(table).maintenance.expire_snapshots().older_than(datetime.now(timezone.utc)).commit()


def words(reader: VersionReader) -> dict[str, list[str]]:
    return {t: sorted(reader.arrow(t).column("word").to_pylist()) for t in reader.tables}


def trino_words(trino: TrinoServer, table: str, tag: str) -> list[str]:
    return sorted(row[0] for row in trino.query(f"SELECT word FROM {MAINTAINED}.{table} FOR VERSION AS OF '{tag}'"))


def head_words(catalog, table: str) -> list[str]:
    return sorted(catalog.load_table(table).scan().to_arrow().column("word").to_pylist())


@pytest.mark.parametrize("maintain", [trino_maintenance, pyiceberg_maintenance], ids=["trino", "pyiceberg"])
def test_retained_pinned_and_newest_versions_read_the_same_after_aggressive_maintenance(
        maintain, lakehouse, trino, connect, namespace):
    settings = lakehouse.catalog_settings()
    catalog = settings.load()
    pipeline = CopyPipeline(catalog, namespace)
    seconds = f"{namespace}.seconds"
    create(catalog, seconds, WORD)
    tables = [pipeline.source, pipeline.sink, seconds]
    fleet = Fleet(connect, settings, interval_ms=1000, grace_ms=200)
    tm = connect()
    collector = GarbageCollector(tm, settings)
    session = ReaderSession(Resolver(catalog, settings, tm), tm)

    def consistently(*expected: str) -> bool:
        try:
            return set(map(tuple, words(VersionReader.resolve(tables, tm, settings=settings)).values())) == {expected}
        except Exception:  # noqa: BLE001 - no consistent version yet
            return False

    try:
        pipeline.start(fleet)
        second = fleet.start(fleet.writer("second", [pipeline.source], [seconds]), copy(pipeline.source, seconds))
        for word in ("a", "b"):
            pipeline.append(word)
        fleet.wait(lambda: consistently("a", "b"), "a and b in both copies")
        collector.run()  # its oldest version is the oldest of its hour: a tagged tier's
        pipeline.append("c")
        fleet.wait(lambda: consistently("a", "b", "c"), "c in both copies")
        pinned = session.resolve(tables)
        session.pin(pinned)  # a live reader's version
        pipeline.append("d")
        fleet.wait(lambda: consistently("a", "b", "c", "d"), "d in both copies")
        [consistent] = collector.run().plan.consistent_epochs.values()  # one pipeline
        untagged = present(consistent)  # tagged while the newest, then the `all` tier's
        pipeline.append("e")
        fleet.wait(lambda: consistently("a", "b", "c", "d", "e"), "e in both copies")
        second.stop()  # `seconds` stays there: the newest consistent version is no longer `copies`'s head
        for word in ("f", "g"):
            pipeline.append(word)
        fleet.wait(lambda: head_words(catalog, pipeline.sink) == list("abcdefg"), "copies ahead of seconds")
    finally:
        fleet.stop_all()
    collector.run()  # tags the newest consistent version and the pinned one
    newest = VersionReader.resolve(tables, tm, settings=settings)
    assert newest.version.snapshots[pipeline.sink] != catalog.load_table(pipeline.sink).current_snapshot().snapshot_id
    retained = {r.epoch: r for r in RetainedVersions(tm).all()}
    assert retained[min(retained)].tagged and retained[present(newest.version.epoch)].tagged
    hour = 3_600_000  # the hourly tier tags the oldest version of each hour
    same_hour = any(e < untagged and e // hour == untagged // hour for e in retained)
    assert retained[untagged].tagged != same_hour
    # The pinned version carries a tag: its pipeline's when it became a retained version, else a pin's.
    pinned_tag = retained[present(pinned.epoch)].tag if present(pinned.epoch) in retained else \
        tag_name(present(pinned.epoch))
    for table in tables:
        assert catalog.load_table(table).refs()[present(pinned_tag)].snapshot_id == pinned.snapshots[table]
    before = {e: words(VersionReader.resolve(tables, tm, settings=settings, as_of=e)) for e in retained}
    assert words(VersionReader(session.resolver, pinned)) == {t: list("abc") for t in tables}
    assert words(newest) == {t: list("abcde") for t in tables} and before[untagged][seconds] == list("abcd")

    maintain(trino, catalog, tables)

    for epoch, record in retained.items():
        if not record.tagged:  # the `all` tier's: only GC protects them (the README's rule on retention)
            continue
        assert words(VersionReader.resolve(tables, tm, settings=settings, as_of=epoch)) == before[epoch]
        assert words(VersionReader.resolve(tables, None, settings=settings, as_of=epoch)) == before[epoch], \
            "without ZooKeeper: found by its tags"
        for table in tables:
            assert trino_words(trino, table, present(record.tag)) == before[epoch][table]
    assert words(VersionReader(Resolver(catalog, settings, tm), pinned)) == {t: list("abc") for t in tables}
    for table in tables:
        assert trino_words(trino, table, present(pinned_tag)) == list("abc")
    after = VersionReader.resolve(tables, tm, settings=settings)
    assert after.version == newest.version and words(after) == words(newest)
    decisions = {v.epoch: v for v in collector.run().plan.versions}
    for epoch, record in retained.items():  # an untagged version whose snapshot went is dropped at the next run
        gone = any(catalog.load_table(t).snapshot_by_id(s) is None for t, s in record.snapshots.items() if s)
        assert not (record.tagged and gone) and (decisions[epoch].action == "drop") == gone, decisions[epoch]
    assert (decisions[untagged].action == "drop") == same_hour, decisions[untagged]

    late = Runner(fleet.writer("second", [pipeline.source], [seconds]), copy(pipeline.source, seconds))
    wait_for(lambda: late.done, "the lagging job to stop", DEADLINE)
    assert isinstance(late.error, InputsExpired), late.error
    assert head_words(catalog, seconds) == list("abcde"), "nothing read twice"


def test_a_pipeline_running_across_compactions_loses_and_duplicates_nothing(lakehouse, trino, connect, namespace):
    settings = lakehouse.catalog_settings()
    catalog = settings.load()
    pipeline = CopyPipeline(catalog, namespace)
    tm = connect()
    fleet = Fleet(connect, settings, interval_ms=1000, grace_ms=200)
    between: list[int] = []  # the epoch whose sink was compacted between its staging and its publish

    def copy_and_compact(ctx) -> None:
        new = ctx.changes(pipeline.source)
        if new.num_rows:
            ctx.append(pipeline.sink, new)
            sink = catalog.load_table(pipeline.sink)
            if not between and sum(snapshot_epoch(s) is not None for s in sink.snapshots()) >= 3:
                compact(trino, pipeline.sink)  # two epochs in main, this one staged
                between.append(ctx.epoch)

    def add(word: str) -> None:
        pipeline.words.refresh()  # compacted meanwhile
        pipeline.append(word)
        fleet.wait(lambda: pipeline.consistent_copies(tm, settings) == sorted(pipeline.appended), f"{word} copied")

    try:
        runner = fleet.start(fleet.writer("copy", [pipeline.source], [pipeline.sink]), copy_and_compact)
        fleet.wait(lambda: runner.writer.committed, "the job's first epoch")
        for word in ("a", "b", "c", "d"):
            add(word)
        assert between, "the sink was compacted between an epoch's staging and its publish"
        compact(trino, pipeline.source)  # its next epoch reads past a compaction of its source
        compact(trino, pipeline.sink)    # and writes on top of one
        for word in ("e", "f"):
            add(word)
    finally:
        fleet.stop_all()
    assert sorted(pipeline.appended) == list("abcdef")
    main = {t: EpochLineage(catalog.load_table(t)).main for t in (pipeline.source, pipeline.sink)}
    compactions = {t: [i for i, s in enumerate(m) if present(s.summary).operation == Operation.REPLACE]
                   for t, m in main.items()}
    assert all(compactions.values()), compactions
    assert len(compactions[pipeline.sink]) == 2, "the compaction between a staging and its publish stays in main"
    below = main[pipeline.sink][compactions[pipeline.sink][0] + 1]
    under = present(snapshot_epoch(below))  # the epoch whose snapshot the sink's compaction sits on: d's
    # An epoch whose snapshot a compaction sits on reads the same, with ZooKeeper and from Iceberg alone.
    for zookeeper in (tm, None):
        at = VersionReader.resolve([pipeline.source, pipeline.sink], zookeeper, settings=settings, as_of=under)
        assert words(at)[pipeline.sink] == words(at)[pipeline.source] == list("abcd")
        newest = VersionReader.resolve([pipeline.source, pipeline.sink], zookeeper, settings=settings)
        assert words(newest)[pipeline.sink] == words(newest)[pipeline.source] == list("abcdef")
