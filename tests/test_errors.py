"""No leaks: each failure the issue found is one ``TidemarkError``, and one ``tidemark: error:`` line from the CLI."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from coordinator import (
    CatalogSettings,
    ConfigurationError,
    CorruptState,
    EmbeddedZooKeeper,
    InvalidName,
    Tidemark,
    TidemarkError,
    VersionNotFound,
    ZooKeeperUnavailable,
)
from coordinator.errors import MultiFailed
from coordinator.history.resolve import Resolver
from coordinator.names import validate_name
from coordinator.operations.zookeeper_server import free_port
from coordinator.records import now_ms
from tests.helpers.cli import TIDEMARK, assert_one_line_error, run_cli
from tests.helpers.lake import commit_rows, create_table, lead_job


def test_multi_failed_is_a_tidemark_error():
    assert issubclass(MultiFailed, TidemarkError)


@pytest.mark.parametrize("argv, needle", [
    (["--root", "tidemark", "status"], "absolute znode path"),
    (["--zk", "host:notaport", "status"], "connect string"),
])
def test_malformed_settings_are_one_line(capsys, argv, needle):
    assert_one_line_error(*run_cli(capsys, *argv)[::2], needle)


@pytest.mark.parametrize("argv", [["--timeout", t, "status"] for t in ("nan", "inf", "0", "-1", "x", "1e9")] + [
                                 ["resolve", "--as-of", "1e30", "db.t"],
                                 ["exporter", "--port", "99999"], ["nosuchcommand"]])
def test_usage_errors_exit_2_in_one_line(capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and err.startswith("tidemark: error: ") and err.count("\n") == 1, err


def test_corrupt_znodes_are_one_line_naming_the_znode(tm, zk_connect, capsys):
    tm.register_job("counts", sources=["db.words"], sinks=["db.counts"])
    tm.barriers.ensure_grid(interval_ms=1000)
    for odd in ("²", "12a", "9" * 40):  # child znodes that are not epochs are ignored
        tm.client.create(tm.paths.barriers + "/" + odd)
        tm.client.create(tm.paths.epochs("counts") + "/" + odd)
    code, out, err = run_cli(capsys, "--zk", zk_connect, "status")
    assert code == 0 and "counts" in out, err

    mark = tm.paths.tidemark("db.counts")
    for raw in (json.dumps({"table": "db.counts", "epoch": 10 ** 30}).encode(), b"[" * 100_000 + b"]" * 100_000,
                json.dumps({"table": "db.counts", "epoch": 2 ** 62}).encode()):
        tm.client.set(mark, raw)
        assert_one_line_error(*run_cli(capsys, "--zk", zk_connect, "status")[::2], mark)
        with pytest.raises(CorruptState):
            tm.tidemarks(["db.counts"])


def test_table_names_are_strict():
    for bad in ("words\n", "db.words\n", "a/b", "..", "db..t", "²", " db.t"):
        with pytest.raises(InvalidName):
            validate_name(bad, "table name")


def test_tidemark_cache_with_zookeeper_down_raises_unavailable(tmp_path):
    server = EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path).start()
    tm = Tidemark.connect(server.connect_string, session_timeout=2, operation_timeout=2)
    try:
        cache = tm.tidemark_cache()
        assert cache.get(["db.a"]) == {"db.a": None}
        server.stop()
        with pytest.raises(ZooKeeperUnavailable):
            cache.get(["db.a", "db.b"])
        with pytest.raises(ZooKeeperUnavailable):
            tm.tidemarks(["db.a"])
    finally:
        tm.close()
        server.stop()


def test_catalog_mistakes_are_one_line_and_create_nothing(capsys, monkeypatch, tmp_path):
    missing = tmp_path / "nope" / "dir" / "catalog.db"
    monkeypatch.setenv("TIDEMARK_CATALOG_URI", f"sqlite:///{missing}")
    assert_one_line_error(*run_cli(capsys, "resolve", "--no-zk", "db.words")[::2], str(missing), "does not exist")
    assert not (tmp_path / "nope").exists()
    with pytest.raises(ConfigurationError):
        CatalogSettings.from_env().spark_conf()

    monkeypatch.delenv("TIDEMARK_CATALOG_URI")
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path / "home"))  # the embedded default is not created either
    assert_one_line_error(*run_cli(capsys, "resolve", "--no-zk", "db.words")[::2],
                          f"catalog 'lake' at sqlite:///{tmp_path / 'home' / 'catalog.db'} does not exist")
    assert not (tmp_path / "home").exists()

    CatalogSettings.embedded(tmp_path / "home").load()  # a program that asks for it
    assert_one_line_error(*run_cli(capsys, "resolve", "--no-zk", "words")[::2], "no namespace")
    assert_one_line_error(*run_cli(capsys, "resolve", "--no-zk", "db.words")[::2], "'db.words' does not exist")


def test_resolve_as_of_before_any_history_is_version_not_found(tm, zk_connect, capsys, monkeypatch, tmp_path,
                                                                 namespace):
    settings = CatalogSettings.embedded(tmp_path)
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path))
    sink = f"{namespace}.counts"
    create_table(settings.load(), sink)
    writer = lead_job(tm, settings, "counts", [sink])
    first = (now_ms() // 1000 - 5) * 1000
    try:
        commit_rows(writer, first)
    finally:
        writer.close()
    for flags in ([], ["--no-zk"]):
        code, _, err = run_cli(capsys, "--zk", zk_connect, "resolve", *flags, "--as-of", str(first - 1000), sink)
        assert_one_line_error(code, err, "before the first epoch")
    resolver = Resolver(settings.load(), settings, tm)
    with pytest.raises(VersionNotFound):
        resolver.resolve([sink], as_of=first - 1000)


def test_exporter_port_in_use_is_one_line(zk_connect, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        code, _, err = run_cli(capsys, "--zk", zk_connect, "exporter", "--address", "127.0.0.1",
                           "--port", str(busy.getsockname()[1]))
    assert_one_line_error(code, err, "pick another port")


def test_a_closed_pipe_ends_the_command_quietly(zk_connect):
    read_end, write_end = os.pipe()
    os.close(read_end)  # nobody will ever read: the first write fails with EPIPE
    result = subprocess.run([*TIDEMARK, "--zk", zk_connect, "topology"],
                            stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    os.close(write_end)
    assert result.returncode == 141 and result.stderr == ""


def test_unreadable_tidemark_table_properties_are_one_line(capsys, monkeypatch, tmp_path, namespace):
    monkeypatch.setenv("TIDEMARK_HOME", str(tmp_path))
    table = create_table(CatalogSettings.embedded(tmp_path).load(), f"{namespace}.t")
    with table.transaction() as tx:
        tx.set_properties({"tidemark.writer": "j", "tidemark.committed-epoch": "1000", "tidemark.first-epoch": "x"})
    assert_one_line_error(*run_cli(capsys, "resolve", "--no-zk", f"{namespace}.t")[::2], "tidemark.first-epoch")
    with table.transaction() as tx:
        tx.set_properties({"tidemark.committed-epoch": "soon"})
    assert_one_line_error(*run_cli(capsys, "resolve", "--no-zk", f"{namespace}.t")[::2], "tidemark.committed-epoch")


def test_as_of_is_asked_for_with_an_epoch_not_by_its_level_name(tmp_path):
    """``level="as_of"`` without ``as_of=T`` resolved like ``consistent`` but was labelled as-of (and a reader session
    then skipped its never-go-back rule): refused, saying how to ask."""
    from coordinator.history.resolve import Resolver
    settings = CatalogSettings.embedded(tmp_path)
    with pytest.raises(ConfigurationError, match="pass as_of=T"):
        Resolver(settings.load(), settings).resolve(["db.a"], level="as_of")


GRID_SCRIPT = """
import sys
from coordinator import CatalogSettings, EpochWriter, Tidemark
writer = EpochWriter(Tidemark.connect(sys.argv[1]), "slow", sources=[], sinks=[sys.argv[2]],
                     catalog=CatalogSettings.embedded(sys.argv[3]), interval_ms=5000)
writer.run(lambda ctx: None, max_epochs=1)
"""


def test_a_scripts_uncaught_error_is_one_line_and_its_traceback_is_behind_tidemark_debug(
        tm, zk_connect, catalog, catalog_settings, lake_home, namespace):
    """A newcomer's job on a 5,000 ms grid where the quickstart made a 1,000 ms one: the script's uncaught
    ``ConfigurationError`` is one ``tidemark: error:`` line saying what to do (status 1), as the CLI's; with
    ``TIDEMARK_DEBUG=1`` Python's traceback is printed too."""
    fast, slow = f"{namespace}.fast", f"{namespace}.slow"
    for table in (fast, slow):
        create_table(catalog, table)
    lead_job(tm, catalog_settings, "fast", [fast]).close()
    command = [sys.executable, "-c", GRID_SCRIPT, zk_connect, slow, str(lake_home)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("tidemark: error: the shared barrier grid is every 1000 ms"), done.stderr
    assert "tidemark barriers --set-interval" in done.stderr and "Traceback" not in done.stderr, done.stderr
    debug = subprocess.run(command, capture_output=True, text=True, timeout=120,
                           env={**os.environ, "TIDEMARK_DEBUG": "1"})
    assert debug.returncode == 1 and debug.stderr.startswith("Traceback"), debug.stderr
    assert "ConfigurationError: the shared barrier grid is every 1000 ms" in debug.stderr, debug.stderr
