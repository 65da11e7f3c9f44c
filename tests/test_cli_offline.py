"""The ``tidemark`` command before it reaches ZooKeeper: range checks, --help, --version, connect strings, a
ZooKeeper that cannot start, the barrier grid's rules, and logging that the library leaves to applications.

tests/test_cli.py covers the commands against a real ZooKeeper."""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coordinator import ConfigurationError, Tidemark
from coordinator.errors import EpochOrderError, InvalidArgument
from coordinator.operations.cli import EXIT_USAGE, build_parser
from coordinator.operations.zookeeper_server import MAIN_CLASS, EmbeddedZooKeeper, free_port
from coordinator.protocol.barriers import (
    CHANGE_LEAD_MS,
    MAX_INTERVAL_MS,
    BarrierGrid,
    Barriers,
    check_grid_request,
    check_interval,
    preview_grid_request,
)
from coordinator.protocol.pacing import Pacing
from coordinator.settings import Settings, check_connect_string
from tests.helpers.cli import TIDEMARK, assert_one_line_error, run_cli
from tools.docs_reference import commands as all_commands

NOW = 1_800_000_000_000  # a grid point of every interval below


@pytest.mark.parametrize(("argv", "needle"), [
    (["barriers", "--set-interval", "999999999999", "--from", "1800000000000"], "100 to 86400000 ms"),
    (["barriers", "--set-interval", "99"], "100 to 86400000 ms"),
    (["barriers", "--set-interval", "-5000"], "100 to 86400000 ms"),
    (["barriers", "--set-interval", "5s"], "cadence (every='1h')"),
    (["barriers", "--set-interval", "5000", "--from", "99999999999999999"], "0 to 253402300799999"),
    (["--timeout", "0", "status"], "up to 3600"),
    (["zk", "stop", "--port", "0"], "1-65535"),
    (["exporter", "--refresh", "1e9"], "up to 3600"),
    (["gc", "--wait", "nan"], "up to 3600"),
    (["gc", "--orphans", "--older-than", "1h"], "less than a day"),
    (["resolve", "--as-of", "-1", "db.t"], "neither an epoch"),
])
def test_numbers_out_of_range_are_refused_in_one_line_saying_what_is_allowed(capsys, argv, needle):
    assert_one_line_error(*run_cli(capsys, *argv)[::2], needle, status=EXIT_USAGE)


@pytest.mark.parametrize("command", ["fence", "unregister", "pause", "retire", "resume"])
def test_every_command_that_takes_a_job_checks_its_name_the_same_way_before_connecting(capsys, command):
    code, _, err = run_cli(capsys, "--zk", "127.0.0.1:1", command, "a/b", "--yes")
    assert_one_line_error(code, err, "job name 'a/b' has characters that cannot be used ('/')", status=EXIT_USAGE)


def test_every_option_of_every_command_is_explained_in_its_help(capsys):
    commands = all_commands(build_parser())
    unexplained = [f"{name} {'/'.join(action.option_strings) or action.dest}"
                   for name, command in commands
                   for action in command._actions
                   if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) and not action.help]
    assert unexplained == []
    assert {"tidemark lakehouse start", "tidemark lakehouse env", "tidemark zk status"} <= dict(commands).keys()
    for name, command in commands:  # each one's own help, `lakehouse start --help` included
        assert run_cli(capsys, *name.split()[1:], "--help")[:2] == (0, command.format_help()), name
    assert run_cli(capsys, "barriers", "--help")[:2] == (0, build_parser()._subparsers._group_actions[0]  # type: ignore
                                                         .choices["barriers"].format_help())
    out = run_cli(capsys, "--help")[1]
    assert "--yes" in out and "--dry-run" in out and "--json" in out and "--version" in out


def test_every_command_says_what_it_is_for_at_the_top_of_its_help(capsys):
    """``tidemark status --help`` opens with the line ``tidemark --help`` gives the command, as every command does."""
    listed = {f"{parent} {choice.dest}": choice.help for parent, command in all_commands(build_parser())
              for action in command._actions if isinstance(action, argparse._SubParsersAction)
              for choice in action._choices_actions}
    assert {"tidemark status", "tidemark versions", "tidemark zk stop"} <= listed.keys()
    for name, helptext in listed.items():
        assert helptext, f"{name} has no help line"
        out = run_cli(capsys, *name.split()[1:], "--help")[1]
        description = " ".join(out.split("\n\n")[1].split())  # the paragraph after the usage, unwrapped
        assert description == " ".join(helptext.split()), f"{name}: its help does not open with what it is for"


def test_version_names_the_installed_distribution():
    tidemark = shutil.which("tidemark", path=str(Path(sys.executable).parent))
    assert tidemark is not None, "the entry point is installed with the package"
    result = subprocess.run([tidemark, "--version"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stderr == ""
    name, version = result.stdout.split()[:2]
    assert name.startswith("tidemark") and version[0].isdigit(), result.stdout
    assert f"coordinator at {Path(__file__).resolve().parent.parent / 'coordinator'}" in result.stdout


def test_version_and_help_load_neither_iceberg_nor_arrow():
    """`tidemark --version` took 1.5 s of CPU: the package imported its whole stack up front."""
    probe = ("import sys\nfrom coordinator.operations import cli\n"
             "for argv in (['--version'], ['--help'], ['lakehouse', 'start', '--help']):\n"
             "    try:\n        cli.main(argv)\n    except SystemExit:\n        pass\n"
             "print(sorted(m for m in ('pyiceberg', 'pyarrow', 'pandas', 'duckdb') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "[]", done.stdout[-300:] + done.stderr


@pytest.mark.parametrize("connect", ["127.0.0.1:2181/bad//chroot", "127.0.0.1:2181/a/", "127.0.0.1:2181/a/./b",
                                     "127.0.0.1:2181,", ",127.0.0.1:2181", "127.0.0.1:notaport", "127.0.0.1:0",
                                     "[::1:2181", "127.0.0.1:2181/a\x01"])
def test_a_malformed_connect_string_is_a_configuration_error(connect, capsys, monkeypatch):
    with pytest.raises(ConfigurationError, match="connect string"):
        check_connect_string(connect)
    with pytest.raises(ConfigurationError, match="TIDEMARK_ZK"):
        Settings.from_env({"TIDEMARK_ZK": connect})
    with pytest.raises(ConfigurationError, match="connect string"):  # before any connection is tried
        Tidemark.connect(connect, connect_timeout=1)
    code, _, err = run_cli(capsys, "--zk", connect, "status")
    assert code == 1 and err.startswith("tidemark: error: ZooKeeper connect string") and err.count("\n") == 1, err
    monkeypatch.setenv("TIDEMARK_ZK", connect)
    code, _, err = run_cli(capsys, "status")
    assert code == 1 and "(TIDEMARK_ZK) is malformed" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("connect", ["zk1:2181", "zk1:2181,zk2:2182/tidemark/prod", "10.0.0.1,10.0.0.2/x",
                                     "[::1]:2181/t", "zk1:2181/"])
def test_well_formed_connect_strings_pass(connect):
    assert check_connect_string(connect) == connect == Settings.from_env({"TIDEMARK_ZK": connect}).zk_connect


def fake_java(tmp_path: Path, body: str) -> dict[str, str]:
    """A JAVA_HOME whose java prints what a broken installation prints: Java itself is what is broken here."""
    (tmp_path / "bin").mkdir(parents=True)
    java = tmp_path / "bin" / "java"
    java.write_text(f"#!/bin/sh\n{body}\n")
    java.chmod(0o755)
    return {**os.environ, "JAVA_HOME": str(tmp_path)}


@pytest.mark.parametrize("body", [
    # The JVM exits at once.
    'echo "Error: Could not find or load main class x" >&2\n'
    'echo "Caused by: java.lang.ClassNotFoundException: x" >&2\nexit 1',
    # The main thread died but the JVM lingers (a non-daemon thread): its log says it will never serve.
    'echo \'Exception in thread "main" java.lang.NoClassDefFoundError: org/slf4j/LoggerFactory\' >&2\nexec sleep 60',
])
def test_zk_start_fails_as_soon_as_java_fails(tmp_path, body):
    env = fake_java(tmp_path / "java", body)
    started = time.monotonic()
    result = subprocess.run([*TIDEMARK, "zk", "start", "--port", str(free_port()), "--data-dir", str(tmp_path / "zk")],
                            capture_output=True, text=True, timeout=60, env=env)
    # well before the 30 s start timeout, with room for a CLI that takes seconds to start on a loaded machine
    assert time.monotonic() - started < 22, "it waited for the start timeout"
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "failed at once" in result.stderr and ("ClassNotFoundException" in result.stderr
                                                  or "NoClassDefFoundError" in result.stderr), result.stderr
    assert EmbeddedZooKeeper(data_dir=tmp_path / "zk").recorded_state() is None
    assert not subprocess.run(["pgrep", "-f", str(tmp_path / "zk" / "zoo.cfg")], capture_output=True).stdout, \
        "a lingering JVM was left running"


def test_zk_status_and_stop_say_where_no_server_is_recorded(tmp_path, capsys):
    code, out, _ = run_cli(capsys, "zk", "status", "--data-dir", str(tmp_path), "--json")
    assert code == 3 and '"running": false' in out
    code, out, _ = run_cli(capsys, "zk", "stop", "--port", "2999", "--data-dir", str(tmp_path))
    assert code == 0 and out.strip() == f"no ZooKeeper server recorded in {tmp_path}"
    assert MAIN_CLASS.endswith("ZooKeeperServerMain")


# -- the barrier grid's rules (pure arithmetic; tests/test_cli.py drives them through ZooKeeper) ---------------

def test_interval_changes_take_effect_ahead_of_the_clock_on_the_grid():
    grid = BarrierGrid(5000)
    assert grid.earliest_change(10_000, NOW) == NOW + 10_000  # 5 s ahead, on the grid and a multiple of 10 s
    changed = grid.with_change(10_000, NOW + 60_000, NOW)
    assert changed.changes == ({"from_epoch": NOW + 60_000, "interval_ms": 10_000},)
    assert changed.pending(NOW) == changed.changes and changed.pending(NOW + 60_000) == ()
    for refused in (NOW, NOW + CHANGE_LEAD_MS - 1000, NOW + 61_000, NOW + 65_000, NOW + 31 * 86_400_000):
        with pytest.raises(EpochOrderError, match=f"The earliest is {NOW + 10_000}"):
            grid.with_change(10_000, refused, NOW)
    for interval in (0, MAX_INTERVAL_MS + 1, 999_999_999_999, True, "5000"):
        with pytest.raises(ConfigurationError, match="cadence"):
            grid.with_change(interval, NOW + 60_000, NOW)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            check_interval(interval)


def test_a_grid_stuck_on_an_absurd_interval_is_left_at_a_multiple_of_the_new_interval():
    past = NOW - 60_000
    stuck = BarrierGrid(5000, changes=({"from_epoch": past, "interval_ms": 999_999_999_999},))
    assert stuck.next_candidate(NOW) == past + 999_999_999_999 and stuck.floor(NOW + 3_600_000) == past
    earliest = stuck.earliest_change(5000, NOW)
    assert earliest == NOW + CHANGE_LEAD_MS  # NOW is a multiple of 5000: the first one 5 s ahead
    freed = stuck.with_change(5000, earliest, NOW)
    assert freed.floor(earliest + 7000) == earliest + 5000 and freed.is_barrier(past)  # the old epochs stay
    assert Pacing(every_ms=60_000, grace_ms=0).newest_by_clock(freed, NOW + 120_000) == NOW + 120_000
    with pytest.raises(EpochOrderError, match="multiple of the new interval"):
        stuck.with_change(5000, earliest + 1000, NOW)  # off the new interval's multiples: cadences never meet it


def test_pending_changes_are_cancelled_while_they_are_ahead_of_the_clock():
    grid = BarrierGrid(5000).with_change(10_000, NOW + 60_000, NOW).with_change(20_000, NOW + 120_000, NOW)
    reverted, removed = grid.without_pending(NOW)
    assert reverted == BarrierGrid(5000) and len(removed) == 2
    one, removed = grid.without_pending(NOW, NOW + 120_000)
    assert one.changes == ({"from_epoch": NOW + 60_000, "interval_ms": 10_000},) and len(removed) == 1
    with pytest.raises(EpochOrderError, match="no pending interval change at 1"):
        grid.without_pending(NOW, 1)
    with pytest.raises(EpochOrderError, match="in less than 5 s"):
        grid.without_pending(NOW + 57_000)
    with pytest.raises(EpochOrderError, match="no interval change is pending"):
        grid.without_pending(NOW + 120_000)


class _NoJobs(Barriers):
    """Barriers without ZooKeeper: no registered job, so every cadence suits a change (the checks are recorded)."""

    def __init__(self) -> None:
        self.checked: list[tuple[BarrierGrid, int]] = []

    def check_cadences(self, changed: BarrierGrid, effective_from: int) -> None:
        self.checked.append((changed, effective_from))


def test_a_request_of_the_grid_is_checked_by_the_protocol_as_the_command_checks_it(capsys):
    assert check_grid_request() is False and check_grid_request(revert=True, effective_from=NOW) is True
    with pytest.raises(InvalidArgument, match="--set-interval and --revert do not go together"):
        check_grid_request(5000, revert=True)
    with pytest.raises(InvalidArgument, match="--from T goes with"):
        check_grid_request(effective_from=NOW)
    grid, barriers = BarrierGrid(5000).with_change(20_000, NOW + 120_000, NOW), _NoJobs()
    assert preview_grid_request(barriers, grid, NOW) == () and barriers.checked == []
    with pytest.raises(InvalidArgument, match=f"needs --from T, .* the earliest allowed is {NOW + 10_000} "):
        preview_grid_request(barriers, grid, NOW, 10_000)
    with pytest.raises(ConfigurationError, match="cadence"):
        preview_grid_request(barriers, grid, NOW, 0)  # out of range: said as such, not a division by zero
    added = preview_grid_request(barriers, grid, NOW, 10_000, NOW + 60_000)
    assert added == ({"from_epoch": NOW + 60_000, "interval_ms": 10_000},)
    assert barriers.checked == [(grid.with_change(10_000, NOW + 60_000, NOW), NOW + 60_000)]
    assert preview_grid_request(barriers, grid, NOW, revert=True) == grid.changes
    with pytest.raises(EpochOrderError, match="no pending interval change at 1"):
        preview_grid_request(barriers, grid, NOW, revert=True, effective_from=1)
    # The command refuses a malformed request before it connects (nothing listens on port 1).
    for argv in (["--set-interval", "5000", "--revert"], ["--from", str(NOW)]):
        code, _, err = run_cli(capsys, "--zk", "127.0.0.1:1", "--timeout", "1", "barriers", *argv)
        assert_one_line_error(code, err, "--from T goes with" if argv[0] == "--from" else "do not go together")


# -- logging: the library configures nothing; the command shows its warnings on stderr --------------------------

def test_importing_the_library_configures_no_logging():
    code = ("import logging, coordinator, coordinator.operations.cli, coordinator.history.gc, "
            "coordinator.job.writer, spark_hooks\n"
            "root = logging.getLogger()\n"
            "print(len(root.handlers), root.level == logging.WARNING,"
            " [n for n in ('coordinator', 'spark_hooks', 'kazoo') if logging.getLogger(n).handlers])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.split() == ["0", "True", "[]"], result.stdout
