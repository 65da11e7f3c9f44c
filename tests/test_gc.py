"""Retained versions and garbage collection on real ZooKeeper and Iceberg tables, on a simulated clock.

A year of barriers is driven through the real protocol (the idle ones on its one-multi path), with
``tidemark gc`` running every simulated week: the kept versions match the policy exactly, every kept
version reads back consistently (from ZooKeeper and from Iceberg tags alone), and a table keeps no more
snapshots than the versions need. Other tests: a pinned version and a lagging job's next inputs survive
GC, and the lagging job catches up in one epoch; versions exist only at epochs every table holds, and
each carries its tag on every table it names a snapshot of; the CLI; GC on a schedule in one elected
process; old metadata files go; a GC process killed after its expiry commit leaves orphan files that
``tidemark gc --orphans`` deletes, and only those.
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
from coordinator.history.versions import RetainedVersions, tag_epoch, tag_name
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.reachability import FileIndex
from coordinator.iceberg.snapshots import snapshot_epoch
from coordinator.operations.cli import main as cli
from tests.helpers.crash import crash_env
from tests.helpers.lake import stage_rows
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
    expected = naive_keep(DEFAULT_POLICY, pipeline.committed, now) | {pipeline.committed[-1]}
    assert retained == sorted(expected)
    for name in pipeline.tables:
        table = pipeline.catalog.load_table(name)
        assert set(tidemark_tags(table)) <= set(retained)
        versions = RetainedVersions(tm)
        assert set(tidemark_tags(table)) == {e for e in retained if present(versions.get(e)).snapshots.get(name)}
    return retained


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
    for epoch in retained:
        pipeline.check(with_zk, with_zk.resolve(pipeline.tables, as_of=epoch))
        pipeline.check(iceberg_only, iceberg_only.resolve(pipeline.tables, as_of=epoch))
    for name in pipeline.tables:  # storage bounded by the policy, not by a year of epochs
        table = pipeline.catalog.load_table(name)
        assert len(table.snapshots()) <= len(retained) + 2, name
    dropped = next(e for e in pipeline.committed if e not in retained)
    for resolver in (with_zk, iceberg_only):
        with pytest.raises(VersionNotFound, match="nearest retained versions are tidemark-"):
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
    collector = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1h"), clock=lambda: now[0])
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
    assert decisions[epochs[4]] == ("keep", "newest consistent version") and plan.consistent_epoch == epochs[4], \
        "rollup holds none of ingest's newer epochs: epochs[4] is the newest one both tables hold"

    report = collector.run()
    assert report.expired_snapshots >= 4 and report.deleted_files > 0
    events.refresh()
    assert events.snapshot_by_id(aborted) is None
    kept_epochs = {snapshot_epoch(s) for s in events.snapshots()}
    assert {epochs[0], epochs[2], epochs[3]}.isdisjoint(kept_epochs) and set(epochs[4:]) <= kept_epochs, \
        "main from the lagging job's last epoch up to the head stays whole"

    pipeline.check(session.resolver, session.resolve(pipeline.tables, as_of=epochs[1]))  # the pin held
    pipeline.roll(epochs[-1])  # the lagging job catches up in one epoch, reading what it would have without GC
    inputs = present(pipeline.rollup.epochs.current).inputs.sources[pipeline.events]
    events.refresh()
    lineage = EpochLineage(events)
    assert (inputs.start, inputs.end) == (lineage.snapshot_at(epochs[4]), lineage.snapshot_at(epochs[-1]))
    resolver = Resolver(pipeline.catalog, catalog_settings, tm)
    version = resolver.resolve(pipeline.tables)
    assert version.epoch == epochs[-1]
    pipeline.check(resolver, version)
    with pytest.raises(VersionNotFound, match=rf"table {pipeline.totals} does not hold it .*the nearest epochs "
                                              rf"{pipeline.totals} holds are {epochs[4]} and {epochs[-1]}"):
        resolver.resolve(pipeline.tables, as_of=epochs[7])  # rollup coalesced over it
    with pytest.raises(VersionNotFound, match=f"nearest retained versions are {tag_name(epochs[1])} and "
                                              f"{tag_name(epochs[4])}"):
        resolver.resolve(pipeline.tables, as_of=epochs[2])

    session.close()
    reader_tm.close()
    collector.run()  # unpinned: the pinned version falls out of the policy now
    assert RetainedVersions(tm).epochs() == [epochs[-1]]


def test_the_cli_lists_versions_dry_runs_gc_and_resolves_a_tag(tm, zk_connect, pipeline, catalog_settings,
                                                               monkeypatch, capsys):
    monkeypatch.setenv("TIDEMARK_CATALOG_URI", catalog_settings.uri)
    monkeypatch.setenv("TIDEMARK_WAREHOUSE", catalog_settings.warehouse)
    base = (datetime.now(timezone.utc).timestamp() * 1000 // INTERVAL_MS - 5) * INTERVAL_MS
    epochs = [int(base + k * INTERVAL_MS) for k in range(3)]
    for epoch in epochs:
        pipeline.epoch(epoch, rows=1)
    args = ["--zk", zk_connect]

    assert cli([*args, "gc", "--dry-run", "--json", "--policy", "all:1d"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["dry_run"] and [v["action"] for v in planned["plan"]["versions"]] == ["create"] * 3
    assert RetainedVersions(tm).epochs() == [], "a dry run changes nothing"

    assert cli([*args, "gc", "--policy", "all:1d"]) == 0
    out = capsys.readouterr().out
    assert f"version {epochs[0]}: create (all)" in out and "expired" in out
    assert cli([*args, "versions", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(v["tag"], v["tier"]) for v in listed] == [(tag_name(e), "all") for e in epochs]
    assert cli([*args, "versions"]) == 0
    assert tag_name(epochs[0]) in capsys.readouterr().out

    assert cli([*args, "resolve", *pipeline.tables, "--as-of", tag_name(epochs[1]), "--json"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["epoch"] == epochs[1] and resolved["level"] == "as_of"
    assert cli([*args, "resolve", *pipeline.tables, "--as-of", "yesterday"]) == 2
    assert "'yesterday' is neither an epoch (milliseconds since 1970) nor a tag" in capsys.readouterr().err
    assert cli([*args, "gc", "--policy", "hourly"]) == 1
    assert "must be <every>:<for>" in capsys.readouterr().err


def test_every_listed_version_has_its_tag_on_every_table_it_covers(tm, zk_connect, pipeline, catalog_settings,
                                                                    monkeypatch, capsys):
    """A version at which every table was empty is not made: no tag could name it (``tidemark versions`` once
    listed such a version as covering 2 tables while no table had its tag). Each listed version names the tables
    carrying its tag, and each of them carries it, on the version's snapshot."""
    monkeypatch.setenv("TIDEMARK_CATALOG_URI", catalog_settings.uri)
    monkeypatch.setenv("TIDEMARK_WAREHOUSE", catalog_settings.warehouse)
    epochs = [START + k * INTERVAL_MS for k in range(1, 4)]
    pipeline.epoch(epochs[0])             # both jobs' first epoch is idle: both tables are empty at it
    pipeline.epoch(epochs[1], rows=2)
    pipeline.epoch(epochs[2])             # idle: both tables keep their snapshots
    report = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1d"),
                              clock=lambda: epochs[2] + 1).run()
    assert f"epoch {epochs[0]} is not made a version: every table was empty then, so no tag could name it" in \
        report.plan.notes
    assert RetainedVersions(tm).epochs() == epochs[1:]

    assert cli(["--zk", zk_connect, "versions", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [v["epoch"] for v in listed] == epochs[1:]
    for version in listed:
        assert sorted(version["tagged"]) == sorted(pipeline.tables) and version["empty"] == []
        for name in version["tagged"]:
            assert tidemark_tags(pipeline.catalog.load_table(name))[version["epoch"]] == version["snapshots"][name]
    assert cli(["--zk", zk_connect, "versions"]) == 0
    assert f"{tag_name(epochs[1])} " in (out := capsys.readouterr().out) and "tagged in 2 tables" in out


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
                                                                            catalog_settings, monkeypatch, capsys):
    monkeypatch.setenv("TIDEMARK_CATALOG_URI", catalog_settings.uri)
    monkeypatch.setenv("TIDEMARK_WAREHOUSE", catalog_settings.warehouse)
    base = (datetime.now(timezone.utc).timestamp() * 1000 // INTERVAL_MS - 5) * INTERVAL_MS
    pipeline.epoch(int(base), rows=1)
    gc = ["--zk", zk_connect, "gc", "--policy", "all:1d"]
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
                                                                                    catalog_settings, monkeypatch,
                                                                                    capsys):
    for k in range(1, 7):
        pipeline.epoch(START + k * INTERVAL_MS, rows=2)
    events = pipeline.catalog.load_table(pipeline.events)
    referenced_before = FileIndex().referenced(events, events.snapshots())
    catalog_env = {"TIDEMARK_CATALOG_URI": catalog_settings.uri, "TIDEMARK_WAREHOUSE": catalog_settings.warehouse,
                   "TIDEMARK_CATALOG_NAME": catalog_settings.name}
    gc = [sys.executable, "-m", "coordinator.operations.cli", "--zk", zk_connect, "gc", "--policy", "all:1h"]
    killed = subprocess.run(gc, env={**crash_env("gc-expired", nth=1), **catalog_env}, capture_output=True,
                            text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert "crash point gc-expired#1 reached" in killed.stderr
    events.refresh()
    left_behind = {local_path(p) for p in referenced_before - FileIndex().referenced(events, events.snapshots())}
    assert left_behind, "the killed run expired snapshots of events before it died"

    for name, value in catalog_env.items():
        monkeypatch.setenv(name, value)
    args = ["--zk", zk_connect, "gc"]
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
