"""A ZooKeeper server rebuilt under running processes: stopped, its data directory deleted, started again empty on
the same port (issue 20). Real servers and processes: an ``EmbeddedZooKeeper`` of the test's own (the shared one
must not lose its data), a PostgreSQL catalog and ``tests/helpers/python_driver.py`` drivers.

The server refuses the old sessions for good (they have seen newer transactions than its own), and kazoo alone
would retry forever. A session must say so (``ZooKeeperRebuilt``) within about its timeout, a driver must say so
in one line and start over in its process on a new session (registering its job again and resuming from Iceberg
with nothing lost or duplicated; where it cannot, it exits with ``EXIT_ZOOKEEPER_REBUILT`` for its supervisor to
restart it), the exporter must connect anew, and SIGTERM during a ZooKeeper outage must end a driver at once,
without a traceback. Every wait has a deadline.
"""
from __future__ import annotations

import signal
import threading
import time
from collections import Counter

import pyarrow as pa
import pytest

from coordinator import EmbeddedZooKeeper, GcSchedule, Tidemark, VersionNotFound, ZooKeeperRebuilt, ZooKeeperUnavailable
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.job.supervisor import EXIT_ZOOKEEPER_REBUILT, Supervisor
from coordinator.operations.exporter import Exporter
from coordinator.operations.zookeeper_server import free_port
from coordinator.protocol.tidemarks import read_tidemarks
from coordinator.zookeeper import watchdog as watchdog_module
from coordinator.zookeeper.session import ZooKeeperSession
from tests.helpers.python_driver import EPOCH_SCHEMA, SOURCE_SCHEMA
from tests.helpers.stand_in_client import StandInClient
from tests.helpers.wait import wait_for
from tests.helpers.zookeeper_tree import back_up_server, rebuild_server, restore_server
from tests.test_writer_faults import catalog_config, count_pipeline, create_table, drivers  # noqa: F401 - a fixture
from tests.test_zookeeper_loss import counted

SESSION = 2.0
INTERVAL_MS = 1000  # the count driver's
# Detection (the session timeout, then a probe) plus a driver's own exit: well within 3 session timeouts + margin.
EXIT_DEADLINE = 3 * SESSION + 20
pytestmark = pytest.mark.fault


@pytest.fixture
def server(tmp_path):
    zk = EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path / "zookeeper").start()
    yield zk
    zk.stop()


def test_session_says_the_server_is_behind_it_and_stops_retrying(server):
    tm = Tidemark.connect(server.connect_string + "/rebuilt", session_timeout=SESSION, operation_timeout=30)
    try:
        for i in range(20):  # transactions the rebuilt server will not have seen
            tm.ensure_path(f"/n{i}")
        rebuild_server(server)
        started = time.monotonic()
        wait_for(lambda: tm.ended_error() is not None, "the session to find the server behind it", EXIT_DEADLINE)
        assert isinstance(tm.ended_error(), ZooKeeperRebuilt)
        asked = time.monotonic()
        with pytest.raises(ZooKeeperRebuilt, match=r"behind this process.s session.*restart this process"):
            tm.get("/n1")
        assert time.monotonic() - asked < 1.0, "an operation on an ended session waited for its deadline"
        assert time.monotonic() - started < 3 * SESSION + 5
        wait_for(lambda: not tm._watchdog.is_alive(), "the session's watchdog to stop kazoo", 30)
        assert not tm.client.connected and tm.client._stopped.is_set(), "kazoo still tries to reconnect"
    finally:
        tm.close()
    with Tidemark.connect(server.connect_string + "/rebuilt", session_timeout=SESSION) as fresh:
        assert fresh.get("/n1") is None  # a new session works: the server is up, and empty


def test_exporter_drops_the_session_and_connects_anew(server):
    connect = server.connect_string + "/exported"
    with Tidemark.connect(connect, session_timeout=SESSION) as writer:
        for i in range(20):
            writer.ensure_path(f"/n{i}")
    exporter = Exporter(lambda: Tidemark.connect(connect, session_timeout=SESSION, operation_timeout=5,
                                                 read_only=True), refresh_every=0.2)
    exporter.start()
    try:
        wait_for(exporter.up, "the exporter's first view", 30)
        first = exporter.tm
        rebuild_server(server)
        with Tidemark.connect(connect, session_timeout=SESSION):  # a restarted driver lays the tree out again
            pass
        wait_for(lambda: exporter.tm is not first and exporter.up(), "the exporter to read the rebuilt server",
                 EXIT_DEADLINE)
    finally:
        exporter.close()


def test_drivers_start_over_in_their_process_and_resume_from_iceberg(server, pg_catalog_settings, namespace,
                                                                      drivers):  # noqa: F811 - the fixture
    """Both replicas find the server behind their sessions, say so in one line, and start over in the same process
    on a new session: the job registers again on the empty server and resumes after its last epoch, no epoch twice,
    and a zombie of the old registration (the replica that led before) commits nothing of its old term."""
    catalog = pg_catalog_settings.load()
    sink = f"pg.{namespace}.epochs"
    table = create_table(catalog, f"{namespace}.epochs", EPOCH_SCHEMA)
    connect = server.connect_string + f"/{namespace}"
    config = {"mode": "serve", "connect": connect, "session_timeout": SESSION, "job": "served",
              "catalog": catalog_config(pg_catalog_settings), "log": sink}
    leader, standby = drivers(config), drivers(config)
    members = {leader.line("READY").split()[1], standby.line("READY").split()[1]}

    def rows() -> list[tuple[int, int, str]]:
        frame = table.refresh().scan().to_arrow()
        return list(zip(*(frame.column(c).to_pylist() for c in ("epoch", "term", "member"))))

    def newest(at_least: int = 1) -> int:
        """The newest epoch in the sink, once it holds ``at_least`` epochs (else 0)."""
        found = [e for e, _, _ in rows()]
        return max(found) if len(found) >= at_least else 0
    before = wait_for(lambda: newest(3), "three epochs committed before the rebuild", 120)
    old_terms = {t for _, t, _ in rows()}

    rebuild_server(server)
    rebuilt_at = time.monotonic()
    started_over = "started over in this process on a new session"
    for driver in (leader, standby):
        wait_for(lambda: started_over in driver.log(), "each replica to start over", EXIT_DEADLINE)
    assert time.monotonic() - rebuilt_at < EXIT_DEADLINE
    wait_for(lambda: newest() > before, "the job to commit again in the same processes", 120)
    for driver in (leader, standby):
        log = driver.log()
        assert driver.proc.poll() is None, f"a driver exited: {log}"
        assert "Traceback" not in log, log
        lines = [line for line in log.splitlines() if started_over in line]
        assert len(lines) == 1 and "behind this process's session" in lines[0], log
        assert "check that the ensemble is up" not in log, log
    after = [(e, t, m) for e, t, m in rows() if e > before]
    assert {m for _, _, m in after} <= members, "an epoch after the rebuild was written by another process"
    assert min(t for _, t, _ in after) > max(old_terms), "the new registration's terms are above the old ones"
    epochs = [e for e, _, _ in rows()]
    assert [e for e, n in Counter(epochs).items() if n > 1] == [], "an epoch was written twice"


def test_a_server_restored_from_an_older_copy_makes_the_job_resume_from_iceberg_above_a_read_floor(
        server, pg_catalog_settings, namespace, drivers, tmp_path):  # noqa: F811 - the fixture
    """The server's data directory is copied while the ``count`` job commits (a backup), the job commits on, and the
    server is restored from the copy: the tree holds the job's older history, whose input ranges would read again
    what the sinks hold. The replica that led (it wrote after the copy) finds the server behind its session and
    starts over; a standby that saw no newer transaction keeps its session, which the copy holds. The next leader
    finds the job's history older than its sinks' Iceberg metadata, resumes from Iceberg instead and sets a read
    floor. Nothing is lost or duplicated, and once the job is back no reader is given a version older than one
    read before."""
    settings = pg_catalog_settings
    catalog = settings.load()
    connect = server.connect_string + f"/{namespace}"
    src, tables, config = count_pipeline(settings, namespace, connect, session_timeout=SESSION, max_epochs=None)
    source, log_sink, counts_sink = tables
    produced = [0]
    stop = threading.Event()

    def produce() -> None:
        while not stop.wait(0.2):
            n = produced[0]
            src.append(pa.table({"k": [f"k{(n + i) % 5}" for i in range(3)], "n": list(range(n, n + 3))},
                                schema=SOURCE_SCHEMA))
            produced[0] = n + 3

    def newest(tm: Tidemark) -> int:
        try:
            return Resolver(catalog, settings, tm).resolve(list(tables)).epoch or 0  # None: not registered yet
        except VersionNotFound:
            return 0
    producer = threading.Thread(target=produce)
    producer.start()
    leader, standby = drivers(config), drivers(config)
    reader = Tidemark.connect(connect, session_timeout=SESSION)
    try:
        copied_after = wait_for(lambda: newest(reader), "the job's first epoch", 120)
        back_up_server(server, tmp_path / "backup")
        before = wait_for(lambda: (e := newest(reader)) > copied_after + 3 * INTERVAL_MS and e,
                          "three more epochs after the copy", 120)
        restore_server(server, tmp_path / "backup")
        with Tidemark.connect(connect, session_timeout=SESSION) as after:
            wait_for(lambda: newest(after) > before, "the job to commit past what was read before the restore", 120)
            floors = {t: m.read_floor for t, m in read_tidemarks(after, [log_sink, counts_sink]).items() if m}
            stop.set()
            producer.join()
            version = wait_for(lambda: (v := Resolver(catalog, settings, after).resolve(list(tables))).epoch and
                               len(read_arrow(Resolver(catalog, settings), v)[source]) == produced[0] and v,
                               "a version holding every produced row", 120)
    finally:
        stop.set()
        producer.join()
        reader.close()
    data = read_arrow(Resolver(catalog, settings), version)
    source_rows = sorted(zip(*(data[source].column(c).to_pylist() for c in ("k", "n"))))
    logged = sorted(zip(*(data[log_sink].column(c).to_pylist() for c in ("k", "n"))))
    assert logged == source_rows, "rows were lost or duplicated across the restore"
    assert counted(data, log_sink, counts_sink) is None
    logs = leader.log() + standby.log()
    assert "started over in this process on a new session" in logs, logs  # the replica that led, at least
    assert "restored from an older copy; resuming from Iceberg" in logs, logs
    assert "Traceback" not in logs, logs
    assert all(floor is not None and floor >= before for floor in floors.values()) and len(floors) == 2, \
        f"the resumed sinks' read floors {floors} are not at or above {before}, read before the restore"


def test_sigterm_during_a_zookeeper_outage_ends_drivers_at_once(server, pg_catalog_settings, namespace,
                                                                drivers):  # noqa: F811 - the fixture
    catalog = pg_catalog_settings.load()
    sink = f"pg.{namespace}.epochs"
    table = create_table(catalog, f"{namespace}.epochs", EPOCH_SCHEMA)
    config = {"mode": "serve", "connect": server.connect_string + f"/{namespace}", "session_timeout": SESSION,
              "job": "served", "catalog": catalog_config(pg_catalog_settings), "log": sink}
    leader, standby = drivers(config), drivers(config)
    leader.line("READY")
    standby.line("READY")
    wait_for(lambda: len(table.refresh().scan().to_arrow()) >= 2, "two epochs committed", 120)

    server.kill()  # an outage, not a rebuild: only SIGTERM may end the drivers
    wait_for(lambda: all("ZooKeeper connection to" in d.log() for d in (leader, standby)),
             "the drivers to see the outage", 30)
    stopped_at = time.monotonic()
    for driver in (leader, standby):
        driver.proc.send_signal(signal.SIGTERM)
    for driver in (leader, standby):
        assert driver.wait(15) == 0, driver.log()
        assert "EXIT ok" in driver.lines and "Traceback" not in driver.log(), driver.log()
    assert time.monotonic() - stopped_at < 10, "SIGTERM waited for ZooKeeper"


def test_operations_of_a_stopping_process_fail_at_once_while_zookeeper_is_down(server):
    tm = Tidemark.connect(server.connect_string + "/stopping", session_timeout=SESSION, operation_timeout=30)
    try:
        server.kill()
        wait_for(lambda: tm.connection_state != "CONNECTED", "the connection to drop", 30)
        tm.stop_waiting()
        asked = time.monotonic()
        with pytest.raises(ZooKeeperUnavailable, match="this process is stopping"):
            tm.get("/anything")
        assert time.monotonic() - asked < 5, "a stopping process waited for ZooKeeper's deadline"
    finally:
        tm.close()


def test_a_probe_under_way_gives_up_when_the_process_stops(server, monkeypatch):
    """SIGTERM while the watchdog probes a server that is down: the probe (a fresh client connecting for up to
    ``PROBE_TIMEOUT_S``, then stopping its connection thread) must not hold the stop back. A fresh-clone run once
    took more than 15 s to end a driver this way."""
    probing = threading.Event()
    real_probe = watchdog_module.probe_zxid

    def watched_probe(*args, **kwargs):
        probing.set()
        return real_probe(*args, **kwargs)
    monkeypatch.setattr(watchdog_module, "probe_zxid", watched_probe)
    tm = Tidemark.connect(server.connect_string + "/probing", session_timeout=SESSION, operation_timeout=30)
    try:
        server.kill()
        assert probing.wait(3 * SESSION + 10), "the watchdog never probed the server that is down"
        tm.stop_waiting()
        asked = time.monotonic()
        wait_for(lambda: tm.ended_error() is not None, "the stopping session to end", 30, every=0.05)
        assert time.monotonic() - asked < 2.0, "ending a stopping session waited for the probe under way"
        assert isinstance(tm.ended_error(), ZooKeeperUnavailable)
    finally:
        tm.close()


def test_a_new_session_on_a_server_that_lost_the_tree_ends_too(server):
    """The rebuilt server took more transactions than the session had seen before it reconnected: the server then
    takes the reconnection, the old session is unknown (expired) and kazoo opens a new one, on a server without
    this session's tree."""
    tm = Tidemark.connect(server.connect_string + "/lost", session_timeout=10, operation_timeout=30)
    try:
        seen = tm.client.last_zxid
        rebuild_server(server)
        with Tidemark.connect(server.connect_string + "/elsewhere", session_timeout=10) as other:
            while other.client.last_zxid <= seen + 5:  # past the old session's zxid before its probe runs
                other.ensure_path(f"/n{other.client.last_zxid}")
            wait_for(lambda: tm.ended_error() is not None, "the new session to find its tree gone", 30)
        error = tm.ended_error()
        assert isinstance(error, ZooKeeperRebuilt) and "tree" in str(error), error
    finally:
        tm.close()


def test_gc_schedule_stops_with_one_line(server, catalog_settings, caplog):
    tm = Tidemark.connect(server.connect_string + "/gc", session_timeout=SESSION, operation_timeout=30)
    schedule = GcSchedule(tm, catalog_settings, every_s=0.2).start()
    try:
        for i in range(20):
            tm.ensure_path(f"/n{i}")
        rebuild_server(server)
        thread = schedule._thread
        assert thread is not None
        wait_for(lambda: not thread.is_alive(), "the GC schedule to stop", EXIT_DEADLINE)
        assert isinstance(schedule.last_error, ZooKeeperRebuilt)
        stops = [r.getMessage() for r in caplog.records
                 if r.name == "coordinator.history.gc_schedule" and "the schedule stops" in r.getMessage()]
        assert len(stops) == 1 and "behind this process's session" in stops[0], stops
    finally:
        schedule.stop()
        tm.close()


def test_one_server_of_an_ensemble_answering_from_the_past_ends_no_session(monkeypatch):
    """On an ensemble, a probe that lands on one server behind the session (a leader cut off from its quorum that
    has not noticed yet) is not enough: the session ends only when a probe starting at each server finds it
    behind, one after another."""
    firsts: list[int] = []
    stale_only = [True]

    def probe(client, timeout: float, first: int, cancelled) -> int:
        firsts.append(first)
        return 0x400000020 if first % 3 == 0 or not stale_only[0] else 0x500000030
    monkeypatch.setattr(watchdog_module, "probe_zxid", probe)
    monkeypatch.setattr(watchdog_module, "PROBE_EVERY_S", 0.05)
    session = ZooKeeperSession(StandInClient(servers=3, connected=False, last_zxid=0x500000010), session_timeout=0.1)
    try:
        session._connection_state.changed("SUSPENDED")  # what kazoo reports when the connection drops
        wait_for(lambda: len(firsts) >= 4, "four probes", 30)
        assert session.ended_error() is None and set(firsts) == {0, 1}
        stale_only[0] = False  # every server behind: rebuilt
        wait_for(lambda: session.ended_error() is not None, "the session to end", 30)
        assert isinstance(session.ended_error(), ZooKeeperRebuilt) and firsts[-3:] == [0, 1, 2], firsts
    finally:
        session.close()


def test_the_supervisor_starts_over_where_it_can_and_exits_75_where_it_cannot():
    """The supervisor's decision alone (pure logic, its callbacks stand-ins): on ``ZooKeeperRebuilt`` it steps down
    and, when ``start_over`` succeeds, contends again; when it fails, the process exits with status 75."""
    calls: list[str] = []

    def take_over() -> None:
        calls.append("take over")
        if calls.count("take over") == 1:
            raise ZooKeeperRebuilt("the server is behind this process's session")

    def start_over(succeeds: bool) -> bool:
        calls.append("start over")
        return succeeds

    def supervisor(succeeds: bool) -> Supervisor:
        return Supervisor("job", threading.Event(), take_over=take_over, step_down=lambda: calls.append("down"),
                          still_leading=lambda: True, start_over=lambda: start_over(succeeds))
    supervisor(succeeds=True).run(lambda: calls.append("lead"), exit_on_rebuilt=True)
    assert calls == ["take over", "down", "start over", "take over", "lead", "down"]

    calls.clear()
    with pytest.raises(SystemExit) as exited:
        supervisor(succeeds=False).run(lambda: calls.append("lead"), exit_on_rebuilt=True)
    assert exited.value.code == EXIT_ZOOKEEPER_REBUILT and calls == ["take over", "down", "start over"]
