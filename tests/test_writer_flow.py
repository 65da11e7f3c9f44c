"""The EpochWriter's barrier behaviour, end to end: real ZooKeeper, a real Iceberg catalog (pyiceberg, no Spark).

Every writer runs in a thread of this process with its own ZooKeeper session (its own
"driver"). Nothing here waits with a fixed sleep for something to happen: every wait polls
a condition until a generous deadline (the machine may be small and loaded).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Optional

import pyarrow as pa
import pytest
from kazoo.protocol.states import ZnodeStat

from coordinator import EpochRecord, EpochState, EpochWriter
from coordinator.iceberg.snapshots import COMMITTED_EPOCH_PROPERTY
from coordinator.records import FinishedRecord, now_ms
from tests.helpers.lake import SCHEMA
from tests.helpers.present import present
from tests.helpers.wait import wait_for

POLL = 0.05
DEADLINE = 90.0


# -- helpers ----------------------------------------------------------------------------------

@pytest.fixture
def catalog(catalog_settings):
    return catalog_settings.load()


def new_table(catalog, name: str):
    catalog.create_namespace_if_not_exists(name.rsplit(".", 1)[0])
    return catalog.create_table(name, schema=SCHEMA)


def rows(epoch: int, values) -> pa.Table:
    values = list(values)
    return pa.table({"epoch": pa.array([epoch] * len(values), pa.int64()), "row": pa.array(values, pa.int64())},
                    schema=SCHEMA)


def as_set(table: pa.Table) -> list[tuple[int, int]]:
    return sorted(zip(table.column("epoch").to_pylist(), table.column("row").to_pylist()))


class Runner:
    """One writer's ``run`` in a daemon thread; the result or the error is kept for the test."""

    def __init__(self, writer: EpochWriter, function: Callable, **kwargs) -> None:
        self.writer = writer
        self.result: Optional[list[int]] = None
        self.error: Optional[BaseException] = None
        self.thread = threading.Thread(target=self._run, args=(function,), kwargs=kwargs, daemon=True,
                                       name=f"writer-{writer.name}")
        self.thread.start()

    def _run(self, function: Callable, **kwargs) -> None:
        try:
            self.result = self.writer.run(function, stop_on_sigterm=False, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported by check()
            self.error = exc

    @property
    def done(self) -> bool:
        return not self.thread.is_alive()

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"writer {self.writer.name} failed: {self.error!r}") from self.error

    def stop(self, timeout: float = DEADLINE) -> None:
        # run() clears an earlier stop() when it starts, so keep asking until the thread has ended.
        deadline = time.monotonic() + timeout
        while self.thread.is_alive() and time.monotonic() < deadline:
            self.writer.stop()
            self.thread.join(0.2)
        assert not self.thread.is_alive(), f"writer {self.writer.name} did not stop within {timeout:.0f}s"
        self.check()


class Fleet:
    """The writers of one test: each with its own ZooKeeper session, all stopped at the end."""

    def __init__(self, connect, settings, interval_ms: int, grace_ms: int) -> None:
        self.connect, self.settings = connect, settings
        self.interval_ms, self.grace_ms = interval_ms, grace_ms
        self.runners: list[Runner] = []

    def writer(self, name: str, sources, sinks, **kwargs) -> EpochWriter:
        kwargs.setdefault("interval_ms", self.interval_ms)
        kwargs.setdefault("grace_ms", self.grace_ms)
        kwargs.setdefault("log_every", 1.0)
        return EpochWriter(self.connect(), name, sources=sources, sinks=sinks, catalog=self.settings, **kwargs)

    def start(self, writer: EpochWriter, function: Callable, **kwargs) -> Runner:
        runner = Runner(writer, function, **kwargs)
        self.runners.append(runner)
        return runner

    def check(self) -> None:
        for runner in self.runners:
            runner.check()

    def wait(self, condition: Callable[[], object], what: str, timeout: float = DEADLINE):
        """Wait for ``condition``, failing at once when a writer thread died."""
        def checked():
            self.check()
            return condition()
        return wait_for(checked, what, timeout, POLL)

    def stop_all(self) -> None:
        errors = []
        for runner in reversed(self.runners):
            try:
                runner.stop()
            except BaseException as exc:  # noqa: BLE001 - stop every writer, then report
                errors.append(exc)
        if errors:
            raise errors[0]


def fleet_fixture(name: str, interval_ms: int, grace_ms: int):
    @pytest.fixture(name=name)
    def fixture(connect, catalog_settings):
        fleet = Fleet(connect, catalog_settings, interval_ms, grace_ms)
        try:
            yield fleet
        finally:
            fleet.stop_all()
    return fixture


fleet_fast = fleet_fixture("fleet", 500, 100)        # most tests: a 500 ms grid
fleet_slow = fleet_fixture("slow_fleet", 1000, 100)  # the backpressure and diamond tests: a 1 s grid


def mark(tm, table: str):
    return tm.tidemarks([table])[table]


def mark_epoch(tm, table: str) -> Optional[int]:
    found = mark(tm, table)
    return found.epoch if found else None


def epoch_record(tm, job: str, epoch: int) -> tuple[EpochRecord, ZnodeStat]:
    found = tm.read(tm.paths.epoch(job, epoch), EpochRecord)
    assert found is not None, f"job {job} has no epoch znode {epoch}"
    return found


def job_epochs(tm, job: str) -> list[int]:
    return sorted(int(c) for c in tm.children(tm.paths.epochs(job)) if c.isdigit())


def clock_barrier(grid, grace_ms: int) -> int:
    """The newest grid point the clock has passed (minus grace): what a root job would agree now."""
    return grid.floor(now_ms() - grace_ms)


# -- 1. idle barriers --------------------------------------------------------------------------

def test_idle_barriers_commit_without_calling_the_function(tm, fleet, catalog, namespace):
    events = new_table(catalog, f"{namespace}.events")
    events.append(rows(0, range(5)))
    counts, everything = f"{namespace}.counts", f"{namespace}.every"
    new_table(catalog, counts)
    new_table(catalog, everything)

    calls: dict[str, list[tuple[int, list]]] = {"counter": [], "always": []}

    def count(ctx) -> None:
        new = ctx.changes(f"{namespace}.events")
        calls["counter"].append((ctx.epoch, as_set(new)))
        if new.num_rows:
            ctx.append(counts, rows(ctx.epoch, [new.num_rows]))

    def always(ctx) -> None:
        calls["always"].append((ctx.epoch, []))

    counter = fleet.start(fleet.writer("counter", [f"{namespace}.events"], [counts]), count)
    always_run = fleet.start(fleet.writer("always", [f"{namespace}.events"], [everything], always_run=True), always)

    # The first epoch (or the one after the append, if the append came after the first barrier) computes.
    fleet.wait(lambda: calls["counter"] and calls["counter"][-1][1] == [(0, r) for r in range(5)],
               "the counter to see the first rows")
    after_rows = len(calls["counter"])
    seen = calls["counter"][-1][0]
    fleet.wait(lambda: len([e for e in counter.writer.committed if e > seen]) >= 5, "five idle epochs")
    assert len(calls["counter"]) == after_rows, "an idle barrier called the function"

    # New rows: exactly one more call, which sees exactly those rows.
    events.append(rows(1, [10, 11]))
    fleet.wait(lambda: len(calls["counter"]) > after_rows, "the counter to see the appended rows")
    fleet.wait(lambda: len([e for e in counter.writer.committed if e > calls["counter"][-1][0]]) >= 4,
               "four idle epochs after the append")
    counter_calls = list(calls["counter"])
    assert len(counter_calls) == after_rows + 1
    assert counter_calls[-1][1] == [(1, 10), (1, 11)]
    last_computed = counter_calls[-1][0]
    snapshot_after = catalog.load_table(counts).current_snapshot().snapshot_id
    fleet.wait(lambda: len(always_run.writer.committed) >= 8, "eight epochs of the always_run job")

    counter.stop()
    always_run.stop()

    # The function ran exactly at the epochs whose recorded inputs changed; idle epochs went in one multi.
    called = [e for e, _ in counter_calls]
    committed = counter.writer.committed
    assert set(called) <= set(committed)
    idle = [e for e in committed if e not in called]
    assert len(idle) >= 9
    for epoch in committed:
        record, stat = epoch_record(tm, "counter", epoch)
        assert record.state == EpochState.COMMITTED
        if epoch in called:
            assert not record.inputs.unchanged
            assert stat.version == 2  # STARTED, PRECOMMITTED, COMMITTED
        else:
            assert record.inputs.unchanged
            assert stat.version == 0 and stat.czxid == stat.mzxid  # created COMMITTED, never touched again
    # The last epoch was idle: its znode and the tidemark were written by the same transaction (one multi).
    assert committed[-1] in idle
    _, last_stat = epoch_record(tm, "counter", committed[-1])
    tidemark_stat = tm.get(tm.paths.tidemark(counts))[1]
    assert tidemark_stat.mzxid == last_stat.czxid

    # Idle epochs leave the sink's snapshot alone while its tidemark advances.
    final = mark(tm, counts)
    assert final.epoch == committed[-1] > last_computed
    assert final.snapshot_id == snapshot_after
    table = catalog.load_table(counts)
    assert table.current_snapshot().snapshot_id == snapshot_after
    assert table.properties.get(COMMITTED_EPOCH_PROPERTY) == str(committed[-1])

    # always_run: one call per committed epoch, idle or not.
    assert [e for e, _ in calls["always"]] == always_run.writer.committed


# -- 2. backpressure ---------------------------------------------------------------------------

def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def test_a_job_slower_than_the_interval_keeps_the_lag_bounded(tm, slow_fleet, catalog, namespace):
    fleet, interval = slow_fleet, slow_fleet.interval_ms
    max_pending = 2
    events = new_table(catalog, f"{namespace}.events")
    events.append(rows(0, range(3)))
    r_out, a_out, b_out = (f"{namespace}.{n}" for n in ("r_out", "a_out", "b_out"))
    for name in (r_out, a_out, b_out):
        new_table(catalog, name)

    def root(ctx) -> None:
        new = ctx.changes(f"{namespace}.events")
        if new.num_rows:
            ctx.append(r_out, new)

    def slow(ctx) -> None:
        time.sleep(1.5 * interval / 1000)

    def fast(ctx) -> None:
        pass

    fleet.start(fleet.writer("root", [f"{namespace}.events"], [r_out], max_pending_barriers=max_pending), root)
    fleet.start(fleet.writer("a", [r_out], [a_out], always_run=True, max_pending_barriers=max_pending), slow)
    fleet.start(fleet.writer("b", [a_out], [b_out], max_pending_barriers=max_pending), fast)
    sinks = [r_out, a_out, b_out]
    fleet.wait(lambda: all(m is not None and m.epoch is not None for m in tm.tidemarks(sinks).values()),
               "every job's first epoch")

    lags: list[float] = []
    pending_seen: list[int] = []
    started = time.monotonic()
    while time.monotonic() - started < 32:
        fleet.check()
        agreed = tm.barriers.agreed()  # read before a's tidemark: a sample never overcounts
        marks = tm.tidemarks(sinks)
        lowest = min(m.epoch for m in marks.values())
        lags.append((now_ms() - lowest) / 1000)
        pending_seen.append(len([b for b in agreed if b > marks[a_out].epoch]))
        time.sleep(0.2)
    fleet.stop_all()

    half = len(lags) // 2
    first, second = p95(lags[:half]), p95(lags[half:])
    print(f"\nlag p95 first half {first:.2f} s, second half {second:.2f} s, max {max(lags):.2f} s; "
          f"pending for a (sampled) max {max(pending_seen)}")
    assert second <= first + 2 * interval / 1000, f"the lag grew: p95 {first:.2f} s then {second:.2f} s"
    assert max(pending_seen) <= max_pending + 1

    # Exactly, from ZooKeeper's transaction ids: at each agreement, how many agreed barriers a had not committed.
    agreed = tm.barriers.agreed()
    created = {b: tm.get(tm.paths.barrier(b))[1].czxid for b in agreed}
    a_commits = sorted((epoch_record(tm, "a", e)[1].mzxid, e) for e in job_epochs(tm, "a"))
    worst = 0
    for barrier in agreed:
        done = [e for zxid, e in a_commits if zxid < created[barrier]]
        if not done:
            continue  # a had not started: it joins at the newest barrier and holds nothing back
        worst = max(worst, len([b for b in agreed if done[-1] < b <= barrier]))
    assert 1 <= worst <= max_pending + 1, f"a was {worst} agreed barriers behind"

    # The barriers stretched: the effective interval is longer than the grid's.
    steady = agreed[len(agreed) // 2:]
    effective = (steady[-1] - steady[0]) / (len(steady) - 1)
    print(f"effective interval {effective:.0f} ms over {len(steady)} barriers (grid {interval} ms); "
          f"max pending at agreement {worst}")
    assert effective > 1.2 * interval


def test_a_job_without_a_live_leader_does_not_hold_back_agreement(tm, fleet, catalog, namespace):
    max_pending = 2
    events = new_table(catalog, f"{namespace}.events")
    events.append(rows(0, range(3)))
    r_out, a_out = f"{namespace}.r_out", f"{namespace}.a_out"
    new_table(catalog, r_out)
    new_table(catalog, a_out)

    def root(ctx) -> None:
        new = ctx.changes(f"{namespace}.events")
        if new.num_rows:
            ctx.append(r_out, new)

    seen: list[int] = []

    def follow(ctx) -> None:
        seen.append(ctx.epoch)

    fleet.start(fleet.writer("root", [f"{namespace}.events"], [r_out], max_pending_barriers=max_pending), root)
    a = fleet.start(fleet.writer("a", [r_out], [a_out], always_run=True, max_pending_barriers=max_pending), follow)
    fleet.wait(lambda: len(a.writer.committed) >= 2, "a's first two epochs")
    a.stop()
    assert tm.get(tm.paths.leader("a")) is None
    stopped_at = mark_epoch(tm, a_out)
    assert stopped_at is not None and stopped_at == a.writer.committed[-1]

    # With a stopped, the root keeps agreeing barriers well past max_pending_barriers.
    fleet.wait(lambda: len(tm.barriers.after(stopped_at)) >= max_pending + 4, "the root to keep agreeing barriers")
    newest = tm.barriers.latest()

    a2 = fleet.start(fleet.writer("a", [r_out], [a_out], always_run=True, max_pending_barriers=max_pending), follow)
    fleet.wait(lambda: (mark_epoch(tm, a_out) or 0) >= newest, "a to catch up")
    a2.stop()
    caught_up = a2.writer.committed
    assert caught_up == tm.barriers.after(stopped_at)[:len(caught_up)]
    assert caught_up[-1] >= newest
    assert [e for e in seen if e > stopped_at] == caught_up  # always_run: called for each, in order


# -- 3. restart after downtime -----------------------------------------------------------------

def test_a_restart_after_downtime_processes_one_epoch_per_job(tm, fleet, catalog, namespace):
    interval, grace = fleet.interval_ms, fleet.grace_ms
    events = new_table(catalog, f"{namespace}.events")
    events.append(rows(0, range(3)))
    r_out, a_out = f"{namespace}.r_out", f"{namespace}.a_out"
    new_table(catalog, r_out)
    new_table(catalog, a_out)

    def root(ctx) -> None:
        new = ctx.changes(f"{namespace}.events")
        if new.num_rows:
            ctx.append(r_out, new)

    def follow(ctx) -> None:
        pass

    def start_both():
        return (fleet.start(fleet.writer("root", [f"{namespace}.events"], [r_out]), root),
                fleet.start(fleet.writer("a", [r_out], [a_out]), follow))

    r, a = start_both()
    fleet.wait(lambda: len(a.writer.committed) >= 2, "a's first epochs")
    r.stop()
    newest = tm.barriers.latest()
    fleet.wait(lambda: mark_epoch(tm, a_out) == newest, "a to process the newest agreed barrier")
    a.stop()

    grid = tm.barriers.grid()
    fleet.wait(lambda: clock_barrier(grid, grace) >= newest + 10 * interval,
               "the clock to pass ten grid points", timeout=60)
    restart = clock_barrier(grid, grace)
    r, a = start_both()
    counts = fleet.wait(
        lambda: all((mark_epoch(tm, t) or 0) >= restart for t in (r_out, a_out)) and
        {job: len([e for e in job_epochs(tm, job) if e > newest]) for job in ("root", "a")},
        "both jobs to reach the clock")
    r.stop()
    a.stop()
    print(f"\nepochs to catch up after {(restart - newest) // interval} grid points of downtime: {counts}")
    assert all(1 <= n <= 2 for n in counts.values()), counts
    first = tm.barriers.after(newest)[0]
    assert first >= restart  # nothing of the downtime was replayed
    assert r.writer.committed[0] == a.writer.committed[0] == first


# -- 4. no epoch before a table's history --------------------------------------------------------

def test_a_new_job_starts_no_earlier_than_its_sources_histories(tm, slow_fleet, catalog, namespace):
    fleet = slow_fleet
    events_name = f"{namespace}.events"
    events = new_table(catalog, events_name)
    per_user, per_bucket, joined = (f"{namespace}.{n}" for n in ("per_user", "per_bucket", "joined"))
    for name in (per_user, per_bucket, joined):
        new_table(catalog, name)

    appending = threading.Event()
    appended: list[int] = []

    def append_forever() -> None:
        while not appending.wait(0.7):
            n = len(appended)
            events.append(rows(n, [n]))
            appended.append(n)

    def by_user(ctx) -> None:
        new = ctx.changes(events_name)
        if new.num_rows:
            ctx.append(per_user, rows(ctx.epoch, new.column("row").to_pylist()))

    def by_bucket(ctx) -> None:
        new = ctx.changes(events_name)
        if new.num_rows:
            ctx.append(per_bucket, rows(ctx.epoch, [r % 3 for r in new.column("row").to_pylist()]))

    read: dict[int, dict[str, list]] = {}

    def join(ctx) -> None:
        read[ctx.epoch] = {s: as_set(ctx.table(s)) for s in (per_user, per_bucket)}
        ctx.append(joined, rows(ctx.epoch, [sum(len(v) for v in read[ctx.epoch].values())]))

    appender = threading.Thread(target=append_forever, daemon=True)
    appender.start()
    try:
        u = fleet.start(fleet.writer("per_user", [events_name], [per_user]), by_user)
        fleet.wait(lambda: len(u.writer.committed) >= 3 and appended, "per_user's first epochs")
        u.stop()
        user_first = mark(tm, per_user).first_epoch
        user_last = u.writer.committed[-1]
        # A root job that starts before the clock passed the next grid point joins at the newest agreed barrier:
        # let the clock move on, so that per_bucket's history starts strictly after per_user's.
        grid = tm.barriers.grid()
        fleet.wait(lambda: clock_barrier(grid, fleet.grace_ms) > user_last, "the clock to pass the next grid point")

        b = fleet.start(fleet.writer("per_bucket", [events_name], [per_bucket]), by_bucket)
        fleet.wait(lambda: len(b.writer.committed) >= 2, "per_bucket's first epochs")
        bucket_first = mark(tm, per_bucket).first_epoch
        assert bucket_first == b.writer.committed[0] > user_last >= user_first

        j = fleet.start(fleet.writer("joined", [per_user, per_bucket], [joined], always_run=True), join)
        u2 = fleet.start(fleet.writer("per_user", [events_name], [per_user]), by_user)
        fleet.wait(lambda: len(j.writer.committed) >= 4, "joined's first epochs", timeout=120)
    finally:
        appending.set()
        appender.join(30)
        fleet.stop_all()

    joined_epochs = j.writer.committed
    print(f"\nper_user first {user_first} (stopped at {user_last}), per_bucket first {bucket_first}, "
          f"joined first {joined_epochs[0]}; joined epochs {len(joined_epochs)}")
    assert joined_epochs[0] >= bucket_first and joined_epochs[0] >= user_first
    # per_user, restarted, processed every barrier agreed while it was stopped, in order.
    assert u2.writer.committed == tm.barriers.after(user_last)[:len(u2.writer.committed)]

    # The truth: each source's rows carry the epoch that wrote them; the state at T is every row of epochs <= T.
    truth = {s: as_set(catalog.load_table(s).scan().to_arrow()) for s in (per_user, per_bucket)}
    for epoch in joined_epochs:
        record, _ = epoch_record(tm, "joined", epoch)
        for source in (per_user, per_bucket):
            state = [r for r in truth[source] if r[0] <= epoch]
            if record.inputs.sources[source].end is None:
                assert not state, f"joined read {source} as empty at {epoch}, but it held {len(state)} rows"
            assert read[epoch][source] == state, f"joined read {source} at {epoch} wrong"


# -- 5. visible waits ----------------------------------------------------------------------------

def test_a_wait_on_a_source_without_a_live_leader_is_visible(tm, fleet, catalog, namespace, caplog):
    caplog.set_level(logging.INFO, logger="coordinator.job.writer")
    events = new_table(catalog, f"{namespace}.events")
    events.append(rows(0, [1]))
    up_out, down_out = f"{namespace}.up_out", f"{namespace}.down_out"
    new_table(catalog, up_out)
    new_table(catalog, down_out)

    def nothing(ctx) -> None:
        pass

    up = fleet.start(fleet.writer("up", [f"{namespace}.events"], [up_out]), nothing)
    fleet.wait(lambda: len(up.writer.committed) >= 2, "up's first epochs")
    up.stop()
    up_at = present(mark_epoch(tm, up_out))

    down = fleet.start(fleet.writer("down", [up_out], [down_out], log_every=0.5), nothing)
    # A new job starts after the newest barrier agreed when it opened (up_at): it waits for a newer one.
    fleet.wait(lambda: down.writer.waiting is not None and f"after barrier {up_at}" in down.writer.waiting.reason,
               "down to wait for a barrier after up's tidemark")

    # A barrier is agreed (by another root job; here, the test) that up, having no leader, never processes.
    grid = tm.barriers.grid()

    def agree_next() -> Optional[int]:
        candidate = clock_barrier(grid, fleet.grace_ms)
        if candidate > up_at:
            tm.barriers.agree(candidate, proposed_by="test")
        latest = tm.barriers.latest()
        return latest if latest > up_at else None
    barrier = fleet.wait(agree_next, "the clock to pass the next grid point")
    waiting = fleet.wait(lambda: down.writer.waiting if down.writer.waiting and down.writer.waiting.barrier == barrier
                         else None, "down to say it waits", timeout=10)
    assert up_out in waiting.reason and f"epoch {up_at}" in waiting.reason, waiting
    note = f"{up_out}'s writer job up has no live leader"
    found = fleet.wait(lambda: [r for r in caplog.records if note in r.getMessage()], "the log line", timeout=10)
    assert f"barrier {barrier}" in found[0].getMessage()
    assert down.writer.committed == []


# -- 6. bounded runs ----------------------------------------------------------------------------

def test_bounded_runs_end_at_their_bound_and_say_so(tm, fleet, catalog, namespace):
    interval = fleet.interval_ms
    events = new_table(catalog, f"{namespace}.events")
    events.append(rows(0, [1, 2]))
    s_out, d_out = f"{namespace}.s_out", f"{namespace}.d_out"
    new_table(catalog, s_out)
    new_table(catalog, d_out)

    def root(ctx) -> None:
        new = ctx.changes(f"{namespace}.events")
        if new.num_rows:
            ctx.append(s_out, new)

    def follow(ctx) -> None:
        pass

    def finished(job: str) -> Optional[FinishedRecord]:
        found = tm.read(tm.paths.finished(job), FinishedRecord)
        return found[0] if found else None

    grid = tm.barriers.ensure_grid(interval)
    until = grid.floor(now_ms()) + 4 * interval
    src = fleet.start(fleet.writer("src", [f"{namespace}.events"], [s_out]), root, until=until)
    dst = fleet.start(fleet.writer("dst", [s_out], [d_out]), follow, until=until)
    fleet.wait(lambda: src.done and dst.done, "both bounded runs to end")
    fleet.check()
    assert src.result and src.result[-1] == until and max(tm.barriers.agreed()) == until
    assert dst.result and dst.result[-1] == until
    assert present(finished("src")).epoch == present(finished("dst")).epoch == until

    src = fleet.start(fleet.writer("src", [f"{namespace}.events"], [s_out]), root, max_epochs=3)
    fleet.wait(lambda: src.done, "three more epochs of src")
    fleet.check()
    assert len(src.result) == 3 and src.result == tm.barriers.after(until)
    assert all(epoch_record(tm, "src", e)[0].state == EpochState.COMMITTED for e in src.result)
    assert present(finished("src")).epoch == src.result[-1]

    # A bounded derived run processes the barriers agreed meanwhile, even with no root job running.
    dst = fleet.start(fleet.writer("dst", [s_out], [d_out]), follow, max_epochs=2)
    fleet.wait(lambda: dst.done, "two more epochs of dst")
    fleet.check()
    assert dst.result == src.result[:2]
    assert present(finished("dst")).epoch == dst.result[-1]

    # A new (unbounded) run removes the mark, and stopping it does not put it back.
    again = fleet.start(fleet.writer("src", [f"{namespace}.events"], [s_out]), root)
    fleet.wait(lambda: finished("src") is None, "the new run to clear the finished mark")
    fleet.wait(lambda: again.writer.committed, "an epoch of the new run")
    again.stop()
    assert finished("src") is None
