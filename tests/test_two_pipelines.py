"""Two pipelines in one tree, on different cadences, one of them stopped: each has its own consistent version, status
headline, freshness series and retained versions, and the stopped one holds back nothing of the other, through the
Python API, the CLI, the exporter's metrics and ``tidemark serve``.

Real ZooKeeper, a real SQLite catalog, real ``EpochWriter`` loops (pyiceberg, no Spark) and a real endpoint.
"""
from __future__ import annotations

import json
import time
import urllib.request

from coordinator.errors import VersionNotFound
from coordinator.history.gc import GarbageCollector
from coordinator.history.resolve import Resolver
from coordinator.history.retention import RetentionPolicy
from coordinator.history.versions import RetainedVersions, tag_name
from coordinator.operations.exporter import view_families
from coordinator.serving.auth import ServerAuth
from coordinator.serving.served_versions import ServedVersions
from coordinator.serving.server import CatalogServer
from coordinator.tidemark import Tidemark
from tests.helpers.background import InBackground
from tests.helpers.cli import run_cli
from tests.helpers.present import present
from tests.helpers.wait import wait_for
from tests.test_status_waiting import INTERVAL, append_epoch, writer
from tests.test_status_waiting import lake as lake  # the fixture: tables in this test's namespace

SLOW_EVERY = 4 * INTERVAL  # the slow pipeline's cadence: every fourth barrier of the grid


def exported(status, label: str) -> dict[tuple, float]:
    return {(s.name, s.labels.get(label)): s.value for family in view_families(status, time.time())
            for s in family.samples}


def served_epoch(server: CatalogServer, table: str) -> int:
    """The epoch a new client of the endpoint (its URI alone, the default scope) is served ``table`` at."""
    with urllib.request.urlopen(f"{server.url}/v1/config", timeout=30) as response:
        prefix = json.loads(response.read())["overrides"]["prefix"]
    namespace, name = table.split(".")[-2:]
    with urllib.request.urlopen(f"{server.url}/v1/{prefix}/namespaces/{namespace}/tables/{name}",
                                timeout=30) as response:
        return int(response.headers["Tidemark-Epoch"])


def test_a_stopped_pipeline_holds_back_nothing_of_another_in_status_metrics_versions_and_the_endpoint(
        tm, connect, catalog_settings, catalog_env, lake, zk_connect, capsys):
    fast_table, slow_table = lake("fast", "slow")
    fast = InBackground(writer(connect(), catalog_settings, "fast", [], [fast_table]), append_epoch(fast_table))
    slow = InBackground(writer(connect(), catalog_settings, "slow", [], [slow_table], every=SLOW_EVERY),
                        append_epoch(slow_table))
    try:
        wait_for(lambda: len(slow.writer.committed) >= 2, "two epochs of the slow pipeline", timeout=90)
        slow.stop()  # stopped without `tidemark pause`: stale, and its pipeline's versions stay where it stopped
        stopped_at = slow.writer.committed[-1]
        wait_for(lambda: fast.writer.committed[-1] > stopped_at + 2 * SLOW_EVERY, "the fast pipeline to move on")

        # The Python API: one status, a pipeline each; the stale job holds back its own pipeline only.
        status = tm.status()
        assert [p.name for p in status.pipelines] == ["fast", "slow"]
        ahead, behind = status.pipeline("fast"), status.pipeline("slow")
        assert present(ahead.consistent_epoch) > stopped_at + 2 * SLOW_EVERY and ahead.stale_jobs == ()
        assert behind.consistent_epoch == stopped_at and behind.stale_jobs == ("slow",)
        assert status.job("slow").stale and not status.job("fast").stale
        assert status.consistent_epoch is None or status.consistent_epoch <= stopped_at  # the `all` scope waits
        resolver = Resolver(catalog_settings.load(), catalog_settings, tm)
        assert present(resolver.resolve([fast_table]).epoch) > stopped_at + 2 * SLOW_EVERY  # its pipeline's
        try:  # every table's: held back by the stopped one (none at all when fast coalesced over its last epoch)
            across_all = resolver.resolve([fast_table], scope="all").epoch
        except VersionNotFound:
            across_all = None
        assert across_all is None or across_all <= stopped_at
        assert resolver.resolve([slow_table]).epoch == stopped_at

        # The CLI: a headline per pipeline, and only the slow one is held back.
        text = run_cli(capsys, "--zk", zk_connect, "status")[1]
        assert text.splitlines()[0] == f"grid: {INTERVAL} ms   pipelines: 2"
        headline = {line.split()[1]: line for line in text.splitlines() if line.startswith("pipeline ")}
        assert headline["fast"].startswith("pipeline fast (1 job): consistent epoch 1")
        assert "held back" not in headline["fast"]
        assert headline["slow"].startswith(f"pipeline slow (1 job): consistent epoch {stopped_at} (")
        assert headline["slow"].endswith("held back by slow")
        report = json.loads(run_cli(capsys, "--zk", zk_connect, "status", "--json")[1])
        assert {p["name"]: p["stale_jobs"] for p in report["pipelines"]} == {"fast": [], "slow": ["slow"]}
        resolved = json.loads(run_cli(capsys, "--zk", zk_connect, "resolve", fast_table, "--json")[1])
        assert resolved["epoch"] > stopped_at + 2 * SLOW_EVERY
        code, _, err = run_cli(capsys, "--zk", zk_connect, "resolve", fast_table, "--scope", "everything")
        assert code == 1 and err.startswith("tidemark: error: scope 'everything' names no group") and \
            err.count("\n") == 1

        # The metrics: each pipeline's freshness is its own.
        by_pipeline = exported(status, "tidemark_pipeline")
        assert by_pipeline[("tidemark_consistent_epoch_timestamp_seconds", "fast")] * 1000 > stopped_at
        assert by_pipeline[("tidemark_consistent_epoch_timestamp_seconds", "slow")] * 1000 == stopped_at
        assert by_pipeline[("tidemark_consistent_lag_seconds", "fast")] < \
            by_pipeline[("tidemark_consistent_lag_seconds", "slow")]
        by_job = exported(status, "tidemark_job")
        assert by_job[("tidemark_job_stale", "slow")] == 1 and by_job[("tidemark_job_stale", "fast")] == 0

        # Retained versions and tags: each pipeline its own, the fast one's newest past the slow one's.
        code, _, err = run_cli(capsys, "--zk", zk_connect, "gc", "--yes", "--policy", "all:1d")
        assert code == 0, err
        retained = RetainedVersions(tm).all()
        newest = {p: max(r.epoch for r in retained if r.pipeline == p) for p in ("fast", "slow")}
        assert newest["fast"] > stopped_at + 2 * SLOW_EVERY and newest["slow"] == stopped_at
        catalog = catalog_settings.load()
        assert tag_name(newest["fast"], "fast") in catalog.load_table(catalog_settings.identifier(fast_table)).refs()
        assert tag_name(stopped_at, "slow") in catalog.load_table(catalog_settings.identifier(slow_table)).refs()
        plan = GarbageCollector(tm, catalog_settings, policy=RetentionPolicy.parse("all:1d")).plan()
        assert plan.consistent_epochs["slow"] == stopped_at and present(plan.consistent_epochs["fast"]) > stopped_at
        listing = run_cli(capsys, "--zk", zk_connect, "versions")[1].splitlines()
        assert [line for line in listing if not line.startswith("  ")] == ["pipeline fast:", "pipeline slow:"]
        assert any(line.startswith(f"  {tag_name(newest['fast'], 'fast')}  ") for line in listing)

        # The endpoint: each table at its own pipeline's version.
        served = ServedVersions(catalog_settings, lambda: Tidemark.connect(zk_connect, read_only=True))
        server = CatalogServer(served, port=0, auth=ServerAuth()).start()
        try:
            assert served_epoch(server, slow_table) == stopped_at
            assert served_epoch(server, fast_table) > stopped_at + 2 * SLOW_EVERY
        finally:
            server.stop()
    finally:
        fast.stop()
