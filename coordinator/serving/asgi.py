"""The HTTP layer of ``tidemark serve``: the REST catalog's routes as a Starlette app, run by uvicorn within limits.

    app = build_app(catalog_server)                 # what each route answers: CatalogServer (server.py)
    server = run_server(app, tls, max_connections)  # a uvicorn.Server; CatalogServer runs it on its own socket

Catalog routes run in worker threads (anyio's, ``WORKER_THREADS``: a backing catalog's load blocks), except that a
table or the configuration is first asked for on the event loop from memory alone (``wait=False``), and only when
that would wait (``WouldWait``: a new version to resolve or load) in a worker thread: a thread's hand-off costs more
than the answer itself. ``/healthz``, ``/readyz`` and ``/metrics`` (prometheus-client's ASGI app) answer on the event
loop, whatever the backing catalog does.

Limits (``limits.py``): a request's head must arrive within ``HEAD_TIMEOUT_S`` (else 408) and ``MAX_HEAD_BYTES``
(else 431), an idle keep-alive connection is closed after ``KEEP_ALIVE_S``, a request beyond ``max_connections``
open connections is answered 503, a malformed request 400. Only the token route reads a body: after checking its
size (``MAX_FORM_BYTES``, else 413), within ``BODY_TIMEOUT_S`` (else 408). No other body is ever read: a request is
authenticated on its head. At shutdown, requests in flight get ``GRACEFUL_S`` to finish and new ones are refused.
Every connection has TCP_NODELAY.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Optional, Union
from urllib.parse import parse_qs

import anyio.to_thread
import uvicorn
from prometheus_client import make_asgi_app
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Mount, Route
from uvicorn.protocols.http.h11_impl import H11Protocol

from coordinator.serving.limits import (
    BODY_TIMEOUT_S,
    GRACEFUL_S,
    HEAD_TIMEOUT_S,
    KEEP_ALIVE_S,
    MAX_FORM_BYTES,
    MAX_HEAD_BYTES,
    WORKER_THREADS,
)
from coordinator.serving.rest_errors import OAuthError, RestError, first_line
from coordinator.serving.served_versions import WouldWait

if TYPE_CHECKING:
    from coordinator.serving.server import CatalogServer, Encoded

log = logging.getLogger("coordinator.serving.server")
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"

Answer = Union["Encoded", BaseModel, Response]  # what a route's handler returns


def build_app(server: CatalogServer) -> Starlette:
    """The Starlette app of ``server``'s routes (module docstring)."""
    metrics = make_asgi_app(server.registry)

    async def health(request: Request) -> Response:
        ready = request.url.path.endswith("healthz") or server.served.zookeeper_connected
        return Response(b'{"ok": true}' if ready else b'{"ok": false}', 200 if ready else 503,
                        media_type="application/json")

    def config(request: Request, _: int, wait: bool = True) -> Answer:
        return server.config(request.query_params.get("warehouse") or request.path_params.get("warehouse"), wait)

    def namespaces(request: Request, _: int) -> Answer:
        return server.namespaces(request.query_params.get("parent"))

    def namespace(request: Request, _: int) -> Answer:
        found = server.namespace(request.path_params["namespace"])
        return Response(status_code=204) if request.method == "HEAD" else found

    def tables(request: Request, _: int) -> Answer:
        return server.tables(request.path_params["namespace"])

    def table(request: Request, arrived_ms: int, wait: bool = True) -> Answer:
        params, headers = request.path_params, request.headers
        prefix = params.get("prefix") or server.prefix_of(params.get("warehouse"))
        authorization = headers.get("authorization", "")
        client = " ".join((request.client.host if request.client else "", headers.get("user-agent", ""),
                           hashlib.sha256(authorization.encode()).hexdigest()[:16] if authorization else ""))
        # Iceberg Java loads a table with ``snapshots`` and reloads one it holds (TableOperations.refresh) without.
        refresh = "snapshots" not in request.query_params and headers.get("x-client-version", "").startswith(
            "Apache Iceberg")
        vended = server.vends_credentials(request.state.authenticated, headers.get("x-iceberg-access-delegation"))
        loaded, extra, _ = server.table(prefix, params["namespace"], params["table"], client,
                                        request.query_params.get("snapshots"), arrived_ms, refresh, request.cookies,
                                        vended, wait)
        if request.method == "HEAD":
            return Response(status_code=204, headers=extra)
        return Response(loaded.body, media_type=loaded.content_type, headers=extra)

    def views(request: Request, _: int) -> Answer:
        return server.views()

    def view(request: Request, _: int) -> Answer:
        return server.view(request.path_params["namespace"], request.path_params["view"])

    def refused(request: Request, _: int) -> Answer:
        return server.write()

    async def token(request: Request, _: int) -> Answer:
        form = await _form(request)
        return await run_in_threadpool(server.token, form, request.headers.get("authorization"))

    async def not_found(request: Request) -> Response:
        error = RestError(404, "NotFoundException", f"no route {request.url.path}: this is an Iceberg REST catalog "
                          "(/v1/config)")
        return _error_response(error)

    def endpoint(route: str, handler: Callable[..., Any], authenticated: bool = True, threaded: bool = True,
                 from_memory_first: bool = False) -> Callable[[Request], Awaitable[Response]]:
        """The route's ASGI endpoint: ``handler(request, arrived_ms)`` in a worker thread (``threaded``) or on the
        event loop (a coroutine function); ``from_memory_first``: ``handler(request, arrived_ms, wait=False)`` on the
        event loop first, in a worker thread only if that raises ``WouldWait``."""
        async def answer(request: Request) -> Response:
            started, arrived_ms = time.perf_counter(), int(time.time() * 1000)  # arrival: a client's loads' gaps
            try:
                request.state.authenticated = server.auth.authenticated(request.headers.get("authorization")) \
                    if authenticated else False
                result = _from_memory(handler, request, arrived_ms) if from_memory_first else None
                response = _response(result if result is not None else await (
                    run_in_threadpool(handler, request, arrived_ms) if threaded else handler(request, arrived_ms)))
            except (RestError, OAuthError) as exc:
                response = _error_response(exc)
            except Exception as exc:  # noqa: BLE001 - one line to the client and the log, never a traceback
                log.warning("tidemark serve: %s %s failed: %s: %s", request.method, request.url.path,
                            type(exc).__name__, first_line(exc))
                response = _error_response(RestError(500, "ServerErrorException",
                                                     f"{type(exc).__name__}: {first_line(exc)}"))
            if _sends_a_body(request) and (threaded or response.status_code >= 400):  # its body not (all) read:
                # the connection cannot carry another request
                response.headers["connection"] = "close"
            server.requests.labels(route, str(response.status_code)).inc()
            server.latency.labels(route).observe(time.perf_counter() - started)
            return response
        return answer

    reads = ["GET"]  # HEAD too: Starlette answers HEAD on every GET route
    writes = ["POST", "PUT", "DELETE", "PATCH"]
    catalog: list[tuple[str, str, Callable[..., Answer]]] = [
        ("/namespaces", "namespaces", namespaces), ("/namespaces/{namespace}", "namespace", namespace),
        ("/namespaces/{namespace}/tables", "tables", tables),
        ("/namespaces/{namespace}/tables/{table}", "table", table),
        ("/namespaces/{namespace}/views", "views", views),
        ("/namespaces/{namespace}/views/{view}", "views", view)]
    v1: list[BaseRoute] = [
        Route("/config", endpoint("config", config, from_memory_first=True), methods=reads),
        Route("/oauth/tokens", endpoint("token", token, authenticated=False, threaded=False), methods=["POST"]),
        *(Route("/{prefix}" + path, endpoint(name, handler, from_memory_first=name == "table"), methods=reads)
          for path, name, handler in catalog),
        # A client that never asked /v1/config: the default scope (or its /w/<warehouse>'s). After the prefixed
        # routes: /v1/namespaces/namespaces is the prefix "namespaces", as the spec's paths read.
        *(Route(path, endpoint(name, handler, from_memory_first=name == "table"), methods=reads)
          for path, name, handler in catalog),
        Route("/{path:path}", endpoint("write", refused), methods=writes),
        Route("/{path:path}", not_found, methods=reads),
    ]
    routes: list[BaseRoute] = [
        Route("/healthz", health, methods=reads),
        Route("/readyz", health, methods=reads),
        Route("/metrics", _Asgi(metrics), methods=reads),
        Mount("/v1", routes=v1),
        Mount("/w/{warehouse}/v1", routes=v1),
        Route("/{path:path}", not_found, methods=[*reads, *writes]),
    ]
    return Starlette(routes=routes, lifespan=_worker_threads, middleware=[Middleware(_HeadLimit)])


def run_server(app: Starlette, tls: Optional[ssl.SSLContext], max_connections: int) -> uvicorn.Server:
    """A uvicorn server for ``app`` with this module's limits, to run on a socket of the caller's."""
    config = uvicorn.Config(app, http=HeadTimeoutProtocol, lifespan="on", log_config=None, access_log=False,
                            server_header=False, limit_concurrency=max_connections,
                            timeout_keep_alive=KEEP_ALIVE_S, timeout_graceful_shutdown=GRACEFUL_S,
                            h11_max_incomplete_event_size=MAX_HEAD_BYTES)
    config.load()
    config.ssl = tls  # the caller's context (its certificate already loaded), rather than uvicorn's from files
    return uvicorn.Server(config)


class HeadTimeoutProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, with a deadline for a request's head: a connection that sends nothing for
    ``HEAD_TIMEOUT_S`` after it opened is closed, and one that began a request and has not sent its whole line and
    headers ``HEAD_TIMEOUT_S`` after its first byte is answered 408 and closed (a slow or stalled client holds no
    connection for ever). Between requests, uvicorn's keep-alive timeout closes an idle connection."""

    _head_deadline: Optional[asyncio.TimerHandle] = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # asyncio sets TCP_NODELAY only on sockets made with IPPROTO_TCP, and a listener from socket.create_server
        # has protocol 0: without it, Nagle holds a response's body behind its head until the client's delayed ACK,
        # 40 ms on every request after a connection's first.
        connection = transport.get_extra_info("socket")
        if connection is not None and connection.family in (socket.AF_INET, socket.AF_INET6):
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._head_deadline is None and self._between_requests():
            self._arm()
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._disarm()
        super().on_response_complete()
        if self._between_requests() and self.conn.trailing_data[0] and not self.transport.is_closing():
            self._arm()  # the next request's first bytes came with this one's

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or self.cycle.response_complete

    def _arm(self) -> None:
        self._head_deadline = self.loop.call_later(HEAD_TIMEOUT_S, self._head_timed_out)

    def _disarm(self) -> None:
        if self._head_deadline is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_timed_out(self) -> None:
        self._head_deadline = None
        if not self._between_requests() or self.transport.is_closing():
            return  # a request under way: its route answers it
        if self.conn.trailing_data[0]:  # part of a request: say why it ends (silence just ends)
            self.transport.write(TIMED_OUT)
        self.transport.close()


class _HeadLimit:
    """Answers 431 to a request whose headers pass ``MAX_HEAD_BYTES`` (h11 bounds only a head still arriving; one
    that came whole in one read is bounded here)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and sum(len(k) + len(v) for k, v in scope["headers"]) > MAX_HEAD_BYTES:
            error = RestError(431, "BadRequestException", f"the request's headers pass {MAX_HEAD_BYTES} bytes")
            response = _error_response(error)
            response.headers["connection"] = "close"
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


class _Asgi:
    """An ASGI app as a route's endpoint (Starlette takes a plain function for a request-response one)."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


@contextlib.asynccontextmanager
async def _worker_threads(app: Starlette) -> AsyncIterator[None]:
    anyio.to_thread.current_default_thread_limiter().total_tokens = WORKER_THREADS
    yield


async def _form(request: Request) -> dict[str, str]:
    """The token route's form, its size checked first and read within ``BODY_TIMEOUT_S``, decoded once."""
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_FORM_BYTES):
        raise RestError(413, "BadRequestException", f"the form must be at most {MAX_FORM_BYTES} bytes")
    async def read() -> bytes:
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_FORM_BYTES:
                raise RestError(413, "BadRequestException", f"the form must be at most {MAX_FORM_BYTES} bytes")
        return body
    try:
        body = await asyncio.wait_for(read(), BODY_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise RestError(408, "BadRequestException", f"the form did not arrive within {BODY_TIMEOUT_S:g} s") from None
    try:
        return {k: v[-1] for k, v in parse_qs(body.decode(), keep_blank_values=True).items()}
    except UnicodeDecodeError:
        raise OAuthError("invalid_request", "the form is not UTF-8") from None


def _from_memory(handler: Callable[..., Answer], request: Request, arrived_ms: int) -> Optional[Answer]:
    """``handler``'s answer from memory alone (``wait=False``), None where it would wait."""
    try:
        return handler(request, arrived_ms, wait=False)
    except WouldWait:
        return None


def _sends_a_body(request: Request) -> bool:
    return request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers


def _response(result: Answer) -> Response:
    if isinstance(result, Response):
        return result
    if isinstance(result, BaseModel):
        return Response(result.model_dump_json().encode(), media_type="application/json")
    return Response(result.body, media_type=result.content_type)


def _error_response(error: Union[RestError, OAuthError]) -> Response:
    return Response(error.body(), error.status, media_type="application/json")


__all__ = ["HeadTimeoutProtocol", "build_app", "run_server"]
