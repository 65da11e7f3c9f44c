"""Status, the CLI and Prometheus metrics on a real ZooKeeper."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from coordinator.operations.zookeeper_server import free_port
from coordinator.records import now_ms
from tests.helpers.lake import SCHEMA, agree, create_table, lead_job


def cli(zk_connect: str, *args: str, catalog=None) -> subprocess.CompletedProcess:
    env = None if catalog is None else {**os.environ, "TIDEMARK_CATALOG_URI": catalog.uri,
                                        "TIDEMARK_WAREHOUSE": catalog.warehouse, "TIDEMARK_CATALOG_NAME": catalog.name}
    return subprocess.run([sys.executable, "-m", "coordinator.operations.cli", "--zk", zk_connect, *args],
                          capture_output=True, text=True, timeout=60, env=env, stdin=subprocess.DEVNULL)


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
        agree(tm, t)
        writer.commit_idle(t)
    yield up, last
    writer.close()


def test_status_topology_fence_unregister_from_the_cli(tm, zk_connect, two_epochs, catalog_settings):
    up, last = two_epochs
    status = json.loads(cli(zk_connect, "status", "--json").stdout)
    jobs = {j["name"]: j for j in status["jobs"]}
    assert jobs["up"]["committed_epoch"] == last and jobs["up"]["leader_state"] == "leading"
    assert jobs["down"]["stale"] and jobs["down"]["leader_state"] == "no leader"
    assert status["newest_barrier"] == last and jobs["up"]["pending_barriers"] == 0
    assert 0 <= jobs["up"]["lag_seconds"] <= (status["read_ms"] - last) / 1000
    assert "up: term 1, leading" in cli(zk_connect, "status").stdout
    topo = json.loads(cli(zk_connect, "topology", "--format", "json").stdout)
    assert topo["edges"] == [{"from": "up", "table": up, "to": "down"}]
    assert cli(zk_connect, "topology", "--format", "mermaid").stdout.startswith("flowchart LR")
    refused = cli(zk_connect, "unregister", "up")
    assert refused.returncode == 1 and "live leader" in refused.stderr and "Traceback" not in refused.stderr
    assert "term is now 2" in cli(zk_connect, "fence", "up").stdout
    assert json.loads(cli(zk_connect, "status", "--json").stdout)["jobs"][1]["leader_state"] == "fenced"
    without_catalog = cli(zk_connect, "unregister", "up", "--yes", catalog=None)  # the sinks cannot be fenced
    assert without_catalog.returncode == 1 and without_catalog.stderr.count("\n") == 1
    assert "cannot be fenced in Iceberg" in without_catalog.stderr and "--unfenced" in without_catalog.stderr
    unconfirmed = cli(zk_connect, "unregister", "up", catalog=catalog_settings)  # no TTY, no --yes: refused
    assert unconfirmed.returncode == 1 and unconfirmed.stderr.count("\n") == 1
    assert f"committed epoch {last}" in unconfirmed.stderr and "pass --yes" in unconfirmed.stderr
    done = cli(zk_connect, "unregister", "up", "--yes", catalog=catalog_settings)
    assert done.returncode == 0 and f"resumes from its sinks' Iceberg metadata: committed epoch {last}" in done.stdout
    assert [j["name"] for j in json.loads(cli(zk_connect, "status", "--json").stdout)["jobs"]] == ["down"]


def test_unreachable_zookeeper_is_a_one_line_error():
    result = subprocess.run([sys.executable, "-m", "coordinator.operations.cli", "--zk", f"127.0.0.1:{free_port()}",
                             "--timeout", "1", "status"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "no ZooKeeper server answered" in result.stderr


def test_exporter_serves_the_status(tm, zk_connect, two_epochs):
    _, last = two_epochs
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "coordinator.operations.cli", "--zk", zk_connect, "exporter",
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
    assert samples[("tidemark_job_pending_barriers", "up")] == 0
    assert samples[("tidemark_job_leader_live", "up")] == 1 and samples[("tidemark_job_stale", "down")] == 1
    assert samples[("tidemark_jobs", None)] == 2
    assert samples[("tidemark_newest_barrier_timestamp_seconds", None)] == last / 1000
