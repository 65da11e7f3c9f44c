"""Leadership, barriers and the epoch state machine on a real ZooKeeper; the grid's arithmetic without one."""
from __future__ import annotations

import threading

import pytest

from coordinator import (
    BarrierGrid,
    BarrierMode,
    ConfigurationError,
    EpochCoordinator,
    EpochInputs,
    EpochOrderError,
    EpochRecord,
    EpochState,
    Fenced,
    InvalidArgument,
    NotLeader,
    RecoveryAction,
    SourceRange,
    TidemarkError,
)
from coordinator.errors import CorruptState
from coordinator.iceberg.progress import ResumePoint
from coordinator.names import parse_epoch
from coordinator.protocol.leadership import Leadership
from coordinator.records import RECENT_PER_LEVEL, EpochProgress, TableTidemark, keep_recent, now_ms
from coordinator.zookeeper.session import ZooKeeperSession
from tests.helpers.present import present

SINKS = ["lake.db.a", "lake.db.b"]


@pytest.fixture
def job(tm):
    tm.register_job("j", sources=["raw.in"], sinks=SINKS)
    tm.barriers.ensure_grid(1000)
    return "j"


def inputs(t: int) -> EpochInputs:
    return EpochInputs({"raw.in": SourceRange(None, t)})


def run_epoch(epochs: EpochCoordinator, t: int) -> None:
    epochs.begin(t, inputs(t))
    epochs.precommit(t, {s: t for s in SINKS})
    epochs.commit(t, {s: t for s in SINKS})


def test_epochs_are_grid_barriers_in_increasing_order_and_may_coalesce(tm, job):
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, SINKS, history=4)
    assert epochs.recover().action == RecoveryAction.START
    with pytest.raises(EpochOrderError, match="not a barrier of the grid"):
        epochs.begin(1500)
    for t in (1000, 2000, 5000, 6000, 9000, 10000):  # 3000, 4000, 7000 and 8000 coalesced into the next epoch
        run_epoch(epochs, t)
    marks = tm.tidemarks(SINKS)
    assert {t: m.epoch for t, m in marks.items()} == {s: 10000 for s in SINKS}
    assert {m.first_epoch for m in marks.values()} == {1000}
    assert {m.epochs for m in marks.values()} == {(1000, 2000, 5000, 6000, 9000, 10000)}
    assert marks["lake.db.a"].holds(5000) and not marks["lake.db.a"].holds(4000)
    assert marks["lake.db.a"].snapshot_at(9000) == 9000
    assert sorted(map(int, tm.children(tm.paths.epochs(job)))) == [5000, 6000, 9000, 10000]
    with pytest.raises(EpochOrderError, match="already committed"):
        epochs.begin(10000)
    with pytest.raises(EpochOrderError, match="already committed"):
        epochs.begin(7000)
    epochs.begin(13000)
    with pytest.raises(EpochOrderError, match="not PRECOMMITTED"):
        epochs.commit(13000, {s: 1 for s in SINKS})
    with pytest.raises(EpochOrderError, match="exactly its sinks"):
        epochs.precommit(13000, {"lake.db.a": 1})
    with pytest.raises(EpochOrderError, match="is STARTED"):
        epochs.begin(14000)


def test_a_tidemark_keeps_recent_epochs_and_coarse_ones_within_a_bounded_record():
    day, hour, minute = 86_400_000, 3_600_000, 60_000
    start = 20 * day
    epochs = list(range(start, start + 3 * day, 5000))  # three days of 5-second epochs
    kept = keep_recent((e, e // 1000) for e in epochs)
    kept_epochs = [e for e, _ in kept]
    assert kept_epochs == sorted(kept_epochs) and kept_epochs[-1] == epochs[-1]
    assert epochs[-RECENT_PER_LEVEL:] == kept_epochs[-RECENT_PER_LEVEL:], "the newest epochs are all kept"
    for period in (minute, hour, day):
        aligned = [e for e in epochs if e % period == 0]
        assert set(aligned[-RECENT_PER_LEVEL:]) <= set(kept_epochs), f"the newest {period} ms points are kept"
    assert len(kept) <= 4 * RECENT_PER_LEVEL
    mark = TableTidemark("lake.db.t")
    for e in epochs[:200]:
        mark = mark.advanced(e, e // 1000, e)
    decoded = TableTidemark.from_json(mark.to_json())
    assert decoded == mark and decoded.first_epoch == epochs[0] and decoded.epoch == epochs[199]
    assert decoded.snapshot_at(epochs[199]) == epochs[199] // 1000 and len(mark.to_json()) < 4096
    legacy = TableTidemark.from_json(b'{"table":"t","epoch":5000,"snapshot_id":7,"first_epoch":1000}')
    assert legacy.holds(5000) and legacy.snapshot_at(5000) == 7, "a tidemark written before `recent` holds its epoch"


def test_the_epoch_machine_runs_on_a_plain_zookeeper_session(tm, zk_connect, job):
    """The recipes take a ``ZooKeeperSession``, so they must not need ``Tidemark``'s shortcuts (``begin`` once
    read ``tm.barriers``, which only ``Tidemark`` has: an AttributeError on the session its signature accepts)."""
    session = ZooKeeperSession.connect(zk_connect, operation_timeout=20)
    try:
        leadership = Leadership(session, job)
        leadership.acquire()
        epochs = EpochCoordinator(leadership, SINKS)
        epochs.recover()
        run_epoch(epochs, 1000)
        run_epoch(epochs, 2000)
    finally:
        session.close()
    assert {m.epoch for m in tm.tidemarks(SINKS).values()} == {2000}


def test_a_new_job_starts_at_any_barrier(tm, job):
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, SINKS)
    epochs.recover()
    run_epoch(epochs, 2000)  # a job's first epoch: nothing committed before it
    assert epochs.first_epoch == 2000 and {m.first_epoch for m in tm.tidemarks(SINKS).values()} == {2000}
    with pytest.raises(EpochOrderError, match="already committed"):
        epochs.begin(1000)
    run_epoch(epochs, 3000)
    assert epochs.first_epoch == 2000 and {m.first_epoch for m in tm.tidemarks(SINKS).values()} == {2000}


def test_idle_epoch_commits_in_one_multi_and_keeps_every_snapshot(tm, job):
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, SINKS)
    epochs.recover()
    run_epoch(epochs, 1000)
    idle = EpochInputs({"raw.in": SourceRange(1000, 1000)})
    assert idle.unchanged
    record = epochs.commit_idle(2000, idle)
    assert record.state == EpochState.COMMITTED and record.published == {s: 1000 for s in SINKS}
    stored = tm.read(tm.paths.epoch(job, 2000), EpochRecord)[0]
    assert stored.state == EpochState.COMMITTED and stored.inputs == idle
    assert {t: (m.epoch, m.snapshot_id) for t, m in tm.tidemarks(SINKS).items()} == {s: (2000, 1000) for s in SINKS}
    with pytest.raises(EpochOrderError, match="already committed"):
        epochs.commit_idle(2000, idle)
    epochs.begin(3000, inputs(3000))  # a started epoch may still turn out idle: recorded inputs only
    with pytest.raises(EpochOrderError, match="recorded inputs"):
        epochs.commit_idle(3000, idle)
    epochs.commit_idle(3000)
    assert epochs.last_committed == 3000 and present(epochs.current).inputs == inputs(3000)


def test_recovery_rolls_forward_a_precommitted_epoch_and_recomputes_a_started_one(tm, connect, job):
    first = tm.leadership(job)
    first.acquire()
    epochs = EpochCoordinator(first, SINKS)
    run_epoch(epochs, 1000)
    epochs.begin(2000, inputs(2000))
    epochs.precommit(2000, {"lake.db.a": 7, "lake.db.b": None})
    first.release()

    second_tm = connect()
    second = second_tm.leadership(job)
    assert second.acquire() == first.term + 1
    recovered = EpochCoordinator(second, SINKS)
    plan = recovered.recover()
    assert plan.action == RecoveryAction.ROLL_FORWARD and present(plan.epoch).epoch == 2000
    assert present(plan.epoch).staged == {"lake.db.a": 7, "lake.db.b": None} and plan.last_committed == 1000
    recovered.commit(2000, {"lake.db.a": 7, "lake.db.b": 1000})
    recovered.begin(3000, inputs(3000))
    second.release()

    third_tm = connect()
    third = third_tm.leadership(job)
    third.acquire()
    again = EpochCoordinator(third, SINKS)
    plan = again.recover()
    assert plan.action == RecoveryAction.RECOMPUTE and present(plan.epoch).inputs == inputs(3000)
    assert plan.last_committed == 2000
    with pytest.raises(EpochOrderError, match="recorded inputs"):
        again.begin(3000, EpochInputs({"raw.in": SourceRange(None, 9999)}))
    assert again.begin(3000).inputs == inputs(3000)
    aborted = again.abort(3000, "bad input")
    assert aborted.state == EpochState.ABORTED and aborted.abort_reason == "bad input"
    assert again.begin(3000).term == third.term


def iceberg_at(epoch: int) -> ResumePoint:
    """What the sinks' Iceberg metadata would say of job ``j``: every sink at ``epoch``."""
    progress = EpochProgress("j", epoch, 1, inputs(epoch))
    return ResumePoint("j", progress, None, dict.fromkeys(SINKS, progress), dict.fromkeys(SINKS),
                       {s: () for s in SINKS}, 1, 1000)


def test_recovery_resumes_from_iceberg_only_where_zookeeper_is_behind_it(tm, connect, job):
    """A take-over compares the job's history with its sinks' progress: the history stands where it covers it (or
    where the progress cannot be read: a release before format 1), and is replaced where Iceberg records a newer
    epoch (a tree restored from an older copy), under a read floor. After a start-over (``after_loss``) the floor
    is set either way."""
    first = tm.leadership(job)
    first.acquire()
    epochs = EpochCoordinator(first, SINKS)
    run_epoch(epochs, 1000)
    run_epoch(epochs, 2000)

    def unreadable() -> ResumePoint:
        raise CorruptState("no input ranges")
    for resume in (unreadable, lambda: iceberg_at(2000), lambda: iceberg_at(1000)):
        plan = EpochCoordinator(first, SINKS).recover(resume)
        assert (plan.action, plan.last_committed, plan.resumed_from) == (RecoveryAction.NEXT, 2000, None)
    assert {m.read_floor for m in tm.tidemarks(SINKS).values() if m} == {None}

    EpochCoordinator(first, SINKS).recover(lambda: iceberg_at(2000), after_loss=True)
    floors = {m.read_floor for m in tm.tidemarks(SINKS).values() if m}
    assert len(floors) == 1 and present(floors.pop()) >= 2000
    assert {present(m).epoch for m in tm.tidemarks(SINKS).values()} == {2000}

    plan = EpochCoordinator(first, SINKS).recover(lambda: iceberg_at(9000))
    assert (plan.action, plan.last_committed) == (RecoveryAction.NEXT, 9000) and plan.resumed_from is not None
    assert [parse_epoch(n) for n in tm.children(tm.paths.epochs(job))] == [9000], "the older history is deleted"
    assert {present(m).epoch for m in tm.tidemarks(SINKS).values()} == {9000}


def test_only_one_replica_leads_and_terms_increase(connect, tm, job):
    replicas = [connect().leadership(job) for _ in range(3)]
    terms: list[int] = []
    leading = threading.Semaphore(1)

    def lead(leadership) -> None:
        term = leadership.acquire(timeout=30)
        assert leading.acquire(blocking=False), "two replicas led at once"
        terms.append(term)
        leading.release()
        leadership.release()
    threads = [threading.Thread(target=lead, args=(r,)) for r in replicas]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(terms) == [1, 2, 3]


def test_standby_times_out_with_not_leader(connect, job):
    leader = connect().leadership(job)
    leader.acquire()
    with pytest.raises(NotLeader, match="not elected"):
        connect().leadership(job).acquire(timeout=0.5)


def test_suspended_leader_stops_committing_until_reconnected(tm, job):
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, SINKS)
    epochs.recover()
    leadership._on_state_change("SUSPENDED")  # what kazoo's listener reports when the connection drops
    with pytest.raises(NotLeader, match="suspended"):
        epochs.begin(1000, inputs(1000))
    leadership._on_state_change("CONNECTED")
    epochs.begin(1000, inputs(1000))
    leadership._on_state_change("LOST")
    with pytest.raises(Fenced, match="session expired"):
        epochs.precommit(1000, {s: 1 for s in SINKS})


def test_barrier_grid_is_shared_and_interval_changes_take_effect_at_a_future_grid_point(tm, connect, job):
    grid = tm.barriers.grid()
    assert grid.interval_ms == 1000 and grid.mode == BarrierMode.PROCESSING_TIME
    with pytest.raises(ConfigurationError, match="every 1000 ms"):
        connect().barriers.ensure_grid(5000)
    future = (now_ms() // 60_000 + 10) * 60_000  # ten minutes ahead, a multiple of every interval below
    for too_early in (grid.floor(now_ms()), 1000):
        with pytest.raises(EpochOrderError, match="future point"):
            tm.barriers.change_interval(5000, effective_from=too_early)
    with pytest.raises(EpochOrderError, match="future point"):
        tm.barriers.change_interval(5000, effective_from=future + 500)  # not a barrier of the current grid
    before = tm.get(tm.paths.barriers)
    assert tm.get(tm.paths.barriers) == before, "a refused change wrote /barriers"

    # Racing changes (compare-and-set on /barriers' version): every one lands, none is lost.
    results: dict[int, BarrierGrid] = {}
    start = threading.Barrier(4)

    def change(i: int) -> None:
        client = connect()
        start.wait()
        results[i] = client.barriers.change_interval(5000 * (i + 1), effective_from=future + i * 600_000)
    threads = [threading.Thread(target=change, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    changed = tm.barriers.grid()
    assert len(results) == 4 and len(changed.changes) == 4, changed.changes
    assert changed.next_candidate(future - 1000) == future and changed.next_candidate(future) == future + 5000
    assert changed.interval_at(future + 1_801_000) == 20_000 and not changed.is_barrier(future + 1_801_000)


def test_derived_job_waits_on_a_watch_until_sources_reach_the_barrier(tm, connect, job):
    cache = connect().tidemark_cache()
    reached = threading.Event()

    def wait() -> None:
        cache.wait_for(SINKS, 2000, timeout=30)
        reached.set()
    waiter = threading.Thread(target=wait)
    waiter.start()
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, SINKS)
    epochs.recover()
    run_epoch(epochs, 1000)
    cache.wait_for(SINKS, 1000, timeout=10)  # the cache has seen epoch 1000 ...
    assert not reached.is_set()             # ... and the waiter for 2000 keeps waiting
    run_epoch(epochs, 2000)
    assert reached.wait(10)
    waiter.join()
    assert {t: v.epoch for t, v in cache.get(SINKS).items()} == {s: 2000 for s in SINKS}
    with pytest.raises(TidemarkError, match="did not reach epoch 9000"):
        cache.wait_for(SINKS, 9000, timeout=0.3)
    assert present(epochs.current).state == EpochState.COMMITTED
    cache.close()


# -- the grid's arithmetic (no ZooKeeper) ------------------------------------------------------

def barriers_between(grid: BarrierGrid, low: int, high: int) -> list[int]:
    return [t for t in range(low, high + 1) if grid.is_barrier(t)]


def check_against_brute_force(grid: BarrierGrid, low: int, high: int) -> None:
    """floor and next_candidate agree with the set of points is_barrier accepts, at every integer."""
    points = barriers_between(grid, low, high)
    index = 0
    for t in range(points[0], points[-1]):
        while points[index + 1] <= t:
            index += 1
        assert grid.floor(t) == points[index], f"floor({t})"
        assert grid.next_candidate(t) == points[index + 1], f"next_candidate({t})"


def test_grid_floor_next_candidate_and_is_barrier():
    grid = BarrierGrid(interval_ms=1000)
    assert [grid.floor(t) for t in (0, 1, 999, 1000, 2500, 2999)] == [0, 0, 0, 1000, 2000, 2000]
    assert [grid.next_candidate(t) for t in (0, 1, 999, 1000, 2500)] == [1000, 1000, 1000, 2000, 3000]
    assert grid.is_barrier(0) and grid.is_barrier(7000) and not grid.is_barrier(7001) and not grid.is_barrier(500)
    assert grid.floor(-1) == -1000 and grid.next_candidate(-1) == 0  # before the epoch origin: same grid
    assert grid.interval_at(123456) == 1000
    wall = 1_700_000_123_456
    assert grid.floor(wall) == 1_700_000_123_000 and grid.next_candidate(grid.floor(wall)) == 1_700_000_124_000
    check_against_brute_force(grid, 0, 10_000)


def test_grid_interval_changes():
    grid = BarrierGrid(interval_ms=1000, changes=({"from_epoch": 30000, "interval_ms": 2000},
                                                   {"from_epoch": 10000, "interval_ms": 5000}))
    assert [c["from_epoch"] for c in grid.changes] == [10000, 30000], "changes are kept in order"
    assert [grid.interval_at(t) for t in (9999, 10000, 29999, 30000, 10**9)] == [1000, 5000, 5000, 2000, 2000]
    assert barriers_between(grid, 8000, 36000) == [8000, 9000, 10000, 15000, 20000, 25000, 30000, 32000, 34000, 36000]
    assert grid.floor(9999) == 9000 and grid.floor(10000) == 10000 and grid.floor(14999) == 10000
    assert grid.floor(29999) == 25000 and grid.floor(31999) == 30000
    assert grid.next_candidate(9000) == 10000 and grid.next_candidate(10000) == 15000
    assert grid.next_candidate(25000) == 30000 and grid.next_candidate(30000) == 32000
    assert not grid.is_barrier(11000) and not grid.is_barrier(31000) and grid.is_barrier(1000)
    check_against_brute_force(grid, 0, 40_000)

    # A change off the old grid (refused by change_interval, but the arithmetic still holds).
    odd = BarrierGrid(interval_ms=3000, changes=({"from_epoch": 10000, "interval_ms": 1000},))
    assert odd.next_candidate(9000) == 10000 and odd.floor(9999) == 9000 and odd.is_barrier(10000)
    check_against_brute_force(odd, 0, 20_000)

    assert BarrierGrid.from_json(grid.to_json()) == grid
    for bad in ({"interval_ms": 0}, {"interval_ms": 1000, "changes": ({"from_epoch": 5000, "interval_ms": 0},)},
                {"interval_ms": 1000, "changes": ({"from_epoch": -1, "interval_ms": 1000},)}):
        with pytest.raises(InvalidArgument):
            BarrierGrid(**bad)
