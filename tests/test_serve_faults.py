"""``tidemark serve`` under faults, on servers of its own: ZooKeeper stopped (the last version is still served, marked
stale, never a newer unchecked one; fresh again once ZooKeeper is back) and the backing PostgreSQL catalog stopped (a
503 in the spec's error model that says what is wrong; served again once it is back). The endpoint killed mid-read,
ZooKeeper wiped and rebuilt under a running endpoint are fault-suite scenarios (tests/faults: serve-kill, zk-wipe,
zk-rebuilt), where every read goes through it."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from coordinator import CatalogSettings, EmbeddedZooKeeper
from coordinator.operations.zookeeper_server import free_port
from coordinator.serving.served_versions import ServedVersions
from coordinator.serving.server import CatalogServer
from coordinator.tidemark import Tidemark
from coordinator.zookeeper.ops import SetData
from tests.helpers.mixed_lake import MixedLake
from tests.helpers.postgres import PostgresServer
from tests.helpers.present import present
from tests.helpers.wait import wait_for
from tests.helpers.zookeeper_tree import wipe_zookeeper


def load(server: CatalogServer, table: str, agent: str) -> tuple[int, Any]:
    namespace, name = table.split(".")
    request = urllib.request.Request(f"{server.url}/v1/pipeline/namespaces/{namespace}/tables/{name}",
                                     headers={"User-Agent": agent})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.headers  # an email Message: its names match in any case
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())["error"]


def metric(server: CatalogServer, name: str) -> float:
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no {name} in /metrics")


@pytest.fixture
def own_zookeeper(tmp_path):
    with EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path / "zookeeper") as zk:
        yield zk


def test_zookeeper_unreachable_serves_the_last_version_marked_stale_then_newer_ones_again(
        own_zookeeper, catalog, catalog_settings, namespace):
    tm = Tidemark.connect(own_zookeeper.connect_string, session_timeout=30, operation_timeout=30)
    lake = MixedLake(catalog, catalog_settings, namespace)
    lake.open(tm)
    served = ServedVersions(catalog_settings, lambda: Tidemark.connect(own_zookeeper.connect_string, read_only=True,
                                                                        connect_timeout=2, operation_timeout=2))
    server = CatalogServer(served, port=0).start()
    try:
        for epoch in (1000, 2000):
            lake.root_epoch(lake.up, epoch)
            lake.copy_epoch(epoch)
        lake.root_epoch(lake.up, 3000)                  # up ahead: 3000 is not consistent yet
        status, headers = load(server, lake.down, "before")
        assert status == 200 and headers["Tidemark-Epoch"] == "2000" and "Tidemark-Stale" not in headers
        assert metric(server, "tidemark_serve_zookeeper_connected") == 1.0

        own_zookeeper.stop()
        wait_for(lambda: not served.zookeeper_connected, "the server to see ZooKeeper gone", 30)
        started = time.monotonic()
        for table in (lake.up, lake.down):
            status, headers = load(server, table, f"during {table}")
            assert status == 200, headers
            assert headers["Tidemark-Epoch"] == "2000" and headers["Tidemark-Stale"] == "zookeeper-unreachable"
        assert time.monotonic() - started < 5, "a stale answer must not wait out ZooKeeper's timeouts"
        assert metric(server, "tidemark_serve_zookeeper_connected") == 0.0
        assert metric(server, "tidemark_serve_stale_tables_total") == 2.0

        own_zookeeper.start()
        lake.copy_epoch(3000)
        # Polled past the query gap, so that each load is a query of its own (polls 50 ms apart are one busy
        # client's query, held on its version up to --max-hold).
        wait_for(lambda: load(server, lake.down, "after")[1].get("Tidemark-Epoch") == "3000",
                 "the newer version once ZooKeeper is back", 60, every=0.6)
        assert "Tidemark-Stale" not in load(server, lake.up, "after again")[1]
    finally:
        server.stop()
        lake.close()
        tm.close()


def test_the_backing_catalog_down_is_a_503_saying_so_and_served_again_once_back(zk_connect, tmp_path, namespace):
    with PostgresServer() as postgres:
        settings = CatalogSettings(name="pg", uri=postgres.uri, warehouse=f"file://{tmp_path / 'warehouse'}")
        tm = Tidemark.connect(zk_connect)
        lake = MixedLake(settings.load(), settings, namespace)
        lake.open(tm)
        server = CatalogServer(ServedVersions(settings, lambda: Tidemark.connect(zk_connect, read_only=True)),
                               port=0).start()
        # a second replica that makes no client of the catalog before it is down: making its first one fails then
        fresh = CatalogServer(ServedVersions(settings, lambda: Tidemark.connect(zk_connect, read_only=True)),
                              port=0).start()
        try:
            lake.root_epoch(lake.up, 1000)
            lake.copy_epoch(1000)
            assert load(server, lake.down, "before")[0] == 200
            postgres.stop()
            # a served version's answer is kept a second (its snapshots never change): then the catalog is asked
            wait_for(lambda: load(server, lake.down, "during")[0] != 200, "an answer once the kept one expired", 30)
            status, error = load(server, lake.down, "during")
            assert (status, error["code"], error["type"]) == (503, 503, "ServiceUnavailableException")
            assert "the backing catalog" in error["message"] and "cannot be reached" in error["message"], error
            status, error = load(fresh, lake.down, "a new client during")
            assert (status, error["type"]) == (503, "ServiceUnavailableException"), error
            postgres.start()
            wait_for(lambda: load(server, lake.down, "after")[0] == 200, "the table served again", 60)
            wait_for(lambda: load(fresh, lake.down, "after")[0] == 200, "the second replica serving again", 60)
        finally:
            fresh.stop()
            server.stop()
            lake.close()
            tm.close()


def test_a_tidemark_table_whose_job_is_gone_is_a_503_until_its_writer_released_it(
        zk_server, zk_connect, catalog, catalog_settings, namespace):
    """An endpoint started after ZooKeeper lost its state (here: the tree deleted under the test's jobs) knows no job
    of a Tidemark table, and its catalog's current snapshot may be older than what readers were served: a 503 that
    says why, until the job registers again. Once the writer released the table (``tidemark release``, as
    ``tidemark unregister`` does), it is served as its catalog has it, the rule a ``Resolver`` follows too."""
    tm = Tidemark.connect(zk_connect, session_timeout=30, operation_timeout=30)
    lake = MixedLake(catalog, catalog_settings, namespace)
    lake.open(tm)
    lake.root_epoch(lake.up, 1000)
    lake.copy_epoch(1000)
    lake.close()
    tm.close()
    wipe_zookeeper(zk_server, zk_connect)
    with Tidemark.connect(zk_connect, session_timeout=30, operation_timeout=30) as operator:
        served = ServedVersions(catalog_settings, lambda: Tidemark.connect(zk_connect, read_only=True))
        server = CatalogServer(served, port=0).start()
        try:
            status, error = load(server, lake.down, "after the loss")
            assert (status, error["type"]) == (503, "ServiceUnavailableException"), error
            assert "not registered in ZooKeeper now and did not release it" in error["message"], error
            assert f"tidemark release {lake.down}" in error["message"], error

            operator.release_tables([lake.down], confirm=True, catalog=catalog_settings)
            status, headers = load(server, lake.down, "after the release")
            assert status == 200, headers
            assert "Tidemark-Epoch" not in headers, "a table in no job's group has no served epoch"
        finally:
            server.stop()


def test_a_tidemark_behind_its_tables_iceberg_metadata_is_a_503_not_an_older_version(
        zk_connect, catalog, catalog_settings, namespace):
    """A tree restored from an older copy holds older tidemarks: an endpoint started then would serve versions
    older than readers were served before. A table whose metadata proves a newer epoch of its writer committed (two
    newer epochs in ``main``, or the committed-epoch marker) is a 503 saying so, until its job has resumed."""
    tm = Tidemark.connect(zk_connect, session_timeout=30, operation_timeout=30)
    lake = MixedLake(catalog, catalog_settings, namespace)
    lake.open(tm)
    try:
        lake.root_epoch(lake.up, 1000)
        lake.copy_epoch(1000)
        copy = {t: present(tm.get(tm.paths.tidemark(t)))[0] for t in (lake.up, lake.down)}  # the older copy's
        for epoch in (2000, 3000):
            lake.root_epoch(lake.up, epoch)
            lake.copy_epoch(epoch)
        tm.multi([SetData(tm.paths.tidemark(t), data) for t, data in copy.items()])  # those znodes restored
        served = ServedVersions(catalog_settings, lambda: Tidemark.connect(zk_connect, read_only=True))
        server = CatalogServer(served, port=0).start()
        try:
            for table in (lake.up, lake.down):
                status, error = load(server, table, f"after the restore {table}")
                assert (status, error["type"]) == (503, "ServiceUnavailableException"), (table, error)
                assert "shows epoch 2000" in error["message"] and "older copy" in error["message"], error
        finally:
            server.stop()
    finally:
        lake.close()
        tm.close()
