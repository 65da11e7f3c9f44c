"""Retained versions and garbage collection on real ZooKeeper and Iceberg tables, on a simulated clock.

A year of barriers is driven through the real protocol (the idle ones on its one-multi path), with
``tidemark gc`` running every simulated week: the kept versions match the policy exactly, the tagged ones
are those of its tiers of an hour or longer plus the newest (within the policy's bound of tags per
table), every kept version reads back consistently (from ZooKeeper, and the tagged ones from Iceberg
tags alone), and a table keeps no more snapshots than the versions need. Two simulated hours at 2 s
barriers under the default policy keep hundreds of versions and three tags per table. Other tests: a
pinned version and a lagging job's next inputs survive GC, and the lagging job catches up in one epoch;
versions exist only at epochs every table holds; every version ``tidemark versions`` lists has its tag
on every table it covers, or is listed as untagged, after GC, after ``tidemark gc`` killed (SIGKILL) between
two tables' commits and after a driver killed in the middle of its scheduled GC; the CLI; GC on a
schedule in one elected process; old metadata files go; a GC process killed after its expiry commit
leaves orphan files that ``tidemark gc --orphans`` deletes, and only those.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest

from coordinator import ConfigurationError, GcRunning, VersionNotFound, ZooKeeperUnavailable
from coordinator.history.gc import GarbageCollector
from coordinator.history.gc_schedule import GcSchedule
from coordinator.history.resolve import ReaderSession, Resolver
from coordinator.history.retention import DAY_MS, DEFAULT_POLICY, HOUR_MS, RetentionPolicy
from coordinator.history.versions import RetainedVersions, VersionRecord, tag_epoch, tag_name
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.reachability import FileIndex
from coordinator.iceberg.snapshots import snapshot_epoch
from coordinator.iceberg.staging import staged_snapshots
from coordinator.operations.cli import main as cli
from coordinator.zookeeper.ops import Create
from tests.helpers.cli import TIDEMARK, run_cli
from tests.helpers.crash import crash_env
from tests.helpers.lake import commit_rows, create_table, lead_job, rows_of, stage_rows
from tests.helpers.present import present
from tests.helpers.retention import INTERVAL_MS, Pipeline, naive_keep
from tests.helpers.wait import wait_for

START = int(datetime(2025, 1, 6, tzinfo=timezone.utc).timestamp() * 1000)  # a Monday


@pytest.fixture
def pipeline(tm, catalog_settings, namespace):
    built = Pipeline(tm, catalog_settings, namespace)
    yield built
    built.close()


def local_path(location: str) -> str:
    return location[len("file://"):] if location.startswith("file://") else location


def tidemark_tags(table) -> dict[int, int]:
    table.refresh()
    return {e: ref.snapshot_id for name, ref in table.metadata.refs.items() if (e := tag_epoch(name))}


def assert_matches_policy(tm, pipeline: Pipeline, now: int) -> list[int]:
    retained = RetainedVersions(tm).epochs()
    newest = pipeline.committed[-1]
    assert retained == sorted(naive_keep(DEFAULT_POLICY, pipeline.committed, now) | {newest})
    records = {r.epoch: r for r in RetainedVersions(tm).all()}
    tagged = {e for e, r in records.items() if r.tagged}
    assert tagged == naive_keep(DEFAULT_POLICY, pipeline.committed, now, tagged=True) | {newest}, \
        "tagged: the versions of the tiers of an hour or longer, and the newest"
    for name in pipeline.tables:
        tags = tidemark_tags(pipeline.catalog.load_table(name))
        assert set(tags) == {e for e in tagged if records[e].snapshots.get(name)}
        assert len(tags) <= present(RetentionPolicy.default().max_tags()) + 1
    return retained


def assert_listing_true(zk_connect: str, catalog, capsys) -> list[dict]:
    """What ``tidemark versions`` lists is true: a version listed with its tag has it on every table it covers, at
    the version's snapshot; a version listed untagged says so in both outputs; every snapshot listed exists."""
    assert cli(["--zk", zk_connect, "versions", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert cli(["--zk", zk_connect, "versions"]) == 0
    out = capsys.readouterr().out.splitlines()
    headings = [line for line in out if line.startswith("pipeline ")]
    assert headings == sorted({f"pipeline {v['pipeline']}:" for v in listed}), "one heading per pipeline"
    lines = [line.strip() for line in out if line.startswith("  ")]
    assert len(lines) == len(listed) or (not listed and out[0].startswith("no retained versions"))
    tables: dict = {}
    for version, line in zip(listed, lines):
        covered = sorted(name for name, snapshot in version["snapshots"].items() if snapshot is not None)
        for name in covered:
            table = tables.get(name) or tables.setdefault(name, catalog.load_table(name))
            assert table.snapshot_by_id(version["snapshots"][name]) is not None, (version, name)
            if version["tag"] is not None:
                assert version["tag"] == tag_name(version["epoch"], version["pipeline"])
                ref = table.metadata.refs.get(version["tag"])
                assert ref is not None and ref.snapshot_id == version["snapshots"][name], (version, name)
        if version["tag"] is not None:
            assert sorted(version["tagged"]) == covered and line.startswith(f"{version['tag']} ")
            assert f"tagged in {len(covered)} tables" in line
        else:
            assert version["tagged"] == [] and line.startswith(f"{version['epoch']} ")
            assert f"untagged: read by snapshot id (--as-of {version['epoch']})" in line
    return listed


def test_a_simulated_year_keeps_exactly_the_policy_and_every_kept_version_reads_back(tm, pipeline, catalog_settings):
    now = [START]
    collector = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.default(), clock=lambda: now[0])
    year = [START + k * 4 * HOUR_MS for k in range(365 * 6)]                      # every 4 h for a year
    last_hours = [year[-1] + k * INTERVAL_MS for k in range(1, 25)]              # then every 5 min for 2 h
    for k, epoch in enumerate(year + last_hours):
        pipeline.epoch(epoch, rows=2 if k % 73 == 0 or k >= len(year) + 20 else 0)  # data every ~12 days
        now[0] = epoch + 60_000
        if k % 42 == 41:                                                          # a GC every simulated week
            collector.run()
            assert_matches_policy(tm, pipeline, now[0])
    report = collector.run()
    retained = assert_matches_policy(tm, pipeline, now[0])
    tiers = [v.reason for v in report.plan.versions if v.action != "drop"]
    assert {"all", "hourly", "daily", "weekly", "monthly"} <= set(tiers), tiers
    assert len(pipeline.committed) > 2000

    with_zk, iceberg_only = Resolver(pipeline.catalog, catalog_settings, tm), Resolver(pipeline.catalog,
                                                                                         catalog_settings, None)
    tagged = [r.epoch for r in RetainedVersions(tm).all() if r.tagged]
    assert 50 < len(tagged) < len(retained)
    for epoch in retained:  # by snapshot id, from the records: every version
        pipeline.check(with_zk, with_zk.resolve(pipeline.tables, as_of=epoch))
    for epoch in tagged:    # by tag, from Iceberg alone: the tagged ones
        pipeline.check(iceberg_only, iceberg_only.resolve(pipeline.tables, as_of=epoch))
    for name in pipeline.tables:  # storage bounded by the policy, not by a year of epochs
        table = pipeline.catalog.load_table(name)
        assert len(table.snapshots()) <= len(retained) + 2, name
    dropped = next(e for e in pipeline.committed if e not in retained)
    for resolver in (with_zk, iceberg_only):
        with pytest.raises(VersionNotFound, match="nearest retained versions are at epochs "):
            resolver.resolve(pipeline.tables, as_of=dropped)


def test_a_pinned_version_and_a_lagging_jobs_next_inputs_survive_gc(tm, connect, pipeline, catalog_settings):
    epochs = [START + k * INTERVAL_MS for k in range(1, 11)]
    for epoch in epochs[:5]:
        pipeline.epoch(epoch, rows=3)
    now = [epochs[4] + 1]
    GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1h"), clock=lambda: now[0]).run()
    assert RetainedVersions(tm).epochs() == epochs[:5]

    reader_tm = connect()
    session = ReaderSession(Resolver(pipeline.catalog, catalog_settings, reader_tm), reader_tm)
    pinned = session.resolve(pipeline.tables, as_of=epochs[1])
    session.pin(pinned)

    for epoch in epochs[5:]:  # rollup stops at epochs[4]: it lags five of ingest's epochs behind
        pipeline.produce(epoch, rows=4)
    events = pipeline.catalog.load_table(pipeline.events)
    aborted = stage_rows(events, epochs[6], "ingest", 1, 5)  # a staged write never published

    now[0] = epochs[-1] + 30 * DAY_MS  # everything is out of the 1 h policy now
    policy = RetentionPolicy.parse("all:1h,hourly:1d")  # the hour's oldest version kept a day, and tagged
    collector = GarbageCollector(tm, catalog_settings, policy=policy, clock=lambda: now[0])
    plan = collector.plan()
    decisions = {v.epoch: (v.action, v.reason) for v in plan.versions}
    assert decisions[epochs[1]] == ("keep", "pinned by a live reader")
    assert decisions[epochs[4]] == ("keep", "newest consistent version")
    assert {decisions[e][0] for e in (epochs[0], epochs[2], epochs[3])} == {"drop"}
    events_plan = next(t for t in plan.tables if t.table == pipeline.events)
    assert [d.reason for d in events_plan.expire if d.snapshot_id == aborted] == [
        f"staged write of aborted epoch {epochs[6]}"]
    kept_why = {d.snapshot_id: d.reason for d in events_plan.keep}
    events.refresh()
    head = events.current_snapshot()
    assert kept_why[head.snapshot_id] == "head of main"
    assert kept_why[present(head.parent_snapshot_id)] == f"main since epoch {epochs[4]}, the newest consistent version"
    assert decisions[epochs[4]] == ("keep", "newest consistent version")
    assert [*plan.consistent_epochs.values()] == [epochs[4]], \
        "rollup holds none of ingest's newer epochs: epochs[4] is the newest one both tables hold"

    report = collector.run()
    assert report.expired_snapshots >= 4 and report.deleted_files > 0
    tagged = {t: s for t, s in pinned.snapshots.items() if s is not None}
    assert tagged and all(pipeline.catalog.load_table(t).refs()[tag_name(epochs[1], pipeline.name)].snapshot_id == s
                          for t, s in tagged.items()), "tagged while pinned: another engine's expiry keeps it too"
    events.refresh()
    assert events.snapshot_by_id(aborted) is None
    kept_epochs = {snapshot_epoch(s) for s in events.snapshots()}
    assert {epochs[0], epochs[2], epochs[3]}.isdisjoint(kept_epochs) and set(epochs[4:]) <= kept_epochs, \
        "main from the lagging job's last epoch up to the head stays whole"

    pipeline.check(session.resolver, session.resolve(pipeline.tables, as_of=epochs[1]))  # the pin held
    pipeline.roll(epochs[-1])  # the lagging job catches up in one epoch, reading what it would have without GC
    inputs = present(pipeline.rollup.epochs.current).inputs.sources[pipeline.events]
    events.refresh()
    recorded = dict(EpochLineage(events).recorded_epochs())
    assert (inputs.start, inputs.end) == (recorded[epochs[4]], recorded[epochs[-1]])
    resolver = Resolver(pipeline.catalog, catalog_settings, tm)
    version = resolver.resolve(pipeline.tables)
    assert version.epoch == epochs[-1]
    pipeline.check(resolver, version)
    with pytest.raises(VersionNotFound, match=rf"table {pipeline.totals} does not hold it .*the nearest epochs "
                                              rf"{pipeline.totals} holds are {epochs[4]} and {epochs[-1]}"):
        resolver.resolve(pipeline.tables, as_of=epochs[7])  # rollup coalesced over it
    with pytest.raises(VersionNotFound, match=f"nearest retained versions are at epochs {epochs[1]} and {epochs[4]}"):
        resolver.resolve(pipeline.tables, as_of=epochs[2])

    session.close()
    reader_tm.close()
    collector.run()  # unpinned: the pinned version falls out of the policy now
    assert RetainedVersions(tm).epochs() == [epochs[-1]]
    assert all(tag_name(epochs[1], pipeline.name) not in pipeline.catalog.load_table(t).refs() for t in tagged)


def test_the_cli_lists_versions_dry_runs_gc_and_resolves_a_tag(tm, zk_connect, pipeline, catalog_settings,
                                                               catalog_env, capsys):
    base = (datetime.now(timezone.utc).timestamp() * 1000 // INTERVAL_MS - 5) * INTERVAL_MS
    epochs = [int(base + k * INTERVAL_MS) for k in range(3)]
    for epoch in epochs:
        pipeline.epoch(epoch, rows=1)
    args = ["--zk", zk_connect]

    assert cli([*args, "gc", "--dry-run", "--json", "--policy", "all:1d"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["dry_run"] and [v["action"] for v in planned["plan"]["versions"]] == ["create"] * 3
    assert RetainedVersions(tm).epochs() == [], "a dry run changes nothing"

    assert cli([*args, "gc", "--yes", "--policy", "all:1d"]) == 0
    out = capsys.readouterr().out
    assert f"pipeline {pipeline.name}: newest consistent epoch {epochs[2]}" in out
    assert f"version {epochs[0]}, pipeline {pipeline.name}'s: create (all, untagged)" in out and "expired" in out
    assert f"version {epochs[2]}, pipeline {pipeline.name}'s: create (all, tagged)" in out, "the newest is tagged"
    assert cli([*args, "versions", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(v["tag"], v["tier"]) for v in listed] == [(None, "all"), (None, "all"),
                                                      (tag_name(epochs[2], pipeline.name), "all")]
    assert cli([*args, "versions"]) == 0
    out = capsys.readouterr().out
    assert f"{epochs[0]}  " in out and f"untagged: read by snapshot id (--as-of {epochs[0]})" in out
    assert out.startswith(f"pipeline {pipeline.name}:\n")
    assert f"  {tag_name(epochs[2], pipeline.name)}  " in out and "tagged in 2 tables" in out

    assert cli([*args, "resolve", *pipeline.tables, "--as-of", tag_name(epochs[1], pipeline.name), "--json"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["epoch"] == epochs[1] and resolved["level"] == "as_of"
    assert cli([*args, "resolve", *pipeline.tables, "--as-of", "yesterday"]) == 2
    assert "'yesterday' is neither an epoch (milliseconds since 1970) nor a tag" in capsys.readouterr().err
    assert cli([*args, "gc", "--policy", "hourly"]) == 1
    assert "must be <every>:<for>" in capsys.readouterr().err


def test_every_listed_version_has_its_tag_on_every_table_it_covers(tm, zk_connect, pipeline, catalog_settings,
                                                                    catalog_env, capsys):
    """A version at which every table was empty is not made: no tag could name it (``tidemark versions`` once
    listed such a version as covering 2 tables while no table had its tag). Each listed version names the tables
    carrying its tag, and each of them carries it, on the version's snapshot."""
    epochs = [START + k * INTERVAL_MS for k in range(1, 4)]
    pipeline.epoch(epochs[0])             # both jobs' first epoch is idle: both tables are empty at it
    pipeline.epoch(epochs[1], rows=2)
    pipeline.epoch(epochs[2])             # idle: both tables keep their snapshots
    report = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1d,tags:all"),
                              clock=lambda: epochs[2] + 1).run()
    assert f"epoch {epochs[0]} is not made a version: every table was empty then, so no tag could name it" in \
        report.plan.notes
    assert RetainedVersions(tm).epochs() == epochs[1:]

    listed = assert_listing_true(zk_connect, pipeline.catalog, capsys)
    assert [v["epoch"] for v in listed] == epochs[1:]
    for version in listed:
        assert sorted(version["tagged"]) == sorted(pipeline.tables) and version["empty"] == []


def test_scheduled_gc_runs_in_one_process_at_a_time(tm, connect, pipeline, catalog_settings):
    epoch = START + INTERVAL_MS
    pipeline.epoch(epoch, rows=1)
    now = [epoch + 1]
    first = GcSchedule(tm, catalog_settings, every_s=3600, clock=lambda: now[0])
    second = GcSchedule(connect(), catalog_settings, every_s=3600, clock=lambda: now[0])
    assert first.run_if_due() is not None
    assert second.run_if_due() is None, "ran less than every_s ago, by the other process"
    holder = tm.client.Lock(tm.paths.gc_lock, identifier="someone")
    now[0] += 3600 * 1000
    assert holder.acquire(timeout=10)
    assert second.run_if_due() is None, "another process holds the GC lock"
    holder.release()
    assert second.run_if_due() is not None and RetainedVersions(tm).epochs() == [epoch]

    now[0] += 3600 * 1000
    threaded = GcSchedule(tm, catalog_settings, every_s=0.05, clock=lambda: now[0]).start()
    wait_for(lambda: threaded.runs >= 1, "the scheduled GC's first run")
    threaded.stop()
    assert threaded.last_error is None


def test_tidemark_gc_waits_for_a_run_in_progress_and_says_so_when_it_cannot(tm, connect, zk_connect, pipeline,
                                                                            catalog_settings, catalog_env, capsys):
    base = (datetime.now(timezone.utc).timestamp() * 1000 // INTERVAL_MS - 5) * INTERVAL_MS
    pipeline.epoch(int(base), rows=1)
    gc = ["--zk", zk_connect, "gc", "--yes", "--policy", "all:1d"]
    running = GarbageCollector(tm, catalog_settings)
    with ThreadPoolExecutor(1) as pool:
        with running.exclusive():
            assert cli([*gc, "--wait", "0.5"]) == 1
            err = capsys.readouterr().err
            assert err.startswith("tidemark: error: another garbage collection is running") and tm.member in err
            assert err.count("\n") == 1 and "Traceback" not in err
            assert RetainedVersions(tm).epochs() == [], "the refused run changed nothing"
            assert cli([*gc, "--wait", "0.5", "--skip-if-running"]) == 0, "a scheduled run skips its turn"
            assert capsys.readouterr().out.startswith("skipped: another garbage collection is running")
            assert cli([*gc, "--dry-run"]) == 0, "a dry run changes nothing, so it needs no lock"
            capsys.readouterr()

            waiting = pool.submit(cli, [*gc, "--wait", "60"])
            lock = tm.client.Lock(tm.paths.gc_lock)
            wait_for(lambda: len(lock.contenders()) == 2, "the command to queue for the GC lock")
            assert RetainedVersions(tm).epochs() == []
        assert waiting.result(timeout=120) == 0, "the command ran once the other run released the lock"
    assert RetainedVersions(tm).epochs() == [int(base)]
    other = GarbageCollector(connect(), catalog_settings)  # another driver calling GC directly
    with running.exclusive():
        with pytest.raises(GcRunning, match="another garbage collection is running"):
            other.run()
        with pytest.raises(GcRunning):
            other.remove_orphan_files()
        assert running.run().dry_run is False, "the holder's own runs go ahead inside its block"
    assert other.run().dry_run is False


def test_a_gc_run_whose_connection_dropped_stops_before_its_next_table(zk_server, tm, pipeline, catalog_settings):
    for k in range(1, 4):
        pipeline.epoch(START + k * INTERVAL_MS, rows=1)
    collector = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1h"),
                                 clock=lambda: START + 4 * INTERVAL_MS)
    before = {name: len(pipeline.catalog.load_table(name).snapshots()) for name in pipeline.tables}
    with collector.exclusive():
        zk_server.kill()
        wait_for(lambda: tm.connection_state != "CONNECTED", "the session to see its connection drop")
        zk_server.start()
        wait_for(lambda: tm.connection_state == "CONNECTED", "the session to reconnect", timeout=60)
        with pytest.raises(ZooKeeperUnavailable, match="another process may hold the GC lock now"):
            collector.run()
    assert {name: len(pipeline.catalog.load_table(name).snapshots()) for name in pipeline.tables} == before
    assert RetainedVersions(tm).epochs() == [], "no table and no version was touched"
    assert collector.run().expired_snapshots > 0, "the next run, under a fresh lock, does the work"


def test_orphan_removal_refuses_tables_that_share_a_directory(tm, pipeline, catalog_settings):
    pipeline.epoch(START + INTERVAL_MS, rows=1)
    events = pipeline.catalog.load_table(pipeline.events)
    with pipeline.catalog.load_table(pipeline.totals).transaction() as tx:
        tx.set_properties({"write.data.path": f"{events.location()}/data"})
    with pytest.raises(ConfigurationError, match=r"share the directory .*nothing was deleted"):
        GarbageCollector(tm, catalog_settings).remove_orphan_files(DAY_MS)


def test_gc_bounds_old_metadata_files(tm, pipeline, catalog_settings):
    for k in range(1, 4):
        pipeline.epoch(START + k * INTERVAL_MS, rows=1)
    GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1h"),
                     clock=lambda: START + 4 * INTERVAL_MS).run()
    for k in range(4, 9):
        pipeline.epoch(START + k * INTERVAL_MS, rows=1)
    table = pipeline.catalog.load_table(pipeline.events)
    metadata_dir = Path(table.metadata_location.replace("file://", "")).parent
    files = [f for f in os.listdir(metadata_dir) if f.endswith(".metadata.json")]
    assert len(files) <= 11, f"{len(files)} metadata files kept"


def test_a_gc_killed_after_its_expiry_commit_leaves_orphans_that_gc_orphans_deletes(tm, zk_connect, pipeline,
                                                                                    catalog_settings, catalog_env,
                                                                                    capsys):
    for k in range(1, 7):
        pipeline.epoch(START + k * INTERVAL_MS, rows=2)
    events = pipeline.catalog.load_table(pipeline.events)
    referenced_before = FileIndex().referenced(events, events.snapshots())
    gc = [*TIDEMARK, "--zk", zk_connect, "gc", "--yes", "--policy", "all:1h"]
    killed = subprocess.run(gc, env={**crash_env("gc-expired", nth=1), **catalog_env}, capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "crash point gc-expired#1 reached" in killed.stderr
    events.refresh()
    left_behind = {local_path(p) for p in referenced_before - FileIndex().referenced(events, events.snapshots())}
    assert left_behind, "the killed run expired snapshots of events before it died"

    args = ["--zk", zk_connect, "gc", "--yes"]
    assert cli(args) == 0, "a complete run finishes what the killed one left (the totals table)"
    capsys.readouterr()
    assert all(os.path.exists(p) for p in left_behind), "no expiry can find the killed run's files any more"

    assert cli([*args, "--orphans", "--dry-run", "--json"]) == 0
    assert [o["paths"] for o in json.loads(capsys.readouterr().out)["orphans"]] == [[], []], \
        "every file is younger than three days: a write in progress could still commit it"

    data_dir = Path(local_path(events.location())) / "data"
    killed_writer = data_dir / "killed-writer-00000.parquet"
    killed_writer.write_bytes(b"PAR1")
    four_days_ago = time.time() - 4 * 24 * 3600
    for name in pipeline.tables:
        for path in Path(local_path(pipeline.catalog.load_table(name).location())).rglob("*"):
            os.utime(path, (four_days_ago, four_days_ago))
    in_flight = data_dir / "in-flight-00000.parquet"
    in_flight.write_bytes(b"PAR1")

    assert cli([*args, "--orphans", "--dry-run", "--json"]) == 0
    found = {o["table"]: set(o["paths"]) for o in json.loads(capsys.readouterr().out)["orphans"]}
    assert found == {pipeline.events: left_behind | {str(killed_writer)}, pipeline.totals: set()}
    assert all(os.path.exists(p) for p in found[pipeline.events]), "a dry run deletes nothing"

    assert cli([*args, "--orphans"]) == 0
    assert f"table {pipeline.events}: deleted {len(left_behind) + 1} orphan files" in capsys.readouterr().out
    assert not any(os.path.exists(p) for p in found[pipeline.events])
    assert in_flight.exists(), "a file younger than --older-than is never an orphan"
    assert cli([*args, "--orphans", "--older-than", "12h"]) == 2
    assert "less than a day" in capsys.readouterr().err

    resolver = Resolver(pipeline.catalog, catalog_settings, tm)
    for epoch in RetainedVersions(tm).epochs():
        pipeline.check(resolver, resolver.resolve(pipeline.tables, as_of=epoch))
    for name in pipeline.tables:
        table = pipeline.catalog.load_table(name)
        for snapshot in table.snapshots():  # every file a remaining snapshot needs is still there
            table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()


def test_the_files_of_a_precommitted_write_are_no_orphans_however_old(tm, connect, catalog_settings, namespace):
    """A write staged with no catalog commit is in no metadata until its publish: while its epoch is precommitted (its
    driver died there, and the job has been down for days), orphan removal keeps its files, and the next leader
    rolls the epoch forward."""
    catalog = catalog_settings.load()
    sink = f"{namespace}.held"
    table = create_table(catalog, sink, first_snapshot=False)
    writer = lead_job(connect(), catalog_settings, "held", [sink])
    commit_rows(writer, START, rows=2)
    record = writer.epochs.begin(START + INTERVAL_MS)
    ctx = writer.context(writer, record)
    ctx.append(sink, rows_of(START + INTERVAL_MS, 3))
    writer.epochs.precommit(record.epoch, ctx.staged, ctx.writes)
    writer.tm.close()  # the driver dies here, with its session
    staged = FileIndex().referenced(table, staged_snapshots(ctx.writes[sink]))
    leftover = Path(local_path(table.location())) / "data" / "killed-writer-00000.parquet"
    leftover.write_bytes(b"PAR1")
    four_days_ago = time.time() - 4 * 24 * 3600
    for path in Path(local_path(table.location())).rglob("*"):
        os.utime(path, (four_days_ago, four_days_ago))

    found = GarbageCollector(tm, catalog_settings).remove_orphan_files(3 * DAY_MS)

    assert [set(o.paths) for o in found] == [{str(leftover)}], "only the file nothing references, nor will"
    assert staged and all(os.path.exists(local_path(p)) for p in staged)
    successor = lead_job(connect(), catalog_settings, "held", [sink])
    assert successor.committed == [START + INTERVAL_MS], "rolled forward"
    assert sorted(catalog.load_table(sink).scan().to_arrow()["epoch"].to_pylist()) == [START] * 2 + \
        [START + INTERVAL_MS] * 3
    successor.close()


def test_the_default_policy_tags_a_bounded_number_of_versions_at_2s_barriers(tm, zk_connect, catalog_settings,
                                                                            catalog_env, namespace, capsys):
    """Issue 19: ``all:1h`` used to tag every version GC made, up to 1,800 tags per table per hour at 2 s barriers,
    each a ref that every commit of the table copies. Under the default, 65 simulated minutes at 2 s barriers with
    GC every 5 minutes keep hundreds of versions in ``/versions`` and tag three: the oldest of each hour and the
    newest."""
    pipeline = Pipeline(tm, catalog_settings, namespace, interval_ms=2000)
    try:
        now = [START]
        collector = GarbageCollector(tm, catalog_settings, clock=lambda: now[0])  # the deployment's: the default
        for k in range(1, 65 * 30 + 1):
            epoch = START + k * 2000
            pipeline.epoch(epoch, rows=1 if k % 30 == 0 else 0)  # data once a minute, idle epochs in between
            now[0] = epoch + 1
            if k % 150 == 0:                                     # GC every 5 simulated minutes
                collector.run()
                listed = assert_listing_true(zk_connect, pipeline.catalog, capsys)
                for name in pipeline.tables:
                    table = pipeline.catalog.load_table(name)
                    assert set(tidemark_tags(table)) == {v["epoch"] for v in listed if v["tag"]}
                    assert len(tidemark_tags(table)) <= 3, (k, sorted(tidemark_tags(table)))
                    assert len(table.metadata.refs) <= 4  # main and the tags
        versions = RetainedVersions(tm).all()
        assert len(versions) > 150, "the all tier keeps every version GC saw in the last hour, untagged"
        tagged = [r.epoch for r in versions if r.tagged]
        assert tagged == [START + 60_000, START + 3_600_000, pipeline.committed[-1]], \
            "the oldest version of each hour GC saw (whole minutes reach every run), and the newest"
        resolver = Resolver(pipeline.catalog, catalog_settings, tm)
        for record in versions[::25]:  # an untagged version reads back by its snapshot ids
            pipeline.check(resolver, resolver.resolve(pipeline.tables, as_of=record.epoch))
    finally:
        pipeline.close()


def test_versions_stay_true_when_tidemark_gc_is_killed_between_two_tables(tm, zk_connect, catalog_settings,
                                                                          catalog_env, namespace, capsys):
    """``tidemark gc`` SIGKILLed after one table's commit, twice, then run to the end: at every point each listed
    version has its tag on every table it covers or is listed untagged. A version that loses its tag (the old
    oldest of its 10 minutes, a tier no longer tagged) is recorded untagged before any table loses the tag."""
    minute = 60_000
    base = int(datetime.now(timezone.utc).timestamp() * 1000) // (10 * minute) * (10 * minute) - 30 * minute
    epochs = [base + (k + 2) * minute for k in range(20)]  # 1 min apart, 10 to 28 min ago; epochs[9] is not the
    pipeline = Pipeline(tm, catalog_settings, namespace, interval_ms=minute)  # oldest of its 10 minutes
    try:
        for epoch in epochs[:10]:
            pipeline.epoch(epoch, rows=1)
        GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1d,10m:1d,tags:10m")).run()
        assert [r.epoch for r in RetainedVersions(tm).all() if r.tagged] == [epochs[0], epochs[8], epochs[9]]
        assert_listing_true(zk_connect, pipeline.catalog, capsys)
        for epoch in epochs[10:]:
            pipeline.epoch(epoch, rows=1)

        # Only whole 10 minutes and the newest are kept now, and only the newest is tagged: epochs[8] loses its tag.
        gc = [*TIDEMARK, "--zk", zk_connect, "gc", "--yes", "--policy", "all:1m,10m:1d,tags:hourly"]
        for killed_after in (pipeline.events, pipeline.totals):  # the second run finds the events table done
            killed = subprocess.run(gc, env={**crash_env("gc-expired", nth=1), **catalog_env}, capture_output=True,
                                    text=True, timeout=120, stdin=subprocess.DEVNULL)
            assert killed.returncode == -signal.SIGKILL, killed.stderr
            listed = {v["epoch"]: v for v in assert_listing_true(zk_connect, pipeline.catalog, capsys)}
            assert listed[epochs[8]]["tag"] is None, "recorded untagged before the first table lost the tag"
            if killed_after == pipeline.events:
                assert epochs[8] in tidemark_tags(pipeline.catalog.load_table(pipeline.totals)), \
                    "killed before the totals table's commit: its tag is still there (harmless)"
                assert epochs[19] in tidemark_tags(pipeline.catalog.load_table(pipeline.events))
            assert epochs[19] not in listed, "a new version is recorded only after every table has its tag"

        assert cli(["--zk", zk_connect, "gc", "--yes"]) == 0
        capsys.readouterr()
        listed = {v["epoch"]: v for v in assert_listing_true(zk_connect, pipeline.catalog, capsys)}
        assert sorted(listed) == [epochs[0], epochs[8], epochs[18], epochs[19]]
        assert [e for e, v in listed.items() if v["tag"]] == [epochs[19]]
        for name in pipeline.tables:
            assert sorted(tidemark_tags(pipeline.catalog.load_table(name))) == [e for e, v in listed.items()
                                                                               if v["tag"]]
        resolver = Resolver(pipeline.catalog, catalog_settings, tm)
        for epoch in listed:
            pipeline.check(resolver, resolver.resolve(pipeline.tables, as_of=epoch))
    finally:
        pipeline.close()


def test_versions_stay_true_when_a_driver_is_killed_in_the_middle_of_its_scheduled_gc(tm, zk_connect,
                                                                                       catalog_settings, catalog_env,
                                                                                       namespace, capsys):
    """A driver process runs a job on a 1 s grid and GC on its schedule, every second; it SIGKILLs itself after its
    eighth expiry commit, several runs in (``latest`` expires a snapshot of its overwrites every run), between a
    table's commit and the rest of the run. Each listed version is tagged on every table it covers, or listed
    untagged, right after the kill and after the next run."""
    catalog = catalog_settings.load()
    log, latest = f"{namespace}.log", f"{namespace}.latest"
    for name in (log, latest):
        create_table(catalog, name)
    policy = "all:30s,5s:1h,tags:5s"  # the oldest version of each 5 s tagged, and the newest
    config = {"connect": zk_connect, "log": log, "latest": latest, "policy": policy, "gc_every_s": 1.0,
              "catalog": {"name": catalog_settings.name, "uri": catalog_settings.uri,
                          "warehouse": catalog_settings.warehouse}}
    driver = subprocess.Popen([sys.executable, "-m", "tests.helpers.gc_driver", json.dumps(config)],
                              env=crash_env("gc-expired", nth=8), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL)
    try:
        _, err = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    assert driver.returncode == -signal.SIGKILL, err
    assert "crash point gc-expired#8 reached" in err
    listed = assert_listing_true(zk_connect, catalog, capsys)
    assert any(v["tag"] for v in listed), listed

    collector = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse(policy))
    collector.run(wait_s=30)  # the killed driver's lock goes with its session
    listed = assert_listing_true(zk_connect, catalog, capsys)
    tagged = sorted(v["epoch"] for v in listed if v["tag"])
    for name in (log, latest):
        assert sorted(tidemark_tags(catalog.load_table(name))) == tagged


def test_a_first_gc_keeps_the_oldest_version_of_the_hour_beyond_zookeepers_recent_epochs(tm, catalog_settings,
                                                                                        namespace):
    """ZooKeeper lists a table's newest 16 epochs (and older aligned ones); a first gc on a running pipeline looks
    in Iceberg too, so the hourly tier keeps the hour's oldest version, as the policy says, not a minute-old one."""
    pipeline = Pipeline(tm, catalog_settings, namespace, interval_ms=2000)
    try:
        hour = START + 10 * HOUR_MS
        epochs = [hour + 62_000 + 2000 * k for k in range(25)]  # 25 epochs in one minute, none minute-aligned
        for epoch in epochs:
            pipeline.epoch(epoch, rows=1)
        recent = tm.tidemarks([pipeline.events])[pipeline.events]
        assert epochs[0] not in dict(present(recent).recent), "ZooKeeper still lists the oldest epoch: no test"
        GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("hourly:1d,tags:hourly"),
                         clock=lambda: epochs[-1] + 60_000).run()
        assert RetainedVersions(tm).epochs() == [epochs[0], epochs[-1]], "the hour's oldest, and the newest"
        pipeline.check(Resolver(pipeline.catalog, catalog_settings, None),
                       Resolver(pipeline.catalog, catalog_settings, None).resolve(pipeline.tables, as_of=epochs[0]))
    finally:
        pipeline.close()


def test_an_earlier_releases_version_stays_readable_by_its_tag_and_ages_out_by_the_policy(
        tm, zk_connect, pipeline, catalog_settings, catalog_env, capsys):
    """A version an earlier release retained (``/versions/<T>`` across every table, tag ``tidemark-<T>``) is read by
    its tag with and without ZooKeeper and listed on its own, while the policy keeps it; GC makes no new one like
    it, and drops it (record and tags) once no tier keeps it, as it did before."""
    epochs = [START + k * INTERVAL_MS for k in range(1, 4)]
    for epoch in epochs:
        pipeline.epoch(epoch, rows=2)
    resolver = Resolver(pipeline.catalog, catalog_settings, tm)
    legacy = resolver.resolve(pipeline.tables, as_of=epochs[0])
    for name, snapshot_id in legacy.snapshots.items():
        table = pipeline.catalog.load_table(name)
        table.manage_snapshots().create_tag(present(snapshot_id), tag_name(epochs[0])).commit()
    tm.multi([Create(tm.paths.version(epochs[0]), VersionRecord(epochs[0], legacy.snapshots, START).to_json())])

    now = [epochs[-1] + 60_000]
    policy = RetentionPolicy.parse("all:1h,hourly:1d")  # the hour's oldest version kept a day, and tagged
    collector = GarbageCollector(tm, catalog_settings, policy=policy, clock=lambda: now[0])
    collector.run()
    assert RetainedVersions(tm).keys() == [(epochs[0], None), *((e, pipeline.name) for e in epochs)]
    for reader in (resolver, Resolver(pipeline.catalog, catalog_settings, None)):  # its tag, or its record
        assert reader.resolve(pipeline.tables, as_of=epochs[0]).snapshots == legacy.snapshots
    for name in pipeline.tables:  # any engine reads it by that name
        assert pipeline.catalog.load_table(name).refs()[tag_name(epochs[0])].snapshot_id == legacy.snapshots[name]
    out = run_cli(capsys, "--zk", zk_connect, "versions")[1]
    assert out.startswith(f"an earlier release's versions, across pipelines:\n  {tag_name(epochs[0])}  ")
    assert f"\npipeline {pipeline.name}:\n" in out
    assert run_cli(capsys, "--zk", zk_connect, "resolve", *pipeline.tables, "--as-of", tag_name(epochs[0]))[0] == 0

    now[0] = epochs[-1] + 2 * DAY_MS  # out of every tier: both kinds age out alike
    collector.run()
    assert RetainedVersions(tm).keys() == [(epochs[-1], pipeline.name)], "only the pipeline's newest stays"
    assert not any(tag_name(epochs[0]) in pipeline.catalog.load_table(name).refs() for name in pipeline.tables)
