"""Leadership, barriers and the epoch state machine on a real ZooKeeper; the grid's arithmetic without one."""
from __future__ import annotations

import random
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
from coordinator.protocol.leadership import Leadership
from coordinator.records import BarrierRecord
from coordinator.zookeeper.session import ZooKeeperSession
from tests.helpers.present import present

SINKS = ["lake.db.a", "lake.db.b"]


@pytest.fixture
def job(tm):
    tm.register_job("j", sources=["raw.in"], sinks=SINKS)
    tm.barriers.ensure_grid(1000)
    return "j"


def agree(tm, *barriers: int) -> None:
    """Agree ``barriers`` in order (only agreed barriers are epochs); each must be new."""
    for t in barriers:
        assert tm.barriers.agree(t, proposed_by="test"), f"barrier {t} was already agreed"


def inputs(t: int) -> EpochInputs:
    return EpochInputs({"raw.in": SourceRange(None, t)})


def run_epoch(epochs: EpochCoordinator, t: int) -> None:
    epochs.begin(t, inputs(t))
    epochs.precommit(t, {s: t for s in SINKS})
    epochs.commit(t, {s: t for s in SINKS})


def test_epochs_run_strictly_in_agreed_order(tm, job):
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, SINKS, history=4)
    assert epochs.recover().action == RecoveryAction.START
    with pytest.raises(EpochOrderError, match="not an agreed barrier"):
        epochs.begin(1000)  # on the grid, but nobody agreed it
    agree(tm, 1000)
    with pytest.raises(EpochOrderError, match="not an agreed barrier"):
        epochs.begin(1500)
    for t in range(1000, 7000, 1000):
        if t > 1000:
            agree(tm, t)
        run_epoch(epochs, t)
    assert {t: m.epoch for t, m in tm.tidemarks(SINKS).items()} == {s: 6000 for s in SINKS}
    assert {m.first_epoch for m in tm.tidemarks(SINKS).values()} == {1000}
    assert sorted(map(int, tm.children(tm.paths.epochs(job)))) == [3000, 4000, 5000, 6000]
    with pytest.raises(EpochOrderError, match="already committed"):
        epochs.begin(6000)
    with pytest.raises(EpochOrderError, match="not an agreed barrier"):
        epochs.begin(7000)
    agree(tm, 7000, 8000, 9000)
    assert tm.barriers.after(6000) == [7000, 8000, 9000] and tm.barriers.next_after(6000) == 7000
    with pytest.raises(EpochOrderError, match="skips"):
        epochs.begin(9000)
    epochs.begin(7000)
    with pytest.raises(EpochOrderError, match="not PRECOMMITTED"):
        epochs.commit(7000, {s: 1 for s in SINKS})
    with pytest.raises(EpochOrderError, match="exactly its sinks"):
        epochs.precommit(7000, {"lake.db.a": 1})
    with pytest.raises(EpochOrderError, match="is STARTED"):
        epochs.begin(8000)


def test_the_epoch_machine_runs_on_a_plain_zookeeper_session(tm, zk_connect, job):
    """The recipes take a ``ZooKeeperSession``, so they must not need ``Tidemark``'s shortcuts (``begin`` once
    read ``tm.barriers``, which only ``Tidemark`` has: an AttributeError on the session its signature accepts)."""
    agree(tm, 1000, 2000)
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


def test_a_new_job_starts_at_any_agreed_barrier_then_follows_every_one(tm, job):
    agree(tm, 1000, 2000, 3000)
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
    agree(tm, 1000, 2000, 3000)
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
    agree(tm, 1000, 2000, 3000)
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
    agree(tm, 1000)
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


def test_barrier_grid_is_shared_and_agreement_has_one_creator(tm, connect, job):
    grid = tm.barriers.grid()
    assert grid.interval_ms == 1000 and grid.mode == BarrierMode.PROCESSING_TIME
    with pytest.raises(ConfigurationError, match="every 1000 ms"):
        connect().barriers.ensure_grid(5000)
    results: dict[str, bool] = {}
    start = threading.Barrier(4)

    def propose(i: int) -> None:
        client = connect()
        start.wait()
        results[f"root{i}"] = client.barriers.agree(42000, proposed_by=f"root{i}")
    threads = [threading.Thread(target=propose, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [name for name, agreed in results.items() if agreed]
    assert len(results) == 4 and len(winners) == 1, results
    assert tm.read(tm.paths.barrier(42000), BarrierRecord)[0].proposed_by == winners[0]
    assert tm.barriers.agreed() == [42000] and tm.barriers.latest() == 42000
    changed = tm.barriers.change_interval(5000, effective_from=50000)
    assert changed.next_candidate(48000) == 49000 and changed.next_candidate(49000) == 50000
    assert changed.next_candidate(50000) == 55000 and not changed.is_barrier(51000)
    assert tm.barriers.grid() == changed
    with pytest.raises(EpochOrderError):
        tm.barriers.change_interval(2000, effective_from=41000)


def test_agreement_is_strictly_increasing(tm, connect, job):
    barriers = tm.barriers
    with pytest.raises(EpochOrderError, match="not a barrier"):
        barriers.agree(1500, proposed_by="test")
    assert barriers.agree(5000, proposed_by="first")
    before_children, before_grid = barriers.agreed(), tm.get(tm.paths.barriers)
    for older in (5000, 4000, 1000, 0):
        assert not barriers.agree(older, proposed_by="late"), f"{older} agreed below the newest barrier 5000"
    assert barriers.agreed() == before_children == [5000]
    assert tm.get(tm.paths.barriers) == before_grid, "a refused agreement wrote /barriers"
    assert tm.read(tm.paths.barrier(5000), BarrierRecord)[0].proposed_by == "first"
    assert barriers.next_after(None) == 5000 and barriers.next_after(5000) is None

    # An interval change takes effect after the newest agreed barrier, never at or before it.
    for too_early in (5000, 3000):
        with pytest.raises(EpochOrderError, match="newest agreed barrier: 5000"):
            barriers.change_interval(2000, effective_from=too_early)
    with pytest.raises(EpochOrderError):
        barriers.change_interval(2000, effective_from=6500)  # not a barrier of the current grid
    barriers.change_interval(2000, effective_from=8000)
    assert barriers.agree(7000, proposed_by="test") and not barriers.agree(7000, proposed_by="test")
    with pytest.raises(EpochOrderError, match="not a barrier"):
        barriers.agree(9000, proposed_by="test")  # 1000-grid point, but the interval is 2000 from 8000
    assert barriers.agree(10000, proposed_by="test")
    with pytest.raises(EpochOrderError, match="newest agreed barrier: 10000"):
        barriers.change_interval(1000, effective_from=8000)

    # Racing proposers of many barriers: every barrier is created above every one that exists.
    clients = [connect() for _ in range(4)]
    candidates = list(range(12000, 40000, 2000))
    won: list[int] = []
    start = threading.Barrier(len(clients))

    def propose(client, seed: int) -> None:
        mine = list(candidates)
        random.Random(seed).shuffle(mine)
        start.wait()
        for t in mine:
            if client.barriers.agree(t, proposed_by=f"p{seed}"):
                won.append(t)
    threads = [threading.Thread(target=propose, args=(c, i)) for i, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    agreed = barriers.agreed()
    assert sorted(won) == agreed[3:] and len(won) == len(set(won)), "a barrier was agreed twice"
    created = sorted(agreed, key=lambda t: tm.client.get(tm.paths.barrier(t))[1].czxid)
    assert created == sorted(agreed), f"barriers were created out of order: {created}"
    assert barriers.latest() == agreed[-1]


def test_derived_job_waits_on_a_watch_until_sources_reach_the_barrier(tm, connect, job):
    agree(tm, 1000, 2000)
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
