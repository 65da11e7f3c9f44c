"""The Iceberg side on a real catalog: conditional publish, epoch lineage, resolution at every level.

A job picks its own epochs among the grid's barriers and may coalesce (skip barriers its next epoch
covers), so a consistent version is the newest epoch every table holds; from ZooKeeper's tidemarks
and from Iceberg alone it is the same when every epoch reached Iceberg (``marker_every`` of 1 ms)."""
from __future__ import annotations

import json
import subprocess
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from coordinator import ConsistencyLevel, EpochState, PublishConflict, Tidemark, VersionNotFound
from coordinator.history.resolve import ReaderSession, Resolver, pinned_versions, read_arrow
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.publish import PublishOutcome, publish_staged
from coordinator.iceberg.snapshots import (
    COMMITTED_EPOCH_PROPERTY,
    snapshot_at_epoch,
    snapshot_epoch,
)
from tests.helpers.cli import TIDEMARK
from tests.helpers.lake import commit_rows, create_table, lead_job, rows_of, stage_rows
from tests.helpers.present import present


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
    publish_staged(table, stage_rows(table, 1000, "j", 1, 3), 1000, 1)
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
HISTORY = st.lists(st.tuples(st.sampled_from(sorted(JOBS)), ACTIONS, st.booleans()), min_size=1, max_size=14)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(history=HISTORY)
def test_consistent_resolution_over_random_histories(history, zk_server, catalog, catalog_settings):
    """Jobs take epochs at their own pace, some coalescing over a barrier (``skip``): the consistent version is
    the newest epoch every table holds and holds exactly the epochs <= T. From Iceberg alone it is the newest
    epoch every table records there (its published snapshots' epochs and its one committed-epoch marker, here
    advanced at every epoch that published nothing in the table): as consistent, never newer, and the same
    version whenever it is the same epoch."""
    import uuid
    ns = "h_" + uuid.uuid4().hex[:8]
    tm = Tidemark.connect(f"{zk_server.connect_string}/{ns}", session_timeout=4)
    writers = {}
    try:
        tables = {t: create_table(catalog, f"{ns}.{t}") for sinks in JOBS.values() for t in sinks}
        written: dict[str, dict[int, int]] = {t: {} for t in tables}  # table -> epoch -> rows
        for job, sinks in JOBS.items():
            writers[job] = lead_job(tm, catalog_settings, job, [f"{ns}.{t}" for t in sinks], marker_every="1ms")
        next_epoch = {job: 1000 for job in JOBS}
        held: dict[str, set[int]] = {job: set() for job in JOBS}  # the epochs each job committed
        published: dict[str, set[int]] = {t: set() for t in tables}  # the epochs a snapshot was published for
        marker: dict[str, int] = {}  # table -> the epoch of its committed-epoch marker
        for step, (job, action, skip) in enumerate(history):
            writer, t = writers[job], next_epoch[job] + (1000 if skip else 0)  # skip: coalesce over a barrier
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
                assert {s for s, staged in record.staged.items() if staged is not None} == {f"{ns}.{s}" for s in rows}
                # published as staged, or built again on the head the abandoned stagings outnumbered
                assert all(snapshot_epoch(present(tables[s].refresh().snapshot_by_id(record.published[f"{ns}.{s}"])))
                           == t for s in rows)
            assert writer.epochs.last_committed == t and present(writer.epochs.current).state == EpochState.COMMITTED
            for sink in JOBS[job]:
                if sink in rows:
                    written[sink][t] = rows[sink]
                    published[sink].add(t)
                else:
                    marker[sink] = t
            next_epoch[job] = t + 1000
            held[job].add(t)

            names = sorted(f"{ns}.{s}" for s in tables)
            common = set.intersection(*held.values())
            recorded = set.intersection(*(published[t] | ({marker[t]} if t in marker else set()) for t in tables))
            versions = {}
            for zk, expected_epochs in ((tm, common), (None, recorded)):
                resolver = Resolver(catalog, catalog_settings, zk)
                if not expected_epochs:
                    with pytest.raises(VersionNotFound, match="no consistent version"):
                        resolver.resolve(names)
                    continue
                version = versions[zk is not None] = resolver.resolve(names)
                assert version.epoch == max(expected_epochs), f"{'ZooKeeper' if zk else 'Iceberg only'}"
                data = read_arrow(resolver, version)
                for sink in tables:
                    expected = {e: n for e, n in written[sink].items() if e <= version.epoch}
                    got: dict[int, int] = {}
                    for r in data[f"{ns}.{sink}"].to_pylist():
                        got[r["epoch"]] = got.get(r["epoch"], 0) + 1
                    assert got == expected, f"{sink} at T={version.epoch}"
            if len(versions) == 2 and versions[True].epoch == versions[False].epoch:
                assert versions[True] == versions[False]
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
    with pytest.raises(VersionNotFound, match=rf"epoch 3000 is not committed in every table .*\({down} is at 2000\)"):
        resolver.resolve([up, down], as_of=3000)
    assert staged_only not in resolver.resolve([up, down], level="latest").snapshots.values()
    assert present(EpochLineage(catalog.load_table(up)).committed_progress()).epoch == 3000
    assert present(snapshot_at_epoch(catalog.load_table(up), 2500)).snapshot_id == up2
    # Epochs that published a snapshot need no property commit: the snapshot carries the epoch.
    assert catalog.load_table(up).properties.get(COMMITTED_EPOCH_PROPERTY) is None
    assert EpochLineage(catalog.load_table(up)).committed_epoch == 3000
    assert Resolver(catalog, catalog_settings, None).resolve([up, down]) == resolver.resolve([up, down])


def test_reader_session_is_monotonic_unpins_and_its_pins_vanish_with_the_session(tm, connect, writers, catalog,
                                                                                 catalog_settings, namespace):
    name = f"{namespace}.t"
    create_table(catalog, name)
    writer = writers("j", [name])
    first = commit_rows(writer, 1000)
    writer.commit_idle(2000)  # nothing new: the table keeps its snapshot, and no marker round is due this minute
    reader_tm = connect()
    session = ReaderSession(Resolver(catalog, catalog_settings, reader_tm), reader_tm)
    version = session.resolve([name])
    assert version.epoch == 2000 and version.snapshots == {name: first}
    session.pin(version)
    assert pinned_versions(tm) == {version.epoch: dict(version.snapshots)}
    # Iceberg records epoch 1000 only (its snapshot; no marker for 2000): read from Iceberg alone the table is a
    # version older, which must not move the reader backwards.
    assert catalog.load_table(name).properties.get(COMMITTED_EPOCH_PROPERTY) is None
    session.resolver = Resolver(catalog, catalog_settings, None)
    assert Resolver(catalog, catalog_settings, None).resolve([name]).epoch == 1000
    assert session.resolve([name]) == version
    assert ConsistencyLevel(version.level) == ConsistencyLevel.CONSISTENT
    session.unpin(version)
    assert pinned_versions(tm) == {} and session.pinned == {}, "an unpinned version is GC's to drop"
    session.pin(version)
    reader_tm.close()
    assert pinned_versions(tm) == {}


def test_cli_resolve_prints_epoch_and_snapshots(tm, writers, zk_connect, catalog, lake_home, namespace):
    name = f"{namespace}.t"
    create_table(catalog, name)
    sid = commit_rows(writers("j", [name]), 1000)
    env = {"TIDEMARK_HOME": str(lake_home), "PATH": "/usr/bin:/bin"}
    cli = [*TIDEMARK, "--zk", zk_connect, "resolve"]
    out = subprocess.run([*cli, name, "--json"], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"epoch": 1000, "level": "consistent", "snapshots": {name: sid}}
    missing = subprocess.run([*cli, "nope.t"], capture_output=True, text=True, env=env, timeout=60)
    assert missing.returncode == 1 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
