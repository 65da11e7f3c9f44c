"""``tidemark serve``'s HTTP layer under the requests people and programs send: malformed, slow, oversized, too
many, and at shutdown. Each limit answers within bounds (``coordinator/serving/limits.py``); the health routes answer
while the backing catalog hangs; OAuth clients get OAuth's error model; a form is decoded once; listening beyond
loopback with no authentication is said at start."""
from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from pyiceberg.catalog.rest import RestCatalog
from pyiceberg.exceptions import OAuthError
from sqlalchemy import create_engine, text

from coordinator import CatalogSettings
from coordinator.serving import asgi, served_versions
from coordinator.serving import server as server_module
from coordinator.serving.auth import ServerAuth
from coordinator.serving.served_versions import ServedVersions
from coordinator.serving.server import CatalogServer
from coordinator.tidemark import Tidemark
from tests.helpers.mixed_lake import MixedLake
from tests.helpers.postgres import PostgresServer
from tests.helpers.served import ServeProcess
from tests.helpers.wait import wait_for

QUICK_S = 2.0  # an answer that does not wait for anything comes well within this on a loaded machine


@pytest.fixture
def serve(zk_connect, catalog_settings):
    servers = []

    def start(settings: CatalogSettings = catalog_settings, **kwargs) -> CatalogServer:
        served = ServedVersions(settings, lambda: Tidemark.connect(zk_connect, read_only=True))
        server = CatalogServer(served, port=0, **kwargs).start()
        servers.append(server)
        return server
    yield start
    for server in servers:
        server.stop()


def exchange(server: CatalogServer, raw: bytes, wait_s: float = 30.0) -> bytes:
    """What the server answers ``raw`` on a new connection, until it closes it or ``wait_s`` passes."""
    host, port = server.url.rsplit("//", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=wait_s) as conn:
        conn.sendall(raw)
        answer = b""
        try:
            while chunk := conn.recv(65536):
                answer += chunk
        except socket.timeout:
            pass
        return answer


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def test_malformed_requests_get_a_4xx_answer_and_the_connection_closed(serve):
    server = serve()
    for raw, status in ((b"GET /v1/config HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400),
                        (b"NOT A REQUEST\r\n\r\n", 400),
                        (b"GET /v1/config HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 64 * 1024 + b"\r\n\r\n", 431)):
        started = time.monotonic()
        answer = exchange(server, raw)
        assert status_of(answer) == status and time.monotonic() - started < QUICK_S, answer[:200]
    answer = exchange(server, b"OPTIONS /v1/config HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert status_of(answer) == 405


def test_requests_after_the_first_on_a_keep_alive_connection_are_answered_without_nagles_delay(serve):
    """Every engine keeps its connection to the catalog open: a response's body held back by Nagle behind its head
    until the client's delayed ACK costs 40 ms on every request after the first (TCP_NODELAY off)."""
    import http.client
    server = serve()
    host, port = server.url.rsplit("//", 1)[1].rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    took = []
    for _ in range(15):
        started = time.perf_counter()
        conn.request("GET", "/v1/config")
        response = conn.getresponse()
        response.read()
        assert response.status == 200
        took.append(time.perf_counter() - started)
    conn.close()
    assert sorted(took)[len(took) // 2] < 0.03, [f"{t * 1000:.1f} ms" for t in took]


def test_a_client_that_never_sends_a_whole_request_head_is_answered_408_and_closed(serve, monkeypatch):
    monkeypatch.setattr(asgi, "HEAD_TIMEOUT_S", 1.0)
    server = serve()
    for raw, answered in ((b"", b""),                                  # silent: closed
                          (b"GET /v1/con", None),                      # a slow loris: 408
                          (b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /he", None)):  # the same after an answer
        started = time.monotonic()
        answer = exchange(server, raw)
        assert 0.9 < time.monotonic() - started < 1 + QUICK_S, answer
        if answered is not None:
            assert answer == answered
        else:
            assert answer.endswith(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")


def test_a_body_is_never_read_before_the_request_is_authenticated_and_a_form_has_a_size_and_a_deadline(
        serve, monkeypatch):
    monkeypatch.setattr(asgi, "BODY_TIMEOUT_S", 1.0)
    open_server, secured = serve(), serve(auth=ServerAuth(("t0ken",)))
    declared = b"POST /v1/pipeline/namespaces/ns/tables HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n"
    for server, status in ((secured, 401), (open_server, 403)):  # 100 MB declared, none sent: answered at once
        started = time.monotonic()
        answer = exchange(server, declared)
        assert status_of(answer) == status and time.monotonic() - started < QUICK_S, answer[:300]
    token = b"POST /v1/oauth/tokens HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
    assert status_of(exchange(secured, token + b"Content-Length: 100000000\r\n\r\n")) == 413
    started = time.monotonic()
    assert status_of(exchange(secured, token + b"Content-Length: 40\r\n\r\ngrant_type=")) == 408
    assert time.monotonic() - started < 1 + QUICK_S


def test_connections_beyond_the_limit_are_answered_503(serve):
    server = serve(max_connections=3)
    host, port = server.url.rsplit("//", 1)[1].rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=30) for _ in range(3)]
    try:
        wait_for(lambda: status_of(exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 5)) == 503,
                 "the fourth connection refused", 10)
    finally:
        for conn in held:
            conn.close()
    wait_for(lambda: status_of(exchange(server, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                                        5)) == 200, "a connection once the others closed", 10)


def test_health_metrics_and_kept_tables_answer_at_once_while_a_load_hangs_on_the_backing_catalog(
        serve, zk_connect, tmp_path, namespace, monkeypatch):
    """With its one worker thread held by a load that waits for the catalog, the server still answers its health
    routes and a table whose answer it keeps (from memory, on the event loop)."""
    monkeypatch.setattr(asgi, "WORKER_THREADS", 1)
    monkeypatch.setattr(server_module, "SERVED_TTL_S", 60.0)  # the kept answer outlives a loaded machine's pauses
    monkeypatch.setattr(served_versions, "TOPOLOGY_TTL_S", 60.0)  # and so does the job graph read
    with PostgresServer() as postgres:
        settings = CatalogSettings(name="pg", uri=postgres.uri, warehouse=f"file://{tmp_path / 'warehouse'}")
        tm = Tidemark.connect(zk_connect)
        lake = MixedLake(settings.load(), settings, namespace)
        lake.open(tm)
        lake.root_epoch(lake.up, 1000)
        lake.copy_epoch(1000)
        server = serve(settings)
        up_namespace, up_name = lake.up.split(".")
        kept = f"{server.url}/v1/pipeline/namespaces/{up_namespace}/tables/{up_name}"
        assert json.loads(_get(kept))["metadata"]  # loaded once: its answer is kept
        locker = create_engine(settings.python_catalog_properties()["uri"]).connect()
        try:
            locker.execute(text("BEGIN"))
            locker.execute(text("LOCK TABLE iceberg_tables IN ACCESS EXCLUSIVE MODE"))  # every catalog read waits
            namespace_, name = lake.down.split(".")
            hung = threading.Thread(target=lambda: exchange(server, f"GET /v1/pipeline/namespaces/{namespace_}/"
                                                                    f"tables/{name} HTTP/1.1\r\nHost: x\r\n"
                                                                    "Connection: close\r\n\r\n".encode(), 60),
                                    daemon=True)
            hung.start()
            wait_for(lambda: "tidemark_serve_requests_total" in _get(server.url + "/metrics"), "metrics", 10)
            for url in (server.url + "/healthz", server.url + "/readyz", server.url + "/metrics", kept):
                started = time.monotonic()
                body = _get(url)
                assert time.monotonic() - started < QUICK_S and body, url
            assert hung.is_alive()  # the load still waits for the catalog
        finally:
            locker.execute(text("ROLLBACK"))
            locker.close()
        hung.join(60)
        lake.close()
        tm.close()


def test_oauth_clients_get_oauths_error_model_and_a_form_is_decoded_once(serve):
    server = serve(auth=ServerAuth((), "reader", "p%41ss"))
    assert RestCatalog("oauth", uri=server.url, credential="reader:p%41ss").list_namespaces() is not None
    with pytest.raises(OAuthError, match="invalid_client"):
        RestCatalog("wrong", uri=server.url, credential="reader:pAss")
    request = urllib.request.Request(f"{server.url}/v1/oauth/tokens", data=b"grant_type=password", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 400 and json.loads(refused.value.read())["error"] == "unsupported_grant_type"


def test_sigterm_answers_the_requests_in_flight_then_exits_and_beyond_loopback_without_auth_it_warns(
        zk_connect, catalog_settings, tmp_path):
    with ServeProcess(catalog_settings, zk_connect, tmp_path, "--host", "0.0.0.0") as served:
        assert "warning: serving on 0.0.0.0 with no authentication" in served.log_tail()
        host, port = "127.0.0.1", served.port
        with socket.create_connection((host, port), timeout=30) as conn:  # a form on its way when SIGTERM comes
            conn.sendall(b"POST /v1/oauth/tokens HTTP/1.1\r\nHost: x\r\nContent-Length: 29\r\n\r\ngrant_type=")
            wait_for(lambda: "tidemark_serve" in _get(f"{served.url}/metrics"), "the server answering", 10)
            assert served.process is not None
            served.process.send_signal(signal.SIGTERM)
            wait_for(lambda: _refused(host, port), "new connections refused", 10)
            conn.sendall(b"client_credentials")  # the rest of the form: the request is answered
            answer = b""
            while chunk := conn.recv(65536):  # until the server closes it: it is shutting down
                answer += chunk
        assert status_of(answer) == 401 and b'"invalid_client"' in answer  # no client credentials here
        assert served.process.wait(30) == 0


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _refused(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False
