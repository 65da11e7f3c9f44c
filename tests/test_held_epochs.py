"""The consistency rule in one place (``coordinator.protocol.held_epochs``): which epochs each table holds, and the
newest epoch a set of tables all hold, the same from ZooKeeper, from Iceberg alone, for GC and for status.

The first tests are of the rule's logic alone (its evidence given as plain functions); the others run writers on
real ZooKeeper and Iceberg, across cadences, until the fast job's lists and epoch records no longer reach the slow
job's epoch.
"""
from __future__ import annotations

import json
import threading
from collections import Counter
from typing import Optional

import pyarrow as pa

from coordinator import VersionNotFound
from coordinator.history.gc import GarbageCollector
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.history.retention import RetentionPolicy
from coordinator.history.versions import tag_name
from coordinator.iceberg.lineage import EpochLineage
from coordinator.protocol.held_epochs import PLACE_TRIES, Evidence, HeldEpochs, common_epochs, held_epochs
from coordinator.records import EpochInputs, SourceRange, TableTidemark, now_ms
from tests.helpers.lake import commit_rows, create_table, lead_job, rows_of
from tests.helpers.present import present
from tests.helpers.wait import wait_for
from tests.test_status import cli


def inputs(**ends: Optional[int]) -> EpochInputs:
    return EpochInputs({f"db.{name}": SourceRange(None, end) for name, end in ends.items()})


# -- the rule's logic ------------------------------------------------------------------------------------------------

def test_common_epochs_are_those_every_table_holds():
    assert common_epochs([{1, 2, 3}, [2, 3, 4], (3, 2)]) == {2, 3}
    assert common_epochs([{1}, {2}]) == set() and common_epochs([]) == set()


class Records:
    """Iceberg's records of two tables, as plain data (``held_epochs.IcebergRecords``), counting what is asked."""

    def __init__(self) -> None:
        self.epochs: dict[str, dict[int, Optional[int]]] = {
            "db.a": {1000: 10, 2000: 20, 3000: 30, 5000: 50}, "db.b": {2000: 200, 4000: 400}}
        self.inputs = {("db.b", 4000): inputs(a=40)}
        self.asked: Counter[str] = Counter()

    def recorded(self, table: str) -> dict[int, Optional[int]]:
        self.asked[f"recorded {table}"] += 1
        return self.epochs[table]

    def committed_epoch(self, table: str) -> Optional[int]:
        return max(self.epochs[table])

    def inputs_at(self, table: str, epoch: int) -> Optional[EpochInputs]:
        self.asked[f"inputs {table} {epoch}"] += 1
        return self.inputs.get((table, epoch))

    def first_epoch(self, table: str) -> Optional[int]:
        return min(self.epochs[table])


def test_held_epochs_are_assembled_one_way_from_the_tidemarks_and_icebergs_records():
    """``db.a`` has a tidemark (its list reaches 3000 and 4000; Iceberg also records older epochs and 5000, above its
    tidemark: not yet committed in ZooKeeper); ``db.b`` has none (its writer is not registered): Iceberg's records,
    up to its committed epoch 4000, whose inputs place ``db.a`` at 4000. ``place`` finds an older epoch in a's
    Iceberg records, and names the table that holds none."""
    mark = TableTidemark("db.a", epoch=4000, snapshot_id=40, first_epoch=1000, recent=((3000, 30), (4000, 40)))
    records = Records()
    holdings = held_epochs({"db.a": mark, "db.b": None}, records)
    assert holdings.held == {"db.a": {3000: 30, 4000: 40}, "db.b": {2000: 200, 4000: 400}}
    assert holdings.newest == {"db.a": 4000, "db.b": 4000}
    assert records.asked["recorded db.a"] == 0, "a table with a tidemark is asked of Iceberg only on demand"
    assert holdings.consistent_epoch() == 4000
    placed = holdings.place(2000)
    assert placed.missing is None and placed.snapshots == {"db.a": 20, "db.b": 200}
    assert holdings.place(1500).missing == "db.a"

    back = held_epochs({"db.a": mark, "db.b": None}, Records(), reach_back=True)
    assert back.held["db.a"] == {1000: 10, 2000: 20, 3000: 30, 4000: 40}, "Iceberg's records up to the tidemark"
    zookeeper_only = held_epochs({"db.a": mark, "db.b": None})
    assert zookeeper_only.held["db.b"] == {} and zookeeper_only.consistent_epoch() is None


def test_the_laggards_epoch_is_placed_in_a_table_by_the_job_that_read_it_and_nowhere_before_its_first_epoch():
    """``db.slow`` (newest 6000) read ``db.fast`` at 6000, an idle epoch of fast's that fast's lists no longer reach:
    fast holds 6000 at the snapshot slow's epoch records. Before fast's first epoch the same record says nothing
    (fast was read by commit time then), and the newest epoch already common is the answer."""
    held = {"db.fast": {5000: 50, 9000: 90}, "db.slow": {2000: 20, 6000: 60}}
    newest = {"db.fast": 9000, "db.slow": 6000}
    recorded_inputs = {("db.slow", 6000): inputs(fast=55)}
    asked: list[tuple[str, int]] = []

    def recorded_at(name: str, epoch: int) -> Optional[EpochInputs]:
        asked.append((name, epoch))
        return recorded_inputs.get((name, epoch))
    holdings = HeldEpochs(held, newest, Evidence(recorded_inputs=recorded_at, first_epoch={"db.fast": 1000}.get))
    assert holdings.consistent_epoch() == 6000
    assert holdings.held["db.fast"][6000] == 55 and asked == [("db.slow", 6000)]

    before_first = HeldEpochs(held, newest, Evidence(recorded_inputs=recorded_at, first_epoch={"db.fast": 7000}.get))
    assert before_first.consistent_epoch() is None, "no epoch in common, and 6000 is before fast's first epoch"


def test_a_later_read_of_a_table_raises_its_newest_epoch_which_iceberg_understates():
    """From Iceberg, ``db.fast``'s newest epoch is 2000 (its idle epochs since fell between marker rounds); ``db.slow``
    read it at 3000, so it holds 3000 (at the snapshot slow's newest epoch records), and that is the version."""
    held = {"db.fast": {1000: 1, 2000: 2}, "db.slow": {1000: 3, 3000: 4}}
    evidence = Evidence(newest_inputs=lambda name: inputs(fast=2) if name == "db.slow" else None,
                        first_epoch={"db.fast": 1000}.get)
    holdings = HeldEpochs(held, {"db.fast": 2000, "db.slow": 3000}, evidence)
    assert holdings.consistent_epoch() == 3000 and holdings.held["db.fast"][3000] == 2
    assert HeldEpochs(held, {"db.fast": 2000, "db.slow": 3000}).consistent_epoch() == 1000, "without the read"


def test_older_epochs_are_tried_newest_first_and_at_most_place_tries_of_them():
    """The laggard's epoch cannot be placed (nothing recorded it): the next older epochs some table holds are tried,
    newest first, at most ``PLACE_TRIES``; an epoch already common ends the search."""
    newest = {"db.a": 100_000, "db.b": 20_000}
    held = {"db.a": {1000: 1, 100_000: 2}, "db.b": {1000: 3, **{e: e for e in range(11_000, 20_001, 1000)}}}
    tried: list[int] = []

    def nothing_recorded(name: str, epoch: int) -> Optional[EpochInputs]:
        tried.append(epoch)
        return None
    evidence = Evidence(recorded_inputs=nothing_recorded, first_epoch={"db.a": 1000, "db.b": 1000}.get)
    assert HeldEpochs(held, newest, evidence).consistent_epoch() == 1000
    assert tried == [20_000, 19_000, 18_000, 17_000][:PLACE_TRIES]

    placed = {("db.b", 18_000): EpochInputs({"db.a": SourceRange(1, 7)})}
    evidence = Evidence(recorded_inputs=lambda n, e: placed.get((n, e)), first_epoch={"db.a": 1000}.get)
    holdings = HeldEpochs(held, newest, evidence)
    assert holdings.consistent_epoch() == 18_000 and holdings.held["db.a"][18_000] == 7


def test_iceberg_records_come_before_a_readers_inputs_and_a_table_with_no_epoch_has_no_version():
    held = {"db.a": {1000: 1}, "db.b": {1000: 2, 3000: 3}}
    evidence = Evidence(recorded=lambda name: {3000: 30} if name == "db.a" else {},
                        recorded_inputs=lambda name, epoch: inputs(a=99), first_epoch={"db.a": 1000}.get)
    holdings = HeldEpochs(held, {"db.a": 5000, "db.b": 3000}, evidence)
    assert holdings.consistent_epoch() == 3000 and holdings.held["db.a"][3000] == 30
    assert HeldEpochs({"db.a": {}, "db.b": {1000: 1}}, {"db.a": None, "db.b": 1000}).consistent_epoch() is None


# -- on real ZooKeeper and Iceberg ------------------------------------------------------------------------------------

def epoch_counts(frame: pa.Table) -> dict[int, int]:
    return dict(Counter(frame.column("epoch").to_pylist()))


def test_an_idle_epoch_of_a_fast_table_is_placed_by_the_slower_job_that_read_it_from_zookeeper_and_iceberg_alike(
        connect, zk_connect, catalog, catalog_settings, namespace):
    """``fast`` computes at E and E+1 s and is idle at D = E+2 s (no marker in that period, so Iceberg does not record
    D); ``slow`` reads it at E and D. Then fast goes on for 40 epochs, past its list and its 2 epoch records. The
    consistent version of both is D, with fast at its snapshot of E+1 s, from ZooKeeper, its watch cache, Iceberg
    alone, GC's ``C``, and ``tidemark status``, which names the epoch ``tidemark resolve`` does."""
    fast, slow = f"{namespace}.fast", f"{namespace}.slow"
    for name in (fast, slow):
        create_table(catalog, name)
    fast_writer = lead_job(connect(), catalog_settings, "fast", [fast], history=2, marker_every="1d")
    slow_writer = lead_job(connect(), catalog_settings, "slow", [slow], sources=(fast,), marker_every="1d")
    base = 7_000_000 * 1000 + 1000  # not on a minute: only the 16 newest of fast's list reach back
    idle = base + 2000

    def copy(ctx) -> None:
        ctx.append(slow, ctx.changes(fast))
    commit_rows(fast_writer, base, rows=1)
    slow_writer.process(base, copy, inputs=slow_writer.inputs_for(base))
    at_idle = commit_rows(fast_writer, base + 1000, rows=2)
    fast_writer.commit_idle(idle)
    slow_writer.process(idle, copy, inputs=slow_writer.inputs_for(idle))
    for i in range(3, 43):
        fast_writer.commit_idle(base + 1000 * i)
    tm = connect()
    assert not present(tm.tidemarks([fast])[fast]).holds(idle), "fast's list should have moved past D"
    assert tm.get(tm.paths.epoch("fast", idle)) is None, "fast's writer should keep no record of D"

    cache = tm.tidemark_cache()
    try:
        resolvers = {"zookeeper": Resolver(catalog, catalog_settings, tm), "iceberg alone": Resolver(
            catalog, catalog_settings, None), "watch cache": Resolver(catalog, catalog_settings, tm, cache)}
        versions = {how: r.resolve([fast, slow]) for how, r in resolvers.items()}
    finally:
        cache.close()
    assert all(v.epoch == idle and v.snapshots[fast] == at_idle for v in versions.values()), {
        how: (v.epoch, v.snapshots[fast], at_idle) for how, v in versions.items()}
    frames = read_arrow(resolvers["zookeeper"], versions["zookeeper"])
    assert epoch_counts(frames[fast]) == epoch_counts(frames[slow]) == {base: 1, base + 1000: 2}

    plan = GarbageCollector(tm, catalog_settings).plan()
    assert [*plan.consistent_epochs.values()] == [idle], "GC tags what readers resolve"
    status = cli(zk_connect, "status", "--json", catalog=catalog_settings)
    resolved = cli(zk_connect, "resolve", fast, slow, "--json", catalog=catalog_settings)
    assert status.returncode == 0 and resolved.returncode == 0, (status.stderr, resolved.stderr)
    assert json.loads(status.stdout)["consistent_epoch"] == json.loads(resolved.stdout)["epoch"] == idle
    fast_writer.close()
    slow_writer.close()


MARKER_S = 10  # the marker period of both jobs: the bound by which Iceberg alone may trail ZooKeeper


def test_across_cadences_iceberg_alone_resolves_what_zookeeper_does_or_trails_within_the_marker_period(
        connect, catalog, catalog_settings, namespace):
    """The issue's set-up, at a smaller scale: a root table appended in bursts (so the fast job has idle epochs),
    ``fast`` at every barrier of a 1 s grid keeping 3 epoch records, ``slow`` every 4 s reading it, a marker period
    of 10 s. Sampled while they run, until 5 samples found ZooKeeper's version at an idle epoch of fast's that
    neither fast's Iceberg records nor its epoch records reach: Iceberg alone always has a version, at most one
    marker period older than ZooKeeper's (or newer: it counts a published snapshot before the ZooKeeper commit),
    and every version read is consistent (slow holds exactly fast's rows up to the epoch)."""
    root, fast, slow = (f"{namespace}.{t}" for t in ("root", "fast", "slow"))
    for name in (root, fast, slow):
        create_table(catalog, name)
    fast_writer = lead_job(connect(), catalog_settings, "fast", [fast], sources=(root,), history=3,
                           marker_every=f"{MARKER_S}s")
    slow_writer = lead_job(connect(), catalog_settings, "slow", [slow], sources=(fast,), every=4000,
                           marker_every=f"{MARKER_S}s")
    stop = threading.Event()

    def bursts() -> None:  # 2 s of appends, then 6 s of nothing
        table = catalog.load_table(root)
        row = 0
        while not stop.is_set():
            for _ in range(4):
                table.append(rows_of(row, 1))
                row += 1
                stop.wait(0.5)
            stop.wait(6)
    runs = [threading.Thread(target=bursts),
            threading.Thread(target=fast_writer.run, args=(lambda ctx: ctx.append(fast, ctx.changes(root)),),
                             kwargs={"stop_on_sigterm": False}),
            threading.Thread(target=slow_writer.run, args=(lambda ctx: ctx.append(slow, ctx.changes(fast)),),
                             kwargs={"stop_on_sigterm": False})]
    tm = connect()
    with_zk, iceberg_alone = Resolver(catalog, catalog_settings, tm), Resolver(catalog, catalog_settings, None)
    problems: list[str] = []
    idle_beyond_records: set[int] = set()
    agreed = 0

    def consistent(resolver: Resolver, version) -> bool:
        frames = read_arrow(resolver, version)
        return sorted(frames[fast].column("row").to_pylist()) == sorted(frames[slow].column("row").to_pylist())

    def sample() -> bool:
        nonlocal agreed
        zk = with_zk.resolve([fast, slow])
        try:
            alone = iceberg_alone.resolve([fast, slow])
        except VersionNotFound as exc:
            problems.append(f"ZooKeeper at {zk.epoch}, Iceberg alone: {exc}")
            return False
        assert zk.epoch is not None and alone.epoch is not None
        agreed += alone == zk
        if zk.epoch - alone.epoch >= MARKER_S * 1000:
            problems.append(f"Iceberg alone at {alone.epoch} trails ZooKeeper's {zk.epoch} by a marker period or more")
        problems.extend(f"{how} version at {v.epoch} is inconsistent" for how, v in (("ZooKeeper", zk),
                        ("Iceberg alone", alone)) if not consistent(iceberg_alone, v))
        recorded = dict(EpochLineage(catalog.load_table(fast)).recorded_epochs())
        if zk.epoch not in recorded and tm.get(tm.paths.epoch("fast", zk.epoch)) is None:
            idle_beyond_records.add(zk.epoch)
        return len(idle_beyond_records) >= 5
    for run in runs:
        run.start()
    try:
        wait_for(lambda: len(slow_writer.committed) >= 1, "slow to commit an epoch", timeout=60)
        wait_for(sample, "5 versions at idle epochs of fast beyond its Iceberg and epoch records", timeout=180,
                 every=0.5)
    finally:
        stop.set()
        fast_writer.stop()
        slow_writer.stop()
        for run in runs:
            run.join(60)
    assert not any(run.is_alive() for run in runs)
    assert problems == [], problems
    assert agreed, "Iceberg alone should name ZooKeeper's version most of the time"
    fast_writer.close()
    slow_writer.close()


def test_a_root_commit_visible_only_after_a_job_read_its_barrier_is_read_as_that_epoch_read_it_then_once_next(
        connect, catalog, catalog_settings, namespace):
    """A producer's commit stamped before barrier ``T`` that becomes visible only after the job's epoch ``T`` read
    the root table (a commit slower than the job's grace): a consistent version at ``T`` has the root as that epoch
    read it, with ZooKeeper, from Iceberg alone, and in the version GC tags; so the copy and the root agree. The
    late rows land in the job's next epoch, once. (Cut by commit time, the root at ``T`` has them and the copy
    does not.)"""
    root, copy = f"{namespace}.root", f"{namespace}.copy"
    create_table(catalog, root)
    create_table(catalog, copy)
    writer = lead_job(connect(), catalog_settings, "copy", [copy], sources=(root,))  # a grace of 0
    table = catalog.load_table(root)
    table.append(rows_of(1, 2))

    def copy_changes(ctx) -> None:
        ctx.append(copy, ctx.changes(root))
    late = table.transaction()
    late.append(rows_of(2, 3))  # the snapshot is stamped now, and becomes visible only at the commit below
    stamped = max(s.timestamp_ms for s in late.table_metadata.snapshots)
    barrier = (stamped // 1000 + 1) * 1000
    wait_for(lambda: now_ms() > barrier, "the clock to pass the barrier after the stamp", timeout=5)
    writer.process(barrier, copy_changes, inputs=writer.inputs_for(barrier))
    late.commit_transaction()
    late_id = present(catalog.load_table(root).current_snapshot()).snapshot_id
    assert EpochLineage(catalog.load_table(root)).at_time(barrier).snapshot_id == late_id  # type: ignore[union-attr]

    tm = connect()

    def rows(resolver: Resolver, version) -> tuple[list, list]:
        frames = read_arrow(resolver, version)
        return (sorted(zip(*(frames[root].column(c).to_pylist() for c in ("epoch", "row")))),
                sorted(zip(*(frames[copy].column(c).to_pylist() for c in ("epoch", "row")))))
    resolvers = {"zookeeper": Resolver(catalog, catalog_settings, tm),
                 "iceberg alone": Resolver(catalog, catalog_settings, None)}
    for how, resolver in resolvers.items():
        version = resolver.resolve([root, copy])
        assert version.epoch == barrier, how
        assert version.snapshots[root] != late_id, f"{how}: the root should be read as epoch {barrier} read it"
        in_root, in_copy = rows(resolver, version)
        assert in_root == in_copy == [(1, 0), (1, 1)], how
    plan = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1h,tags:all")).plan()
    tagged = next(t for t in plan.tables if t.table == root).tags_to_create
    assert tagged[tag_name(barrier, "copy")] == resolvers["zookeeper"].resolve([root, copy]).snapshots[root]

    following = barrier + 1000
    wait_for(lambda: now_ms() > following, "the clock to pass the next barrier", timeout=5)
    writer.process(following, copy_changes, inputs=writer.inputs_for(following))
    for how, resolver in resolvers.items():
        version = resolver.resolve([root, copy])
        assert version.epoch == following and version.snapshots[root] == late_id, how
        in_root, in_copy = rows(resolver, version)
        assert in_root == in_copy == [(1, 0), (1, 1), (2, 0), (2, 1), (2, 2)], how
    writer.close()
