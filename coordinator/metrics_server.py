"""Serving Prometheus metrics and a health check over HTTP: ``/metrics`` and ``/healthz``.

    server = MetricsServer(registry, port=9465, healthy=lambda: loop_thread.is_alive())
    server.port            # the bound port (``port=0`` binds any free one)
    server.close()

``/metrics`` (any path but ``/healthz``, as prometheus-client does) is prometheus-client's
exposition of ``registry``: the text format, or OpenMetrics and gzip when the scraper asks.
``/healthz`` answers ``200 ok`` while ``healthy()`` is true and ``503`` otherwise. Both run
in-memory code only, so a scrape never waits on ZooKeeper. Each request has its own daemon
thread: a slow client holds up no other request, nor the process's exit.

Failure behaviour: a port that cannot be bound (in use, no permission) raises
``ConfigurationError`` naming it.
"""
from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from .errors import ConfigurationError

HEALTH_PATH = "/healthz"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # "fire and forget": a hung client never blocks close() or exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the stdlib's signature
        """Scrapes every few seconds are not news: no access log on stderr."""


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, port: int, address: str = "0.0.0.0",
                 healthy: Callable[[], bool] = lambda: True) -> None:
        metrics = make_wsgi_app(registry)

        def app(environ, start_response):
            if environ.get("PATH_INFO") != HEALTH_PATH:
                return metrics(environ, start_response)
            ok = healthy()
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"unhealthy\n"]

        try:
            # The family of the address asked for: an IPv6 address cannot be bound on an IPv4 socket.
            family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
            server_class = type("MetricsHTTPServer", (_Server,), {"address_family": family})
            self._httpd = make_server(sockaddr[0], port, app, server_class, handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigurationError(f"cannot serve metrics on {address}:{port} ({exc.strerror or exc}): "
                                     "pick another port (--port, or TIDEMARK_METRICS_PORT for a driver)") from None
        self.address = address
        self.port: int = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"metrics-http-{self.port}",
                                        daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
