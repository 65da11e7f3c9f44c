"""Resolution is the same whether ZooKeeper's records or Iceberg's metadata name the versions, for tables at mixed
epochs, after GC and after a ZooKeeper wipe once the writers are past their read floor (real ZooKeeper, real SQLite
catalog, real ``GarbageCollector``).

The lake: ``up`` (a root job) takes every barrier and runs two epochs ahead of ``down``, which reads it and
coalesced over one of its barriers; ``other`` (a root job) holds fewer barriers than ``up`` and one more than
``down``. So every set of tables resolves to an epoch below some table's newest, and that table's snapshot
comes from its list of recent epochs (ZooKeeper) or from its lineage (Iceberg), never from its head.

Each version is checked three ways: a new ``Resolver`` per resolution (cold: one read of the tidemarks), a
``Resolver`` on the watch cache (resolved twice, the second time from memory), and a ``Resolver`` with no
ZooKeeper; and against the truth, the snapshot each writer published at the epoch (so a resolver that
picks the wrong snapshot of a table, ahead or not, fails even when the other paths pick it too).
"""
from __future__ import annotations

import pytest

from coordinator.errors import VersionNotFound
from coordinator.history.gc import GarbageCollector
from coordinator.history.resolve import ReaderSession, Resolver
from coordinator.history.retention import RetentionPolicy
from coordinator.zookeeper.ops import SetData
from tests.helpers.mixed_lake import MixedLake
from tests.helpers.present import present
from tests.helpers.zookeeper_tree import wipe_zookeeper


def assert_same_everywhere(catalog, settings, lake: MixedLake, warm: Resolver, loaded: list[str],
                           zookeeper_names: bool) -> None:
    """Cold, watch-cache and Iceberg-only resolution of every set give the truth; with ``zookeeper_names``,
    the two ZooKeeper paths take every snapshot from ZooKeeper's records (the watch cache's loads no table metadata;
    a new resolver one table per job once, to check its tidemarks), and the
    watch cache is first waited on until it saw every table's newest epoch (its watches are asynchronous)."""
    assert warm.tm is not None and warm.cache is not None
    if zookeeper_names:
        for table, published in lake.published.items():
            warm.cache.wait_for([table], epoch=max(published), timeout=30)
    for tables in lake.sets():
        truth = lake.truth(tables)
        assert truth.epoch is not None and any(max(lake.published[t]) > truth.epoch for t in tables), \
            f"{tables}: no table is ahead"
        loaded.clear()
        cold = Resolver(catalog, settings, warm.tm).resolve(tables, scope="set")
        if zookeeper_names:
            assert sorted(loaded) == sorted(tables), \
                f"{tables}: a new resolver loads one table of each job, to check its tidemark (an older copy's?)"
        loaded.clear()
        cached = warm.resolve(tables, scope="set")
        again = warm.resolve(tables, scope="set")
        if zookeeper_names:
            assert loaded == [], f"{tables}: ZooKeeper's records name every snapshot, no metadata is loaded"
        iceberg = Resolver(catalog, settings, None).resolve(tables)
        assert cold == truth, f"{tables} cold from ZooKeeper"
        assert cached == truth and again == truth, f"{tables} from the watch cache"
        assert iceberg == truth, f"{tables} from Iceberg alone"


def test_zookeeper_and_iceberg_resolve_the_same_versions_at_mixed_epochs_after_gc_and_after_a_wipe(
        tm, connect, zk_server, zk_connect, catalog, catalog_settings, namespace, loaded):
    lake = MixedLake(catalog, catalog_settings, namespace)
    up, down, other = lake.up, lake.down, lake.other
    lake.open(tm)
    cache = tm.tidemark_cache()
    warm = Resolver(catalog, catalog_settings, tm, cache)
    try:
        for epoch in (1000, 2000, 3000):
            lake.root_epoch(up, epoch)
        lake.copy_epoch(2000)
        lake.root_epoch(other, 2000)
        assert warm.resolve([up, down, other]).epoch == 2000  # the cache loads and watches every tidemark
        for epoch in (4000, 5000, 6000):
            lake.root_epoch(up, epoch)           # up holds every barrier up to 6000
        lake.copy_epoch(4000)                    # down coalesced over 3000, which up holds
        for epoch in (4000, 5000):
            lake.root_epoch(other, epoch)        # other skips 1000, 3000 and 6000
        assert [lake.truth(s).epoch for s in lake.sets()] == [4000, 5000, 4000, 4000]
        assert lake.truth((up, down)).snapshots[up] != catalog.load_table(up).current_snapshot().snapshot_id
        assert_same_everywhere(catalog, catalog_settings, lake, warm, loaded, zookeeper_names=True)

        # GC expires the snapshots below each pipeline's newest consistent epoch (up and down's 4000, other's 5000)
        # that no retained version keeps, so Iceberg's lineages no longer reach the oldest epochs ZooKeeper's lists
        # still name.
        report = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1d"),
                                  clock=lambda: 7000).run()
        assert report.plan.consistent_epochs == {"down": 4000, "other": 5000} and report.expired_snapshots > 0
        assert catalog.load_table(up).snapshot_by_id(lake.published[up][3000]) is None, "up's 3000 expired"
        assert_same_everywhere(catalog, catalog_settings, lake, warm, loaded, zookeeper_names=True)
    finally:
        cache.close()
        lake.close()

    # ZooKeeper loses everything: a reader with no ZooKeeper goes by each table's Iceberg records; one with it reads
    # no version until the writers are back (Iceberg may hold less than it read before the loss).
    wipe_zookeeper(zk_server, zk_connect)
    fresh = connect()
    cache = fresh.tidemark_cache()
    warm = Resolver(catalog, catalog_settings, fresh, cache)
    try:
        assert_zookeeper_refuses(catalog, catalog_settings, lake, warm, "did not release them")

        # The writers restart and reseed their jobs from their sinks' Iceberg progress, with a read floor (the
        # newest barrier then): with ZooKeeper no version below it is read. Above it, at mixed epochs again,
        # ZooKeeper names the snapshots again and every path agrees.
        lake.open(fresh)
        floor = max(present(present(m).read_floor) for m in fresh.tidemarks(lake.tables).values())
        assert_zookeeper_refuses(catalog, catalog_settings, lake, warm, r"no consistent version at or after epoch "
                                 r"\d+ yet .* resumed from Iceberg after ZooKeeper lost their state")
        for epoch in (floor, floor + 1000, floor + 2000, floor + 3000):
            lake.root_epoch(up, epoch, rows=1)
        lake.copy_epoch(floor + 1000)                 # coalesced over the floor, which up holds
        for epoch in (floor + 1000, floor + 2000):
            lake.root_epoch(other, epoch, rows=1)     # other skips the floor and floor + 3000
        assert [lake.truth(s).epoch - floor for s in lake.sets()] == [1000, 2000, 1000, 1000]
        assert_same_everywhere(catalog, catalog_settings, lake, warm, loaded, zookeeper_names=True)
    finally:
        cache.close()
        lake.close()


def test_tidemarks_restored_from_an_older_copy_are_not_resolved_and_no_reader_goes_back(
        tm, catalog, catalog_settings, namespace):
    """A tree restored from an older copy holds older tidemarks, until the job's next take-over resumes it from
    Iceberg. A new resolver there (a new ``tidemark resolve``), one on the watch cache and one that resolved before
    the restore all refuse them (``consistent`` and ``committed``), where the old code gave the copy's older epoch;
    a ``ReaderSession`` gives its newest version again; with the tidemarks current again, resolution goes on."""
    lake = MixedLake(catalog, catalog_settings, namespace)
    pair = (lake.up, lake.down)
    lake.open(tm)
    cache = tm.tidemark_cache()
    before = Resolver(catalog, catalog_settings, tm)
    session = ReaderSession(Resolver(catalog, catalog_settings, tm))
    try:
        lake.root_epoch(lake.up, 1000)
        lake.copy_epoch(1000)
        copy = {t: present(tm.get(tm.paths.tidemark(t)))[0] for t in pair}  # the older copy's
        for epoch in (2000, 3000):
            lake.root_epoch(lake.up, epoch)
            lake.copy_epoch(epoch)
        assert before.resolve(pair).epoch == session.resolve(pair).epoch == 3000
        current = {t: present(tm.get(tm.paths.tidemark(t)))[0] for t in pair}
        tm.multi([SetData(tm.paths.tidemark(t), data) for t, data in copy.items()])  # those znodes restored
        for resolver in (Resolver(catalog, catalog_settings, tm), Resolver(catalog, catalog_settings, tm, cache),
                         before):
            for level in ("consistent", "committed"):
                with pytest.raises(VersionNotFound, match=r"shows epoch 2000 .* committed, and its tidemark in "
                                                          r"ZooKeeper is at 1000: ZooKeeper holds an older copy"):
                    resolver.resolve(pair, level)
        assert session.resolve(pair).epoch == 3000, "a reader session never goes back"
        assert Resolver(catalog, catalog_settings, tm).resolve(pair, as_of=1000).epoch == 1000, "as_of still reads"

        tm.multi([SetData(tm.paths.tidemark(t), data) for t, data in current.items()])  # the job resumed
        assert before.resolve(pair).epoch == 3000
        lake.root_epoch(lake.up, 4000)
        lake.copy_epoch(4000)
        assert session.resolve(pair).epoch == Resolver(catalog, catalog_settings, tm).resolve(pair).epoch == 4000
    finally:
        cache.close()
        lake.close()


def assert_zookeeper_refuses(catalog, settings, lake: MixedLake, warm: Resolver, why: str) -> None:
    """Every set resolves to its truth from Iceberg alone, and to no version with ZooKeeper (``why`` says so)."""
    for tables in lake.sets():
        assert Resolver(catalog, settings, None).resolve(tables) == lake.truth(tables), f"{tables} from Iceberg"
        for resolver in (Resolver(catalog, settings, warm.tm), warm):
            with pytest.raises(VersionNotFound, match=why):
                resolver.resolve(tables)
