"""Status, the CLI and Prometheus metrics on a real ZooKeeper."""
from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from coordinator import EpochCoordinator
from coordinator.zookeeper_server import free_port


def cli(zk_connect: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "coordinator.cli", "--zk", zk_connect, *args],
                          capture_output=True, text=True, timeout=60)


def commit_two_epochs(tm) -> None:
    tm.register_job("up", sources=["raw.in"], sinks=["lake.db.up"])
    tm.register_job("down", sources=["lake.db.up"], sinks=["lake.db.down"])
    grid = tm.barriers.ensure_grid(1000)
    leadership = tm.leadership("up")
    leadership.acquire()
    epochs = EpochCoordinator(leadership, ["lake.db.up"], grid)
    epochs.recover()
    for t in (1000, 2000):
        tm.barriers.agree(t, proposed_by="up")
        epochs.begin(t, {})
        epochs.precommit(t, {"lake.db.up": None})
        epochs.commit(t, {"lake.db.up": None})


def test_status_topology_fence_unregister_from_the_cli(tm, zk_connect):
    commit_two_epochs(tm)
    status = json.loads(cli(zk_connect, "status", "--json").stdout)
    jobs = {j["name"]: j for j in status["jobs"]}
    assert jobs["up"]["committed_epoch"] == 2000 and jobs["up"]["leader_state"] == "leading"
    assert jobs["down"]["stale"] and jobs["down"]["leader_state"] == "no leader"
    assert status["newest_barrier"] == 2000 and jobs["up"]["lag_ms"] == 0
    assert "up: term 1, leading" in cli(zk_connect, "status").stdout
    topo = json.loads(cli(zk_connect, "topology", "--format", "json").stdout)
    assert topo["edges"] == [{"from": "up", "table": "lake.db.up", "to": "down"}]
    assert cli(zk_connect, "topology", "--format", "mermaid").stdout.startswith("flowchart LR")
    refused = cli(zk_connect, "unregister", "up")
    assert refused.returncode == 1 and "live leader" in refused.stderr and "Traceback" not in refused.stderr
    assert "term is now 2" in cli(zk_connect, "fence", "up").stdout
    assert json.loads(cli(zk_connect, "status", "--json").stdout)["jobs"][1]["leader_state"] == "fenced"
    assert cli(zk_connect, "unregister", "up").returncode == 0
    assert [j["name"] for j in json.loads(cli(zk_connect, "status", "--json").stdout)["jobs"]] == ["down"]


def test_unreachable_zookeeper_is_a_one_line_error():
    result = subprocess.run([sys.executable, "-m", "coordinator.cli", "--zk", f"127.0.0.1:{free_port()}",
                             "--timeout", "1", "status"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "no ZooKeeper server answered" in result.stderr


def test_metrics_endpoint_serves_the_status(tm, zk_connect):
    commit_two_epochs(tm)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "coordinator.cli", "--zk", zk_connect, "metrics",
                               "--port", str(port), "--address", "127.0.0.1"], stdout=subprocess.PIPE, text=True)
    try:
        fetch = Retrying(stop=stop_after_delay(30), wait=wait_fixed(0.2), reraise=True,
                         retry=retry_if_exception_type(OSError))
        body = fetch(lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
    finally:
        server.terminate()
        server.wait(10)
    samples = {(s.name, s.labels.get("job")): s.value for f in text_string_to_metric_families(body) for s in f.samples}
    assert samples[("tidemark_job_committed_epoch_ms", "up")] == 2000
    assert samples[("tidemark_job_leader_live", "up")] == 1 and samples[("tidemark_job_stale", "down")] == 1
    assert samples[("tidemark_jobs", None)] == 2 and samples[("tidemark_newest_barrier_ms", None)] == 2000
