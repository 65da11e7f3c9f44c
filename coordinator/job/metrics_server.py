"""Serving Prometheus metrics and a health check over HTTP: ``/metrics`` and ``/healthz``.

    server = MetricsServer.shared(9465)            # one server per address and port in this process
    server.attach(registry, healthy=lambda: loop_thread.is_alive())
    server.port                                    # the bound port (``port=0`` binds a new, free one)
    server.detach(registry)                        # the last one out closes the server

``/metrics`` (any path but ``/healthz``, as prometheus-client does) is prometheus-client's
exposition of every attached registry, a family that several registries export (two
writers of one process) merged into one: the text format, or OpenMetrics and gzip when the
scraper asks. ``/healthz`` answers ``200 ok`` while some attached ``healthy()`` is true and
``503`` otherwise. Both run in-memory code only, so a scrape never waits on ZooKeeper.
Each request has its own daemon thread: a slow client holds up no other request, nor the
process's exit.

Failure behaviour: a port that cannot be bound (in use, no permission) raises
``ConfigurationError`` naming it.
"""
from __future__ import annotations

import socket
import threading
from collections.abc import Iterable
from socketserver import ThreadingMixIn
from typing import Any, Callable, ClassVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from coordinator.errors import ConfigurationError

HEALTH_PATH = "/healthz"


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # "fire and forget": a hung client never blocks close() or exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds are not news: no access log on stderr."""


class _Merged(Collector):
    """Every attached registry's families, one family per name (an exposition may not repeat a family)."""

    def __init__(self) -> None:
        self.registries: dict[int, CollectorRegistry] = {}

    def collect(self) -> list[Metric]:
        merged: dict[str, Metric] = {}
        for registry in list(self.registries.values()):
            for family in registry.collect():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        return list(merged.values())


class MetricsServer:
    """An HTTP server serving ``/metrics`` and ``/healthz`` (module docstring) for the registries attached to it,
    on a daemon thread of its own; ``shared`` gives the one of this process on an address and port.

    Failure behaviour: a port that cannot be bound (in use, no permission) raises ``ConfigurationError``
    naming it, from the constructor or ``shared``.
    """

    _shared: ClassVar[dict[tuple[str, int], MetricsServer]] = {}
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def shared(cls, port: int, address: str = "0.0.0.0") -> MetricsServer:
        """The server of this process on ``address:port``, started on first use (port 0: always a new one).

        :raises ConfigurationError: the port cannot be bound.
        """
        with cls._shared_lock:
            server = cls._shared.get((address, port))
            if server is None:
                server = cls(port, address)
                if port:
                    cls._shared[(address, port)] = server
            return server

    def __init__(self, port: int, address: str = "0.0.0.0") -> None:
        self._merged = _Merged()
        self._health: dict[int, Callable[[], bool]] = {}
        exposition = CollectorRegistry()
        exposition.register(self._merged)
        metrics = make_wsgi_app(exposition)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") != HEALTH_PATH:
                return metrics(environ, start_response)
            ok = any(healthy() for healthy in list(self._health.values()))
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [b"ok\n" if ok else b"unhealthy\n"]

        try:
            # The family of the address asked for: an IPv6 address cannot be bound on an IPv4 socket.
            family, _, _, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                           flags=socket.AI_PASSIVE)[0]
            server_class = type("MetricsHTTPServer", (_Server,), {"address_family": family})
            self._httpd: WSGIServer = make_server(str(sockaddr[0]), port, app, server_class,
                                                  handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigurationError(f"cannot serve metrics on {address}:{port} ({exc.strerror or exc}): "
                                     "pick another port (--port, or TIDEMARK_METRICS_PORT for a driver)") from None
        self.address, self.requested_port = address, port
        self.port: int = self._httpd.server_port
        self._thread = threading.Thread(target=self._httpd.serve_forever, name=f"metrics-http-{self.port}",
                                        daemon=True)
        self._thread.start()

    def attach(self, registry: CollectorRegistry, healthy: Callable[[], bool] = lambda: True) -> None:
        """Serve ``registry`` too; ``healthy`` joins the health check."""
        self._merged.registries[id(registry)] = registry
        self._health[id(registry)] = healthy

    def detach(self, registry: CollectorRegistry) -> None:
        """Stop serving ``registry``; without any left, stop serving and free the port."""
        self._merged.registries.pop(id(registry), None)
        self._health.pop(id(registry), None)
        if not self._merged.registries:
            self.close()

    def close(self) -> None:
        """Stop serving and free the port."""
        with self._shared_lock:
            if self._shared.get((self.address, self.requested_port)) is self:
                del self._shared[(self.address, self.requested_port)]
        self._httpd.shutdown()
        self._httpd.server_close()
