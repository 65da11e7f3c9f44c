"""Monotonic fencing and Iceberg as the record of progress, on real ZooKeeper and a real SQLite catalog.

A fenced leader of an unregistered (and re-registered) job can change nothing; a job with no
ZooKeeper history (unregistered, or the whole tree wiped mid-run) resumes from its sinks'
Iceberg metadata with no duplicate and no loss, and consistent reads stay consistent.
"""
from __future__ import annotations

import io
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError
from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table.update import SetPropertiesUpdate

from coordinator import EpochWriter, Fenced, LeaderState, Tidemark
from coordinator.errors import RegistrationError, UnregisterNotConfirmed, VersionNotFound
from coordinator.history.resolve import Resolver
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.publish import AssertTermAtMost, advance_committed_epoch, claim_table, publish_staged
from coordinator.iceberg.snapshots import TERM_PROPERTY, is_released, main_lineage, recorded_term, snapshot_progress
from coordinator.iceberg.staging import stage_append
from coordinator.protocol import registry
from coordinator.records import EpochProgress, EpochState, SourceRange, TableTidemark, now_ms
from tests.conftest import SESSION_TIMEOUT
from tests.helpers.cli import assert_one_line_error, run_cli
from tests.helpers.lake import SCHEMA, commit_rows, create_table, lead_job, rows_of
from tests.helpers.present import present
from tests.helpers.wait import wait_for
from tests.helpers.zookeeper_tree import wipe_zookeeper

DEADLINE = 90.0


def rows_in(table, snapshot_id=None) -> list[tuple[int, int]]:
    if snapshot_id is None:
        table.refresh()
        if table.current_snapshot() is None:
            return []
        snapshot_id = table.current_snapshot().snapshot_id
    data = table.scan(snapshot_id=snapshot_id).to_arrow()
    return sorted(zip(data["epoch"].to_pylist(), data["row"].to_pylist()))


@pytest.mark.parametrize("catalog_fixture", ["catalog_settings", "pg_catalog_settings"])
def test_a_fenced_zombie_changes_nothing_after_unregister_and_reregister(tm, connect, request, catalog_fixture,
                                                                         namespace):
    catalog_settings = request.getfixturevalue(catalog_fixture)  # SQLite, and PostgreSQL as in production
    catalog = catalog_settings.load()
    sink = f"{namespace}.counts"
    table = create_table(catalog, sink)
    zombie = lead_job(connect(), catalog_settings, "counts", [sink])  # its own session, alive throughout
    commit_rows(zombie, 1000, rows=2)
    zombie.epochs.begin(2000, zombie.inputs_for(2000))
    staged_by_zombie = stage_append(zombie.table(sink), rows_of(2000, 5), 2000, "counts", zombie.term)
    old_term = zombie.term

    fence_term = tm.fence_job("counts")
    with pytest.raises(UnregisterNotConfirmed, match="committed epoch 1000"):
        tm.unregister_job("counts", catalog=catalog_settings)
    plan = tm.unregister_job("counts", confirm=True, catalog=catalog_settings)
    assert plan.resume.committed.epoch == 1000 and plan.resume.term >= old_term
    with pytest.raises(Fenced):  # fenced in Iceberg as soon as it is unregistered
        publish_staged(zombie.table(sink), staged_by_zombie.snapshot_id, 2000, old_term, staged_by_zombie)

    successor = lead_job(connect(), catalog_settings, "counts", [sink])  # registers a new incarnation
    assert successor.term > fence_term > old_term, "a re-registered job must never reuse or go below a term"
    assert successor.epochs.last_committed == 1000  # resumed from Iceberg, not from scratch
    commit_rows(successor, 2000, rows=3)
    commit_rows(successor, 3000, rows=1)
    mark_before = tm.tidemarks([sink])[sink]
    lineage_before = [s.snapshot_id for s in main_lineage(catalog.load_table(sink))]

    # The zombie's session is still alive and it believes it leads: it tries every step, and every one is refused.
    assert zombie.leadership.is_leading
    with pytest.raises(Fenced):
        # refused by ZooKeeper: its incarnation is gone
        zombie.epochs.precommit(2000, {sink: staged_by_zombie.snapshot_id}, {sink: staged_by_zombie})
    with pytest.raises(Fenced):
        zombie.epochs.begin(2000)
    with pytest.raises(Fenced):
        zombie.epochs.abort(2000)
    zombie_table = zombie.table(sink)
    with pytest.raises(Fenced):
        publish_staged(zombie_table, staged_by_zombie.snapshot_id, 2000, old_term, staged_by_zombie)
    with pytest.raises(Fenced):
        advance_committed_epoch(zombie_table, EpochProgress("counts", 4000, old_term), old_term)
    with pytest.raises(Fenced):
        claim_table(zombie_table, "counts", old_term)
    with pytest.raises(Fenced):
        zombie.process(2000, lambda ctx: ctx.append(sink, rows_of(2000, 7)))
    assert not zombie.leadership.confirm()

    assert tm.tidemarks([sink])[sink] == mark_before, "the zombie moved the tidemark"
    table = catalog.load_table(sink)
    assert [s.snapshot_id for s in main_lineage(table)] == lineage_before, "a zombie snapshot was published"
    assert int(table.properties[TERM_PROPERTY]) == successor.term
    assert Counter(e for e, _ in rows_in(table)) == {1000: 2, 2000: 3, 3000: 1}
    zombie.close()
    successor.close()


def barrier_after_appends(tm, interval_ms: int = 1000) -> int:
    """The next grid point, once the clock has passed it: every row appended so far is before it."""
    barrier = (now_ms() // interval_ms + 1) * interval_ms
    wait_for(lambda: now_ms() > barrier, f"the clock to pass {barrier}", 10)
    return barrier


def test_the_catalog_checks_the_term_claim_atomically_with_the_commit(catalog, namespace):
    """A zombie whose own look at the table predates the takeover still cannot commit: the catalog validates
    ``AssertTermAtMost`` against the metadata it replaces."""
    table = create_table(catalog, f"{namespace}.t")
    stale = catalog.load_table(f"{namespace}.t")  # loaded before the new leader's claim
    claim_table(table, "j", 5)
    with pytest.raises(CommitFailedException, match="claimed by term 5"):
        catalog.commit_table(stale, (AssertTermAtMost(term=4),), (SetPropertiesUpdate(updates={"zombie": "1"}),))
    catalog.commit_table(stale, (AssertTermAtMost(term=5),), (SetPropertiesUpdate(updates={"leader": "1"}),))
    assert catalog.load_table(f"{namespace}.t").properties.get("zombie") is None


def copy_job(source: str, sink: str):
    return lambda ctx: ctx.append(sink, ctx.changes(source))


def test_reregistered_job_resumes_from_iceberg_with_no_duplicate_and_no_loss(tm, connect, catalog, catalog_settings,
                                                                             namespace):
    source, sink = f"{namespace}.events", f"{namespace}.copy"
    catalog.create_namespace_if_not_exists(namespace)
    events = catalog.create_table(source, schema=SCHEMA)
    create_table(catalog, sink)

    def run(writer: EpochWriter, epochs: int) -> None:
        for k in range(epochs):
            events.append(rows_of(len(writer.committed) + 10 * k, 3))
            epoch = barrier_after_appends(tm)
            writer.process(epoch, copy_job(source, sink), inputs=writer.inputs_for(epoch))

    first = EpochWriter(connect(), "copier", sources=[source], sinks=[sink], catalog=catalog_settings,
                        interval_ms=1000, grace_ms=0)
    first.open(leader_timeout=30)
    run(first, 3)
    last = first.committed[-1]
    first.close()
    first.tm.close()
    plan = tm.unregister_job("copier", confirm=True, catalog=catalog_settings)
    end = plan.resume.committed.inputs.sources[source].end
    assert f"copier resumes from its sinks' Iceberg metadata: committed epoch {last}" in plan.describe()
    assert end == events.current_snapshot().snapshot_id  # reads next after the last snapshot it read

    again = EpochWriter(connect(), "copier", sources=[source], sinks=[sink], catalog=catalog_settings,
                        interval_ms=1000, grace_ms=0)
    again.open(leader_timeout=30)
    start = plan.resume.committed.inputs.sources[source].start
    assert present(again.epochs.current).inputs.sources[source] == SourceRange(start, end)
    run(again, 2)
    term = again.term
    again.close()
    assert rows_in(catalog.load_table(sink)) == rows_in(events), "duplicates or losses after re-registration"
    newest = present(EpochLineage(catalog.load_table(sink)).committed_progress())
    assert (newest.job, newest.epoch, newest.term) == ("copier", again.committed[-1], term)


def test_resume_recomputes_an_epoch_only_some_sinks_published(tm, connect, catalog, catalog_settings, namespace):
    """Two sinks; the ZooKeeper history is lost after one of them published epoch 2000: every sink then holds
    that epoch exactly once, recomputed from the inputs its published snapshot records."""
    source, left, right = f"{namespace}.events", f"{namespace}.left", f"{namespace}.right"
    catalog.create_namespace_if_not_exists(namespace)
    events = catalog.create_table(source, schema=SCHEMA)
    for name in (left, right):
        create_table(catalog, name)

    def both(ctx):
        changes = ctx.changes(source)
        ctx.append(left, changes)
        ctx.append(right, changes)

    writer = EpochWriter(connect(), "split", sources=[source], sinks=[left, right], catalog=catalog_settings,
                         interval_ms=1000, grace_ms=0)
    writer.open(leader_timeout=30)
    events.append(rows_of(1, 2))
    first = barrier_after_appends(tm)
    writer.process(first, both, inputs=writer.inputs_for(first))
    events.append(rows_of(2, 4))
    second = barrier_after_appends(tm)
    record = writer.epochs.begin(second, writer.inputs_for(second))
    ctx = writer.context(writer, record)
    both(ctx)
    writer.epochs.precommit(second, ctx.staged, ctx.writes)
    publish_staged(writer.table(left), ctx.staged[left], second, writer.term, ctx.writes[left])
    writer.tm.close()  # the driver dies here, with its session
    plan = tm.unregister_job("split", confirm=True, catalog=catalog_settings)
    assert plan.resume.committed.epoch == first and plan.resume.in_flight.epoch == second

    again = EpochWriter(connect(), "split", sources=[source], sinks=[left, right], catalog=catalog_settings,
                        interval_ms=1000, grace_ms=0)
    again.open(leader_timeout=30)
    current = present(again.epochs.current)
    assert current.state == EpochState.STARTED and current.epoch == second
    assert again.epochs.last_committed == first
    again.run(both, max_epochs=1, stop_on_sigterm=False)
    again.close()
    for name in (left, right):
        assert rows_in(catalog.load_table(name)) == rows_in(events), f"{name}: duplicates or losses"
        assert present(EpochLineage(catalog.load_table(name)).committed_progress()).epoch == second


def copier_after_one_epoch(tm, connect, catalog, catalog_settings, namespace) -> tuple[Any, EpochWriter, int]:
    """Job ``copier`` copying ``<namespace>.events`` to ``<namespace>.copy``, led by the returned writer, after
    its first committed epoch; returns the source table, the writer and that epoch."""
    source, sink = f"{namespace}.events", f"{namespace}.copy"
    catalog.create_namespace_if_not_exists(namespace)
    events = catalog.create_table(source, schema=SCHEMA)
    create_table(catalog, sink)
    writer = EpochWriter(connect(), "copier", sources=[source], sinks=[sink], catalog=catalog_settings,
                         interval_ms=1000, grace_ms=0)
    writer.open(leader_timeout=30)
    events.append(rows_of(1, 3))
    first = barrier_after_appends(tm)
    writer.process(first, copy_job(source, sink), inputs=writer.inputs_for(first))
    return events, writer, first


def test_unregister_carries_an_epoch_committed_only_in_zookeeper_into_the_sinks(tm, connect, catalog,
                                                                               catalog_settings, namespace):
    """An idle epoch commits in ZooKeeper first and marks the sinks after; a leader killed in between leaves
    Iceberg one epoch behind. Unregistering must not let readers, or the next registration, fall back to it."""
    source, sink = f"{namespace}.events", f"{namespace}.copy"
    events, writer, first = copier_after_one_epoch(tm, connect, catalog, catalog_settings, namespace)
    idle = barrier_after_appends(tm)
    writer.epochs.commit_idle(idle, writer.inputs_for(idle))  # committed in ZooKeeper; the marker never comes
    writer.tm.close()  # the driver dies here, with its session
    recorded = present(EpochLineage(catalog.load_table(sink)).committed_progress())
    assert recorded.epoch == first, "Iceberg is one epoch behind"
    readers = Resolver(catalog, catalog_settings, tm)
    assert readers.resolve([source, sink]).epoch == idle

    plan = tm.unregister_job("copier", confirm=True, catalog=catalog_settings)
    assert present(plan.resume.committed).epoch == idle and f"committed epoch {idle}" in plan.describe()
    progress = present(EpochLineage(catalog.load_table(sink)).committed_progress())
    assert (progress.epoch, progress.inputs) == (idle, plan.resume.committed.inputs)
    assert is_released(catalog.load_table(sink).properties), "unregister records the release last"
    assert readers.resolve([source, sink]).epoch == idle, "the consistent epoch moved backwards"

    again = EpochWriter(connect(), "copier", sources=[source], sinks=[sink], catalog=catalog_settings,
                        interval_ms=1000, grace_ms=0)
    again.open(leader_timeout=30)
    assert again.epochs.last_committed == idle, "the next registration resumes after the idle epoch"
    assert not is_released(catalog.load_table(sink).properties), "the new leader's claim undoes the release"
    events.append(rows_of(2, 2))
    after = barrier_after_appends(tm)
    again.process(after, copy_job(source, sink), inputs=again.inputs_for(after))
    again.close()
    assert rows_in(catalog.load_table(sink)) == rows_in(events), "duplicates or losses after re-registration"


def test_tidemark_release_lets_readers_with_zookeeper_read_tables_whose_writer_left_no_release(
        tm, connect, catalog, catalog_settings, namespace, zk_server, zk_connect, capsys, monkeypatch):
    """A table whose job is gone from ZooKeeper without a release recorded (a job unregistered by an earlier release
    leaves the same as a wipe): a reader with ZooKeeper reads nothing of it, rather than Iceberg's records, which may
    be behind what it read; ``tidemark release`` records the release. It asks first, and refuses a table a
    registered job writes and one no Tidemark job ever claimed, in one line each."""
    source, sink = f"{namespace}.events", f"{namespace}.copy"
    _, writer, first = copier_after_one_epoch(tm, connect, catalog, catalog_settings, namespace)
    writer.close()
    wipe_zookeeper(zk_server, zk_connect)
    fresh = connect()
    with pytest.raises(VersionNotFound, match=rf"did not release them.*`tidemark release {sink}`"):
        Resolver(catalog, catalog_settings, fresh).resolve([source, sink])
    for name, value in catalog_settings.environment().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    zk = ["--zk", zk_connect]
    code, out, err = run_cli(capsys, *zk, "release", sink, "--dry-run")
    assert code == 0 and out.startswith(f"release {sink}: readers with ZooKeeper") and "nothing changed" in out, err
    assert_one_line_error(*run_cli(capsys, *zk, "release", sink)[::2], "pass --yes")
    assert not is_released(catalog.load_table(sink).properties)
    code, out, err = run_cli(capsys, *zk, "release", sink, "--yes")
    assert code == 0 and f"table {sink} released" in out, err
    assert is_released(catalog.load_table(sink).properties)
    assert Resolver(catalog, catalog_settings, fresh).resolve([source, sink]).epoch == first
    assert_one_line_error(*run_cli(capsys, *zk, "release", source, "--yes")[::2],
                          f"no Tidemark job ever claimed tables ['{source}']")

    again = EpochWriter(connect(), "copier", sources=[source], sinks=[sink], catalog=catalog_settings,
                        interval_ms=1000, grace_ms=0)
    again.open(leader_timeout=30)
    try:
        assert not is_released(catalog.load_table(sink).properties), "the new leader's claim undoes the release"
        assert_one_line_error(*run_cli(capsys, *zk, "release", sink, "--yes")[::2],
                              f"tables ['{sink}'] are written by registered jobs ['copier']", "tidemark unregister")
    finally:
        again.close()


def test_unregister_deletes_nothing_when_a_leader_is_elected_meanwhile(tm, connect, catalog, catalog_settings,
                                                                       namespace, monkeypatch):
    source, sink = f"{namespace}.events", f"{namespace}.copy"
    _, writer, first = copier_after_one_epoch(tm, connect, catalog, catalog_settings, namespace)
    writer.tm.close()
    fence_in_iceberg = registry._fence_in_iceberg
    elected = []

    def a_standby_leads_during_the_fence(*args) -> None:  # a waiting replica wins the election right then
        fence_in_iceberg(*args)
        standby = EpochWriter(connect(), "copier", sources=[source], sinks=[sink], catalog=catalog_settings,
                              interval_ms=1000, grace_ms=0)
        standby.open(leader_timeout=30)
        elected.append(standby.term)
        standby.close()
        standby.tm.close()
    monkeypatch.setattr(registry, "_fence_in_iceberg", a_standby_leads_during_the_fence)
    with pytest.raises(RegistrationError, match="elected a leader while it was being unregistered"):
        tm.unregister_job("copier", confirm=True, catalog=catalog_settings)
    assert elected and "copier" in tm.topology().jobs
    assert present(tm.read(tm.paths.tidemark(sink), TableTidemark))[0].epoch == first, "nothing was deleted"


def test_unregister_goes_ahead_past_a_corrupt_epoch_record(tm, connect, catalog, catalog_settings, namespace):
    _, writer, first = copier_after_one_epoch(tm, connect, catalog, catalog_settings, namespace)
    writer.tm.close()
    tm.client.create(tm.paths.epoch("copier", first + 1000), b"{not json")
    plan = tm.unregister_job("copier", confirm=True, catalog=catalog_settings)
    assert present(plan.committed).epoch == first and "copier" not in tm.topology().jobs


def test_registration_clears_a_job_znode_a_lock_recipe_left_after_a_wipe(tm, connect):
    """A standby contending while the tree is wiped re-creates ``/jobs/<job>/election`` (kazoo's lock recipe
    ensures its path): the orphan is not a registration, and registering the job clears it."""
    standby_lock = tm.paths.election("orphan") + "/lock"
    tm.client.ensure_path(standby_lock)
    assert "orphan" not in tm.topology().jobs
    tm.register_job("orphan", sources=[], sinks=["lake.db.orphan"])
    assert tm.get(standby_lock) is None
    assert connect().leadership("orphan").acquire(timeout=30) == 1


def test_a_registration_without_incarnation_gets_one_and_its_leaders_check_it(tm, connect):
    """A job registered by a release before incarnations: registering it again (every driver does at start)
    gives it one, and from then on its leaders check it."""
    tm.register_job("legacy", sources=[], sinks=["lake.db.legacy"])
    record = tm.topology().jobs["legacy"]
    tm.client.delete(tm.paths.incarnation("legacy", record.incarnation))
    tm.client.set(tm.paths.job("legacy"), replace(record, incarnation=None).to_json())
    upgraded = connect().register_job("legacy", sources=[], sinks=["lake.db.legacy"])
    assert upgraded.incarnation is not None and tm.get(tm.paths.incarnation("legacy", upgraded.incarnation))
    leadership = connect().leadership("legacy")
    leadership.acquire(timeout=30)
    assert any(op.path.endswith(f"incarnation-{upgraded.incarnation}") for op in leadership.fencing_checks())


class Driver:
    """One writer run in a thread with its own ZooKeeper session (a driver process, as far as ZooKeeper sees)."""

    def __init__(self, zk_connect: str, settings, name: str, sources, sinks, function) -> None:
        self.tm = Tidemark.connect(zk_connect, session_timeout=SESSION_TIMEOUT, operation_timeout=10)
        self.writer = EpochWriter(self.tm, name, sources=sources, sinks=sinks, catalog=settings, interval_ms=500,
                                  grace_ms=100, log_every=1.0)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(function,), daemon=True, name=f"driver-{name}")
        self.thread.start()

    def _run(self, function) -> None:
        try:
            self.writer.run(function, stop_on_sigterm=False, leader_timeout=DEADLINE)
        except BaseException as exc:  # noqa: BLE001 - a crashed driver; the test decides whether that is expected
            self.error = exc

    def stop(self) -> None:
        while self.thread.is_alive():
            self.writer.stop()
            self.thread.join(0.2)
        self.tm.close()

    def kill(self) -> None:
        """The driver dies with its session (the writer thread then fails, or ends)."""
        self.writer.stop()
        self.tm.close()
        self.thread.join(DEADLINE)
        assert not self.thread.is_alive()


def test_zookeeper_wiped_mid_run_resumes_from_iceberg_exactly_once(zk_server, zk_connect, catalog,
                                                                   catalog_settings, namespace):
    """A cascade ``events -> copy -> final`` keeps running; the whole chroot is deleted under it; the drivers
    restart on the empty ensemble. Every consistent read checks out all along, and at the end every event is
    in both derived tables exactly once."""
    events, copy, final = f"{namespace}.events", f"{namespace}.copy", f"{namespace}.final"
    catalog.create_namespace_if_not_exists(namespace)
    source = catalog.create_table(events, schema=SCHEMA)
    for name in (copy, final):
        create_table(catalog, name)
    appended = [0]

    def feed(count: int = 1) -> None:
        for _ in range(count):
            appended[0] += 1
            source.append(pa.table({"epoch": pa.array([appended[0]], pa.int64()),
                                    "row": pa.array([appended[0]], pa.int64())}, schema=SCHEMA))

    def start(downstream_first: bool = False) -> list[Driver]:
        def downstream() -> Driver:
            return Driver(zk_connect, catalog_settings, "final", [copy], [final], copy_job(copy, final))
        first = downstream() if downstream_first else None
        if first is not None:  # it must wait for copy's writer, not read copy as a root table by commit time
            wait_for(lambda: first.writer.waiting is not None, "final to wait for its upstream", DEADLINE)
            assert not first.writer.has_root_source, "final took its unregistered upstream for a root table"
        started = [Driver(zk_connect, catalog_settings, "copy", [events], [copy], copy_job(events, copy))]
        return [*started, first or downstream()]

    resolver = Resolver(catalog, catalog_settings, None)  # Iceberg alone: readable whatever ZooKeeper holds
    checked = []

    def consistent_read_checks_out() -> None:
        try:
            version = resolver.resolve([events, copy, final])
        except VersionNotFound:
            return  # before final's first epoch
        if version.epoch is None:
            return
        snaps = version.snapshots
        got = [rows_in(catalog.load_table(t), snaps[t]) if snaps[t] else [] for t in (events, copy, final)]
        assert got[1] == got[2] == got[0], f"inconsistent read at epoch {version.epoch}: {[len(g) for g in got]}"
        checked.append(version.epoch)

    def final_holds(count: int):
        def holds() -> bool:
            feed()
            consistent_read_checks_out()
            return len(rows_in(catalog.load_table(final))) >= count
        return holds

    drivers = start()
    wait_for(final_holds(5), "the cascade to carry 5 events through", DEADLINE, every=0.3)
    for driver in drivers:
        assert driver.error is None, driver.error
    wiper = KazooClient(hosts=zk_server.connect_string)
    wiper.start(30)
    chroot = "/" + zk_connect.split("/", 1)[1]

    def wiped() -> bool:  # ZooKeeper loses everything
        try:
            wiper.delete(chroot, recursive=True)
        except (NotEmptyError, NoNodeError):
            pass  # a running driver created a node during the recursive delete: delete again
        return wiper.exists(chroot) is None
    wait_for(wiped, "the whole tree to be deleted", DEADLINE)
    wiper.stop()
    wiper.close()
    for driver in drivers:
        driver.kill()
    consistent_read_checks_out()
    before = len(rows_in(catalog.load_table(final)))
    drivers = start(downstream_first=True)  # restarted in the wrong order, on an empty ensemble
    wait_for(final_holds(before + 5), "the restarted cascade to carry 5 more events", DEADLINE, every=0.3)
    for driver in drivers:
        driver.stop()
        assert driver.error is None, driver.error
    consistent_read_checks_out()
    # Drain: the events appended last may not be in any epoch yet; restart until final holds all of them.
    drivers = start()
    total = appended[0]
    wait_for(lambda: len(rows_in(catalog.load_table(final))) >= total, "every event in final", DEADLINE, every=0.3)
    for driver in drivers:
        driver.stop()
        assert driver.error is None, driver.error
    everything = rows_in(source)
    for name in (copy, final):
        assert rows_in(catalog.load_table(name)) == everything, f"{name}: duplicates or losses across the wipe"
    assert len(checked) > 3
    fresh = Tidemark.connect(zk_connect, session_timeout=SESSION_TIMEOUT)
    try:
        marks = fresh.tidemarks([copy, final])
        recorded = {t: present(EpochLineage(catalog.load_table(t)).committed_progress()).epoch for t in (copy, final)}
        assert all(present(present(marks[t]).epoch) >= recorded[t] for t in (copy, final)), \
            "a tidemark went back behind what its sink records"
        inputs = [snapshot_progress(s) for s in main_lineage(catalog.load_table(final))]
        assert all(p.inputs is not None for p in inputs if p is not None)
        assert recorded_term(catalog.load_table(copy)) >= 2  # the restart took a term above the first run's
    finally:
        fresh.close()


def test_a_waiting_replica_of_an_unregistered_job_registers_it_again_and_takes_over(tm, connect, catalog,
                                                                                   catalog_settings, namespace):
    """The operator's sequence with a standby waiting: fence, unregister. The standby neither exits nor
    reuses a term: it registers the job again, leads above the fence and resumes from the sink."""
    sink = f"{namespace}.counts"
    create_table(catalog, sink)
    old = lead_job(connect(), catalog_settings, "counts", [sink])
    commit_rows(old, 1000, rows=2)
    standby = EpochWriter(connect(), "counts", sources=[], sinks=[sink], catalog=catalog_settings,
                          interval_ms=1000, grace_ms=0, always_run=True)
    outcome: dict[str, Any] = {}

    def write(ctx) -> None:
        outcome["term"] = ctx.writer.term
        ctx.append(sink, rows_of(ctx.epoch, 1))

    def run_standby() -> None:
        try:
            outcome["epochs"] = standby.run(write, max_epochs=1, stop_on_sigterm=False)
        except Exception as exc:  # noqa: BLE001 - the assertion below reports it
            outcome["error"] = exc

    thread = threading.Thread(target=run_standby, daemon=True)
    thread.start()
    wait_for(lambda: standby.leadership.state == LeaderState.CONTENDING, "the standby to contend", DEADLINE)
    fence_term = tm.fence_job("counts")
    tm.unregister_job("counts", confirm=True, catalog=catalog_settings)
    old.close()
    thread.join(DEADLINE)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    (epoch,) = outcome["epochs"]
    assert epoch > 1000 and "counts" in tm.topology().jobs
    assert outcome["term"] > fence_term, "the new registration reused a term at or below the fence"
    assert Counter(e for e, _ in rows_in(catalog.load_table(sink))) == {1000: 2, epoch: 1}
    standby.tm.close()


def test_a_replica_stepping_down_while_zookeeper_is_down_returns_within_its_deadline(tm, connect, zk_server):
    """kazoo's ``Lock.release`` waits for its delete with no deadline while the connection is down: a leader
    stepping down during a ZooKeeper outage must still return within its operation deadline (the writer then
    contends again and says so), and once ZooKeeper is back the same session leads again, whatever its old
    contender node became (deleted late, or left behind and deleted by the next contender: kazoo #732)."""
    tm.register_job("outage", sources=[], sinks=["lake.db.outage"])
    replica = connect(session_timeout=60, operation_timeout=2)
    leadership = replica.leadership("outage")
    assert leadership.acquire(timeout=30) == 1
    zk_server.kill()
    try:
        started = time.monotonic()
        stepping_down = threading.Thread(target=leadership.release, daemon=True)
        stepping_down.start()
        stepping_down.join(30)
        assert not stepping_down.is_alive(), "stepping down waits for ZooKeeper with no deadline"
        assert time.monotonic() - started < 15
    finally:
        zk_server.start()
    wait_for(lambda: replica.connection_state == "CONNECTED", "the replica's session to come back", DEADLINE)
    assert replica.leadership("outage").acquire(timeout=30) == 2
