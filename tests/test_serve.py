"""``tidemark serve``, read by pyiceberg's ``RestCatalog`` configured with the URI alone, on real ZooKeeper and a real
SQLite catalog: each pipeline at its own consistent version, one version across a group or a pin when asked, staged
snapshots never visible, writes refused in the spec's error form, credentials required when configured.

The lake (``MixedLake``): ``up`` runs ahead of ``down``, which reads it; ``other`` is an unrelated pipeline. The fault
suite reads through the endpoint during every scenario (tests/faults/harness.py, ``ServedReader``).
"""
from __future__ import annotations

import itertools
import json
import os
import ssl
import threading
import urllib.error
import urllib.request
from typing import Optional

import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import NoSuchTableError, OAuthError, UnauthorizedError

from coordinator.errors import InvalidArgument
from coordinator.operations.zookeeper_server import free_port
from coordinator.serving.auth import ServerAuth
from coordinator.serving.hold import DEFAULT_QUERY_GAP_MS, Hold, HoldRule, table_bit
from coordinator.serving.scope import Group, Pin, PinKind, Scope
from coordinator.serving.served_versions import ServedVersions
from coordinator.serving.server import CatalogServer, tls_context
from coordinator.tidemark import Tidemark
from tests.helpers.cli import assert_one_line_error, tidemark
from tests.helpers.lake import create_table, rows_of, stage_rows
from tests.helpers.mixed_lake import MixedLake, MovingPipeline, epoch_counts
from tests.helpers.present import present
from tests.helpers.served import EpochRecordingClient, ServeProcess
from tests.helpers.tls import make_certificates
from tests.helpers.wait import wait_for


def test_a_warehouse_names_a_group_and_a_pin_and_travels_as_the_prefix():
    assert Scope.from_warehouse(None) == Scope.from_warehouse("pipeline") == Scope()
    assert Scope.from_warehouse("all@1795834273000") == Scope(Group.ALL, pin=Pin(PinKind.EXACT, 1795834273000))
    assert Scope.from_warehouse("namespace:sales@tidemark-5000").pin == Pin(PinKind.EXACT, 5000)
    assert Scope.from_warehouse("pipeline@1970-01-01T00:00:06Z").pin == Pin(PinKind.AT_OR_BEFORE, 6000)
    assert Scope.from_warehouse("namespace:sales@pinned").pinned_at_config
    for scope in (Scope(), Scope(Group.NAMESPACE, "sales", Pin(PinKind.AT_OR_BEFORE, 7)), Scope(Group.ALL)):
        assert Scope.from_prefix(scope.prefix) == scope
    for bad in ("everything", "namespace:", "pipeline@yesterday", "namespace:a/b"):
        with pytest.raises(InvalidArgument, match=r"warehouse|pin"):
            Scope.from_warehouse(bad)
    with pytest.raises(InvalidArgument, match="unknown catalog prefix"):
        Scope.from_prefix("ns.sales~at-x")


def test_client_credentials_become_a_token_every_replica_accepts_until_it_expires():
    auth = ServerAuth(("static",), "reader", "s3cret")
    token = auth.issue("reader", "s3cret", now=1000.0)
    assert auth.accepts(token, now=1001.0) and auth.accepts("static")
    assert ServerAuth((), "reader", "s3cret").accepts(token, now=1001.0)  # another replica, the same secret
    assert not auth.accepts(token, now=1000.0 + 7200) and not auth.accepts(token.replace("reader", "admin"))
    assert not ServerAuth((), "reader", "other").accepts(token, now=1001.0)


QUERIES = 24  # per client


@pytest.fixture
def lake(tm, catalog, catalog_settings, namespace):
    lake = MixedLake(catalog, catalog_settings, namespace)
    lake.open(tm)
    for epoch in range(1000, 7000, 1000):
        lake.root_epoch(lake.up, epoch)            # up holds every barrier up to 6000: it runs ahead
    lake.copy_epoch(2000)
    lake.copy_epoch(5000)                          # down is at 5000
    for epoch in (2000, 4000, 6000):
        lake.root_epoch(lake.other, epoch)         # other, an unrelated pipeline, is at 6000
    yield lake
    lake.close()


@pytest.fixture
def serve(zk_connect, catalog_settings):
    """Start servers in this process; each is stopped at the end."""
    servers = []

    def start(auth: Optional[ServerAuth] = None, **kwargs) -> CatalogServer:
        served = ServedVersions(catalog_settings, lambda: Tidemark.connect(zk_connect, read_only=True), **kwargs)
        server = CatalogServer(served, port=0, auth=auth or ServerAuth()).start()
        servers.append(server)
        return server
    yield start
    for server in servers:
        server.stop()


def served_epoch(server: CatalogServer, table: str, warehouse: str = "", agent: str = "test") -> int:
    prefix = json.loads(_get(f"{server.url}/v1/config?warehouse={warehouse}"))["overrides"]["prefix"]
    namespace, name = table.split(".")
    request = urllib.request.Request(f"{server.url}/v1/{prefix}/namespaces/{namespace}/tables/{name}",
                                     headers={"User-Agent": agent})
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.headers["Tidemark-Epoch"])


def newest_served(server: CatalogServer, table: str, epoch: int) -> int:
    """The epoch a new client is served ``table`` at, once it is ``epoch``: the server's tidemarks follow a commit by
    a watch, so a load right after the commit may still get the version before it."""
    newcomers = (f"a new client {i}" for i in itertools.count())

    def served() -> Optional[int]:
        found = served_epoch(server, table, agent=next(newcomers))
        return found if found == epoch else None
    return wait_for(served, f"{table} served at {epoch}")


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read()


def test_each_pipeline_is_served_at_its_own_consistent_version_and_reads_exactly_it(lake, serve):
    server = serve()
    catalog = RestCatalog("served", uri=server.url)  # the URI alone
    truth = lake.truth((lake.up, lake.down))
    assert truth.epoch == 5000
    for name in (lake.up, lake.down):
        table = catalog.load_table(name)
        assert table.metadata.current_snapshot_id == truth.snapshots[name], name
        expected = {e: n for e, n in lake.written[name].items() if e <= 5000}
        assert epoch_counts(table.scan().to_arrow()) == expected, name
    other = catalog.load_table(lake.other)   # not held back by the up/down pipeline
    assert other.metadata.current_snapshot_id == lake.published[lake.other][6000]
    assert served_epoch(server, lake.other) == 6000


def test_a_group_or_a_pin_gives_one_version_across_pipelines(lake, serve, namespace):
    server = serve()
    assert lake.truth((lake.up, lake.down, lake.other)).epoch == 2000
    for warehouse in ("all", f"namespace:{namespace}"):
        assert {served_epoch(server, t, warehouse) for t in lake.tables} == {2000}, warehouse
    assert {served_epoch(server, t, "pipeline@2000") for t in (lake.up, lake.down)} == {2000}
    assert served_epoch(server, lake.down, "pipeline@1970-01-01T00:00:04.5Z") == 2000  # down holds 2000 and 5000
    pinned = RestCatalog("pinned", uri=server.url, warehouse="pipeline@pinned")
    before = pinned.load_table(lake.up).metadata.current_snapshot_id
    lake.root_epoch(lake.up, 7000)
    lake.copy_epoch(7000)
    assert pinned.load_table(lake.up).metadata.current_snapshot_id == before  # the session keeps its version
    assert newest_served(server, lake.up, 7000) == 7000


def test_a_pinned_session_keeps_its_version_after_zookeepers_recent_epochs_moved_past_it(lake, serve, tm):
    """ZooKeeper lists a table's newest 16 epochs: a session pinned longer than that gets its version from the
    tables' Iceberg records, never an older one nor an error."""
    server = serve()
    pinned = RestCatalog("pinned", uri=server.url, warehouse="pipeline@pinned")
    before = {t: pinned.load_table(t).metadata.current_snapshot_id for t in (lake.up, lake.down)}
    for epoch in range(7000, 7000 + 20 * 1000, 1000):
        lake.root_epoch(lake.up, epoch)
        lake.copy_epoch(epoch)
    assert 5000 not in dict(present(tm.tidemarks([lake.down])[lake.down]).recent), "ZooKeeper still lists it"
    assert {t: pinned.load_table(t).metadata.current_snapshot_id for t in (lake.up, lake.down)} == before
    assert newest_served(server, lake.down, 26000) == 26000


def test_staged_snapshots_and_newer_ones_are_never_in_the_served_metadata(lake, serve, catalog):
    server = serve()
    up = catalog.load_table(lake.up)
    staged = stage_rows(up, 8000, "up", 1, 3)   # staged, never published: in no ref
    served = RestCatalog("served", uri=server.url).load_table(lake.up)
    ids = {s.snapshot_id for s in served.metadata.snapshots}
    assert staged not in ids and lake.published[lake.up][6000] not in ids  # up is served at down's 5000
    assert lake.published[lake.up][5000] in ids and set(served.metadata.refs) == {"main"}
    assert [e.snapshot_id for e in served.metadata.snapshot_log][-1] == lake.published[lake.up][5000]


def test_a_client_holds_its_version_through_a_query_and_moves_at_its_next_one(lake, serve):
    """The rule on explicit times: loads less than the query gap apart are one query, and so is a table the query
    has not loaded yet a little later; a busy client moves at a shorter gap once its version is max_hold old; the
    hold a client sends continues its query on any replica, and one this deployment never served is ignored."""
    server = serve(rule=HoldRule(query_gap_ms=100, max_hold_ms=1_000))
    served, scope = server.served, Scope()
    newcomers = (f"client {i}" for i in itertools.count())  # each with no hold: the newest version

    def pipeline_at(epoch: int) -> None:  # up holds 6000 already
        if epoch > 6000:
            lake.root_epoch(lake.up, epoch)
        lake.copy_epoch(epoch)
        wait_for(lambda: served.choose(scope, lake.down, next(newcomers), now_ms=0).version.epoch == epoch,
                 f"the server's tidemarks to reach {epoch}")

    first = served.choose(scope, lake.up, "dashboard", now_ms=0)
    group = first.group
    assert group is not None and first.version.epoch == 5000
    assert first.hold == Hold.taken(5000, 0, table_bit(group, lake.up))
    pipeline_at(6000)
    assert served.choose(scope, lake.down, "dashboard", now_ms=60).version.epoch == 5000    # the same query
    assert served.choose(scope, lake.down, "dashboard", now_ms=200).version.epoch == 6000   # again after a gap: next
    pipeline_at(7000)
    assert served.choose(scope, lake.up, "dashboard", now_ms=550).version.epoch == 6000     # not loaded yet: the same
    assert served.choose(scope, lake.up, "dashboard", now_ms=700).version.epoch == 7000     # again after a gap: next
    held = {served.choose(scope, lake.up, "busy", now_ms=t).version.epoch for t in range(500, 1_500, 5)}
    pipeline_at(8000)
    assert held == {7000} and served.choose(scope, lake.up, "busy", now_ms=1_504).version.epoch == 7000
    assert served.choose(scope, lake.up, "busy", now_ms=1_520).version.epoch == 8000  # past max_hold: 10 ms is a gap
    pipeline_at(9000)
    busy = [served.choose(scope, lake.up, "busy", now_ms=t).version.epoch for t in range(1_520, 3_600, 5)]
    assert busy[0] == 8000 and busy[-1] == 9000  # never quiet for 10 ms: moves at twice max_hold
    replica = serve(rule=HoldRule(query_gap_ms=100))                        # another replica, the client's cookie
    sent = Hold.taken(5000, 0, table_bit(group, lake.up)).loaded(1_000)
    continued = replica.served.choose(scope, lake.down, "via a balancer", hold=sent, now_ms=1_050)
    assert continued.version.epoch == 5000 and continued.hold == sent.loaded(1_050, table_bit(group, lake.down))
    for made_up in (Hold(4500, 0, 1_000), Hold(99_000, 0, 1_000)):         # an epoch the group does not hold
        assert replica.served.choose(scope, lake.down, "forger", hold=made_up, now_ms=1_050).version.epoch == 9000
    assert served_epoch(server, lake.down) == 9000                          # over HTTP: the newest


def test_a_dashboard_and_reader_threads_get_one_version_per_query_while_the_pipeline_commits(
        lake, zk_connect, catalog_settings, tmp_path):
    """What clients run: a two-panel dashboard (one ``RestCatalog``; ``down`` alone, then ``up`` and ``down``) and
    reader threads in one process, each with its own long-lived client, all from one address and user agent, through
    ``tidemark serve`` on its defaults. Every query's tables come at one epoch; no client's epochs go back."""
    moving = MovingPipeline(lake, epoch=7000, pause_s=0.4).start()  # an epoch about every 500 ms
    panels = [[lake.down], [lake.up, lake.down]]
    pause_s = 2 * DEFAULT_QUERY_GAP_MS / 1000  # a dashboard's refresh: its next query comes after a quiet gap
    try:
        server = ServeProcess(catalog_settings, zk_connect, tmp_path).start()
        clients = [EpochRecordingClient(server.url, panels[i % 2:] + panels[:i % 2], pause_s) for i in range(4)]
        threads = [threading.Thread(target=client.run, args=(QUERIES,)) for client in clients]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
    finally:
        moving.stop()
        server.stop()
    for i, client in enumerate(clients):
        assert client.errors == [], client.errors
        assert len(client.queries) == QUERIES, f"client {i} made {len(client.queries)} queries"
        assert client.straddled() == [], f"client {i} joined two versions: {client.straddled()} {client.trace}"
        assert client.stepped_back() == [], f"client {i} stepped back: {client.stepped_back()}"
        assert len({q[0] for q in client.queries}) >= 3, f"client {i} never moved: {client.queries}"


def test_tables_outside_tidemark_pass_through_and_writes_are_refused_saying_where_to_write(lake, serve, catalog,
                                                                                       namespace):
    outside = create_table(catalog, f"{namespace}.outside")
    outside.append(rows_of(1, 2))
    server = serve()
    rest = RestCatalog("served", uri=server.url)
    assert rest.load_table(f"{namespace}.outside").metadata.current_snapshot_id == \
        catalog.load_table(f"{namespace}.outside").metadata.current_snapshot_id
    assert rest.table_exists(lake.down) and not rest.table_exists(f"{namespace}.missing")
    with pytest.raises(NoSuchTableError):
        rest.load_table(f"{namespace}.missing")
    with pytest.raises(NotImplementedError):  # /v1/config lists the read endpoints only: the client refuses itself
        rest.create_table(f"{namespace}.new", schema=catalog.load_table(lake.up).schema())
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(urllib.request.Request(f"{server.url}/v1/pipeline/namespaces/{namespace}/tables/down",
                                                      data=b"{}", method="POST"), timeout=30)
    error = json.loads(refused.value.read())["error"]
    assert refused.value.code == error["code"] == 403 and error["type"] == "ForbiddenException"
    assert "read-only" in error["message"] and "write through the backing catalog" in error["message"]
    assert sorted(rest.list_tables(namespace)) == sorted(tuple(t.split(".")) for t in
                                                         [*lake.tables, f"{namespace}.outside"])
    assert b"tidemark_serve_requests_total" in _get(f"{server.url}/metrics")
    assert b"tidemark_serve_version_age_seconds" in _get(f"{server.url}/metrics")


def test_readers_authenticate_with_a_token_or_client_credentials(lake, serve):
    server = serve(ServerAuth(("t0ken",), "reader", "s3cret"))
    with pytest.raises((UnauthorizedError, OAuthError)):
        RestCatalog("anonymous", uri=server.url).load_table(lake.up)
    assert RestCatalog("token", uri=server.url, token="t0ken").load_table(lake.up) is not None
    oauth = RestCatalog("oauth", uri=server.url, credential="reader:s3cret")
    assert oauth.load_table(lake.down).metadata.current_snapshot_id == lake.published[lake.down][5000]
    with pytest.raises(OAuthError):
        RestCatalog("wrong", uri=server.url, credential="reader:wrong")


def test_the_command_refuses_bad_input_in_one_line_and_creates_nothing(tmp_path):
    env = {**os.environ, "TIDEMARK_HOME": str(tmp_path / "home")}
    env = {k: v for k, v in env.items() if not k.startswith(("PYICEBERG_CATALOG__", "TIDEMARK_CATALOG"))}
    done = tidemark("serve", "--query-gap-ms", "-5", env=env)
    assert_one_line_error(done.returncode, done.stderr, "--query-gap-ms", status=2)
    done = tidemark("serve", "--tls-cert-file", "cert.pem", env=env)
    assert_one_line_error(done.returncode, done.stderr, "--tls-key-file")
    done = tidemark("--timeout", "1", "serve", "--port", str(free_port()), env=env)
    assert_one_line_error(done.returncode, done.stderr, "does not exist", "TIDEMARK_CATALOG_URI")
    assert not (tmp_path / "home").exists()


def test_https_with_the_servers_certificate_and_a_client_that_trusts_it(lake, zk_connect, catalog_settings, tmp_path,
                                                                         monkeypatch):
    for variable in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests prefers them to a session's own CA bundle
        monkeypatch.delenv(variable, raising=False)
    certificates = make_certificates(tmp_path / "tls")
    served = ServedVersions(catalog_settings, lambda: Tidemark.connect(zk_connect, read_only=True))
    server = CatalogServer(served, port=0, tls=tls_context(str(tmp_path / "tls" / "server.pem"),
                                                           str(tmp_path / "tls" / "server.key"))).start()
    try:
        assert server.url.startswith("https://")
        trusted = RestCatalog("tls", uri=server.url, ssl={"cabundle": str(certificates.ca)})  # type: ignore[arg-type]
        assert trusted.load_table(lake.down).metadata.current_snapshot_id == lake.published[lake.down][5000]
        context = ssl.create_default_context(cafile=str(certificates.other_ca))
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(f"{server.url}/v1/config", timeout=30, context=context)
        assert trusted.load_table(lake.up) is not None  # a refused handshake does not stop the server
    finally:
        server.stop()
