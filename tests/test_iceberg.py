"""The Iceberg side on a real catalog: conditional publish, epoch lineage, resolution at every level."""
from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator import ConsistencyLevel, EpochState, PublishConflict, Tidemark, VersionNotFound
from coordinator.history.resolve import ReaderSession, Resolver, pinned_versions, read_arrow
from coordinator.iceberg.publish import PublishOutcome, publish_staged
from coordinator.iceberg.snapshots import (
    COMMITTED_EPOCH_PROPERTY,
    committed_epoch,
    committed_properties,
    highest_epoch,
    snapshot_at_epoch,
    staged_snapshots,
)
from coordinator.records import EpochProgress
from tests.helpers.lake import agree, commit_rows, create_table, lead_job, rows_of, stage_rows
from tests.helpers.present import present


@pytest.fixture
def catalog(catalog_settings):
    return catalog_settings.load()


@pytest.fixture
def writers(tm, catalog_settings):
    """Open ``EpochWriter`` s on this test's ZooKeeper (closed at the end): ``writers(job, sinks)``."""
    opened = []

    def open_one(job: str, sinks: list[str]):
        opened.append(lead_job(tm, catalog_settings, job, sinks))
        return opened[-1]
    yield open_one
    for writer in opened:
        writer.close()


def test_racing_publishers_of_one_epoch_make_exactly_one_snapshot_current(catalog, catalog_settings, namespace):
    table = create_table(catalog, f"{namespace}.t")
    stage_rows(table, 1000, "j", 1, 3)
    publish_staged(table, next(iter(staged_snapshots(table))).snapshot_id, 1000, 1)
    for trial in range(5):
        epoch = 2000 + 1000 * trial
        candidates = [stage_rows(table, epoch, "j", 1, 2) for _ in range(2)]  # two attempts, same parent
        results, start = [], threading.Barrier(2)

        def publish(snapshot_id: int) -> None:
            own = catalog_settings.load().load_table(f"{namespace}.t")
            start.wait()
            results.append(publish_staged(own, snapshot_id, epoch, 1))
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
    publish_staged(table, first, 1000, 1)
    with pytest.raises(PublishConflict, match="main moved"):
        publish_staged(table, late, 2000, 1)
    table.refresh()
    assert table.current_snapshot().snapshot_id == first


# -- random histories ------------------------------------------------------------------------

JOBS = {"ja": ["t_a1", "t_a2"], "jb": ["t_b"], "jc": ["t_c"]}
ACTIONS = st.sampled_from(["data", "empty", "idle", "abort_then_data", "crash_after_publish", "abort_then_empty"])
HISTORY = st.lists(st.tuples(st.sampled_from(sorted(JOBS)), ACTIONS), min_size=1, max_size=14)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=HISTORY)
def test_consistent_resolution_over_random_histories(history, zk_server, catalog, catalog_settings):
    """Every consistent version holds exactly the epochs <= T*; ZooKeeper and Iceberg-only agree."""
    import uuid
    ns = "h_" + uuid.uuid4().hex[:8]
    tm = Tidemark.connect(f"{zk_server.connect_string}/{ns}", session_timeout=4)
    writers = {}
    try:
        tables = {t: create_table(catalog, f"{ns}.{t}") for sinks in JOBS.values() for t in sinks}
        written: dict[str, dict[int, int]] = {t: {} for t in tables}  # table -> epoch -> rows
        for job, sinks in JOBS.items():
            writers[job] = lead_job(tm, catalog_settings, job, [f"{ns}.{t}" for t in sinks])
        next_epoch = {job: 1000 for job in JOBS}
        for step, (job, action) in enumerate(history):
            writer, t = writers[job], next_epoch[job]
            agree(tm, t)
            assert tm.barriers.next_after(writer.epochs.last_committed) == t
            rows = {}  # sink -> rows this epoch appends (the other sinks do not change)
            for i, sink in enumerate(JOBS[job]):
                if not (action.endswith("empty") or action == "idle" or (action == "data" and (step + i) % 3 == 2)):
                    rows[sink] = 1 + (step + i) % 3

            def compute(ctx) -> None:
                for sink, n in rows.items():
                    ctx.append(f"{ns}.{sink}", rows_of(ctx.epoch, n))
            if action == "idle":
                writer.commit_idle(t)
            elif action == "crash_after_publish":
                writer.epochs.begin(t, writer.inputs_for(t))
                staged = {f"{ns}.{sink}": stage_rows(tables[sink], t, job, writer.term, rows[sink]) if sink in rows
                          else None for sink in JOBS[job]}
                writer.epochs.precommit(t, staged)
                first = sorted(staged)[0]
                if (staged_first := staged[first]) is not None:
                    publish_staged(catalog.load_table(first), staged_first, t, writer.term)
                # The leader dies here; the next one rolls the epoch forward (publishing again is a no-op
                # where it already happened).
                writer.close()
                writer.open(leader_timeout=30)
                assert writer.committed[-1] == t
            else:
                if action.startswith("abort"):
                    writer.epochs.begin(t, writer.inputs_for(t))
                    for sink in JOBS[job]:
                        stage_rows(tables[sink], t, job, writer.term, 1)  # staged, then abandoned
                    writer.epochs.abort(t, "test")
                record = writer.process(t, compute)  # an aborted epoch is recomputed from its recorded inputs
                assert record.staged == {f"{ns}.{s}": record.published[f"{ns}.{s}"] if s in rows else None
                                         for s in JOBS[job]}
            assert writer.epochs.last_committed == t and present(writer.epochs.current).state == EpochState.COMMITTED
            for sink, n in rows.items():
                written[sink][t] = n
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
                rows_read = data[f"{ns}.{sink}"].to_pylist()
                expected = {e: n for e, n in written[sink].items() if e <= with_zk.epoch}
                got: dict[int, int] = {}
                for r in rows_read:
                    got[r["epoch"]] = got.get(r["epoch"], 0) + 1
                assert got == expected, f"{sink} at T*={with_zk.epoch}"
    finally:
        for writer in writers.values():
            writer.close()
        tm.close()


def test_levels_and_as_of(tm, writers, catalog, catalog_settings, namespace):
    up, down = f"{namespace}.up", f"{namespace}.down"
    tables = {n: create_table(catalog, n) for n in (up, down)}
    jobs = {sink: writers(job, [sink]) for job, sink in (("up", up), ("down", down))}

    def epoch(sink: str, t: int) -> int:
        return commit_rows(jobs[sink], t)
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
    assert present(snapshot_at_epoch(catalog.load_table(up), 2500)).snapshot_id == up2
    # Epochs that published a snapshot need no property commit: the snapshot carries the epoch.
    assert catalog.load_table(up).properties.get(COMMITTED_EPOCH_PROPERTY) is None
    assert committed_epoch(catalog.load_table(up)) == 3000
    assert Resolver(catalog, catalog_settings, None).resolve([up, down]) == resolver.resolve([up, down])


def test_reader_session_is_monotonic_and_pins_vanish_with_the_session(tm, connect, writers, catalog,
                                                                      catalog_settings, namespace):
    name = f"{namespace}.t"
    table = create_table(catalog, name)
    writer = writers("j", [name])
    first = commit_rows(writer, 1000)
    agree(tm, 2000)
    writer.commit_idle(2000)  # nothing new: the table keeps its snapshot, its property records the epoch
    reader_tm = connect()
    session = ReaderSession(Resolver(catalog, catalog_settings, reader_tm), reader_tm)
    version = session.resolve([name])
    assert version.epoch == 2000 and version.snapshots == {name: first}
    session.pin(version)
    assert pinned_versions(tm) == {version.epoch: dict(version.snapshots)}
    # Iceberg metadata lagging ZooKeeper (the property mark of epoch 2000 not made yet) must not move the
    # reader backwards
    session.resolver = Resolver(catalog, catalog_settings, None)
    table.transaction().set_properties(committed_properties(EpochProgress("j", 1000, writer.term))).commit_transaction()
    assert Resolver(catalog, catalog_settings, None).resolve([name]).epoch == 1000
    assert session.resolve([name]) == version
    assert ConsistencyLevel(version.level) == ConsistencyLevel.CONSISTENT
    reader_tm.close()
    assert pinned_versions(tm) == {}


def test_cli_resolve_prints_epoch_and_snapshots(tm, writers, zk_connect, catalog, lake_home, namespace):
    name = f"{namespace}.t"
    create_table(catalog, name)
    sid = commit_rows(writers("j", [name]), 1000)
    env = {"TIDEMARK_HOME": str(lake_home), "PATH": "/usr/bin:/bin"}
    cli = [sys.executable, "-m", "coordinator.operations.cli", "--zk", zk_connect, "resolve"]
    out = subprocess.run([*cli, name, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"epoch": 1000, "level": "consistent", "snapshots": {name: sid}}
    missing = subprocess.run([*cli, "nope.t"], capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
