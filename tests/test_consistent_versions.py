"""Consistent versions of tables at mixed epochs, on real ZooKeeper and a real SQLite catalog.

Jobs pick their own epochs among the grid's barriers: an upstream table runs ahead of its downstream, a
downstream job coalesces over barriers its upstream holds (one epoch covers them all), and a job at a
coarser cadence holds only the barriers on its cadence. A consistent version of a set of tables is the
newest epoch every table of the set holds, each table at its snapshot of that epoch. Every version these
tests resolve is read back and checked: a derived table holds exactly the copies of what its upstream
held at the same epoch. They resolve from ZooKeeper's records and from Iceberg alone, after GC, and after
the whole ZooKeeper tree is deleted and the writers restart; and ``as_of`` a barrier a table coalesced
over is refused, naming the table.
"""
from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Mapping
from typing import Optional

import pyarrow as pa
import pytest

from coordinator import InvalidArgument, VersionNotFound
from coordinator.history import resolve as resolve_module
from coordinator.history.checker import ConsistencyChecker
from coordinator.history.gc import GarbageCollector
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.history.retention import RetentionPolicy
from coordinator.history.versions import RetainedVersions, tag_name
from coordinator.iceberg.snapshots import COMMITTED_EPOCH_PROPERTY, snapshot_at_epoch
from coordinator.records import ConsistentVersion
from tests.helpers.lake import commit_rows, create_table, lead_job, rows_of
from tests.helpers.mixed_lake import MixedLake, epoch_counts
from tests.helpers.present import present
from tests.helpers.wait import wait_for
from tests.helpers.zookeeper_tree import wipe_zookeeper


def resolve_all(resolver: Resolver, lake: MixedLake) -> dict[tuple[str, ...], ConsistentVersion]:
    """The consistent version of each set of tables the tests look at, each checked."""
    sets = [(lake.up, lake.down), (lake.up, lake.down, lake.other), (lake.up, lake.other), (lake.down, lake.other)]
    found = {}
    for tables in sets:
        version = found[tables] = resolver.resolve(tables, scope="set")
        lake.check(resolver, version)
    return found


def test_tables_at_mixed_epochs_resolve_to_the_newest_epoch_they_all_hold(tm, connect, zk_server, zk_connect,
                                                                           catalog, catalog_settings, namespace):
    lake = MixedLake(catalog, catalog_settings, namespace)
    lake.open(tm)
    try:
        for epoch in range(1000, 7000, 1000):
            lake.root_epoch(lake.up, epoch)            # up holds every barrier up to 6000: it runs ahead
        lake.copy_epoch(2000)
        lake.copy_epoch(5000)                          # down coalesced over 3000 and 4000, which up holds
        for epoch in (2000, 4000, 6000):
            lake.root_epoch(lake.other, epoch)         # other holds every other barrier
        up, down, other = lake.up, lake.down, lake.other
        expected = {(up, down): 5000, (up, down, other): 2000, (up, other): 6000, (down, other): 2000}

        with_zk = Resolver(catalog, catalog_settings, tm)
        iceberg_only = Resolver(catalog, catalog_settings, None)
        from_zk = resolve_all(with_zk, lake)
        assert {tables: v.epoch for tables, v in from_zk.items()} == expected
        assert resolve_all(iceberg_only, lake) == from_zk, "every epoch published a snapshot: Iceberg records them all"
        # The default scope is the tables' pipelines (up and down are one, other another), as tidemark serve reads
        # them; the set scope is the tables named alone, and without ZooKeeper (no job graph) it is the only one.
        assert with_zk.resolve([up]) == ConsistentVersion(5000, {up: from_zk[(up, down)].snapshots[up]})
        assert with_zk.resolve([up, other]).epoch == 2000 == from_zk[(up, down, other)].epoch  # both pipelines
        assert with_zk.resolve([up, other], scope="set").epoch == 6000 == iceberg_only.resolve([up, other]).epoch
        assert with_zk.resolve([up, other], scope="namespace:elsewhere").epoch == 6000  # no table of it there
        assert with_zk.resolve([other], scope="all").epoch == 2000
        with pytest.raises(InvalidArgument, match=r"scope 'everything' names no group.*resolve also takes set"):
            with_zk.resolve([up], scope="everything")

        # What reading down "at its newest snapshot at or before 4000" would give is not a state of the data:
        # down holds up's rows up to 2000 there, up holds them up to 4000.
        stale = present(snapshot_at_epoch(catalog.load_table(down), 4000))
        assert max(epoch_counts(catalog.load_table(down).scan(snapshot_id=stale.snapshot_id).to_arrow())) == 2000
        for resolver in (with_zk, iceberg_only):
            with pytest.raises(VersionNotFound, match=rf"table {down} does not hold it \(its job coalesced over it"
                                                      rf".*the nearest epochs {down} holds are 2000 and 5000"):
                resolver.resolve([up, down], as_of=4000)
            with pytest.raises(VersionNotFound, match=rf"table {other} does not hold it"):
                resolver.resolve([up, other], as_of=5000)
            version = resolver.resolve([up, down], as_of=2000)
            assert version.epoch == 2000
            lake.check(resolver, version)

        # An idle epoch reaches Iceberg only at the next marker round (once a minute): until then a reader with
        # no ZooKeeper reads the version before it, which is as consistent; after it, the same version.
        lake.writers[up].commit_idle(59_000)
        assert with_zk.resolve([up], scope="set").epoch == 59_000 and iceberg_only.resolve([up]).epoch == 6000
        lake.writers[up].commit_idle(60_000)            # the first epoch of a new minute: a marker round
        assert catalog.load_table(up).properties.get(COMMITTED_EPOCH_PROPERTY) == "60000"
        assert with_zk.resolve([up], scope="set") == iceberg_only.resolve([up])
        assert with_zk.resolve([up], scope="set").epoch == 60_000
        lake.check(iceberg_only, iceberg_only.resolve([up]))
        expected[(up, other)] = 6000
        before_gc = resolve_all(with_zk, lake)
        assert {tables: v.epoch for tables, v in before_gc.items()} == expected

        # GC keeps each pipeline's versions: up and down are one pipeline (named after down, its first job by
        # name), other another, and neither holds the other's back; every table keeps what the reads above need.
        report = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1d"),
                                  clock=lambda: 61_000).run()
        assert report.plan.consistent_epochs == {"down": 5000, "other": 6000}, "each pipeline's newest epoch"
        assert RetainedVersions(tm).keys() == [(2000, "down"), (2000, "other"), (4000, "other"), (5000, "down"),
                                               (6000, "other")]
        assert report.expired_snapshots > 0
        for record in RetainedVersions(tm).all():
            for name in record.covered if record.tag else ():
                assert catalog.load_table(name).metadata.refs[record.tag].snapshot_id == record.snapshots[name]
        assert all(tag_name(5000, "down") in catalog.load_table(name).metadata.refs for name in (up, down))
        assert resolve_all(with_zk, lake) == before_gc
        assert resolve_all(iceberg_only, lake) == before_gc
        for resolver in (with_zk, iceberg_only):  # two pipelines' versions at one epoch: one version of both
            together = resolver.resolve([up, down, other], as_of=2000)
            assert (together.epoch, together.snapshots) == (2000, before_gc[(up, down, other)].snapshots)
        with pytest.raises(VersionNotFound, match=r"snapshot at it .* was expired: the nearest retained versions "
                                                  r"are at epochs 2000"):
            with_zk.resolve([up], as_of=1000)
    finally:
        lake.close()

    # ZooKeeper loses everything. Readers with no ZooKeeper go by the tables' Iceberg records; readers with it read
    # nothing until the writers are back, since Iceberg may hold less than they read (an idle epoch reaches it on a
    # marker round only). Restarted writers reseed their tidemarks from Iceberg with a read floor, the newest barrier
    # by ZooKeeper's clock: no version below it is read with ZooKeeper, and above it the versions agree again.
    wipe_zookeeper(zk_server, zk_connect)
    fresh = connect()
    with pytest.raises(VersionNotFound, match=r"did not release them: ZooKeeper lost their job's state"):
        Resolver(catalog, catalog_settings, fresh).resolve([up, down])
    assert resolve_all(Resolver(catalog, catalog_settings, None), lake) == before_gc
    lake.open(fresh)
    try:
        marks = fresh.tidemarks(lake.tables)
        assert present(marks[down]).epochs == (2000, 5000)
        # GC kept up's main from its pipeline's consistent epoch 5000 (other, another pipeline, holds nothing back):
        # its 3000 and 4000 went, so its lineage starts at 5000.
        assert {5000, 6000, 60_000} <= set(present(marks[up]).epochs) and 4000 not in present(marks[up]).epochs
        floor = max(present(present(m).read_floor) for m in marks.values())
        assert floor >= fresh.server_clock.now_ms() - 60_000, "the read floor is not the barrier of the resumption"
        for resolver in (Resolver(catalog, catalog_settings, fresh), Resolver(catalog, catalog_settings, fresh,
                                                                              fresh.tidemark_cache())):
            with pytest.raises(VersionNotFound, match=rf"no consistent version at or after epoch "
                                                      rf"{max(present(marks[t]).read_floor or 0 for t in (up, down))}"):
                resolver.resolve([up, down])
        lake.copy_epoch(60_000)                        # down carries on where its table says it was
        assert Resolver(catalog, catalog_settings, None).resolve([up, down]).epoch == 60_000
        for table in (up, other):
            lake.root_epoch(table, floor, rows=1)
        lake.copy_epoch(floor)
        version = Resolver(catalog, catalog_settings, fresh).resolve([up, down, other])
        assert version.epoch == floor
        lake.check(Resolver(catalog, catalog_settings, fresh), version)
        assert Resolver(catalog, catalog_settings, None).resolve([up, down, other]) == version
    finally:
        lake.close()


def test_a_fast_table_and_a_slower_cadence_table_read_consistently(connect, catalog, catalog_settings, namespace):
    """``fast`` takes every barrier of a 1 s grid; ``slow`` copies it every 4 s (``every=4000``). Their versions
    are the 4 s barriers both hold, checked while both run; ``as_of`` a barrier only ``fast`` holds names
    ``slow``."""
    fast, slow = f"{namespace}.fast", f"{namespace}.slow"
    for name in (fast, slow):
        create_table(catalog, name)
    fast_writer = lead_job(connect(), catalog_settings, "fast", [fast])
    slow_writer = lead_job(connect(), catalog_settings, "slow", [slow], sources=(fast,), every=4000)
    runs = [threading.Thread(target=fast_writer.run, args=(lambda ctx: ctx.append(fast, rows_of(ctx.epoch, 2)),),
                             kwargs={"stop_on_sigterm": False}),
            threading.Thread(target=slow_writer.run, args=(lambda ctx: ctx.append(slow, ctx.changes(fast)),),
                             kwargs={"stop_on_sigterm": False})]

    def invariant(frames: Mapping[str, pa.Table]) -> Optional[str]:
        fast_rows, slow_rows = epoch_counts(frames[fast]), epoch_counts(frames[slow])
        return None if fast_rows == slow_rows else f"fast holds {fast_rows}, slow {slow_rows}"
    reader = connect()
    checker = ConsistencyChecker(Resolver(catalog, catalog_settings, reader, reader.tidemark_cache()), [fast, slow],
                                 invariant)
    seen: list[int] = []

    def observe() -> bool:
        version = checker.observe()
        if version is not None and version.epoch is not None:
            seen.append(version.epoch)
        return len(slow_writer.committed) >= 3 and checker.checked >= 2
    for run in runs:
        run.start()
    try:
        wait_for(observe, "slow to commit 3 epochs and 2 versions to be checked", timeout=120, every=0.2)
    finally:
        fast_writer.stop()
        slow_writer.stop()
        for run in runs:
            run.join(60)
    assert not any(run.is_alive() for run in runs)
    assert checker.failures == [] and checker.stepped_back == []
    assert seen and all(e % 4000 == 0 for e in seen), seen
    assert all(e % 4000 == 0 for e in slow_writer.committed), slow_writer.committed
    assert any(e % 4000 for e in fast_writer.committed), "fast takes every barrier of the grid"
    assert set(slow_writer.committed) <= set(fast_writer.committed), "slow takes only barriers fast holds"

    with_zk = Resolver(catalog, catalog_settings, reader)
    iceberg_only = Resolver(catalog, catalog_settings, None)
    version = with_zk.resolve([fast, slow])
    assert version.epoch == max(set(slow_writer.committed) & set(fast_writer.committed))
    assert iceberg_only.resolve([fast, slow]) == version, "every epoch of both published a snapshot"
    assert invariant(read_arrow(with_zk, version)) is None
    between = [e for e in fast_writer.committed if slow_writer.committed[0] < e < slow_writer.committed[-1]
               and e not in slow_writer.committed]
    assert between, (fast_writer.committed, slow_writer.committed)
    for resolver in (with_zk, iceberg_only):
        with pytest.raises(VersionNotFound, match=rf"epoch {between[0]} is not a version of .*table {slow} does not "
                                                  r"hold it \(its job coalesced over it"):
            resolver.resolve([fast, slow], as_of=between[0])
        assert resolver.resolve([fast], as_of=between[0]).epoch == between[0], "fast alone holds it"


def test_tables_sharing_no_epoch_and_epochs_before_a_first_epoch_are_refused(tm, catalog, catalog_settings,
                                                                              namespace):
    """No version where the tables share no epoch (each table's newest is named), nor before a table's first
    epoch (the table and its first epoch are named), from ZooKeeper and from Iceberg alone."""
    a, b, d = (f"{namespace}.{t}" for t in ("a", "b", "d"))
    for name in (a, b, d):
        create_table(catalog, name)
    writers = [lead_job(tm, catalog_settings, job, [name]) for job, name in (("a", a), ("b", b), ("d", d))]
    try:
        for epoch in (1000, 3000):
            commit_rows(writers[0], epoch)       # a coalesced over 2000
        writers[1].commit_idle(5000)             # b starts later, and writes nothing
        for epoch in (2000, 4000):
            commit_rows(writers[2], epoch)       # d holds neither of a's epochs
        for resolver in (Resolver(catalog, catalog_settings, tm), Resolver(catalog, catalog_settings, None)):
            with pytest.raises(VersionNotFound, match=rf"tables \['{a}', '{d}'\] share no epoch, so no consistent "
                                                      rf"version of them exists now \({a} at 3000, {d} at 4000\)"):
                resolver.resolve([a, d])
            with pytest.raises(VersionNotFound, match=rf"no consistent version of .* exists yet: {a} at 3000, {d} "
                                                      rf"at 4000, below the first epoch of {b} \(first epoch 5000\)"):
                resolver.resolve([a, b, d])
            with pytest.raises(VersionNotFound, match=rf"epoch 3000 is before the first epoch of {b} \(first "
                                                      "epoch 5000\\)"):
                resolver.resolve([a, b], as_of=3000)
            assert resolver.resolve([b]) == ConsistentVersion(5000, {b: None}), "b holds its first epoch, empty"
            with pytest.raises(VersionNotFound, match=rf"table {a} does not hold it .*the nearest epochs {a} holds "
                                                      "are 1000 and 3000"):
                resolver.resolve([a, d], as_of=2000)
    finally:
        for writer in writers:
            writer.close()


def test_a_stopped_table_holds_the_consistent_epoch_at_its_own_once_its_peers_lists_move_on(tm, connect, catalog,
                                                                                            catalog_settings,
                                                                                            namespace):
    """``stuck``'s job stops at epoch E while ``busy``'s goes on far past its list of recent epochs: the
    consistent version of both stays at E (from ``busy``'s writer's epoch records), not at an older epoch
    the two lists still share; and ``busy`` is read at its snapshot of E."""
    stuck, busy = f"{namespace}.stuck", f"{namespace}.busy"
    for name in (stuck, busy):
        create_table(catalog, name)
    stuck_writer = lead_job(connect(), catalog_settings, "stuck", [stuck])
    busy_writer = lead_job(connect(), catalog_settings, "busy", [busy])
    base = 7_000_000 * 1000 + 1000  # not on a minute: only the 16 newest of busy's list would reach it
    commit_rows(stuck_writer, base, rows=1)
    at_base = commit_rows(busy_writer, base, rows=2)
    for i in range(1, 40):
        commit_rows(busy_writer, base + 1000 * i, rows=1)
    assert not present(tm.tidemarks([busy])[busy]).holds(base), "busy's list should have moved past E"
    version = Resolver(catalog, catalog_settings, tm).resolve([stuck, busy])
    assert version.epoch == base and version.snapshots[busy] == at_base
    frames = read_arrow(Resolver(catalog, catalog_settings), version)
    assert epoch_counts(frames[busy]) == {base: 2} and epoch_counts(frames[stuck]) == {base: 1}


def test_zookeeper_resolves_tables_at_mixed_epochs_without_loading_iceberg_metadata(tm, catalog, catalog_settings,
                                                                                   namespace, loaded):
    """``up`` is ahead of ``down`` and ``other``: its tidemark lists the epoch they hold with its snapshot there,
    so resolving from ZooKeeper takes no snapshot from table metadata: the watch cache loads none, and a new resolver
    one table per job, once (to check its tidemarks are not an older copy's); Iceberg alone (which loads each table
    once) gives the same version."""
    lake = MixedLake(catalog, catalog_settings, namespace)
    lake.open(tm)
    cache = tm.tidemark_cache()
    try:
        for epoch in (1000, 2000, 3000, 4000):
            lake.root_epoch(lake.up, epoch)
        lake.copy_epoch(2000)
        for epoch in (2000, 3000):
            lake.root_epoch(lake.other, epoch)
        loaded.clear()
        cold = Resolver(catalog, catalog_settings, tm).resolve(lake.tables)
        assert cold.epoch == 2000 and sorted(loaded) == sorted(lake.tables), "one table per job (three jobs here)"
        warm = Resolver(catalog, catalog_settings, tm, cache)
        assert warm.resolve(lake.tables) == cold
        loaded.clear()
        assert warm.resolve(lake.tables) == cold and warm.resolve([lake.up, lake.other], scope="set").epoch == 3000
        assert loaded == [], "ZooKeeper names every table's snapshot at the consistent epoch"
        assert Resolver(catalog, catalog_settings, None).resolve(lake.tables) == cold
        assert sorted(loaded) == sorted(lake.tables), "Iceberg alone loads each table's metadata once"
        lake.check(Resolver(catalog, catalog_settings), cold)
    finally:
        cache.close()
        lake.close()


def test_iceberg_alone_keeps_no_tables_metadata_and_indexes_a_table_once_per_metadata_file(
        tm, catalog, catalog_settings, namespace, monkeypatch):
    """A resolver keeps a summary of each table's lineage, not the table: every table a resolution loads is garbage
    once indexed (1,000 tables' metadata kept alive made Python's cyclic collector walk them again and again), and a
    table whose metadata file has not changed since is loaded again (its commits must be seen) but not re-indexed."""
    lake = MixedLake(catalog, catalog_settings, namespace)
    lake.open(tm)
    loaded_tables: list[weakref.ref] = []
    indexed: list[str] = []
    load, lineage = resolve_module.load_table, resolve_module.EpochLineage

    def tracked_load(catalog, settings, name: str):
        table = load(catalog, settings, name)
        loaded_tables.append(weakref.ref(table))
        return table

    def tracked_lineage(table):
        indexed.append(table.name()[-1])
        return lineage(table)
    monkeypatch.setattr(resolve_module, "load_table", tracked_load)
    monkeypatch.setattr(resolve_module, "EpochLineage", tracked_lineage)
    try:
        for epoch in (1000, 2000):
            lake.root_epoch(lake.up, epoch)
        lake.copy_epoch(2000)
        lake.root_epoch(lake.other, 2000)
        resolver = Resolver(catalog, catalog_settings, None)
        version = resolver.resolve(lake.tables)
        assert version.epoch == 2000
        gc.collect()
        assert len(loaded_tables) == 3 and all(ref() is None for ref in loaded_tables), "no table's metadata is kept"
        assert sorted(indexed) == ["down", "other", "up"]
        indexed.clear()
        assert resolver.resolve(lake.tables) == version and indexed == [], "the same metadata files: no new index"
        assert len(loaded_tables) == 6, "each table's metadata is loaded again, to see its new commits"
        lake.root_epoch(lake.up, 3000)
        assert resolver.resolve(lake.tables) == version and indexed == ["up"], "only up's metadata changed"
        assert Resolver(catalog, catalog_settings, tm).resolve(lake.tables) == version
        lake.check(resolver, version)
    finally:
        lake.close()


def test_a_stopped_tables_epoch_comes_from_iceberg_once_its_peers_writer_records_no_longer_reach_it(
        tm, connect, catalog, catalog_settings, namespace, loaded):
    """As above, but ``busy``'s writer keeps 2 epoch records: neither its tidemark's list nor its records reach E
    any more. Its Iceberg metadata does (it published a snapshot at E): once the resolver checked each job's
    tidemarks, only that table's is loaded, and the version is E, the same as from Iceberg alone."""
    stuck, busy = f"{namespace}.stuck", f"{namespace}.busy"
    for name in (stuck, busy):
        create_table(catalog, name)
    stuck_writer = lead_job(connect(), catalog_settings, "stuck", [stuck])
    busy_writer = lead_job(connect(), catalog_settings, "busy", [busy], history=2)
    base = 7_000_000 * 1000 + 1000  # not on a minute: only the 16 newest of busy's list would reach it
    commit_rows(stuck_writer, base, rows=1)
    at_base = commit_rows(busy_writer, base, rows=2)
    for i in range(1, 40):
        busy_writer.commit_idle(base + 1000 * i)  # ZooKeeper only: Iceberg records E by its snapshot
    assert not present(tm.tidemarks([busy])[busy]).holds(base), "busy's list should have moved past E"
    assert tm.get(tm.paths.epoch("busy", base)) is None, "busy's writer should keep no record of E"
    resolver = Resolver(catalog, catalog_settings, tm)
    version = resolver.resolve([stuck, busy])
    assert version.epoch == base and version.snapshots[busy] == at_base
    loaded.clear()
    assert resolver.resolve([stuck, busy]) == version and loaded == [busy]
    assert Resolver(catalog, catalog_settings, None).resolve([stuck, busy]) == version
    frames = read_arrow(Resolver(catalog, catalog_settings), version)
    assert epoch_counts(frames[busy]) == {base: 2} and epoch_counts(frames[stuck]) == {base: 1}
