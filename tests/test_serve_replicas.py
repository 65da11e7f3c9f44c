"""``tidemark serve``'s replicas behind a load balancer with no affinity (HAProxy, every request balanced
round-robin on its own), as the chart runs them: one version per query and never back, while the pipeline commits
about every 500 ms and replicas are killed with ``kill -9`` and restarted. A client's query spans replicas; its hold
(a cookie) tells each replica which version the query reads (``coordinator/serving/hold.py``).
"""
from __future__ import annotations

import functools
import threading

from coordinator.serving.hold import DEFAULT_QUERY_GAP_MS
from tests.helpers.balancer import Balancer
from tests.helpers.mixed_lake import MixedLake, MovingPipeline
from tests.helpers.served import EpochRecordingClient, ServeProcess
from tests.helpers.wait import wait_for

QUERIES = 30  # per client
PIPELINE_PAUSE_S = 0.4  # between epochs: with an epoch's own commits, one about every 500 ms


def test_replicas_behind_a_round_robin_balancer_serve_one_version_per_query_and_never_back(
        tm, catalog, catalog_settings, namespace, zk_connect, tmp_path):
    lake = MixedLake(catalog, catalog_settings, namespace)
    lake.open(tm)
    moving = MovingPipeline(lake, pause_s=PIPELINE_PAUSE_S).start()
    replicas = [ServeProcess(catalog_settings, zk_connect, tmp_path / f"replica{i}") for i in range(3)]
    panels = [[lake.down], [lake.up, lake.down]]
    try:
        for replica in replicas:
            replica.start()
        with Balancer(tmp_path / "haproxy", [replica.port for replica in replicas]) as balancer:
            clients = [EpochRecordingClient(balancer.url, panels[i % 2:] + panels[:i % 2],
                                            pause_s=2 * DEFAULT_QUERY_GAP_MS / 1000) for i in range(3)]
            threads = [threading.Thread(target=client.run, args=(QUERIES,)) for client in clients]
            for thread in threads:
                thread.start()

            def made(queries: int) -> bool:
                return sum(len(client.queries) for client in clients) >= queries
            for victim, after in ((replicas[1], 15), (replicas[2], 45)):
                wait_for(functools.partial(made, after), f"{after} queries", timeout=300)
                victim.kill()                                          # kill -9, mid-traffic
                wait_for(functools.partial(made, after + 10), f"{after + 10} queries on two replicas", timeout=300)
                victim.start()                                         # back on its port: a fresh process
            for thread in threads:
                thread.join(600)
    finally:
        moving.stop()
        for replica in replicas:
            replica.stop()
        lake.close()
    for i, client in enumerate(clients):
        assert len(client.queries) == QUERIES, f"client {i} made {len(client.queries)} queries: {client.errors}"
        assert client.straddled() == [], f"client {i} joined two versions: {client.straddled()} {client.trace}"
        assert client.stepped_back() == [], f"client {i} stepped back: {client.stepped_back()} {client.trace}"
        assert len({q[0] for q in client.queries}) >= 5, f"client {i} never moved: {client.queries}"
