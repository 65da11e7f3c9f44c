"""Leadership, barriers and the epoch state machine on a real ZooKeeper."""
from __future__ import annotations

import threading

import pytest

from coordinator import (BarrierMode, ConfigurationError, EpochCoordinator, EpochOrderError, EpochState, Fenced,
                         NotLeader, RecoveryAction, TidemarkError)

SINKS = ["lake.db.a", "lake.db.b"]


@pytest.fixture
def job(tm):
    tm.register_job("j", sources=["raw.in"], sinks=SINKS)
    tm.barriers.ensure_grid(1000)
    return "j"


def run_epoch(epochs: EpochCoordinator, t: int) -> None:
    epochs.begin(t, {"raw.in": [t]})
    epochs.precommit(t, {s: t for s in SINKS})
    epochs.commit(t, {s: t for s in SINKS})


def test_epochs_run_strictly_in_grid_order(tm, job):
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, SINKS, tm.barriers.grid(), history=4)
    assert epochs.recover().action == RecoveryAction.START
    with pytest.raises(EpochOrderError, match="not a barrier"):
        epochs.begin(1500)
    for t in range(1000, 7000, 1000):
        run_epoch(epochs, t)
    assert {t: m.epoch for t, m in tm.tidemarks(SINKS).items()} == {s: 6000 for s in SINKS}
    assert sorted(map(int, tm.children(tm.paths.epochs(job)))) == [3000, 4000, 5000, 6000]
    with pytest.raises(EpochOrderError, match="already committed"):
        epochs.begin(6000)
    with pytest.raises(EpochOrderError, match="skips barriers"):
        epochs.begin(9000)
    epochs.begin(7000)
    with pytest.raises(EpochOrderError, match="not PRECOMMITTED"):
        epochs.commit(7000, {s: 1 for s in SINKS})
    with pytest.raises(EpochOrderError, match="exactly its sinks"):
        epochs.precommit(7000, {"lake.db.a": 1})
    with pytest.raises(EpochOrderError, match="is STARTED"):
        epochs.begin(8000)


def test_recovery_rolls_forward_a_precommitted_epoch_and_recomputes_a_started_one(tm, connect, job):
    first = tm.leadership(job)
    first.acquire()
    epochs = EpochCoordinator(first, SINKS, tm.barriers.grid())
    run_epoch(epochs, 1000)
    epochs.begin(2000, {"raw.in": [2000]})
    epochs.precommit(2000, {"lake.db.a": 7, "lake.db.b": None})
    first.release()

    second_tm = connect()
    second = second_tm.leadership(job)
    assert second.acquire() == first.term + 1
    recovered = EpochCoordinator(second, SINKS, second_tm.barriers.grid())
    plan = recovered.recover()
    assert plan.action == RecoveryAction.ROLL_FORWARD and plan.epoch.epoch == 2000
    assert plan.epoch.staged == {"lake.db.a": 7, "lake.db.b": None} and plan.last_committed == 1000
    recovered.commit(2000, {"lake.db.a": 7, "lake.db.b": 1000})
    recovered.begin(3000, {"raw.in": [3000]})
    second.release()

    third_tm = connect()
    third = third_tm.leadership(job)
    third.acquire()
    again = EpochCoordinator(third, SINKS, third_tm.barriers.grid())
    plan = again.recover()
    assert plan.action == RecoveryAction.RECOMPUTE and plan.epoch.inputs == {"raw.in": [3000]}
    with pytest.raises(EpochOrderError, match="recorded inputs"):
        again.begin(3000, {"raw.in": [9999]})
    assert again.begin(3000).inputs == {"raw.in": [3000]}
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
    leadership = tm.leadership(job)
    leadership.acquire()
    epochs = EpochCoordinator(leadership, SINKS, tm.barriers.grid())
    epochs.recover()
    leadership._on_state_change("SUSPENDED")  # what kazoo's listener reports when the connection drops
    with pytest.raises(NotLeader, match="suspended"):
        epochs.begin(1000)
    leadership._on_state_change("CONNECTED")
    epochs.begin(1000)
    leadership._on_state_change("LOST")
    with pytest.raises(Fenced, match="session expired"):
        epochs.precommit(1000, {s: 1 for s in SINKS})


def test_barrier_grid_is_shared_and_agreement_has_one_creator(tm, connect, job):
    grid = tm.barriers.grid()
    assert grid.interval_ms == 1000 and grid.mode == BarrierMode.PROCESSING_TIME
    with pytest.raises(ConfigurationError, match="every 1000 ms"):
        connect().barriers.ensure_grid(5000)
    results = []

    def agree(i: int) -> None:
        results.append(connect().barriers.agree(42000, proposed_by=f"root{i}"))
    threads = [threading.Thread(target=agree, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(created for _, created in results) == 1
    assert len({record.proposed_by for record, _ in results}) == 1
    changed = tm.barriers.change_interval(5000, effective_from=50000)
    assert changed.next_candidate(48000) == 49000 and changed.next_candidate(49000) == 50000
    assert changed.next_candidate(50000) == 55000 and not changed.is_barrier(51000)
    with pytest.raises(EpochOrderError):
        tm.barriers.change_interval(2000, effective_from=41000)


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
    epochs = EpochCoordinator(leadership, SINKS, tm.barriers.grid())
    epochs.recover()
    run_epoch(epochs, 1000)
    assert not reached.wait(0.5)
    run_epoch(epochs, 2000)
    assert reached.wait(10)
    waiter.join()
    assert {t: v.epoch for t, v in cache.get(SINKS).items()} == {s: 2000 for s in SINKS}
    with pytest.raises(TidemarkError, match="did not reach epoch 9000"):
        cache.wait_for(SINKS, 9000, timeout=0.3)
    assert EpochState.COMMITTED == epochs.current.state
