"""The ``tidemark`` command against a real ZooKeeper and real catalogs: confirmations and dry runs, the interval
typo refused and a pending change reverted, a stuck grid left without editing znodes, answers that say where
they looked, catalogs lacking registered tables, --json everywhere, ``zk`` honouring its arguments, and one log
line per connection change. Failures are one ``tidemark: error:`` line and a non-zero exit."""
from __future__ import annotations

import io
import json
import logging
import os
import pty
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator import CatalogSettings, ConfigurationError, EmbeddedZooKeeper, Tidemark, VersionReader
from coordinator.history.gc import GarbageCollector
from coordinator.history.versions import RetainedVersions
from coordinator.operations.zookeeper_server import four_letter_word, free_port
from coordinator.protocol.barriers import BarrierGrid
from coordinator.records import now_ms
from coordinator.zookeeper.session import KAZOO_LOG
from tests.helpers.cli import TIDEMARK, assert_one_line_error, run_cli
from tests.helpers.lake import commit_rows, create_table, lead_job
from tests.helpers.wait import wait_for


class Terminal(io.StringIO):
    """Standard input on a terminal, where an operator types ``answer``."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def no_terminal(monkeypatch):
    """Standard input is not a terminal (a script, a CronJob)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))


def test_the_interval_typo_is_refused_and_a_pending_change_is_reverted(tm, zk_connect, capsys, monkeypatch,
                                                                       no_terminal):
    tm.barriers.ensure_grid(1000)
    zk = ["--zk", zk_connect]
    future = (now_ms() // 60_000 + 2) * 60_000
    before = tm.get(tm.paths.barriers)
    assert before is not None

    code, _, err = run_cli(capsys, *zk, "barriers", "--set-interval", "999999999999", "--from", str(future))
    assert code == 2 and err.count("\n") == 1 and "100 to 86400000 ms (a day)" in err, err
    code, _, err = run_cli(capsys, *zk, "barriers", "--set-interval", "2000", "--from", str(future))
    assert_one_line_error(code, err, f"change the barrier interval of every job from 1000 ms to 2000 ms at {future}",
                   "nothing changed: pass --yes")
    code, out, _ = run_cli(capsys, *zk, "barriers", "--set-interval", "2000", "--from", str(future), "--dry-run")
    assert code == 0 and out.endswith("dry run: nothing changed\n")
    assert tm.get(tm.paths.barriers) == before, "a refused or dry-run change wrote /barriers"

    code, out, err = run_cli(capsys, *zk, "barriers", "--set-interval", "2000", "--from", str(future), "--yes")
    assert code == 0, err
    assert f"  every 2000 ms from {future} (" in out and "pending: `tidemark barriers --revert` cancels it" in out
    assert tm.barriers.grid().pending(now_ms()) == ({"from_epoch": future, "interval_ms": 2000},)

    monkeypatch.setattr(sys, "stdin", Terminal("n\n"))
    code, out, err = run_cli(capsys, *zk, "barriers", "--revert")
    assert_one_line_error(code, err, "not confirmed; nothing changed")
    assert f"cancel the pending interval change to 2000 ms at {future}" in out and "Cancel it? [y/N]" in out
    assert tm.barriers.grid().changes != ()
    monkeypatch.setattr(sys, "stdin", Terminal("y\n"))
    code, out, err = run_cli(capsys, *zk, "barriers", "--revert")
    assert code == 0, err
    assert tm.barriers.grid() == BarrierGrid(1000)
    assert_one_line_error(*run_cli(capsys, *zk, "barriers", "--revert", "--yes")[::2], "no interval change is pending")


def test_a_grid_stuck_on_an_absurd_interval_is_left_without_editing_znodes(tm, zk_connect, capsys, no_terminal,
                                                                            tmp_path, namespace):
    lake = CatalogSettings.embedded(tmp_path)
    sink = f"{namespace}.ticks"
    create_table(lake.load(), sink)
    past = (now_ms() // 1000 - 60) * 1000
    # What a release without range checks let through: an interval of 31 years, in force for a minute now.
    tm.barriers.ensure_grid(1000)
    tm.client.set(tm.paths.barriers,
                  BarrierGrid(1000, changes=({"from_epoch": past, "interval_ms": 999_999_999_999},)).to_json())
    writer = lead_job(tm, lake, "ticks", [sink])
    try:
        assert writer.next_barrier(wait=False) is None, "the grid has no point between now and 2058"
        zk = ["--zk", zk_connect]
        code, out, _ = run_cli(capsys, *zk, "barriers")
        assert code == 0 and "no job takes an epoch until then" in out and "--set-interval MS --from T" in out

        code, _, err = run_cli(capsys, *zk, "barriers", "--set-interval", "1000", "--yes")
        assert_one_line_error(code, err, "--from T", "the earliest allowed is ")
        # A few seconds later than the earliest: that moves on with the clock while the next command starts.
        start = int(err.split("the earliest allowed is ")[1].split()[0]) + 3000
        code, _, err = run_cli(capsys, *zk, "barriers", "--set-interval", "1000", "--from", str(start), "--yes")
        assert code == 0, err
        grid = tm.barriers.grid()
        assert grid.is_barrier(past) and grid.next_candidate(past) == start
        assert grid.floor(start + 2500) == start + 2000

        epoch = writer.next_barrier(wait=True)  # the job takes epochs again once the clock reaches the new points
        assert epoch is not None and epoch >= start and grid.is_barrier(epoch)
        commit_rows(writer, epoch)
        assert tm.tidemarks([sink])[sink].epoch == epoch
    finally:
        writer.close()


def test_fence_and_unregister_ask_first_and_dry_run(tm, zk_connect, capsys, monkeypatch, no_terminal, tmp_path):
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path))
    tm.register_job("counts", sources=["db.words"], sinks=["db.counts"])
    zk = ["--zk", zk_connect]
    term = next(j.term for j in tm.status().jobs if j.name == "counts")
    code, _, err = run_cli(capsys, *zk, "fence", "counts")
    assert_one_line_error(code, err, f"fence job counts: its term goes from {term} to {(term or 0) + 1}", "pass --yes")
    code, out, _ = run_cli(capsys, *zk, "fence", "counts", "--dry-run")
    assert code == 0 and "dry run: nothing changed" in out
    assert next(j.term for j in tm.status().jobs if j.name == "counts") == term
    monkeypatch.setattr(sys, "stdin", Terminal("yes\n"))
    code, out, err = run_cli(capsys, *zk, "fence", "counts")
    assert code == 0 and "Fence job counts? [y/N]" in out and f"term is now {(term or 0) + 1}" in out, err

    assert_one_line_error(*run_cli(capsys, *zk, "fence", "nojob", "--yes")[::2], "job 'nojob' is not registered",
                   f"looked in ZooKeeper {zk_connect.split('/')[0]}, chroot /{zk_connect.split('/', 1)[1]}, "
                   "root /tidemark")
    code, out, err = run_cli(capsys, *zk, "unregister", "counts", "--dry-run", "--unfenced")
    assert code == 0 and out.endswith("dry run: nothing changed\n"), err
    assert "counts" in tm.topology().jobs


def test_answers_that_find_nothing_say_where_they_looked(zk_connect, capsys, tm):
    tm.barriers.ensure_grid(1000)
    hosts, chroot = zk_connect.split("/", 1)
    for argv, where in ([["--zk", zk_connect + "-typo"], f"chroot /{chroot}-typo, root /tidemark"],
                        [["--zk", zk_connect, "--root", "/nope"], f"chroot /{chroot}, root /nope"]):
        looked = f"(looked in ZooKeeper {hosts}, {where})"
        for command in (["status"], ["topology"]):
            code, out, err = run_cli(capsys, *argv, *command)
            assert code == 0 and f"no jobs registered {looked}" in out, (command, out, err)
        code, out, _ = run_cli(capsys, *argv, "versions")
        assert code == 0 and f"no retained versions (looked in ZooKeeper {hosts}, {where}; run `tidemark gc`)" in out
        assert_one_line_error(*run_cli(capsys, *argv, "barriers")[::2], f"no barrier grid is defined yet {looked}")
    code, out, _ = run_cli(capsys, "--zk", zk_connect, "barriers")  # the right place: a grid and no jobs
    assert code == 0 and out.startswith("grid: every 1000 ms") and "no jobs registered (looked in" in out


def test_a_catalog_lacking_a_registered_table_is_refused_and_gc_changes_nothing(tm, zk_connect, capsys, monkeypatch,
                                                                                 tmp_path, namespace, no_terminal):
    right = CatalogSettings.embedded(tmp_path / "right")
    sink = f"{namespace}.counts"
    create_table(right.load(), sink)
    writer = lead_job(tm, right, "counts", [sink])
    try:
        epoch = tm.barriers.grid().floor(now_ms()) - 2000
        commit_rows(writer, epoch)
    finally:
        writer.close()
    GarbageCollector(tm, right).run()
    retained = RetainedVersions(tm).epochs()
    assert epoch in retained
    zk = ["--zk", zk_connect]
    monkeypatch.delenv("TIDEMARK_CATALOG_URI", raising=False)

    # TIDEMARK_HOME wrong: no catalog there, and the commands create none (tests/test_fresh_home.py has them all).
    wrong = CatalogSettings.embedded(tmp_path / "wrong")
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "wrong"))
    assert_one_line_error(*run_cli(capsys, *zk, "resolve", sink)[::2], f"Iceberg catalog 'lake' at {wrong.uri} does "
                          "not exist")
    assert not (tmp_path / "wrong").exists()
    # A catalog there, but another one: it lacks the job's table, which is registered in ZooKeeper.
    wrong.load()
    code, out, err = run_cli(capsys, *zk, "resolve", sink)
    missing = f"{sink} (written by job counts) does not exist in catalog 'lake' at {wrong.uri}"
    assert_one_line_error(code, err, missing, "though it is registered in ZooKeeper", "point TIDEMARK_CATALOG_URI")
    assert out == ""
    for command in (["gc", "--yes"], ["versions"], ["versions", "--json"]):
        assert_one_line_error(*run_cli(capsys, *zk, *command)[::2], missing)
    assert RetainedVersions(tm).epochs() == retained, "gc with the wrong catalog dropped retained versions"
    # Only the tables jobs registered are said to be registered: not a typo named with them.
    code, _, err = run_cli(capsys, *zk, "resolve", sink, f"{namespace}.typo")
    assert_one_line_error(code, err, f"{sink} (written by job counts), {namespace}.typo do not exist in catalog 'lake' "
                          f"at {wrong.uri}, though {sink} is registered in ZooKeeper")

    # Another catalog with a table of that name (a quickstart run on the embedded catalog, then the tree used with
    # the lakehouse): not the job's table, so every command refuses, rather than answer for tables it never wrote.
    create_table(wrong.load(), sink)
    other = f"table {sink} in catalog 'lake' at {wrong.uri} is not the table job counts writes"
    for command in (["resolve", sink], ["gc", "--yes"], ["versions"]):
        assert_one_line_error(*run_cli(capsys, *zk, *command)[::2], other, "belongs to another catalog")
    assert RetainedVersions(tm).epochs() == retained, "gc with another catalog's table dropped retained versions"
    with pytest.raises(ConfigurationError, match=other):  # resolved from ZooKeeper alone, refused at the first read
        VersionReader.resolve([sink], tm, settings=wrong).arrow(sink)
    with pytest.raises(ConfigurationError, match=other):
        lead_job(tm, wrong, "counts", [sink]).close()

    # The right catalog: every read command prints one JSON document with --json, and gc asks first.
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "right"))
    for command in (["status"], ["topology"], ["barriers"], ["versions"], ["resolve", sink]):
        code, out, err = run_cli(capsys, *zk, *command, "--json")
        assert code == 0 and err == "", (command, err)
        assert isinstance(json.loads(out), (dict, list)), command
    assert json.loads(run_cli(capsys, *zk, "resolve", sink, "--json")[1])["snapshots"][sink] is not None
    assert_one_line_error(*run_cli(capsys, *zk, "gc")[::2], "gc with the policy", "pass --yes")
    code, out, _ = run_cli(capsys, *zk, "gc", "--dry-run")
    assert code == 0 and out.startswith("dry run: nothing changed")
    code, out, err = run_cli(capsys, *zk, "gc", "--yes")
    assert code == 0 and "expired" in out, err


def test_a_table_missing_in_an_empty_deployment_is_not_said_to_be_registered(zk_connect, capsys, tmp_path,
                                                                             monkeypatch):
    monkeypatch.delenv("TIDEMARK_CATALOG_URI", raising=False)
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path))
    lake = CatalogSettings.embedded(tmp_path)
    lake.load()
    code, out, err = run_cli(capsys, "--zk", zk_connect, "resolve", "db.t")
    assert_one_line_error(code, err, f"db.t does not exist in catalog 'lake' at {lake.uri}: check the table names")
    assert "registered" not in err and out == ""


def test_a_terminal_confirms_through_the_real_entry_point(tm, zk_connect):
    tm.barriers.ensure_grid(1000)
    future = (now_ms() // 60_000 + 2) * 60_000
    controller, terminal = pty.openpty()
    try:
        os.write(controller, b"y\n")
        done = subprocess.run([*TIDEMARK, "--zk", zk_connect, "barriers", "--set-interval", "5000", "--from",
                               str(future)], stdin=terminal, capture_output=True, text=True, timeout=120)
    finally:
        os.close(controller)
        os.close(terminal)
    assert done.returncode == 0, done.stderr
    assert "Change the interval? [y/N]" in done.stdout and f"every 5000 ms from {future}" in done.stdout
    assert tm.barriers.grid().changes == ({"from_epoch": future, "interval_ms": 5000},)


def thread_states(pid: int) -> list[str]:
    """The state letter of each thread of process ``pid`` (none once it is gone): ``Z`` for one that ended."""
    states = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            states.append(stat.read_text().rsplit(")", 1)[1].split()[0])
        except OSError:
            pass  # the thread ended meanwhile
    return states


def test_zk_stop_and_status_honour_the_port_and_start_fails_fast_without_zookeeper_classes(tmp_path):
    port, data = free_port(), tmp_path / "zk"
    started = subprocess.run([*TIDEMARK, "zk", "start", "--port", str(port), "--data-dir", str(data)],
                             capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr
    try:
        other = subprocess.run([*TIDEMARK, "zk", "stop", "--port", "1", "--data-dir", str(data)],
                               capture_output=True, text=True, timeout=120)
        assert other.returncode == 1 and other.stderr.count("\n") == 1, other.stderr
        assert f"listens on port {port}, not 1: nothing stopped" in other.stderr
        assert four_letter_word("127.0.0.1", port) == b"imok", "--port 1 stopped the server on another port"
        status = subprocess.run([*TIDEMARK, "zk", "status", "--port", str(port), "--data-dir", str(data), "--json"],
                                capture_output=True, text=True, timeout=120)
        assert status.returncode == 0 and json.loads(status.stdout)["running"] is True
        assert json.loads(status.stdout)["mode"] == "standalone"
        pid = json.loads(status.stdout)["pid"]
        elsewhere = subprocess.run([*TIDEMARK, "zk", "status", "--port", "1", "--data-dir", str(data)],
                                   capture_output=True, text=True, timeout=120)
        assert elsewhere.returncode == 3 and f"listens on {port}" in elsewhere.stdout
        stopped = subprocess.run([*TIDEMARK, "zk", "stop", "--port", str(port), "--data-dir", str(data)],
                                 capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0 and stopped.stdout.strip() == "stopped"
        assert four_letter_word("127.0.0.1", port) is None
        states = thread_states(pid)
        assert set(states) <= {"Z"}, f"zk stop said 'stopped' while the server's threads still run ({states})"
    finally:
        EmbeddedZooKeeper(port, data).stop()

    began = time.monotonic()
    broken = subprocess.run([*TIDEMARK, "zk", "start", "--port", str(free_port()), "--data-dir", str(tmp_path / "b")],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, "TIDEMARK_ZK_CLASSPATH": str(tmp_path / "no-zookeeper.jar")})
    assert time.monotonic() - began < 20, "zk start waited for its timeout after Java had died"
    assert broken.returncode == 1 and broken.stderr.count("\n") == 1, broken.stderr
    assert "failed at once" in broken.stderr and "ClassNotFoundException" in broken.stderr, broken.stderr


def test_each_connection_change_is_one_log_line_and_kazoo_attempts_are_not_logged(tmp_path, caplog):
    server = EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path).start()
    # A session that outlives a slow restart of the server: the connection comes back with the session kept.
    tm = Tidemark.connect(server.connect_string, session_timeout=30, operation_timeout=5)
    changes: list[str] = []
    tm.add_state_listener(changes.append)
    try:
        def outage() -> tuple[list[logging.LogRecord], list[str]]:
            """The log records and connection changes of one outage, taken together: a busy server may flap
            again right after, and a change seen without its line (or the other way round) is no miss."""
            caplog.clear()
            changes.clear()
            server.stop()
            wait_for(lambda: tm.connection_state == "SUSPENDED", "the connection to be suspended", timeout=30)
            server.start()  # kazoo tries to reconnect every few hundred ms meanwhile
            wait_for(lambda: tm.connection_state == "CONNECTED", "the session to be back", timeout=30)
            wait_for(lambda: any("is back" in r.getMessage() for r in caplog.records), "the log line", timeout=10)
            wait_for(lambda: len([r for r in caplog.records if r.name == "coordinator.zookeeper.session"])
                     == len(changes), "a log line for each connection change", timeout=10)
            return list(caplog.records), list(changes)

        with caplog.at_level(logging.DEBUG):
            records, seen = outage()
        ours = [r.getMessage() for r in records if r.name == "coordinator.zookeeper.session"]
        assert len(ours) == len(seen) >= 2, (ours, seen)  # a busy server may flap: still one line each
        assert ours[0].startswith(f"ZooKeeper connection to {server.connect_string} lost: reconnecting"), ours
        assert ours[-1] == f"ZooKeeper connection to {server.connect_string} is back (session kept)", ours
        noise = [r.getMessage() for r in records if r.name.startswith(("kazoo", "coordinator.zookeeper.kazoo"))
                 and r.levelno >= logging.INFO]
        assert noise == [], "kazoo's per-attempt lines were logged"

        # The control: with its level lowered, kazoo's logger shows the attempts this test means to hide.
        KAZOO_LOG.setLevel(logging.INFO)
        try:
            with caplog.at_level(logging.DEBUG):
                records, _ = outage()
        finally:
            KAZOO_LOG.setLevel(logging.ERROR)
        assert any("Connection" in r.getMessage() for r in records if r.name == KAZOO_LOG.name), \
            [(r.name, r.getMessage()) for r in records]
    finally:
        tm.close()
        server.stop()


def test_a_reconnection_stuck_in_a_handshake_the_restarted_server_never_answers_is_tried_again_keeping_the_session(
        tmp_path):
    """kazoo waits for the answer to its handshake for the whole session timeout, and a restarting server can take
    the connection and never answer it (CI saw sessions lost so after ZooKeeper restarts). The session's helper,
    finding the server serving while the session is still not back, drops the stuck attempt; kazoo tries again."""
    port = free_port()
    server = EmbeddedZooKeeper(port=port, data_dir=tmp_path).start()
    tm = Tidemark.connect(server.connect_string, session_timeout=20, operation_timeout=5)
    taken: list[socket.socket] = []
    try:
        tm.register_job("kept", sources=[], sinks=["db.kept"])
        session = tm.client.client_id
        server.stop()
        wait_for(lambda: tm.connection_state == "SUSPENDED", "the connection to be suspended", timeout=30)
        # What the restarting server did: take kazoo's next attempt and never answer its handshake.
        with socket.create_server(("127.0.0.1", port)) as silent:
            silent.settimeout(15)
            taken.append(silent.accept()[0])
        server.start()
        # Without the helper: back only once kazoo's handshake wait (20 s) ran out, after about 20 s.
        wait_for(lambda: tm.connection_state == "CONNECTED", "the session to be back", timeout=15)
        assert tm.client.client_id == session
        assert tm.get(tm.paths.job("kept")) is not None
    finally:
        for connection in taken:
            connection.close()
        tm.close()
        server.stop()
