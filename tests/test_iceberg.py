"""The Iceberg side on a real catalog: conditional publish, epoch lineage, resolution at every level."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator import (ConsistencyLevel, EpochCoordinator, PublishConflict, Tidemark, VersionNotFound)
from coordinator.commit import EpochCommitter
from coordinator.publish import PublishOutcome, expire_unpublished, publish_staged
from coordinator.resolve import ReaderSession, Resolver, pinned_snapshots, read_arrow
from coordinator.snapshots import highest_epoch, snapshot_at_epoch, staged_snapshots
from tests.helpers.lake import commit_rows, create_table, lead_job, stage_rows


@pytest.fixture
def catalog(catalog_settings):
    return catalog_settings.load()


def test_racing_publishers_of_one_epoch_make_exactly_one_snapshot_current(catalog, catalog_settings, namespace):
    table = create_table(catalog, f"{namespace}.t")
    stage_rows(table, 1000, "j", 1, 3)
    publish_staged(table, [s for s in staged_snapshots(table)][0].snapshot_id, 1000)
    for trial in range(5):
        epoch = 2000 + 1000 * trial
        candidates = [stage_rows(table, epoch, "j", 1, 2) for _ in range(2)]  # two attempts, same parent
        results, start = [], threading.Barrier(2)

        def publish(snapshot_id: int) -> None:
            own = catalog_settings.load().load_table(f"{namespace}.t")
            start.wait()
            results.append(publish_staged(own, snapshot_id, epoch))
        threads = [threading.Thread(target=publish, args=(c,)) for c in candidates]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(r.outcome for r in results) == [PublishOutcome.ALREADY_PUBLISHED, PublishOutcome.PUBLISHED]
        winner = next(r for r in results if r.outcome == PublishOutcome.PUBLISHED)
        table.refresh()
        assert table.current_snapshot().snapshot_id == winner.snapshot_id
        assert all(r.snapshot_id == winner.snapshot_id for r in results)
    rows = table.scan().to_arrow().to_pylist()
    assert sorted({r["epoch"] for r in rows}) == [1000, 2000, 3000, 4000, 5000, 6000]
    assert len(rows) == 3 + 5 * 2, "an epoch was published twice"


def test_publish_whose_parent_moved_is_refused_and_loses_nothing(catalog, namespace):
    table = create_table(catalog, f"{namespace}.t")
    first = stage_rows(table, 1000, "j", 1, 1)
    late = stage_rows(table, 2000, "j", 1, 1)  # staged on the same (empty) parent
    publish_staged(table, first, 1000)
    with pytest.raises(PublishConflict, match="main moved"):
        publish_staged(table, late, 2000)
    table.refresh()
    assert table.current_snapshot().snapshot_id == first
    assert expire_unpublished(table, up_to_epoch=2000) == [late]
    assert table.snapshot_by_id(late) is None and table.snapshot_by_id(first) is not None


# -- random histories ------------------------------------------------------------------------

JOBS = {"ja": ["t_a1", "t_a2"], "jb": ["t_b"], "jc": ["t_c"]}
ACTIONS = st.sampled_from(["data", "empty", "abort_then_data", "crash_after_publish", "abort_then_empty"])
HISTORY = st.lists(st.tuples(st.sampled_from(sorted(JOBS)), ACTIONS), min_size=1, max_size=14)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=HISTORY)
def test_consistent_resolution_over_random_histories(history, zk_server, catalog, catalog_settings):
    """Every consistent version holds exactly the epochs <= T*; ZooKeeper and Iceberg-only agree."""
    import uuid
    ns = "h_" + uuid.uuid4().hex[:8]
    tm = Tidemark.connect(f"{zk_server.connect_string}/{ns}", session_timeout=4)
    try:
        grid = tm.barriers.ensure_grid(1000)
        tables = {t: create_table(catalog, f"{ns}.{t}") for sinks in JOBS.values() for t in sinks}
        written: dict[str, dict[int, int]] = {t: {} for t in tables}  # table -> epoch -> rows
        runners = {}
        for job, sinks in JOBS.items():
            tm.register_job(job, sources=[], sinks=[f"{ns}.{t}" for t in sinks])
            leadership = tm.leadership(job)
            leadership.acquire()
            epochs = EpochCoordinator(leadership, [f"{ns}.{t}" for t in sinks], grid)
            epochs.recover()
            runners[job] = EpochCommitter(epochs, lambda name: catalog.load_table(name))
        next_epoch = {job: 1000 for job in JOBS}
        for step, (job, action) in enumerate(history):
            committer, t = runners[job], next_epoch[job]
            epochs = committer.epochs
            epochs.begin(t, {"step": step})
            if action.startswith("abort"):
                for sink in JOBS[job]:
                    stage_rows(tables[sink], t, job, 1, 1)  # staged, then abandoned
                epochs.abort(t, "test")
                epochs.begin(t)
            staged = {}
            for i, sink in enumerate(JOBS[job]):
                if action.endswith("empty") or (action == "data" and (step + i) % 3 == 2):
                    staged[f"{ns}.{sink}"] = None
                else:
                    rows = 1 + (step + i) % 3
                    staged[f"{ns}.{sink}"] = stage_rows(tables[sink], t, job, 1, rows)
                    written[sink][t] = rows
            if action == "crash_after_publish":
                record = epochs.precommit(t, staged)
                first = sorted(staged)[0]
                if staged[first] is not None:
                    publish_staged(catalog.load_table(first), staged[first], t)
                committer.roll_forward(record)  # the recovering leader repeats publish: a no-op there
            else:
                committer.finish(t, staged)
            next_epoch[job] = t + 1000

            names = sorted(f"{ns}.{s}" for s in tables)
            committed = [next_epoch[j] - 1000 for j in JOBS]
            if min(committed) == 0:
                for zk in (tm, None):
                    with pytest.raises(VersionNotFound):
                        Resolver(catalog, catalog_settings, zk).resolve(names)
                continue
            with_zk = Resolver(catalog, catalog_settings, tm).resolve(names)
            iceberg_only = Resolver(catalog, catalog_settings, None).resolve(names)
            assert with_zk == iceberg_only
            assert with_zk.epoch == min(committed)
            data = read_arrow(Resolver(catalog, catalog_settings), with_zk)
            for sink in tables:
                rows = data[f"{ns}.{sink}"].to_pylist()
                expected = {e: n for e, n in written[sink].items() if e <= with_zk.epoch}
                got: dict[int, int] = {}
                for r in rows:
                    got[r["epoch"]] = got.get(r["epoch"], 0) + 1
                assert got == expected, f"{sink} at T*={with_zk.epoch}"
    finally:
        tm.close()


def test_levels_and_as_of(tm, catalog, catalog_settings, namespace):
    up, down = f"{namespace}.up", f"{namespace}.down"
    tables = {n: create_table(catalog, n) for n in (up, down)}
    committers = {sink: lead_job(tm, catalog, job, [sink]) for job, sink in (("up", up), ("down", down))}

    def epoch(sink: str, t: int) -> int:
        return commit_rows(committers[sink], tables[sink], t)
    up1, up2, up3 = epoch(up, 1000), epoch(up, 2000), epoch(up, 3000)
    down1, down2 = epoch(down, 1000), epoch(down, 2000)
    staged_only = stage_rows(tables[up], 4000, "x", 1, 1)
    resolver = Resolver(catalog, catalog_settings, tm, tm.tidemark_cache())
    assert resolver.resolve([up, down]).snapshots == {up: up2, down: down2}
    assert resolver.resolve([up, down], level="committed").snapshots == {up: up3, down: down2}
    assert resolver.resolve([up, down], level="latest").snapshots == {up: up3, down: down2}
    assert resolver.resolve([up, down], as_of=1000).snapshots == {up: up1, down: down1}
    with pytest.raises(VersionNotFound, match="not committed in every table"):
        resolver.resolve([up, down], as_of=3000)
    assert staged_only not in resolver.resolve([up, down], level="latest").snapshots.values()
    assert highest_epoch(catalog.load_table(up)) == 3000
    assert snapshot_at_epoch(catalog.load_table(up), 2500).snapshot_id == up2


def test_reader_session_is_monotonic_and_pins_vanish_with_the_session(tm, connect, catalog, catalog_settings,
                                                                      namespace):
    name = f"{namespace}.t"
    table = create_table(catalog, name)
    committer = lead_job(tm, catalog, "j", [name])
    for t in (1000, 2000):
        commit_rows(committer, table, t)
    reader_tm = connect()
    session = ReaderSession(Resolver(catalog, catalog_settings, reader_tm), reader_tm)
    version = session.resolve([name])
    assert version.epoch == 2000
    session.pin(version)
    assert pinned_snapshots(tm) == {name: {version.snapshots[name]}}
    # Iceberg metadata lagging ZooKeeper must not move the reader backwards
    session.resolver = Resolver(catalog, catalog_settings, None)
    table.transaction().set_properties({"tidemark.committed-epoch": "1000"}).commit_transaction()
    assert session.resolve([name]) == version
    assert ConsistencyLevel(version.level) == ConsistencyLevel.CONSISTENT
    reader_tm.close()
    assert pinned_snapshots(tm) == {}


def test_cli_resolve_prints_epoch_and_snapshots(tm, zk_connect, catalog, lake_home, namespace):
    name = f"{namespace}.t"
    table = create_table(catalog, name)
    sid = commit_rows(lead_job(tm, catalog, "j", [name]), table, 1000)
    env = {"TIDEMARK_HOME": str(lake_home), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "coordinator.cli", "--zk", zk_connect, "resolve", name, "--json"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"epoch": 1000, "level": "consistent", "snapshots": {name: sid}}
    missing = subprocess.run([sys.executable, "-m", "coordinator.cli", "--zk", zk_connect, "resolve", "nope.t"],
                             capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
