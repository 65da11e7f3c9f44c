"""TLS on a real ZooKeeper secure client port: it works, and each mismatch is a specific error within seconds; so
is an address where an HTTP server answers instead of ZooKeeper."""
from __future__ import annotations

import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from coordinator import ConfigurationError, EmbeddedZooKeeper, Tidemark, TlsError, TlsSettings
from coordinator.operations.cli import main
from coordinator.operations.zookeeper_server import ServerTls, free_port
from tests.helpers.tls import make_certificates

CONNECT_TIMEOUT = 30.0
QUICK = 10.0  # a mismatch is reported long before the connect timeout


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    return make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_server(certs, tmp_path_factory):
    """A server that speaks TLS on ``secure_port`` and needs a client certificate signed by the CA."""
    server = EmbeddedZooKeeper(port=free_port(), data_dir=tmp_path_factory.mktemp("zk-tls"),
                               tls=ServerTls(certs.server_keystore, certs.ca, client_auth="need"),
                               secure_port=free_port()).start()
    yield server
    server.stop()


def client_tls(certs, **changes) -> TlsSettings:
    return replace(TlsSettings(ca=str(certs.ca), certfile=str(certs.client_cert), keyfile=str(certs.client_key)),
                   **changes)


def connect(hosts: str, tls=None) -> Tidemark:
    return Tidemark.connect(hosts, tls=tls, connect_timeout=CONNECT_TIMEOUT, session_timeout=4,
                            operation_timeout=20)


def refused_quickly(hosts: str, tls, match: str) -> None:
    started = time.monotonic()
    with pytest.raises(TlsError, match=match):
        connect(hosts, tls)
    assert time.monotonic() - started < QUICK


def test_tls_with_the_right_ca_and_client_certificate(tls_server, certs):
    with connect(f"{tls_server.secure_connect_string}/tls-ok", client_tls(certs)) as tm:
        tm.register_job("secured", sources=[], sinks=["db.secured"])
        assert tm.topology().writer_of("db.secured") == "secured"


def test_tls_cli_options_and_environment(tls_server, certs, capsys, monkeypatch):
    hosts = f"{tls_server.secure_connect_string}/tls-cli"
    code = main(["--zk", hosts, "--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert),
                 "--tls-key", str(certs.client_key), "status"])
    out, err = capsys.readouterr()
    assert code == 0 and "no jobs registered" in out, err

    monkeypatch.setenv("TIDEMARK_ZK_TLS_CA", str(certs.ca))
    monkeypatch.setenv("TIDEMARK_ZK_TLS_CERT", str(certs.client_cert))
    monkeypatch.setenv("TIDEMARK_ZK_TLS_KEY", str(certs.client_key))
    code = main(["--zk", hosts, "topology"])
    out, err = capsys.readouterr()
    assert code == 0 and "no jobs registered" in out, err

    monkeypatch.setenv("TIDEMARK_ZK_TLS_CA", str(certs.other_ca))
    code = main(["--zk", hosts, "--timeout", str(CONNECT_TIMEOUT), "status"])
    _, err = capsys.readouterr()
    assert code == 1 and err.startswith("tidemark: error: the TLS certificate") and err.count("\n") == 1, err


def test_a_wrong_ca_is_named(tls_server, certs):
    refused_quickly(tls_server.secure_connect_string, client_tls(certs, ca=str(certs.other_ca)),
                    r"certificate of ZooKeeper at 127\.0\.0\.1:\d+ was not accepted.*--tls-ca")


def test_plaintext_to_a_tls_port_is_named(tls_server):
    refused_quickly(tls_server.secure_connect_string, None, r"speaks TLS \(a secureClientPort\)")


def test_tls_to_a_plaintext_port_is_named(tls_server, certs):
    refused_quickly(tls_server.connect_string, client_tls(certs), r"plaintext clientPort")


def test_a_missing_client_certificate_is_named(tls_server, certs):
    refused_quickly(tls_server.secure_connect_string, TlsSettings(ca=str(certs.ca)),
                    r"requires a client certificate.*--tls-cert")


def test_missing_tls_files_fail_before_connecting(certs, tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        TlsSettings(ca=str(tmp_path / "nope.pem"))
    with pytest.raises(ConfigurationError, match="both --tls-cert and --tls-key"):
        TlsSettings(ca=str(certs.ca), certfile=str(certs.client_cert))


def test_an_http_server_at_the_address_is_named_by_what_it_answered(capsys):
    """An address that answers as an HTTP server (a proxy in front of nothing) is said to be one, quoting its status
    line, rather than called a TLS port or waited on until the timeout."""
    class Quiet(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the server's access log would go to the CLI's stderr
            pass
    with ThreadingHTTPServer(("127.0.0.1", 0), Quiet) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started = time.monotonic()
        code = main(["--zk", f"127.0.0.1:{server.server_port}", "--timeout", str(CONNECT_TIMEOUT), "status"])
        server.shutdown()
    _, err = capsys.readouterr()
    assert time.monotonic() - started < QUICK
    assert code == 1 and err.count("\n") == 1 and err.startswith(
        f"tidemark: error: 127.0.0.1:{server.server_port} is not ZooKeeper: it answered \"HTTP/1.0 501 "), err
    assert "Point --zk (TIDEMARK_ZK)" in err and "TLS" not in err, err
