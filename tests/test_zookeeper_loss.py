"""ZooKeeper's state lost at each crash point of an epoch: no reader's consistent epoch steps back, and nothing is lost
or duplicated (issue 49). Real servers and processes: the shared ZooKeeper (the test's chroot deleted), PostgreSQL
and ``tests/helpers/python_driver.py`` drivers killed by their own crash points (``coordinator/crashpoints.py``).

At every point a driver of job ``counter`` dies (SIGKILL) in an epoch, the whole tree is deleted, and a new driver
resumes from Iceberg. Iceberg may then hold less than ZooKeeper had committed: an epoch in which ``counts`` publishes
nothing is marked there only on a marker round (once an hour here), and the loss falls between the ZooKeeper commit
and the marks at ``committed`` and ``idle-commit``. Three readers check every version (the counts are the counts of
the log): one with ZooKeeper from before the loss to the end, a ``ReaderSession`` on it, one started after the loss
(a new process: it must not read older than what was read before the loss), and one with Iceberg alone.
"""
from __future__ import annotations

import json
import signal
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Optional

import pyarrow as pa
import pytest

from coordinator import Tidemark, VersionNotFound
from coordinator.history.checker import ConsistencyChecker
from coordinator.history.resolve import ReaderSession, Resolver, read_arrow
from coordinator.records import ConsistentVersion
from tests.helpers.present import present
from tests.helpers.python_driver import NOISE, SOURCE_SCHEMA
from tests.helpers.wait import wait_for
from tests.helpers.zookeeper_tree import wipe_zookeeper
from tests.test_writer_faults import DEADLINE, DRIVER_SESSION, count_pipeline, drivers  # noqa: F401 - a fixture

pytestmark = pytest.mark.fault

# crash point -> (its nth time, what the source gets after the first batch). The first epoch always counts rows.
POINTS = {
    "precommitted": (2, "rows"),     # after the precommit: nothing of the epoch published
    "published-one": (2, "rows"),    # after the first sink's publish
    "committed": (2, "noise"),       # after the ZooKeeper commit, before the marks: counts published nothing
    "idle-commit": (2, "nothing"),   # after an idle epoch's ZooKeeper commit: Iceberg records neither sink's
    "marked": (1, "rows"),           # after the first epoch's marks
}


def counted(frames: Mapping[str, pa.Table], log: str, counts: str) -> Optional[str]:
    """The pipeline's rule: the counts are the log's rows per key, noise left out."""
    want = Counter(k for k in frames[log].column("k").to_pylist() if k != NOISE)
    have = dict(zip(frames[counts].column("k").to_pylist(), frames[counts].column("cnt").to_pylist()))
    return None if have == dict(want) else f"counts {have} are not the log's {dict(want)}"


class Reading:
    """A reader resolving ``tables`` every 0.1 s in a thread of its own (through ``session`` when given), each new
    version checked, every step back kept."""

    def __init__(self, resolver: Resolver, tables: list[str], log: str, counts: str,
                 session: Optional[ReaderSession] = None) -> None:
        self.checker = ConsistencyChecker(resolver, tables, lambda frames: counted(frames, log, counts))
        self.resolve: Callable[[list[str]], ConsistentVersion] = (session or resolver).resolve
        self.tables = tables
        self.seen: list[int] = []
        self.stepped_back: list[tuple[int, int]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()  # a resolver serves one resolution at a time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def read(self) -> Optional[int]:
        with self._lock:
            try:
                version = self.resolve(self.tables)
            except VersionNotFound:
                return None
            if version.epoch is None:
                return None
            if self.seen and version.epoch < max(self.seen):
                self.stepped_back.append((max(self.seen), version.epoch))
            if version.epoch not in self.seen:
                self.checker.check(version)
            self.seen.append(version.epoch)
            return version.epoch

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.read()
            except Exception as exc:  # noqa: BLE001 - kept for the test's message
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:300]}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(DEADLINE)


@pytest.mark.parametrize("crash_at", list(POINTS))
def test_zookeeper_lost_at_each_crash_point_no_reader_steps_back_and_nothing_is_lost(
        crash_at, zk_server, zk_connect, pg_catalog_settings, namespace, drivers):  # noqa: F811 - the fixture
    settings = pg_catalog_settings
    catalog = settings.load()
    src, (source, log_sink, counts_sink), config = count_pipeline(settings, namespace, zk_connect, marker_every="1h")
    tables = [source, log_sink, counts_sink]
    nth, after_first = POINTS[crash_at]
    produced = [0]

    def append_batch(noise: bool = False) -> None:
        n = produced[0]
        keys = [NOISE if noise else f"k{(n + i) % 5}" for i in range(3)]
        src.append(pa.table({"k": keys, "n": list(range(n, n + 3))}, schema=SOURCE_SCHEMA))
        produced[0] = n + 3

    stop = threading.Event()

    def produce() -> None:
        while after_first != "nothing" and not stop.wait(0.2):
            append_batch(noise=after_first == "noise")

    before = Tidemark.connect(zk_connect, session_timeout=DRIVER_SESSION)
    in_session = Resolver(catalog, settings, before)
    readers = {"with ZooKeeper since before the loss": Reading(Resolver(catalog, settings, before), tables, log_sink,
                                                                counts_sink),
               "a ReaderSession": Reading(in_session, tables, log_sink, counts_sink, ReaderSession(in_session, before)),
               "with Iceberg alone": Reading(Resolver(catalog, settings, None), tables, log_sink, counts_sink)}
    after: Optional[Tidemark] = None
    append_batch()
    producer = threading.Thread(target=produce)
    producer.start()
    try:
        crashed = drivers({**config, "max_epochs": 6, "crash_at": crash_at, "crash_nth": nth})
        assert crashed.wait() == -signal.SIGKILL, crashed.log()
        stop.set()
        producer.join()
        newest_before = readers["with ZooKeeper since before the loss"].read()  # ZooKeeper's last word
        assert newest_before is not None, "no consistent version before the loss"

        wipe_zookeeper(zk_server, zk_connect)
        after = Tidemark.connect(zk_connect, session_timeout=DRIVER_SESSION)
        started_after = Reading(Resolver(catalog, settings, after), tables, log_sink, counts_sink)
        readers["with ZooKeeper, started after the loss"] = started_after
        try:  # before the job is back, Iceberg may hold less than was read: no version, rather than an older one
            early: Optional[int] = Resolver(catalog, settings, after).resolve(tables).epoch
        except VersionNotFound:
            early = None
        assert early is None or early >= newest_before, \
            f"read {early} before the job was back, older than {newest_before} read before the loss"

        append_batch()
        resumed = drivers({**config, "max_epochs": 3, "crash_at": "none"})
        assert resumed.wait() == 0, resumed.log()
        last = json.loads(resumed.line("{"))["committed"][-1]
        # Iceberg alone records the job's last epochs only when they published something (marker rounds are hours
        # apart here): its reader reaches what Iceberg holds.
        goals = {name: last for name in readers}
        goals["with Iceberg alone"] = present(Resolver(catalog, settings, None).resolve(tables).epoch)
        try:
            wait_for(lambda: all(max(r.seen, default=0) >= goals[name] for name, r in readers.items()),
                     f"every reader to read the resumed job's last epoch ({goals})", DEADLINE, every=0.2)
        except AssertionError as exc:
            seen = {name: (r.seen[-3:], r.errors[-2:]) for name, r in readers.items()}
            raise AssertionError(f"{exc}; each reader's last epochs and errors: {seen}") from None
    finally:
        stop.set()
        producer.join()
        for reading in readers.values():
            reading.stop()
        before.close()
        if after is not None:
            after.close()

    for name, reading in readers.items():
        assert reading.checker.failures == [], f"reader {name}: {reading.checker.failures}"
        assert reading.stepped_back == [], f"reader {name} stepped back: {reading.stepped_back}"
    assert min(started_after.seen) >= newest_before, \
        f"a reader started after the loss read {min(started_after.seen)}, older than {newest_before} read before it"

    with Tidemark.connect(zk_connect, session_timeout=DRIVER_SESSION) as tm:
        version = Resolver(catalog, settings, tm).resolve(tables)
    assert version.epoch == last
    data = read_arrow(Resolver(catalog, settings), version)
    source_rows = sorted(zip(*(data[source].column(c).to_pylist() for c in ("k", "n"))))
    logged = sorted(zip(*(data[log_sink].column(c).to_pylist() for c in ("k", "n"))))
    assert len(source_rows) == produced[0], "the last version must hold every produced row"
    assert logged == source_rows, "an epoch's rows were lost or duplicated across the loss"
    assert counted(data, log_sink, counts_sink) is None
