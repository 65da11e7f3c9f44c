"""Status, the CLI and Prometheus metrics on a real ZooKeeper."""
from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Optional

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from coordinator.errors import ConfigurationError
from coordinator.job.writer import EpochWriter
from coordinator.operations.zookeeper_server import free_port
from coordinator.records import now_ms
from tests.helpers.cli import TIDEMARK, tidemark
from tests.helpers.lake import SCHEMA, create_table, lead_job


def cli(zk_connect: str, *args: str, catalog=None, home: Optional[Path] = None) -> subprocess.CompletedProcess:
    """``tidemark --zk ZK_CONNECT ARGS...`` as a program; ``catalog`` names one, ``home`` (no catalog named) is the
    TIDEMARK_HOME of the embedded default."""
    env = dict(os.environ)
    if catalog is not None:
        env.update(TIDEMARK_CATALOG_URI=catalog.uri, TIDEMARK_WAREHOUSE=catalog.warehouse,
                   TIDEMARK_CATALOG_NAME=catalog.name)
    if home is not None:
        env = {k: v for k, v in env.items() if k not in ("TIDEMARK_CATALOG_URI", "TIDEMARK_WAREHOUSE",
                                                         "TIDEMARK_CATALOG_NAME")}
        env["TIDEMARK_HOME"] = str(home)
    return tidemark("--zk", zk_connect, *args, env=env, timeout=60)


@pytest.fixture
def two_epochs(tm, catalog_settings, namespace):
    """Job ``up`` (root source ``raw``, unchanged) committed two idle epochs at the newest barriers the clock
    has passed and still leads; ``down`` reads its sink and has no leader. Yields up's sink and its last epoch."""
    raw, up, down = f"lake.{namespace}.raw", f"lake.{namespace}.up", f"lake.{namespace}.down"
    catalog = catalog_settings.load()
    create_table(catalog, catalog_settings.identifier(up))
    catalog.create_table(catalog_settings.identifier(raw), schema=SCHEMA)  # no snapshot: it never changes
    tm.register_job("down", sources=[up], sinks=[down])
    writer = lead_job(tm, catalog_settings, "up", [up], sources=(raw,))
    last = tm.barriers.grid().floor(now_ms())
    for t in (last - 1000, last):
        writer.commit_idle(t)
    yield up, last
    writer.close()


def test_status_topology_fence_unregister_from_the_cli(tm, zk_connect, two_epochs, catalog_settings, tmp_path):
    up, last = two_epochs
    status = json.loads(cli(zk_connect, "status", "--json").stdout)
    jobs = {j["name"]: j for j in status["jobs"]}
    assert jobs["up"]["committed_epoch"] == last and jobs["up"]["leader_state"] == "leading"
    assert jobs["down"]["stale"] and jobs["down"]["leader_state"] == "no leader"
    assert status["interval_ms"] == 1000 and status["grid"]["interval_ms"] == 1000
    assert (jobs["up"]["cadence_ms"], jobs["up"]["effective_cadence_ms"], jobs["up"]["cadence_from"]) == (1000, 1000,
                                                                                                          None)
    assert jobs["up"]["pacing"] == {"every_ms": None, "grace_ms": 0}
    assert jobs["down"]["pacing"] is None and jobs["down"]["effective_cadence_ms"] == 1000  # the grid's
    assert status["consistent_epoch"] is None  # down has committed nothing
    assert "pending_barriers" not in jobs["up"] and "newest_barrier" not in status
    assert 0 <= jobs["up"]["lag_seconds"] <= (status["read_ms"] - last) / 1000
    text = cli(zk_connect, "status").stdout
    assert "up: term 1, leading" in text and "cadence 1s" in text and text.startswith("grid: 1000 ms")
    topo = json.loads(cli(zk_connect, "topology", "--format", "json").stdout)
    assert topo["edges"] == [{"from": "up", "table": up, "to": "down"}]
    assert cli(zk_connect, "topology", "--format", "mermaid").stdout.startswith("flowchart LR")
    refused = cli(zk_connect, "unregister", "up")
    assert refused.returncode == 1 and "live leader" in refused.stderr and "Traceback" not in refused.stderr
    assert "term is now 2" in cli(zk_connect, "fence", "up", "--yes").stdout
    assert json.loads(cli(zk_connect, "status", "--json").stdout)["jobs"][1]["leader_state"] == "fenced"
    new_home = tmp_path / "new-home"  # no catalog there, and unregister creates none: the sinks cannot be fenced
    new_home.mkdir()
    without_catalog = cli(zk_connect, "unregister", "up", "--yes", home=new_home)
    assert without_catalog.returncode == 1 and without_catalog.stderr.count("\n") == 1, without_catalog.stderr
    assert "cannot be fenced in Iceberg" in without_catalog.stderr and "--unfenced" in without_catalog.stderr
    assert f"catalog 'lake' at sqlite:///{new_home / 'catalog.db'} does not exist" in without_catalog.stderr
    assert list(new_home.iterdir()) == []
    unconfirmed = cli(zk_connect, "unregister", "up", catalog=catalog_settings)  # no TTY, no --yes: refused
    assert unconfirmed.returncode == 1 and unconfirmed.stderr.count("\n") == 1
    assert f"committed epoch {last}" in unconfirmed.stderr and "pass --yes" in unconfirmed.stderr
    done = cli(zk_connect, "unregister", "up", "--yes", catalog=catalog_settings)
    assert done.returncode == 0 and f"resumes from its sinks' Iceberg metadata: committed epoch {last}" in done.stdout
    assert [j["name"] for j in json.loads(cli(zk_connect, "status", "--json").stdout)["jobs"]] == ["down"]


def test_unreachable_zookeeper_is_a_one_line_error():
    result = tidemark("--zk", f"127.0.0.1:{free_port()}", "--timeout", "1", "status", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "no ZooKeeper server answered" in result.stderr


def test_a_refused_connection_is_reported_at_once_not_after_the_timeout():
    began = time.monotonic()
    port = free_port()
    result = tidemark("--zk", f"127.0.0.1:{port}", "status", timeout=60)  # the default timeout: 15 s
    assert time.monotonic() - began < 10, "a refused connection waited out the connect timeout"
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert f"no ZooKeeper server runs at 127.0.0.1:{port} (127.0.0.1:{port} refused the connection)" in result.stderr
    assert "tidemark zk start" in result.stderr


def test_exporter_serves_the_status(tm, zk_connect, two_epochs):
    _, last = two_epochs
    port = free_port()
    server = subprocess.Popen([*TIDEMARK, "--zk", zk_connect, "exporter",
                               "--port", str(port), "--address", "127.0.0.1"], stdout=subprocess.PIPE, text=True)
    try:
        fetch = Retrying(stop=stop_after_delay(30), wait=wait_fixed(0.2), reraise=True,
                         retry=retry_if_exception_type((OSError, AssertionError)))

        def serving_a_view() -> str:
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            assert "tidemark_up 1.0" in body
            return body
        body = fetch(serving_a_view)
    finally:
        server.terminate()
        server.wait(10)
    samples = {(s.name, s.labels.get("tidemark_job")): s.value
               for f in text_string_to_metric_families(body) for s in f.samples}
    assert samples[("tidemark_job_committed_epoch_timestamp_seconds", "up")] == last / 1000
    assert samples[("tidemark_job_cadence_seconds", "up")] == 1.0
    assert samples[("tidemark_job_effective_cadence_seconds", "down")] == 1.0
    assert samples[("tidemark_job_leader_live", "up")] == 1 and samples[("tidemark_job_stale", "down")] == 1
    assert samples[("tidemark_jobs", None)] == 2
    assert samples[("tidemark_barrier_interval_seconds", None)] == 1.0
    assert ("tidemark_consistent_epoch_timestamp_seconds", None) not in samples  # down has committed nothing
    assert not {name for name, _ in samples} & {"tidemark_job_pending_barriers",
                                                "tidemark_newest_barrier_timestamp_seconds"}


def test_barriers_prints_the_grid_and_each_jobs_cadence_and_changes_the_interval(tm, zk_connect, catalog_settings,
                                                                                 namespace):
    sink, hourly_sink = f"lake.{namespace}.fast", f"lake.{namespace}.slow"
    catalog = catalog_settings.load()
    for table in (sink, hourly_sink):
        create_table(catalog, catalog_settings.identifier(table))
    fast = lead_job(tm, catalog_settings, "fast", [sink])
    slow = EpochWriter(tm, "slow", sources=[], sinks=[hourly_sink], catalog=catalog_settings, interval_ms=1000,
                       every="2s", grace_ms=0)
    slow.open(leader_timeout=30)
    tm.register_job("report", sources=[sink, hourly_sink], sinks=[f"lake.{namespace}.report"])
    try:
        last = tm.barriers.grid().floor(now_ms()) // 2000 * 2000
        fast.commit_idle(last)
        slow.commit_idle(last)

        shown = cli(zk_connect, "barriers")
        assert shown.returncode == 0, shown.stderr
        lines = shown.stdout.splitlines()
        assert lines[0].startswith("grid: every 1000 ms from epoch 0 (") and "in force now: 1000 ms" in lines[0]
        assert f"fast: cadence 1s, last epoch {last} (" in shown.stdout
        assert f"slow: cadence 2s, last epoch {last} (" in shown.stdout
        assert "report: cadence 1s, follows the cadence of slow (2s), last epoch -" in shown.stdout
        report = json.loads(cli(zk_connect, "barriers", "--json").stdout)
        assert report["grid"]["interval_ms"] == 1000 and report["interval_ms"] == 1000
        assert report["grid_point"] % 1000 == 0 and report["grid_point"] <= now_ms()
        assert {j["name"]: (j["cadence_ms"], j["effective_cadence_ms"], j["cadence_from"], j["last_epoch"])
                for j in report["jobs"]} == {"fast": (1000, 1000, None, last), "slow": (2000, 2000, None, last),
                                             "report": (1000, 2000, "slow", None)}
        status_line = next(line for line in cli(zk_connect, "status").stdout.splitlines()
                           if line.startswith("report:"))
        assert "cadence 1s, follows the cadence of slow (2s)" in status_line

        # An interval the 2 s cadence is not a multiple of is refused, naming the job; nothing changes.
        future = tm.barriers.grid().floor(now_ms()) // 6000 * 6000 + 60_000  # a multiple of 2000 and 3000
        refused = cli(zk_connect, "barriers", "--set-interval", "3000", "--from", str(future))
        assert refused.returncode == 1 and refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
        assert refused.stderr.startswith("tidemark: error: nothing changed") and "job slow" in refused.stderr
        with pytest.raises(ConfigurationError, match="nothing changed: with that interval, job slow could not run"):
            tm.barriers.change_interval(3000, effective_from=future)  # the library refuses it as the command does
        assert tm.barriers.grid().changes == ()
        past = cli(zk_connect, "barriers", "--set-interval", "2000", "--from", str(last))
        assert past.returncode == 1 and past.stderr.count("\n") == 1 and "future point" in past.stderr
        missing = cli(zk_connect, "barriers", "--set-interval", "2000")
        assert missing.returncode == 1 and "--from T" in missing.stderr
        assert cli(zk_connect, "barriers", "--set-interval", "0", "--from", str(future)).returncode == 2

        changed = cli(zk_connect, "barriers", "--set-interval", "2000", "--from", str(future), "--yes")
        assert changed.returncode == 0, changed.stderr
        assert f"  every 2000 ms from {future} (" in changed.stdout
        assert tm.barriers.grid().changes == ({"from_epoch": future, "interval_ms": 2000},)
        assert "fast: cadence 1s" in changed.stdout  # its own cadence is the grid's in force now
    finally:
        fast.close()
        slow.close()


def test_barriers_without_a_grid_is_a_one_line_error(zk_connect):
    result = cli(zk_connect, "barriers")
    assert result.returncode == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("tidemark: error: no barrier grid is defined yet")
