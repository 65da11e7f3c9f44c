"""The HTTP side of ``tidemark serve``: the Iceberg REST catalog's read routes over ``ServedVersions``.

    server = CatalogServer(ServedVersions(settings, connect), host="0.0.0.0", port=8181, auth=ServerAuth.from_env())
    server.start()                 # a background thread; server.url is where engines point
    server.stop()

Routes (the REST spec's, under ``/v1`` or ``/w/<warehouse>/v1``): ``GET /v1/config``, ``GET|HEAD`` namespaces, a
namespace, its tables and a table (``snapshots=all|refs``), ``GET`` views (none), ``POST /v1/oauth/tokens``
(client credentials). Every other method is refused with the spec's error model: the catalog is read-only, and the
message says where to write. ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz`` are outside ``/v1``, and open.

Headers of a served table: ``Tidemark-Epoch`` (the version's epoch), ``Tidemark-Version-Age-Ms`` (how far it is
behind the wall clock), ``Set-Cookie: tidemark-hold-<digest>=...`` (the client's hold, ``hold.py``: sent back, it
lets any replica continue the client's query) and, while ZooKeeper is unreachable, ``Tidemark-Stale:
zookeeper-unreachable``.

Failure behaviour: a table that does not exist is a 404 (``NoSuchTableException``), a namespace a 404
(``NoSuchNamespaceException``), a bad warehouse or prefix a 400; the backing catalog or its object store out of
reach, ZooKeeper before the job graph was ever read, or a group with no consistent version yet (a job that committed
nothing; empty tables are not consistent either), a 503 (``ServiceUnavailableException``). A request handler never
raises: an unexpected error is a 500 with its one-line message, logged.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import logging
import os
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from queue import Empty, LifoQueue
from typing import TYPE_CHECKING, Any, Optional
from urllib.parse import parse_qs, unquote, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from coordinator.errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidName,
    TableNotFound,
    VersionNotFound,
    ZooKeeperUnavailable,
)
from coordinator.iceberg.catalog import is_catalog_outage, load_table
from coordinator.iceberg.catalog_properties import java_properties
from coordinator.iceberg.snapshots import WRITER_PROPERTY
from coordinator.serving.hold import cookie_name
from coordinator.serving.scope import Scope
from coordinator.serving.served_metadata import served_metadata
from coordinator.serving.served_versions import Choice, ServedVersions

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

log = logging.getLogger(__name__)
DEFAULT_PORT = 8181  # the port Iceberg's REST catalogs usually take
TOKEN_LIFETIME_S = 3600
HOLD_COOKIE_AGE_S = 86_400  # a client's hold outlives its query: it is also the client's floor (never back)
STORAGE_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hadoop.", "py-io-impl", "io-impl")
SERVED_TTL_S = 1.0  # a served version's answer is kept this long (its snapshots never change)
SERVED_KEPT = 10_000  # answers kept at most (all dropped beyond)
LOAD_WAIT_S = 5.0  # a request waits this long at most for another's load of the same answer, then tries itself
TLS_HANDSHAKE_S = 30.0
CATALOG_WAIT_S = 60.0  # a request waits this long at most for a backing-catalog client another one is using
CATALOG_POOL = 8  # backing-catalog clients kept for the request threads (each made on first need)
NAMESPACE_SEPARATOR = "\x1f"
READ_ENDPOINTS = [
    "GET /v1/{prefix}/namespaces", "HEAD /v1/{prefix}/namespaces/{namespace}",
    "GET /v1/{prefix}/namespaces/{namespace}", "GET /v1/{prefix}/namespaces/{namespace}/tables",
    "GET /v1/{prefix}/namespaces/{namespace}/tables/{table}", "HEAD /v1/{prefix}/namespaces/{namespace}/tables/{table}",
    "GET /v1/{prefix}/namespaces/{namespace}/views",
]


@dataclass(frozen=True)
class Encoded:
    """An answer's body, already encoded."""

    body: bytes
    content_type: str = "application/json"


class RestError(Exception):
    """An answer in the spec's error model: ``status``, the exception ``kind`` engines map, and the message."""

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind

    def body(self) -> bytes:
        """The answer's JSON body, ``{"error": {"message", "type", "code"}}``."""
        return json.dumps({"error": {"message": str(self), "type": self.kind, "code": self.status}}).encode()


@dataclass(frozen=True)
class ServerAuth:
    """Who may read: static bearer ``tokens``, and OAuth2 client credentials (``client_id``, ``client_secret``) that
    ``/v1/oauth/tokens`` exchanges for a signed token any replica with the same secret accepts. Neither: anyone.

    ``from_env`` reads ``TIDEMARK_SERVE_TOKENS`` (comma-separated), ``TIDEMARK_SERVE_CLIENT_ID`` and
    ``TIDEMARK_SERVE_CLIENT_SECRET``: secrets stay off the command line.
    """

    tokens: tuple[str, ...] = ()
    client_id: Optional[str] = None
    client_secret: Optional[str] = None

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> ServerAuth:
        """The auth the variables configure (see the class docstring); none of them: anyone may read.

        :param env: the variables to read (default ``os.environ``).
        :raises ConfigurationError: only one of the client id and the client secret is set.
        """
        env = os.environ if env is None else env
        tokens = tuple(t.strip() for t in env.get("TIDEMARK_SERVE_TOKENS", "").split(",") if t.strip())
        client_id, secret = env.get("TIDEMARK_SERVE_CLIENT_ID") or None, env.get("TIDEMARK_SERVE_CLIENT_SECRET") or None
        if (client_id is None) != (secret is None):
            raise ConfigurationError("set both TIDEMARK_SERVE_CLIENT_ID and TIDEMARK_SERVE_CLIENT_SECRET (OAuth2 "
                                     "client credentials), or neither")
        return cls(tokens, client_id, secret)

    @property
    def required(self) -> bool:
        """Whether a request needs a bearer token: static tokens or client credentials are configured."""
        return bool(self.tokens or self.client_id)

    def issue(self, client_id: str, client_secret: str, now: Optional[float] = None) -> str:
        """A token for valid client credentials; ``RestError`` 401 otherwise."""
        if self.client_id is None or self.client_secret is None or not (
                hmac.compare_digest(client_id, self.client_id) and hmac.compare_digest(client_secret,
                                                                                       self.client_secret)):
            raise RestError(401, "NotAuthorizedException", "invalid client credentials")
        expires = int((now if now is not None else time.time()) + TOKEN_LIFETIME_S)
        return f"tm.{expires}.{self._signature(client_id, expires)}.{client_id}"

    def accepts(self, token: str, now: Optional[float] = None) -> bool:
        """Whether ``token`` is one of the static ``tokens``, or a token ``issue`` signed with this client secret
        that has not expired (``TOKEN_LIFETIME_S`` after it was issued).

        :param now: the time to judge expiry by, in seconds since 1970 (default: now).
        """
        if any(hmac.compare_digest(token, t) for t in self.tokens):
            return True
        parts = token.split(".", 3)
        if self.client_id is None or len(parts) != 4 or parts[0] != "tm" or not parts[1].isdigit():
            return False
        expires, signature, client_id = int(parts[1]), parts[2], parts[3]
        return (expires > (now if now is not None else time.time())
                and hmac.compare_digest(signature, self._signature(client_id, expires)))

    def _signature(self, client_id: str, expires: int) -> str:
        key = (self.client_secret or "").encode()
        return hmac.new(key, f"{client_id}:{expires}".encode(), hashlib.sha256).hexdigest()


class CatalogServer:
    """A read-only Iceberg REST catalog serving consistent versions (module docstring).

    :param served: the versions to serve (it owns the backing catalog's and ZooKeeper's sessions).
    :param host: the address to listen on.
    :param port: the port (0: a free one; ``url`` says which).
    :param auth: who may read.
    :param tls: a server-side SSL context (``tls_context``), None for plain HTTP.
    :param storage_config: hand engines the backing catalog's object-store settings with each table.
    """

    served: ServedVersions
    auth: ServerAuth
    registry: CollectorRegistry

    def __init__(self, served: ServedVersions, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 auth: ServerAuth = ServerAuth(), tls: Optional[ssl.SSLContext] = None,
                 storage_config: bool = True) -> None:
        self.served, self.auth, self.storage_config = served, auth, storage_config
        self.registry = CollectorRegistry()
        self.requests = Counter("tidemark_serve_requests", "Requests answered, by route and HTTP status",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram("tidemark_serve_request_duration_seconds", "Time to answer a request, by route",
                                 ["route"], registry=self.registry,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.stale = Counter("tidemark_serve_stale_tables", "Tables served while ZooKeeper was unreachable (the "
                             "last version known)", registry=self.registry)
        self.registry.register(_ServedCollector(served))
        self._bodies: dict[tuple[str, Optional[int], bool], tuple[float, Encoded]] = {}
        self._bodies_lock = threading.Lock()
        self._loading: dict[tuple[str, Optional[int], bool], threading.Event] = {}
        self._catalogs: LifoQueue[Catalog] = LifoQueue()
        self._catalogs_made = 0
        self._catalogs_lock = threading.Lock()
        handler = type("Handler", (_Handler,), {"server_side": self})
        self.httpd = _Listener((host, port), handler)
        if tls is not None:
            # the handshake happens in the request's thread (``_Handler.setup``), never in the one that accepts
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.scheme = "https" if tls is not None else "http"

    @property
    def url(self) -> str:
        """Where engines point: ``http(s)://host:port`` as bound (the port chosen when it was given as 0)."""
        host, port = self.httpd.server_address[:2]
        return f"{self.scheme}://{host!s}:{port}"

    def start(self) -> CatalogServer:
        """Serve in a background (daemon) thread, and return this server; ``stop`` ends it."""
        threading.Thread(target=self.httpd.serve_forever, name="tidemark-serve", daemon=True).start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until ``stop`` is called from another one."""
        self.httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving, close the listening socket, then ``served`` (its ZooKeeper session). Only while the server
        serves (``start``, or ``serve_forever`` in another thread): otherwise it waits for ever."""
        self.httpd.shutdown()
        self.httpd.server_close()
        self.served.close()

    # -- the backing catalog, shared by the request threads --------------------------------

    def catalog(self) -> _Lease:
        """A backing-catalog client lent for a ``with`` block (``with server.catalog() as catalog:``). Up to
        ``CATALOG_POOL`` clients are made, each when first needed. Beyond that, entering waits up to
        ``CATALOG_WAIT_S`` for a client to be given back.

        :raises RestError: 503 when a client cannot be made (the catalog unreachable or not configured) or none was
            given back in time."""
        return _Lease(self)

    def _take(self) -> Catalog:
        try:
            return self._catalogs.get_nowait()
        except Empty:
            pass
        with self._catalogs_lock:
            make = self._catalogs_made < CATALOG_POOL
            if make:
                self._catalogs_made += 1
        if make:
            try:
                return self._backing(self.served.settings.load)  # a REST client asks its server at once
            except BaseException:
                with self._catalogs_lock:
                    self._catalogs_made -= 1  # not made: the next request tries again
                raise
        try:
            return self._catalogs.get(timeout=CATALOG_WAIT_S)
        except Empty:
            raise RestError(503, "ServiceUnavailableException", f"all {CATALOG_POOL} clients of the backing catalog "
                            f"stayed busy for {CATALOG_WAIT_S:g} s: retry") from None

    # -- routes ---------------------------------------------------------------------------

    def config(self, query: Mapping[str, str], warehouse: Optional[str]) -> dict[str, Any]:
        """``GET /v1/config``: the read endpoints, and the warehouse's scope as the ``prefix`` override, a
        ``@pinned`` scope pinned at the version newest now.

        :param query: the request's query parameters; their ``warehouse`` wins over the path's.
        :param warehouse: the warehouse in the URI's path (``/w/<warehouse>/v1/config``), if any.
        :raises RestError: 400 for a warehouse outside the grammar (``scope.py``); 503 for ``@pinned`` when
            ZooKeeper is unreachable and the job graph was never read.
        """
        scope = _scope_from_warehouse(query.get("warehouse", warehouse))
        if scope.pinned_at_config:
            scope = scope.with_pin(self._unavailable_as_503(lambda: self.served.pin_now(scope)))
        return {"defaults": {}, "overrides": {"prefix": scope.prefix}, "endpoints": READ_ENDPOINTS}

    def namespaces(self, parent: Optional[str]) -> dict[str, Any]:
        """``GET /v1/{prefix}/namespaces``: the backing catalog's namespaces, under ``parent`` when given.

        :param parent: a namespace, its parts separated by ``\\x1f`` as the REST spec encodes them.
        :raises RestError: 503 when the backing catalog cannot be reached.
        """
        with self.catalog() as catalog:
            found = self._backing(lambda: catalog.list_namespaces(_namespace(parent) if parent else ()))
        return {"namespaces": [list(ns) for ns in found]}

    def namespace(self, namespace: str) -> dict[str, Any]:
        """``GET|HEAD /v1/{prefix}/namespaces/{namespace}``: the namespace and its properties, as the backing
        catalog has them.

        :raises RestError: 404 when the backing catalog has no such namespace, 503 when it cannot be reached.
        """
        properties = self._in_namespace(namespace, lambda catalog, ns: catalog.load_namespace_properties(ns))
        return {"namespace": list(_namespace(namespace)), "properties": dict(properties)}

    def tables(self, namespace: str) -> dict[str, Any]:
        """``GET /v1/{prefix}/namespaces/{namespace}/tables``: every table the backing catalog lists there.

        :raises RestError: 404 when the backing catalog has no such namespace, 503 when it cannot be reached.
        """
        found = self._in_namespace(namespace, lambda catalog, ns: catalog.list_tables(ns))
        return {"identifiers": [{"namespace": list(t[:-1]), "name": t[-1]} for t in found]}

    def _in_namespace(self, namespace: str, call: Any) -> Any:
        """``call(catalog, namespace)`` on a backing catalog; a namespace it lacks is a 404."""
        from pyiceberg.exceptions import NoSuchNamespaceError
        with self.catalog() as catalog:
            try:
                return self._backing(lambda: call(catalog, _namespace(namespace)))
            except NoSuchNamespaceError:
                raise RestError(404, "NoSuchNamespaceException",
                                f"namespace {_dotted(namespace)} does not exist") from None

    def table(self, prefix: str, namespace: str, name: str, client: str, snapshots: Optional[str] = None,
              arrived_ms: Optional[int] = None, refresh: bool = False, cookies: Optional[Mapping[str, str]] = None,
              ) -> tuple[Encoded, dict[str, str], Choice]:
        """The table's LoadTableResult at its served version, its headers (``Tidemark-*``, and ``Set-Cookie`` with the
        client's hold), and the choice made.

        :param cookies: the cookies the client sent: its hold for the table's group among them (``hold.py``).

        A served version's answer is kept ``SERVED_TTL_S`` (``_kept``): the snapshots it shows never change, only what
        the backing catalog may change beside them (properties, schema, tags) is up to twice that late."""
        scope = _scope_from_prefix(prefix)
        identifier = f"{_dotted(namespace)}.{name}"
        choice = self._unavailable_as_503(lambda: self._choose(scope, identifier, client, arrived_ms, refresh, cookies))
        headers: dict[str, str] = {}
        version = choice.version
        if not choice.passthrough and version is not None and version.epoch is not None:
            headers["Tidemark-Epoch"] = str(version.epoch)
            headers["Tidemark-Version-Age-Ms"] = str(max(0, int(time.time() * 1000) - version.epoch))
        if choice.stale:
            headers["Tidemark-Stale"] = "zookeeper-unreachable"
            self.stale.inc()
        if choice.passthrough:
            return self._load_table(identifier, choice, snapshots == "refs"), headers, choice
        key = (identifier, choice.snapshot_id, snapshots == "refs")
        body = self._kept(key, lambda: self._load_table(identifier, choice, snapshots == "refs"))
        hold = self.served.answered(scope, client, choice)
        if hold is not None and choice.group is not None:
            headers["Set-Cookie"] = (f"{cookie_name(scope.prefix, choice.group)}={hold.encode()}; Path=/; "
                                     f"Max-Age={HOLD_COOKIE_AGE_S}; HttpOnly")
        return body, headers, choice

    def _kept(self, key: tuple[str, Optional[int], bool], load: Callable[[], Encoded]) -> Encoded:
        """The answer kept for ``key``, else ``load()``'s, kept ``SERVED_TTL_S``. One load per answer: the clients
        asking meanwhile wait for it (a new version's herd). An answer expired less than ``SERVED_TTL_S`` ago is
        still given while one request's thread loads it again behind it, so a table read all the time never makes a
        client wait for the backing catalog, only a new version does."""
        while True:
            with self._bodies_lock:
                kept = self._bodies.get(key)
                now = time.monotonic()
                if kept is not None and kept[0] > now:
                    return kept[1]
                loading = self._loading.get(key)
                if kept is not None and kept[0] + SERVED_TTL_S > now:
                    if loading is None:
                        self._loading[key] = threading.Event()
                        threading.Thread(target=self._reload, args=(key, load), daemon=True,
                                         name="tidemark-serve-reload").start()
                    return kept[1]
                if loading is None:
                    self._loading[key] = threading.Event()
                    break
            loading.wait(LOAD_WAIT_S)
        return self._load_and_keep(key, load)

    def _reload(self, key: tuple[str, Optional[int], bool], load: Callable[[], Encoded]) -> None:
        try:
            self._load_and_keep(key, load)
        except Exception as exc:  # noqa: BLE001 - the answer expires; the next request loads it and answers the error
            log.warning("tidemark serve: reloading %s failed: %s: %s", key[0], type(exc).__name__, _first_line(exc))

    def _load_and_keep(self, key: tuple[str, Optional[int], bool], load: Callable[[], Encoded]) -> Encoded:
        try:
            body = load()
            with self._bodies_lock:
                if len(self._bodies) > SERVED_KEPT:
                    self._bodies.clear()
                self._bodies[key] = (time.monotonic() + SERVED_TTL_S, body)
            return body
        finally:
            with self._bodies_lock:
                self._loading.pop(key).set()

    def _load_table(self, identifier: str, choice: Choice, refs_only: bool) -> Encoded:
        with self.catalog() as catalog:
            try:
                table = self._backing(lambda: load_table(catalog, self.served.settings, identifier))
            except (TableNotFound, InvalidName):
                raise RestError(404, "NoSuchTableException", f"table {identifier} does not exist in the backing "
                                f"catalog ({self.served.settings.describe()})") from None
        metadata = table.metadata
        if choice.passthrough and WRITER_PROPERTY in metadata.properties:
            raise RestError(503, "ServiceUnavailableException", f"table {identifier} is written by Tidemark job "
                            f"{metadata.properties[WRITER_PROPERTY]!r}, which is not registered in ZooKeeper now (its "
                            "state lost, or the job unregistered): no consistent version of it can be chosen; retry")
        if not choice.passthrough:
            try:
                metadata = served_metadata(metadata, choice.snapshot_id)
            except KeyError:
                raise RestError(503, "ServiceUnavailableException",
                                f"table {identifier}'s snapshot {choice.snapshot_id} of the version served is no "
                                "longer in its metadata (expired): retry; the next version is served") from None
        if refs_only:
            referenced = {ref.snapshot_id for ref in metadata.refs.values()}
            metadata = metadata.model_copy(update={"snapshots": [s for s in metadata.snapshots
                                                                 if s.snapshot_id in referenced]})
        config = storage_config(table.io.properties) if self.storage_config else {}
        # The metadata is serialized once, by pyiceberg, straight into the answer.
        return Encoded(b'{"metadata-location": ' + json.dumps(table.metadata_location).encode() + b', "metadata": '
                       + metadata.model_dump_json().encode() + b', "config": ' + json.dumps(config).encode() + b"}")

    def token(self, form: Mapping[str, str], authorization: Optional[str]) -> dict[str, Any]:
        """``POST /v1/oauth/tokens``: a bearer token (``ServerAuth.issue``) for OAuth2 client credentials.

        :param form: the request's form fields (``grant_type``, ``client_id``, ``client_secret``).
        :param authorization: the ``Authorization`` header: ``Basic`` credentials there win over the form's.
        :raises RestError: 400 for a grant other than ``client_credentials``, 401 for invalid credentials.
        """
        if form.get("grant_type") != "client_credentials":
            raise RestError(400, "unsupported_grant_type", "only the client_credentials grant is supported")
        client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        if authorization and authorization.lower().startswith("basic "):
            client_id, _, secret = base64.b64decode(authorization[6:]).decode().partition(":")
        return {"access_token": self.auth.issue(unquote(client_id), unquote(secret)), "token_type": "bearer",
                "expires_in": TOKEN_LIFETIME_S, "issued_token_type": "urn:ietf:params:oauth:token-type:access_token"}

    def _choose(self, scope: Scope, identifier: str, client: str, arrived_ms: Optional[int], refresh: bool,
                cookies: Optional[Mapping[str, str]]) -> Choice:
        try:
            return self.served.choose(scope, identifier, client, now_ms=arrived_ms, refresh=refresh, cookies=cookies)
        except VersionNotFound as exc:
            # Empty tables are no consistent version either (a derived table may hold a row for an empty source).
            raise RestError(503, "ServiceUnavailableException", f"no consistent version of table {identifier} "
                            f"({scope.describe()}) can be served: {_first_line(exc)}") from None

    def _backing(self, call: Any) -> Any:
        try:
            return call()
        except RestError:
            raise
        except Exception as exc:
            if is_catalog_outage(exc) or isinstance(exc, ConfigurationError):
                raise RestError(503, "ServiceUnavailableException",
                                f"the backing catalog ({self.served.settings.describe()}) cannot be reached: "
                                f"{type(exc).__name__}: {_first_line(exc)}; retry") from None
            raise

    @staticmethod
    def _unavailable_as_503(call: Any) -> Any:
        try:
            return call()
        except ZooKeeperUnavailable as exc:
            raise RestError(503, "ServiceUnavailableException", _first_line(exc)) from None


class _Listener(ThreadingHTTPServer):
    request_queue_size = 1024  # the listen backlog: hundreds of clients connect at once (the default is 5)
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside a request (a TLS handshake refused, a client gone): one log line."""
        error = sys.exc_info()[1]
        log.info("tidemark serve: connection from %s failed: %s", client_address[0], error)


class _Lease:
    def __init__(self, server: CatalogServer) -> None:
        self.server = server

    def __enter__(self) -> Catalog:
        self.catalog = self.server._take()
        return self.catalog

    def __exit__(self, *exc_info: object) -> None:
        self.server._catalogs.put(self.catalog)


class _ServedCollector:
    """The served versions' ages and ZooKeeper's reachability, computed at each scrape from memory."""

    def __init__(self, served: ServedVersions) -> None:
        self.served = served

    def collect(self) -> Iterable[GaugeMetricFamily]:
        now_ms = time.time() * 1000
        age = GaugeMetricFamily("tidemark_serve_version_age_seconds", "How far the newest version served of each "
                                "group is behind the wall clock (group: its first table)", labels=["group"])
        epoch = GaugeMetricFamily("tidemark_serve_version_epoch_timestamp_seconds", "The epoch of the newest "
                                  "version served of each group", labels=["group"])
        for group, version in sorted(self.served.newest_versions().items(), key=lambda kv: min(kv[0])):
            if version.epoch is not None:
                age.add_metric([min(group)], max(0.0, (now_ms - version.epoch) / 1000))
                epoch.add_metric([min(group)], version.epoch / 1000)
        up = GaugeMetricFamily("tidemark_serve_zookeeper_connected", "1 while ZooKeeper answers the server")
        up.add_metric([], 1.0 if self.served.zookeeper_connected else 0.0)
        return [age, epoch, up]


_DATE: list[Any] = [None, ""]  # the second and its Date header (threads may race to set it: both right)


class _Handler(BaseHTTPRequestHandler):
    server_side: CatalogServer
    protocol_version = "HTTP/1.1"  # keep-alive: a client's loads come on one connection
    disable_nagle_algorithm = True  # headers and body are two writes: Nagle and a delayed ACK would add 40 ms

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):
            self.request.settimeout(TLS_HANDSHAKE_S)
            self.request.do_handshake()
            self.request.settimeout(None)
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)

    def date_time_string(self, timestamp: Optional[float] = None) -> str:
        """The ``Date`` header, formatted once a second (``email.utils`` is a tenth of an answer's time)."""
        if timestamp is not None:
            return super().date_time_string(timestamp)
        second = int(time.time())
        if _DATE[0] != second:
            _DATE[:] = [second, super().date_time_string(second)]
        return _DATE[1]

    def do_GET(self) -> None:
        self._answer("GET")

    def do_HEAD(self) -> None:
        self._answer("HEAD")

    def do_POST(self) -> None:
        self._answer("POST")

    def do_PUT(self) -> None:
        self._answer("PUT")

    def do_DELETE(self) -> None:
        self._answer("DELETE")

    def _answer(self, method: str) -> None:
        started = time.perf_counter()
        self._arrived_ms = int(time.time() * 1000)  # a client's loads are timed by their arrival, on the wall clock
        route, status = "other", 500
        headers: dict[str, str] = {}
        body: bytes = b""
        content_type = "application/json"
        try:
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.split("/") if p]
            warehouse: Optional[str] = None
            if len(parts) >= 2 and parts[0] == "w":  # /w/<warehouse>/v1/...: a warehouse in the URI's path
                warehouse, parts = parts[1], parts[2:]
            query = {k: v[-1] for k, v in parse_qs(url.query).items()}
            route, status, payload, headers = self._route(method, parts, query, warehouse)
            if isinstance(payload, Encoded):
                body, content_type = payload.body, payload.content_type
            elif payload is not None:
                body = json.dumps(payload).encode()
        except RestError as exc:
            status, body = exc.status, exc.body()
        except Exception as exc:  # noqa: BLE001 - one line to the client and the log, never a traceback
            log.warning("tidemark serve: %s %s failed: %s: %s", method, self.path, type(exc).__name__,
                        _first_line(exc))
            status, body = 500, RestError(500, "ServerErrorException",
                                          f"{type(exc).__name__}: {_first_line(exc)}").body()
        self._drain()
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        if status == 204:
            self.send_header("Content-Length", "0")
            body = b""
        else:
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if method != "HEAD" and body:
            self.wfile.write(body)
        side = self.server_side
        side.requests.labels(route, str(status)).inc()
        side.latency.labels(route).observe(time.perf_counter() - started)

    def _drain(self) -> None:
        """Read a request body nobody read (a refused write's), so the connection stays usable."""
        length = int(self.headers.get("Content-Length") or 0)
        if length and not getattr(self, "_body_read", False):
            self.rfile.read(length)
            self._body_read = True

    def _form(self) -> dict[str, str]:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length).decode() if length else ""
        self._body_read = True
        return {k: v[-1] for k, v in parse_qs(raw).items()}

    def _route(self, method: str, parts: list[str], query: Mapping[str, str], warehouse: Optional[str],
               ) -> tuple[str, int, Any, dict[str, str]]:
        side = self.server_side
        if parts == ["metrics"] and method in ("GET", "HEAD"):
            return "metrics", 200, Encoded(generate_latest(side.registry), CONTENT_TYPE_LATEST), {}
        if parts in (["healthz"], ["readyz"]) and method in ("GET", "HEAD"):
            ready = parts == ["healthz"] or side.served.zookeeper_connected
            return parts[0], 200 if ready else 503, {"ok": ready}, {}
        if not parts or parts[0] != "v1":
            raise RestError(404, "NotFoundException", f"no route {'/'.join(parts)}: this is an Iceberg REST catalog "
                            "(/v1/config)")
        rest = parts[1:]
        if rest == ["oauth", "tokens"] and method == "POST":
            return "token", 200, side.token(self._form(), self.headers.get("Authorization")), {}
        self._authenticate()
        if rest == ["config"] and method == "GET":
            return "config", 200, side.config(query, warehouse), {}
        if method not in ("GET", "HEAD"):
            raise RestError(403, "ForbiddenException", "tidemark serve is a read-only catalog of consistent "
                            f"versions: write through the backing catalog ({side.served.settings.describe()}), "
                            "where Tidemark's jobs write")
        if len(rest) >= 2 and rest[1] == "namespaces":
            prefix, tail = rest[0], rest[2:]
        elif rest and rest[0] == "namespaces":  # a client that never asked /v1/config: the default scope
            prefix, tail = (Scope.from_warehouse(warehouse).prefix if warehouse else Scope().prefix), rest[1:]
        else:
            raise RestError(404, "NotFoundException", f"no route /v1/{'/'.join(rest)}")
        if not tail:
            return "namespaces", 200, side.namespaces(query.get("parent")), {}
        namespace = tail[0]
        if len(tail) == 1:
            return "namespace", 204 if method == "HEAD" else 200, side.namespace(namespace), {}
        if tail[1] == "tables" and len(tail) == 2:
            return "tables", 200, side.tables(namespace), {}
        if tail[1] == "tables" and len(tail) == 3:
            client = " ".join((self.client_address[0], self.headers.get("User-Agent", ""),
                               _digest(self.headers.get("Authorization", ""))))
            # Iceberg Java loads a table with ``snapshots`` and reloads one it holds (TableOperations.refresh) without
            refresh = "snapshots" not in query and self.headers.get("X-Client-Version", "").startswith("Apache Iceberg")
            loaded, headers, _ = side.table(prefix, namespace, tail[2], client, query.get("snapshots"),
                                            self._arrived_ms, refresh, _cookies(self.headers.get("Cookie")))
            return "table", 204 if method == "HEAD" else 200, loaded, headers
        if tail[1] == "views" and len(tail) == 2:
            return "views", 200, {"identifiers": []}, {}
        if tail[1] == "views" and len(tail) == 3:
            raise RestError(404, "NoSuchViewException", f"view {_dotted(namespace)}.{tail[2]} does not exist")
        raise RestError(404, "NotFoundException", f"no route /v1/{'/'.join(rest)}")

    def _authenticate(self) -> None:
        auth = self.server_side.auth
        if not auth.required:
            return
        header = self.headers.get("Authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else ""
        if not token or not auth.accepts(token):
            raise RestError(401, "NotAuthorizedException", "a valid bearer token is required (OAuth2 client "
                            "credentials at /v1/oauth/tokens, or a token the server was given)")


def storage_config(properties: Mapping[str, str]) -> dict[str, str]:
    """The object-store settings of the backing catalog's FileIO for engines (the ``config`` of a loaded table), under
    pyiceberg's names and Iceberg Java's (``client.region``, ``io-impl``, the path style said aloud: Java's S3FileIO
    and DuckDB default to virtual hosts, pyiceberg to paths on a custom endpoint)."""
    python = {k: str(v) for k, v in properties.items() if k.startswith(STORAGE_PREFIXES)}
    java = {k: v for k, v in java_properties(python).items() if k.startswith(STORAGE_PREFIXES)}
    return {**python, **java}


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """A server-side TLS context, or ``ConfigurationError`` naming the file that cannot be used."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigurationError(f"cannot use the TLS certificate {certfile} and key {keyfile}: {exc}") from None
    return context


def _scope_from_warehouse(warehouse: Optional[str]) -> Scope:
    try:
        return Scope.from_warehouse(warehouse)
    except InvalidArgument as exc:
        raise RestError(400, "BadRequestException", str(exc)) from None


@functools.lru_cache(maxsize=1024)  # a client sends its prefix with every request
def _scope_from_prefix(prefix: str) -> Scope:
    try:
        return Scope.from_prefix(prefix)
    except InvalidArgument as exc:
        raise RestError(400, "BadRequestException", str(exc)) from None


def _cookies(header: Optional[str]) -> dict[str, str]:
    """The cookies a request sent; none for a header that is not a cookie list."""
    cookies: SimpleCookie = SimpleCookie()
    try:
        cookies.load(header or "")
    except CookieError:
        return {}
    return {name: morsel.value for name, morsel in cookies.items()}


def _namespace(text: str) -> tuple[str, ...]:
    return tuple(text.split(NAMESPACE_SEPARATOR))


def _dotted(namespace: str) -> str:
    return ".".join(_namespace(namespace))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16] if text else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["DEFAULT_PORT", "CatalogServer", "RestError", "ServerAuth", "tls_context"]
