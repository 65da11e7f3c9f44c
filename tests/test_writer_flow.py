"""The EpochWriter's pacing, end to end: real ZooKeeper, a real Iceberg catalog (pyiceberg, no Spark).

Every writer runs in a thread of this process with its own ZooKeeper session (its own
"driver"). Nothing here waits with a fixed sleep for something to happen: every wait polls
a condition until a generous deadline (the machine may be small and loaded).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

import pyarrow as pa
import pytest
from kazoo.protocol.states import ZnodeStat

from coordinator import EpochRecord, EpochState, EpochWriter
from coordinator.errors import NotLeader
from coordinator.iceberg.snapshots import COMMITTED_EPOCH_PROPERTY
from coordinator.protocol.pacing import CATCH_UP_TAKEOVERS
from coordinator.records import FinishedRecord, now_ms
from tests.helpers.lake import SCHEMA, create_table
from tests.helpers.present import present
from tests.helpers.wait import wait_for

POLL = 0.05
DEADLINE = 90.0


# -- helpers ----------------------------------------------------------------------------------

def root_and_derived_tables(catalog, namespace: str) -> tuple[Any, str, str]:
    """A root table ``events`` with three rows, and the empty sinks ``r_out`` (of a root job reading it) and
    ``a_out`` (of a job reading ``r_out``)."""
    events = create_table(catalog, f"{namespace}.events", first_snapshot=False)
    events.append(rows(0, range(3)))
    r_out, a_out = f"{namespace}.r_out", f"{namespace}.a_out"
    create_table(catalog, r_out, first_snapshot=False)
    create_table(catalog, a_out, first_snapshot=False)
    return events, r_out, a_out


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
fleet_slow = fleet_fixture("slow_fleet", 1000, 100)  # the overload, isolation and join tests: a 1 s grid


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


def copy(source: str, sink: str) -> Callable:
    """An epoch function appending to ``sink`` the rows appended to ``source`` in the epoch."""
    def step(ctx) -> None:
        new = ctx.changes(source)
        if new.num_rows:
            ctx.append(sink, new)
    return step


def clock_barrier(grid, grace_ms: int) -> int:
    """The newest grid point the clock has passed (minus grace): what a root job takes now."""
    return grid.floor(now_ms() - grace_ms)


# -- 1. idle barriers --------------------------------------------------------------------------

def test_idle_barriers_commit_without_calling_the_function(tm, fleet, catalog, namespace):
    events = create_table(catalog, f"{namespace}.events", first_snapshot=False)
    events.append(rows(0, range(5)))
    counts, everything = f"{namespace}.counts", f"{namespace}.every"
    create_table(catalog, counts, first_snapshot=False)
    create_table(catalog, everything, first_snapshot=False)

    calls: dict[str, list[tuple[int, list]]] = {"counter": [], "always": []}

    def count(ctx) -> None:
        new = ctx.changes(f"{namespace}.events")
        calls["counter"].append((ctx.epoch, as_set(new)))
        if new.num_rows:
            ctx.append(counts, rows(ctx.epoch, [new.num_rows]))

    def always(ctx) -> None:
        calls["always"].append((ctx.epoch, []))

    counter = fleet.start(fleet.writer("counter", [f"{namespace}.events"], [counts], marker_every="1d"), count)
    always_run = fleet.start(fleet.writer("always", [f"{namespace}.events"], [everything], always_run=True), always)

    # The first epoch (or the one after the append, if the append came after the first barrier) computes.
    fleet.wait(lambda: calls["counter"] and calls["counter"][-1][1] == [(0, r) for r in range(5)],
               "the counter to see the first rows")
    after_rows = len(calls["counter"])
    seen = calls["counter"][-1][0]
    # The writer lists an epoch once it has finished it, marker commits included (its first epoch marks its
    # sinks in Iceberg after the ZooKeeper commit that moves the tidemark), so from here on the sink is quiet.
    fleet.wait(lambda: seen in counter.writer.committed, "the counter to commit the epoch that saw the rows")
    metadata_before = catalog.load_table(counts).metadata_location
    fleet.wait(lambda: len([e for e in counter.writer.committed if e > seen]) >= 5, "five idle epochs")
    assert len(calls["counter"]) == after_rows, "an idle barrier called the function"
    assert catalog.load_table(counts).metadata_location == metadata_before, "an idle epoch made a catalog commit"

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
    # A marker comes only at the writer's first epoch and once per marker_every (a day here): never at an idle one.
    assert table.properties.get(COMMITTED_EPOCH_PROPERTY) in (None, str(committed[0]))

    # always_run: one call per committed epoch, idle or not.
    assert [e for e, _ in calls["always"]] == always_run.writer.committed


# -- 2. overload and isolation: coalescing instead of backpressure ---------------------------------

def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def test_a_job_slower_than_the_interval_coalesces_and_slows_nobody(tm, slow_fleet, catalog, namespace):
    """A derived job at 1.5x the interval: its lag stays flat and bounded (its epochs coalesce the barriers
    that came while it worked), its upstream keeps every grid point, and an unrelated pipeline too."""
    fleet, interval = slow_fleet, slow_fleet.interval_ms
    events = create_table(catalog, f"{namespace}.events", first_snapshot=False)
    other_events = create_table(catalog, f"{namespace}.other", first_snapshot=False)
    events.append(rows(0, range(3)))
    other_events.append(rows(0, range(3)))
    r_out, a_out, b_out, o_root, o_out = (f"{namespace}.{n}" for n in ("r_out", "a_out", "b_out", "o_root", "o_out"))
    for name in (r_out, a_out, b_out, o_root, o_out):
        create_table(catalog, name, first_snapshot=False)
    slow_seconds = 1.5 * interval / 1000

    def slow(ctx) -> None:
        time.sleep(slow_seconds)

    def fast(ctx) -> None:
        pass

    fleet.start(fleet.writer("root", [f"{namespace}.events"], [r_out]), copy(f"{namespace}.events", r_out))
    fleet.start(fleet.writer("a", [r_out], [a_out], always_run=True), slow)
    fleet.start(fleet.writer("b", [a_out], [b_out]), fast)
    fleet.start(fleet.writer("o_root", [f"{namespace}.other"], [o_root]), copy(f"{namespace}.other", o_root))
    fleet.start(fleet.writer("o_follow", [o_root], [o_out], always_run=True), fast)
    sinks = [r_out, a_out, b_out, o_root, o_out]
    fleet.wait(lambda: all(m is not None and m.epoch is not None for m in tm.tidemarks(sinks).values()),
               "every job's first epoch")

    lags: list[float] = []
    other_lags: list[float] = []
    started = time.monotonic()
    while time.monotonic() - started < 30:
        fleet.check()
        marks = tm.tidemarks(sinks)
        lags.append((now_ms() - min(marks[t].epoch for t in (r_out, a_out, b_out))) / 1000)
        other_lags.append((now_ms() - min(marks[t].epoch for t in (o_root, o_out))) / 1000)
        time.sleep(0.2)
    fleet.stop_all()

    half = len(lags) // 2
    first, second = p95(lags[:half]), p95(lags[half:])
    bound = 2 * slow_seconds + interval / 1000 + 1.0  # 2 x its epoch time + interval, plus the grace and a margin
    print(f"\nslow pipeline lag p95 {first:.2f} s then {second:.2f} s (bound {bound:.2f} s); unrelated pipeline "
          f"p95 {p95(other_lags):.2f} s")
    assert second <= first + interval / 1000, f"the lag grew: p95 {first:.2f} s then {second:.2f} s"
    assert second <= bound, f"lag p95 {second:.2f} s above 2 x epoch time + interval"
    assert p95(other_lags) <= 2 * interval / 1000 + 1.0, "the unrelated pipeline slowed down"

    # The root took every grid point (nothing held it back); a coalesced: each epoch covers several barriers,
    # and each of its epochs is one the root holds, read at exactly the root's snapshot of that epoch.
    root_epochs = job_epochs(tm, "root")
    effective = (root_epochs[-1] - root_epochs[0]) / (len(root_epochs) - 1)
    assert effective <= 1.2 * interval, f"the root was held back: one epoch every {effective:.0f} ms"
    a_epochs = job_epochs(tm, "a")
    assert max(b - a for a, b in zip(a_epochs, a_epochs[1:])) >= 2 * interval, "a never coalesced"
    for epoch in a_epochs:
        record, _ = epoch_record(tm, "a", epoch)
        assert epoch in root_epochs and record.inputs.sources[r_out].end == epoch_record(tm, "root", epoch)[0] \
            .published[r_out]
    for before, after in zip(a_epochs, a_epochs[1:]):  # contiguous ranges: nothing skipped, nothing read twice
        assert epoch_record(tm, "a", after)[0].inputs.sources[r_out].start == \
            epoch_record(tm, "a", before)[0].inputs.sources[r_out].end


def test_a_stopped_job_holds_nobody_back_and_catches_up_in_one_epoch(tm, fleet, catalog, namespace):
    events, r_out, a_out = root_and_derived_tables(catalog, namespace)

    def root(ctx) -> None:
        new = ctx.changes(f"{namespace}.events")
        if new.num_rows:
            ctx.append(r_out, new)

    seen: list[tuple[int, list]] = []

    def follow(ctx) -> None:
        new = ctx.changes(r_out)
        seen.append((ctx.epoch, as_set(new)))
        if new.num_rows:
            ctx.append(a_out, new)

    r = fleet.start(fleet.writer("root", [f"{namespace}.events"], [r_out]), root)
    a = fleet.start(fleet.writer("a", [r_out], [a_out]), follow)
    fleet.wait(lambda: len(a.writer.committed) >= 2, "a's first two epochs")
    a.stop()
    assert tm.get(tm.paths.leader("a")) is None
    stopped_at = present(mark_epoch(tm, a_out))

    # With a stopped, the root keeps its cadence, and new rows arrive over several of its epochs.
    for n in range(1, 5):
        events.append(rows(n, [n]))
        fleet.wait(lambda n=n: len([e for e in r.writer.committed if e > stopped_at]) >= 2 * n,
                   "the root to commit more epochs")
    newest = present(mark_epoch(tm, r_out))
    calls_before = len(seen)

    a2 = fleet.start(fleet.writer("a", [r_out], [a_out]), follow)
    fleet.wait(lambda: (mark_epoch(tm, a_out) or 0) >= newest, "a to catch up")
    a2.stop()
    first = a2.writer.committed[0]
    assert first >= newest, "a replayed a barrier of its downtime instead of coalescing"
    assert len([e for e, _ in seen[calls_before:] if e <= first]) == 1, "a caught up in more than one call"
    # The coalesced epoch is exactly the sum of the barriers it covers: every row the root wrote since.
    assert seen[calls_before][1] == [(n, n) for n in range(1, 5)]
    assert as_set(catalog.load_table(a_out).scan().to_arrow()) == as_set(catalog.load_table(r_out).scan().to_arrow())


# -- 3. restart after downtime -----------------------------------------------------------------

def test_a_restart_after_downtime_processes_one_epoch_per_job(tm, fleet, catalog, namespace):
    interval, grace = fleet.interval_ms, fleet.grace_ms
    _, r_out, a_out = root_and_derived_tables(catalog, namespace)

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
    newest = present(mark_epoch(tm, r_out))
    fleet.wait(lambda: mark_epoch(tm, a_out) == newest, "a to process the root's newest epoch")
    a.stop()

    grid = tm.barriers.grid()
    fleet.wait(lambda: clock_barrier(grid, grace) >= newest + 10 * interval,
               "the clock to pass ten grid points", timeout=60)
    restart = clock_barrier(grid, grace)
    r, a = start_both()
    fleet.wait(lambda: all((mark_epoch(tm, t) or 0) >= restart for t in (r_out, a_out)), "both jobs to reach the clock")
    r.stop()
    a.stop()
    firsts = {job: min(e for e in job_epochs(tm, job) if e > newest) for job in ("root", "a")}
    print(f"\nfirst epochs after {(restart - newest) // interval} grid points of downtime: {firsts}")
    assert all(first >= restart for first in firsts.values()), "a job replayed a barrier of its downtime"
    assert r.writer.committed[0] == firsts["root"] and a.writer.committed[0] == firsts["a"]


def test_after_a_restart_a_job_waits_for_its_upstreams_catch_up_epoch_rather_than_run_twice(
        tm, fleet, catalog, namespace):
    """Stopped together, the root ahead: on restart the derived job does not take the root's stale epoch first
    (a second epoch for the backlog after it); it waits for the root's catch-up epoch."""
    interval, grace = fleet.interval_ms, fleet.grace_ms
    events, r_out, a_out = root_and_derived_tables(catalog, namespace)
    in_catch_up, release = threading.Event(), threading.Event()

    def root(ctx) -> None:
        new = ctx.changes(f"{namespace}.events")
        if in_catch_up.is_set():
            assert release.wait(DEADLINE), "the test never released the root's catch-up epoch"
        if new.num_rows:
            ctx.append(r_out, new)

    def start(job: str):
        if job == "root":
            return fleet.start(fleet.writer("root", [f"{namespace}.events"], [r_out]), root)
        return fleet.start(fleet.writer("a", [r_out], [a_out]), copy(r_out, a_out))

    r, a = start("root"), start("a")
    fleet.wait(lambda: len(a.writer.committed) >= 2, "a's first epochs")
    a.stop()
    behind = present(mark_epoch(tm, a_out))
    fleet.wait(lambda: (mark_epoch(tm, r_out) or 0) > behind, "the root to commit an epoch a has not")
    r.stop()
    ahead = present(mark_epoch(tm, r_out))
    events.append(rows(1, [7]))  # during the downtime: the root's catch-up epoch computes (and is held)
    # Long enough a downtime that the root's catch-up epoch covers more than 4x what a could take now, and
    # both are further behind than a takeover leaves a job (CATCH_UP_TAKEOVERS session timeouts).
    downtime = max(10, 4 * (ahead - behind) // interval + 2,
                   (CATCH_UP_TAKEOVERS * int(tm.session_timeout * 1000)) // interval + 4) * interval
    grid = tm.barriers.grid()
    fleet.wait(lambda: clock_barrier(grid, grace) >= ahead + downtime, "the clock to pass the downtime",
               timeout=60 + downtime / 1000)
    in_catch_up.set()
    r, a = start("root"), start("a")
    fleet.wait(lambda: a.writer.waiting is not None and "catching up" in a.writer.waiting.reason,
               "a to wait for the root's catch-up epoch")
    assert not a.writer.committed, f"a committed {a.writer.committed} before the root's catch-up epoch"
    release.set()
    fleet.wait(lambda: a.writer.committed, "a's first epoch after the restart")
    # The root may first recover an epoch it had in flight when it stopped, then catch up; a waits for that.
    caught_up = next(e for e in r.writer.committed if e >= ahead + downtime)
    assert a.writer.committed[0] == caught_up, "a ran the root's stale epoch before its catch-up epoch"
    assert (1, 7) in as_set(catalog.load_table(a_out).scan().to_arrow())


# -- 4. no epoch before a table's history --------------------------------------------------------

def test_a_new_job_starts_no_earlier_than_its_sources_histories(tm, slow_fleet, catalog, namespace):
    fleet = slow_fleet
    events_name = f"{namespace}.events"
    events = create_table(catalog, events_name, first_snapshot=False)
    per_user, per_bucket, joined = (f"{namespace}.{n}" for n in ("per_user", "per_bucket", "joined"))
    for name in (per_user, per_bucket, joined):
        create_table(catalog, name, first_snapshot=False)

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
        # A new job starts after the time it opened, so per_bucket's history starts strictly after per_user's.

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
    # per_user, restarted, caught up in one epoch that reads on from where it stopped.
    resumed = epoch_record(tm, "per_user", u2.writer.committed[0])[0].inputs.sources[events_name]
    assert resumed.start == epoch_record(tm, "per_user", user_last)[0].inputs.sources[events_name].end

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
    events = create_table(catalog, f"{namespace}.events", first_snapshot=False)
    events.append(rows(0, [1]))
    up_out, down_out = f"{namespace}.up_out", f"{namespace}.down_out"
    create_table(catalog, up_out, first_snapshot=False)
    create_table(catalog, down_out, first_snapshot=False)

    def nothing(ctx) -> None:
        pass

    up = fleet.start(fleet.writer("up", [f"{namespace}.events"], [up_out]), nothing)
    fleet.wait(lambda: len(up.writer.committed) >= 2, "up's first epochs")
    up.stop()
    up_at = present(mark_epoch(tm, up_out))

    down = fleet.start(fleet.writer("down", [up_out], [down_out], log_every=0.5), nothing)
    # A new job starts after the time it opened: up, with no leader, commits nothing newer, so down waits.
    waiting = fleet.wait(lambda: down.writer.waiting, "down to say it waits", timeout=20)
    assert up_out in waiting.reason and f"epoch {up_at}" in waiting.reason, waiting
    note = f"{up_out}'s writer job up has no live leader"
    fleet.wait(lambda: [r for r in caplog.records if note in r.getMessage()], "the log line", timeout=10)
    assert down.writer.committed == []


# -- 6. bounded runs ----------------------------------------------------------------------------

def test_bounded_runs_end_at_their_bound_and_say_so(tm, fleet, catalog, namespace):
    interval = fleet.interval_ms
    events = create_table(catalog, f"{namespace}.events", first_snapshot=False)
    events.append(rows(0, [1, 2]))
    s_out, d_out = f"{namespace}.s_out", f"{namespace}.d_out"
    create_table(catalog, s_out, first_snapshot=False)
    create_table(catalog, d_out, first_snapshot=False)

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
    assert src.result and src.result[-1] == until
    assert dst.result and dst.result[-1] == until
    assert present(finished("src")).epoch == present(finished("dst")).epoch == until

    src = fleet.start(fleet.writer("src", [f"{namespace}.events"], [s_out]), root, max_epochs=3)
    fleet.wait(lambda: src.done, "three more epochs of src")
    fleet.check()
    assert len(src.result) == 3 and src.result[0] > until and src.result == sorted(src.result)
    assert all(epoch_record(tm, "src", e)[0].state == EpochState.COMMITTED for e in src.result)
    assert present(finished("src")).epoch == src.result[-1]

    # A batch run (once): one epoch at the newest barrier its source holds, with no root job running.
    dst = fleet.start(fleet.writer("dst", [s_out], [d_out]), follow, once=True)
    fleet.wait(lambda: dst.done, "dst's one epoch")
    fleet.check()
    assert dst.result == [src.result[-1]]
    assert present(finished("dst")).epoch == src.result[-1]
    # Nothing newer: another batch run commits nothing and ends at once.
    dst = fleet.start(fleet.writer("dst", [s_out], [d_out]), follow, once=True)
    fleet.wait(lambda: dst.done, "dst's empty batch run")
    fleet.check()
    assert dst.result == []

    # A new (unbounded) run removes the mark, and stopping it does not put it back.
    again = fleet.start(fleet.writer("src", [f"{namespace}.events"], [s_out]), root)
    fleet.wait(lambda: finished("src") is None, "the new run to clear the finished mark")
    fleet.wait(lambda: again.writer.committed, "an epoch of the new run")
    again.stop()
    assert finished("src") is None


# -- 7. cadence -----------------------------------------------------------------------------------

def test_a_batch_run_covers_the_rows_committed_just_before_it(tm, slow_fleet, catalog, namespace):
    """A batch run (``once``) waits out the grace for the first barrier at or after its call, rather than take the
    newest barrier the grace allows now, which left rows appended a moment before for the next run."""
    events = create_table(catalog, f"{namespace}.events", first_snapshot=False)
    out = f"{namespace}.out"
    create_table(catalog, out, first_snapshot=False)
    copied = copy(f"{namespace}.events", out)

    def batch_run() -> list[int]:
        runner = slow_fleet.start(slow_fleet.writer("batch", [f"{namespace}.events"], [out], grace_ms=3000),
                                  copied, once=True)
        slow_fleet.wait(lambda: runner.done, "the batch run to return")
        runner.check()
        return present(runner.result)

    for run, values in enumerate(([1, 2], [3], [4, 5])):
        events.append(rows(run, values))
        called_at = now_ms()
        taken = batch_run()
        assert len(taken) == 1 and taken[0] >= called_at, (taken, called_at)
        held = as_set(catalog.load_table(out).scan().to_arrow())
        assert held == as_set(events.refresh().scan().to_arrow()), f"run {run} left rows for the next one: {held}"
    assert len(batch_run()) == 1, "a batch run with nothing new commits its barrier as an idle epoch"
    assert as_set(catalog.load_table(out).scan().to_arrow()) == as_set(events.scan().to_arrow())


def test_a_job_at_a_coarser_cadence_takes_only_its_barriers_and_a_job_below_follows_it(tm, fleet, catalog, namespace):
    interval = fleet.interval_ms
    every = 4 * interval
    events = create_table(catalog, f"{namespace}.events", first_snapshot=False)
    fine, coarse, below = f"{namespace}.fine", f"{namespace}.coarse", f"{namespace}.below"
    for name in (fine, coarse, below):
        create_table(catalog, name, first_snapshot=False)
    stop_appending = threading.Event()

    def append_forever() -> None:
        n = 0
        while not stop_appending.wait(0.3):
            events.append(rows(n, [n]))
            n += 1

    appender = threading.Thread(target=append_forever, daemon=True)
    appender.start()
    try:
        fleet.start(fleet.writer("fine", [f"{namespace}.events"], [fine]), copy(f"{namespace}.events", fine))
        c = fleet.start(fleet.writer("coarse", [fine], [coarse], every=every), copy(fine, coarse))
        b = fleet.start(fleet.writer("below", [coarse], [below]), copy(coarse, below))
        fleet.wait(lambda: len(b.writer.committed) >= 3, "three epochs of the job below the coarse one", timeout=120)
    finally:
        stop_appending.set()
        appender.join(30)
        fleet.stop_all()
    assert all(e % every == 0 for e in c.writer.committed), c.writer.committed
    assert all(e % every == 0 for e in b.writer.committed), "the job below did not follow the coarse cadence"
    fine_mark, coarse_mark = present(mark(tm, fine)), present(mark(tm, coarse))
    assert all(fine_mark.holds(e) for e in coarse_mark.epochs if e >= fine_mark.epochs[0])
    # At an epoch both hold, the coarse table holds exactly the fine table's rows (it copies them).
    common = max(set(fine_mark.epochs) & set(coarse_mark.epochs))
    at = {t: as_set(catalog.load_table(t).scan(snapshot_id=present(mark(tm, t)).snapshot_at(common)).to_arrow())
          for t in (fine, coarse)}
    assert at[fine] == at[coarse] and at[fine]


def test_an_epoch_whose_function_fails_is_aborted_with_its_reason_and_recomputed_from_its_inputs(
        connect, catalog_settings, catalog, namespace, caplog):
    """The function raises in epoch T: T is ABORTED in ZooKeeper with the error's first line, nothing is published,
    and the next run recomputes T from the inputs recorded for it (its log names the failure), exactly once."""
    sink = f"{namespace}.out"
    create_table(catalog, sink, first_snapshot=False)
    writer = EpochWriter(connect(), "flaky", sources=[], sinks=[sink], catalog=catalog_settings, interval_ms=1000,
                         grace_ms=0)
    writer.open(leader_timeout=30)
    epoch = writer.grid().floor(now_ms()) // 1000 * 1000

    def broken(ctx) -> None:
        ctx.append(sink, pa.table({"epoch": [ctx.epoch], "row": [0]}, schema=SCHEMA))
        raise ValueError("the upstream API said no\nsecond line")
    with pytest.raises(ValueError, match="the upstream API said no"):
        writer.process(epoch, broken, inputs=writer.inputs_for(epoch))
    aborted = present(writer.epochs.current)
    assert (aborted.epoch, aborted.state, aborted.abort_reason) == (
        epoch, EpochState.ABORTED, "ValueError: the upstream API said no")
    assert catalog.load_table(sink).scan().to_arrow().num_rows == 0, "an aborted epoch publishes nothing"
    writer.close()

    again = EpochWriter(connect(), "flaky", sources=[], sinks=[sink], catalog=catalog_settings, interval_ms=1000,
                        grace_ms=0)
    with caplog.at_level(logging.INFO, logger="coordinator.job.writer"):
        committed = again.run(lambda ctx: ctx.append(sink, pa.table({"epoch": [ctx.epoch], "row": [1]},
                                                                    schema=SCHEMA)),
                              max_epochs=1, stop_on_sigterm=False)
    assert committed == [epoch]
    assert f"recomputing epoch {epoch} from its recorded inputs (it failed: ValueError: the upstream API said no)" \
        in caplog.text
    assert catalog.load_table(sink).scan().to_arrow().column("row").to_pylist() == [1]
    again.close()


def test_a_writer_holds_a_whole_term_or_none_and_a_context_stages_only_in_its_own(connect, catalog_settings,
                                                                                   catalog, namespace):
    """Before ``open`` and after ``close`` every call that needs a term raises ``NotLeader`` with one message (and
    the metrics show no leader); an epoch's context stages under the term that made it, never once that term is
    over, whichever term the writer holds by then."""
    sink = f"{namespace}.out"
    create_table(catalog, sink, first_snapshot=False)
    writer = EpochWriter(connect(), "terms", sources=[], sinks=[sink], catalog=catalog_settings, interval_ms=1000,
                         grace_ms=0)
    metric = writer.metrics.registry.get_sample_value
    job = {"tidemark_job": "terms"}

    def closed() -> None:
        for call in (lambda: writer.epochs, lambda: writer.process(0, print), lambda: writer.commit_idle(0),
                     lambda: writer.inputs_for(0), lambda: writer.next_barrier(wait=False)):
            with pytest.raises(NotLeader, match=r"job 'terms': open\(\) the writer \(or run it\) first"):
                call()
        with pytest.raises(NotLeader, match="job 'terms': this replica does not lead the job"):
            writer.term  # noqa: B018 - the property access is the test
        assert writer.tidemarks_in_memory() is None and not writer.has_root_source
        assert (metric("tidemark_driver_leader", job), metric("tidemark_driver_term", job)) == (0, None)

    closed()
    writer.open(leader_timeout=30)
    first = writer.term
    assert (metric("tidemark_driver_leader", job), metric("tidemark_driver_term", job)) == (1, first)
    epoch = writer.grid().floor(now_ms()) // 1000 * 1000
    ctx = writer.context(writer, writer.epochs.begin(epoch, writer.inputs_for(epoch)))
    writer.close()
    closed()
    writer.open(leader_timeout=30)
    assert writer.term > first
    with pytest.raises(NotLeader, match="this replica is RELEASED, not the leader"):
        ctx.append(sink, rows(epoch, [0]))
    assert ctx.staged == {} and catalog.load_table(sink).snapshots() == []
    writer.close()


def test_a_job_asking_another_interval_than_a_changed_grid_runs_on_the_grid_and_says_so(
        tm, catalog, catalog_settings, namespace, caplog):
    """Before any change a job asking another interval than the grid's is refused (``ensure_grid``); once an
    operator changed the grid, which every job follows, it runs on the grid, and its log says so in one line."""
    first, second = f"{namespace}.first", f"{namespace}.second"
    for table in (first, second):
        create_table(catalog, table)
    made_the_grid = EpochWriter(tm, "first", sources=[], sinks=[first], catalog=catalog_settings, interval_ms=1000)
    made_the_grid.open(leader_timeout=30)
    made_the_grid.close()
    change_at = (tm.server_clock.now_ms() // 5000 + 3) * 5000  # 10 to 15 s ahead, on both grids
    tm.barriers.change_interval(5000, effective_from=change_at)
    caplog.set_level(logging.WARNING, logger="coordinator.job.writer")
    writer = EpochWriter(tm, "second", sources=[], sinks=[second], catalog=catalog_settings, interval_ms=2000,
                         grace_ms=0)
    writer.open(leader_timeout=30)
    try:
        said = [r.getMessage() for r in caplog.records if "job second asked for barriers" in r.getMessage()]
        assert said == ["job second asked for barriers every 2000 ms, and the shared grid is every 1000 ms now "
                        "(changed with `tidemark barriers --set-interval`, which every job follows): it runs on the "
                        "grid; give it `every` for a slower cadence of it"], said
        assert writer.grid().interval_at(change_at - 1) == 1000 and writer.grid().interval_at(change_at) == 5000
    finally:
        writer.close()
