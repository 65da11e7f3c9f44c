"""The pure-Python EpochWriter under faults, on real components: ZooKeeper, a PostgreSQL Iceberg catalog, processes.

kill -9 of a driver at every step of an epoch, a fenced leader and a leader whose session expired (SIGSTOP)
stepping down and contending again.
Every wait is for a condition, with a deadline.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from itertools import groupby
from pathlib import Path
from typing import Any, Optional

import pyarrow as pa
import pytest

from coordinator import EpochRecord, EpochState, EpochWriter, Tidemark
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.iceberg.lineage import EpochLineage
from coordinator.iceberg.snapshots import TERM_KEY, main_lineage, snapshot_epoch
from coordinator.protocol.job_run import JobRun
from coordinator.protocol.leadership import current_leader
from coordinator.records import TermRecord
from tests.helpers.crash import crash_env
from tests.helpers.lake import create_table
from tests.helpers.present import present
from tests.helpers.python_driver import COUNT_SCHEMA, EPOCH_SCHEMA, NOISE, SOURCE_SCHEMA
from tests.helpers.wait import wait_for

REPO = Path(__file__).resolve().parents[1]
DRIVER_SESSION = 3.0
DEADLINE = 120.0


# -- helpers ---------------------------------------------------------------------------------------


wait_for = functools.partial(wait_for, timeout=DEADLINE)  # subprocesses on a loaded machine: generous


def catalog_config(settings) -> dict:
    return {"name": settings.name, "uri": settings.uri, "warehouse": settings.warehouse}


class Driver:
    """A tests/helpers/python_driver.py process; its stdout lines are collected by a thread."""

    def __init__(self, config: dict, log_path: Path) -> None:
        self.log_path = log_path
        self.stderr = open(log_path, "w")  # noqa: SIM115 - the driver's stderr, closed when the driver stops
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.helpers.python_driver", json.dumps(config)],
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True, bufsize=1,
                                     env=crash_env(config.get("crash_at", "none"), config.get("crash_nth", 2)))
        self.stdin, self.stdout = present(self.proc.stdin), present(self.proc.stdout)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.stdout:
            self.lines.append(line.strip())

    def line(self, prefix: str, timeout: float = DEADLINE) -> str:
        def found() -> Optional[str]:
            hit = next((line for line in self.lines if line.startswith(prefix)), None)
            if hit is None and self.proc.poll() is not None:
                self._reader.join(5)
                hit = next((line for line in self.lines if line.startswith(prefix)), None)
                if hit is None:
                    raise AssertionError(f"driver exited ({self.proc.returncode}) without saying {prefix!r}:\n"
                                         f"{self.log()}")
            return hit
        return wait_for(found, f"the driver to say {prefix!r}", timeout=timeout)

    def send(self, text: str) -> None:
        self.stdin.write(text + "\n")
        self.stdin.flush()

    def wait(self, timeout: float = DEADLINE) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # Where it is stuck: the driver writes every thread's stack to its log on SIGUSR1.
            os.kill(self.proc.pid, signal.SIGUSR1)
            wait_for(lambda: "most recent call first" in self.log(), "the driver's stacks", 10)
            raise AssertionError(f"the driver did not exit within {timeout:.0f} s:\n{self.log()}") from None
        self._reader.join(5)
        return rc

    def log(self) -> str:
        self.stderr.flush()
        return self.log_path.read_text()[-4000:]

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process must run to die
            except ProcessLookupError:
                pass
            self.proc.kill()
        self.proc.wait(30)
        self.stderr.close()


@pytest.fixture
def drivers(tmp_path):
    """Start driver processes; every one is killed at the end of the test, whatever happened."""
    started: list[Driver] = []

    def start(config: dict) -> Driver:
        driver = Driver(config, tmp_path / f"driver-{len(started)}.log")
        started.append(driver)
        return driver
    yield start
    for driver in started:
        driver.kill()


def count_pipeline(settings, namespace: str, zk_connect: str, **driver: object) -> tuple[Any, tuple[str, str, str],
                                                                                   dict]:
    """The tables of a ``count`` driver (``tests/helpers/python_driver.py``) in ``namespace``: the source table, the
    names (source, log, counts) and the driver's config (``driver`` adds to it)."""
    catalog = settings.load()
    names = tuple(f"pg.{namespace}.{n}" for n in ("src", "log", "counts"))
    src = create_table(catalog, f"{namespace}.src", SOURCE_SCHEMA, first_snapshot=False)
    create_table(catalog, f"{namespace}.log", SOURCE_SCHEMA, first_snapshot=False)
    create_table(catalog, f"{namespace}.counts", COUNT_SCHEMA, first_snapshot=False)
    config = {"mode": "count", "connect": zk_connect, "session_timeout": DRIVER_SESSION,
              "catalog": catalog_config(settings), "source": names[0], "log": names[1], "counts": names[2], **driver}
    return src, (names[0], names[1], names[2]), config


def lineage_epochs(table) -> list[tuple[int, set[str]]]:
    """``main``'s epochs, oldest first, one entry per run of consecutive snapshots of the same epoch, with the
    terms that wrote the run (an overwrite is a delete and an append: two snapshots of one write)."""
    table.refresh()
    tagged = [(e, present(s.summary).get(TERM_KEY) or "") for s in reversed(list(main_lineage(table)))
              if (e := snapshot_epoch(s)) is not None]
    return [(epoch, {term for _, term in group}) for epoch, group in groupby(tagged, key=lambda t: t[0])]


def assert_each_epoch_published_once(table) -> list[int]:
    """Each epoch is in ``main``'s lineage at most once (one staged write, of one term), in increasing order."""
    runs = lineage_epochs(table)
    epochs = [epoch for epoch, _ in runs]
    assert epochs == sorted(set(epochs)), f"{'.'.join(table.name())}: epochs published twice or out of order: {epochs}"
    for epoch, terms in runs:
        assert len(terms) == 1, f"{'.'.join(table.name())}: epoch {epoch} holds writes of terms {sorted(terms)}"
    return epochs


def term_of(tm: Tidemark, job: str) -> int:
    return present(tm.read(tm.paths.term(job), TermRecord))[0].term


def committed_epochs(tm: Tidemark, job: str) -> dict[int, EpochRecord]:
    """The job's epoch records that are COMMITTED, by epoch."""
    found = {}
    for child in tm.children(tm.paths.epochs(job)):
        read = tm.read(tm.paths.epoch(job, int(child)), EpochRecord)
        if read is not None and read[0].state == EpochState.COMMITTED:
            found[read[0].epoch] = read[0]
    return found


def commits_under(tm: Tidemark, job: str, term: int) -> list[int]:
    return sorted(e for e, r in committed_epochs(tm, job).items() if r.term == term)


def election_members(tm: Tidemark, job: str) -> list[str]:
    """The identifiers of the replicas contending for (or holding) the job's election lock."""
    path = tm.paths.election(job)
    children = tm.children(path)
    return [raw[0].decode() for raw in tm.get_many([f"{path}/{c}" for c in children]) if raw is not None]


# -- 1. kill -9 at each step of an epoch ----------------------------------------------------------------


@pytest.mark.fault
@pytest.mark.parametrize("crash_at", ["staged-one", "staged", "precommitted", "published-one", "committed"])
def test_pure_python_writer_killed_at_each_step_recovers_every_epoch_exactly_once(
        crash_at, zk_connect, pg_catalog_settings, namespace, drivers):
    settings = pg_catalog_settings
    catalog = settings.load()
    src, (source, log_sink, counts_sink), config = count_pipeline(settings, namespace, zk_connect)

    produced = [0]
    stop = threading.Event()

    def append_batch() -> None:
        n = produced[0]
        # At "committed" only the first epoch has rows to count: the crashed epoch publishes nothing to the
        # count table, which leaves its Iceberg mark to the commit's last step (where the driver dies).
        keys = [NOISE if crash_at == "committed" and n else f"k{(n + i) % 5}" for i in range(3)]
        src.append(pa.table({"k": keys, "n": list(range(n, n + 3))}, schema=SOURCE_SCHEMA))
        produced[0] = n + 3

    def produce() -> None:
        while not stop.wait(0.2):
            append_batch()

    append_batch()  # the first epoch has rows to compute
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        crashed = drivers({**config, "max_epochs": 4, "crash_at": crash_at})
        assert crashed.wait() == -signal.SIGKILL, crashed.log()
    finally:
        stop.set()
        producer.join()

    crash = assert_crashed_at(crash_at, zk_connect, catalog, namespace, counts_sink, log_sink)

    recovered = drivers({**config, "max_epochs": 3, "crash_at": "none"})
    assert recovered.wait() == 0, recovered.log()
    result = json.loads(recovered.line("{"))
    committed = result["committed"]
    assert len(committed) == 3 and committed == sorted(set(committed)), committed
    if crash_at in ("staged-one", "staged"):
        assert committed[0] == crash == result["computed"][0], "the started epoch must be recomputed"
    elif crash_at in ("precommitted", "published-one"):
        assert committed[0] == crash and crash not in result["computed"], "the epoch must be rolled forward"
    else:
        assert committed[0] > crash

    tables = [source, log_sink, counts_sink]
    with Tidemark.connect(zk_connect) as tm:
        version = Resolver(catalog, settings, tm).resolve(tables)
        assert version == Resolver(catalog, settings, None).resolve(tables), "ZooKeeper and Iceberg disagree"
        marks = tm.tidemarks([log_sink, counts_sink])
        records = [present(tm.read(tm.paths.epoch("counter", e), EpochRecord))[0]
                   for e in sorted(committed_epochs(tm, "counter"))]
    assert version.epoch == committed[-1] and all(present(m).epoch == committed[-1] for m in marks.values())
    # the epochs' input ranges are contiguous: every source snapshot read once, none skipped
    ranges = [r.inputs.sources[source] for r in records]
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:])), ranges

    data = read_arrow(Resolver(catalog, settings), version)
    source_rows = sorted(zip(*(data[source].column(c).to_pylist() for c in ("k", "n"))))
    logged = sorted(zip(*(data[log_sink].column(c).to_pylist() for c in ("k", "n"))))
    counts = dict(zip(*(data[counts_sink].column(c).to_pylist() for c in ("k", "cnt"))))
    assert len(source_rows) == produced[0], "the consistent version must hold every produced row"
    assert logged == source_rows, "an appended epoch was lost or duplicated"
    assert counts == dict(Counter(k for k, _ in source_rows if k != NOISE)), "an epoch was lost or counted twice"
    assert counts, "nothing was counted"
    for sink in ("log", "counts"):
        table = catalog.load_table(f"{namespace}.{sink}")
        assert_each_epoch_published_once(table)
        assert EpochLineage(table).committed_epoch == committed[-1], f"{sink}: Iceberg lags ZooKeeper"


def assert_crashed_at(crash_at: str, zk_connect: str, catalog, namespace: str, counts_sink: str,
                      log_sink: str) -> int:
    """Check the state the killed driver left matches its crash point; returns the epoch it died in."""
    with Tidemark.connect(zk_connect) as tm:
        epoch = max(int(c) for c in tm.children(tm.paths.epochs("counter")))
        record = present(tm.read(tm.paths.epoch("counter", epoch), EpochRecord))[0]
    published = {name: epoch in [e for e, _ in lineage_epochs(catalog.load_table(f"{namespace}.{name}"))]
                 for name in ("counts", "log")}
    expected = {"staged-one": (EpochState.STARTED, {"counts": False, "log": False}),
                "staged": (EpochState.STARTED, {"counts": False, "log": False}),
                "precommitted": (EpochState.PRECOMMITTED, {"counts": False, "log": False}),
                "published-one": (EpochState.PRECOMMITTED, {"counts": True, "log": False}),
                "committed": (EpochState.COMMITTED, {"counts": False, "log": True})}[crash_at]
    assert (record.state, published) == expected, f"crashed at {crash_at}: {record}"
    if crash_at in ("staged-one", "staged"):  # staging commits nothing: the epoch is in no table's metadata
        assert not any(snapshot_epoch(s) == epoch for name in ("counts", "log")
                       for s in catalog.load_table(f"{namespace}.{name}").snapshots())
    if crash_at in ("precommitted", "published-one"):
        assert all(record.staged[s] is not None for s in (counts_sink, log_sink))
        assert {s: w.snapshot_id for s, w in record.writes.items()} == dict(record.staged), "the writes recorded"
    if crash_at == "committed":  # the count table published nothing: its Iceberg mark was still to come
        assert record.staged[counts_sink] is None
        assert (EpochLineage(catalog.load_table(f"{namespace}.counts")).committed_epoch or 0) < epoch
    return epoch


# -- 2. fenced and expired leaders step down and contend again -----------------------------------------------


def test_fenced_leader_steps_down_contends_again_and_keeps_committing(connect, tm, pg_catalog_settings, namespace):
    catalog = pg_catalog_settings.load()
    sink = f"pg.{namespace}.epochs"
    table = create_table(catalog, f"{namespace}.epochs", EPOCH_SCHEMA, first_snapshot=False)
    session = connect(session_timeout=DRIVER_SESSION)
    writer = EpochWriter(session, "fenced", sources=[], sinks=[sink], catalog=pg_catalog_settings,
                         interval_ms=1000, grace_ms=200)
    errors: list[BaseException] = []

    def step(ctx) -> None:
        ctx.append(sink, pa.table({"epoch": [ctx.epoch], "term": [ctx.writer.term], "member": ["thread"]},
                                  schema=EPOCH_SCHEMA))

    def run() -> None:
        try:
            writer.run(step)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
    thread = threading.Thread(target=run)
    thread.start()
    try:
        first = wait_for(lambda: (leader := current_leader(tm, "fenced")) and leader.term,
                         "the writer to lead")
        wait_for(lambda: len(commits_under(tm, "fenced", first)) >= 2 or errors, "two epochs under the first term")
        fenced_at = tm.fence_job("fenced", by="test")
        assert fenced_at == first + 1

        def leading_again() -> Optional[int]:
            assert not errors, f"run() raised {errors[0]!r}"
            leader = current_leader(tm, "fenced")
            return leader.term if leader is not None and leader.term > fenced_at else None
        second = wait_for(leading_again, "the fenced writer to lead again with a higher term")
        assert second > fenced_at and term_of(tm, "fenced") == second
        wait_for(lambda: errors or len(commits_under(tm, "fenced", second)) >= 2, "two epochs under the new term")
        assert not errors, f"run() raised {errors[0]!r}"
        assert thread.is_alive()
    finally:
        writer.stop()
        thread.join(DEADLINE)
    assert not thread.is_alive() and not errors, errors
    done = committed_epochs(tm, "fenced")
    assert writer.committed == sorted(set(writer.committed)) and set(writer.committed) <= set(done)
    epochs = assert_each_epoch_published_once(table)
    rows = catalog.load_table(f"{namespace}.epochs").scan().to_arrow()
    assert sorted(rows.column("epoch").to_pylist()) == epochs == sorted(done)
    assert {r.term for r in done.values()} >= {first, second}


def test_leader_fenced_while_recovering_contends_again(connect, tm, pg_catalog_settings, namespace, monkeypatch):
    """Fenced between winning the election and its first write (here: recording its pacing and clearing the last
    bounded run's ``finished`` mark), a new leader steps down and contends again instead of raising out of
    ``run``."""
    catalog = pg_catalog_settings.load()
    sink = f"pg.{namespace}.epochs"
    table = create_table(catalog, f"{namespace}.epochs", EPOCH_SCHEMA, first_snapshot=False)
    fenced: list[int] = []
    fence_next = threading.Event()
    started = JobRun.started

    def fenced_while_recovering(run: JobRun, pacing) -> None:
        if fence_next.is_set():  # an operator (another session) fences the job right then
            fence_next.clear()
            fenced.append(tm.fence_job(run.job, by="test"))
        started(run, pacing)
    monkeypatch.setattr(JobRun, "started", fenced_while_recovering)
    writer = EpochWriter(connect(session_timeout=DRIVER_SESSION), "recovering", sources=[], sinks=[sink],
                         catalog=pg_catalog_settings, interval_ms=1000, grace_ms=200)

    def step(ctx) -> None:
        ctx.append(sink, pa.table({"epoch": [ctx.epoch], "term": [ctx.writer.term], "member": ["thread"]},
                                  schema=EPOCH_SCHEMA))
    first = writer.run(step, max_epochs=1, leader_timeout=DEADLINE)
    assert len(first) == 1 and tm.get(tm.paths.finished("recovering")) is not None
    fence_next.set()
    later = writer.run(step, max_epochs=2, leader_timeout=DEADLINE)
    assert len(fenced) == 1, "the hook did not fence the job while it recovered"
    assert len(later) == 2 and later[0] > first[0]
    done = committed_epochs(tm, "recovering")
    assert done[later[-1]].term == term_of(tm, "recovering") == fenced[0] + 1
    assert assert_each_epoch_published_once(table) == sorted(done) == first + later


@pytest.mark.fault
def test_leader_whose_session_expired_becomes_a_standby_and_no_epoch_commits_twice(
        zk_connect, tm, pg_catalog_settings, namespace, drivers):
    catalog = pg_catalog_settings.load()
    sink = f"pg.{namespace}.epochs"
    table = create_table(catalog, f"{namespace}.epochs", EPOCH_SCHEMA, first_snapshot=False)
    config = {"mode": "serve", "connect": zk_connect, "session_timeout": DRIVER_SESSION, "job": "served",
              "catalog": catalog_config(pg_catalog_settings), "log": sink}

    old = drivers(config)
    old_member = old.line("READY").split()[1]
    first = wait_for(lambda: (leader := current_leader(tm, "served")) is not None and leader.member == old_member
                     and leader.term, "the first driver to lead")
    standby = drivers(config)
    standby_member = standby.line("READY").split()[1]
    wait_for(lambda: standby_member in election_members(tm, "served"), "the second driver to wait as a standby")
    wait_for(lambda: commits_under(tm, "served", first), "an epoch committed by the first driver")

    # Pause it right after a commit, while it waits for the next barrier: paused inside a catalog commit it
    # could hold a database row lock that the new leader would wait for.
    committed = tm.tidemarks([sink])[sink].epoch
    wait_for(lambda: tm.tidemarks([sink])[sink].epoch != committed, "the first driver's next commit", every=0.01)
    os.kill(old.proc.pid, signal.SIGSTOP)  # paused longer than its session: the standby must take over
    second = wait_for(lambda: (leader := current_leader(tm, "served")) is not None and leader.member == standby_member
                      and leader.term, "the standby to take over")
    assert second > first
    wait_for(lambda: len(commits_under(tm, "served", second)) >= 2, "the new leader to commit")
    os.kill(old.proc.pid, signal.SIGCONT)

    # the old leader learns its session expired, steps down without raising out of run(), and waits as a standby
    def old_is_standby() -> bool:
        assert old.proc.poll() is None, f"the old leader exited:\n{old.log()}"
        return old_member in election_members(tm, "served")
    wait_for(old_is_standby, "the old leader to contend again")
    after = len(commits_under(tm, "served", second))
    wait_for(lambda: len(commits_under(tm, "served", second)) >= after + 2, "the new leader to keep committing")
    assert old.proc.poll() is None and standby.proc.poll() is None, old.log() + standby.log()
    leader = current_leader(tm, "served")
    assert leader is not None and leader.member == standby_member and leader.term == second

    # it really is a standby: it takes over when the new leader dies
    standby.proc.kill()
    third = wait_for(lambda: (leader := current_leader(tm, "served")) is not None and leader.member == old_member
                     and leader.term > second and leader.term, "the old leader to take over again")
    wait_for(lambda: commits_under(tm, "served", third), "the old leader to commit again")
    os.kill(old.proc.pid, signal.SIGTERM)  # stop(): finish the epoch in flight and return from run()
    assert old.wait() == 0, old.log()
    assert "EXIT ok" in old.lines

    done = committed_epochs(tm, "served")
    epochs = assert_each_epoch_published_once(table)
    rows = catalog.load_table(f"{namespace}.epochs").scan().to_arrow()
    assert sorted(rows.column("epoch").to_pylist()) == epochs, "an epoch's row is in the sink twice"
    assert set(done) <= set(epochs) and epochs[-1] == max(done)
    assert {r.term for r in done.values()} >= {first, second, third}
