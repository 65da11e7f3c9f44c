"""The catalog side of ``tidemark serve``: what each of the Iceberg REST catalog's read routes answers, over
``ServedVersions``, and the server's life (uvicorn running ``asgi.py``'s app).

    server = CatalogServer(ServedVersions(settings, connect), host="0.0.0.0", port=8181, auth=ServerAuth.from_env())
    server.start()                 # a background thread; server.url is where engines point
    server.stop()                  # requests in flight finish; new ones are refused

Routes (the REST spec's, under ``/v1`` or ``/w/<warehouse>/v1``; ``asgi.py`` maps them): ``GET /v1/config``,
``GET|HEAD`` namespaces, a namespace, its tables and a table (``snapshots=all|refs``), ``GET`` views (none), ``POST
/v1/oauth/tokens`` (client credentials). Every other method is refused with the spec's error model: the catalog is
read-only, and the message says where to write. ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz`` are outside
``/v1``, and open.

Headers of a served table: ``Tidemark-Epoch`` (the version's epoch), ``Tidemark-Version-Age-Ms`` (how far it is
behind the wall clock), ``Set-Cookie: tidemark-hold-<digest>=...`` (the client's hold, ``hold.py``: sent back, it
lets any replica continue the client's query) and, while ZooKeeper is unreachable, ``Tidemark-Stale:
zookeeper-unreachable``.

Storage: a table's ``config`` carries the backing catalog's object-store settings (endpoint, region, path style;
``storage_config``). Credentials (``credentials.py``: by default short-lived read-only STS ones for the table's files,
the catalog's own keys only with ``Vending.STATIC``) go only to a client that authenticated and asked for them
(``X-Iceberg-Access-Delegation: vended-credentials``), or to anyone when the operator said so
(``vend_credentials_to_anyone``): with no authentication configured, no secret leaves the server by default.

Failure behaviour: a table that does not exist is a 404 (``NoSuchTableException``), a namespace a 404
(``NoSuchNamespaceException``), a bad warehouse or prefix a 400; the backing catalog or its object store out of
reach, ZooKeeper before the job graph was ever read, or a group with no consistent version yet (a job that committed
nothing; empty tables are not consistent either), a 503 (``ServiceUnavailableException``). An unexpected error is a
500 with its one-line message, logged.
"""
from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from queue import Empty, LifoQueue
from typing import TYPE_CHECKING, Any, NoReturn, Optional
from urllib.parse import unquote

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from pyiceberg.catalog.rest import (
    ConfigResponse,
    ListNamespaceResponse,
    ListTableResponseEntry,
    ListTablesResponse,
    ListViewsResponse,
    NamespaceResponse,
    TableResponse,
)
from pyiceberg.catalog.rest.response import TokenResponse
from pyiceberg.catalog.rest.scan_planning import StorageCredential

from coordinator.errors import (
    ConfigurationError,
    InvalidArgument,
    InvalidName,
    StorageError,
    TableNotFound,
    VersionNotFound,
    ZooKeeperUnavailable,
)
from coordinator.iceberg.catalog import is_catalog_outage, load_table
from coordinator.iceberg.catalog_properties import java_properties
from coordinator.iceberg.snapshots import WRITER_PROPERTY, is_released
from coordinator.serving.asgi import build_app, run_server
from coordinator.serving.auth import TOKEN_LIFETIME_S, ServerAuth
from coordinator.serving.credentials import CredentialVending
from coordinator.serving.hold import cookie_name
from coordinator.serving.limits import DEFAULT_MAX_CONNECTIONS
from coordinator.serving.rest_errors import OAuthError, RestError, first_line
from coordinator.serving.scope import Scope
from coordinator.serving.served_metadata import served_metadata
from coordinator.serving.served_versions import Choice, ServedVersions, WouldWait

if TYPE_CHECKING:
    import uvicorn
    from pyiceberg.catalog import Catalog

_BodyKey = tuple[str, Optional[int], bool, bool]  # table, snapshot, refs only, with credentials

log = logging.getLogger(__name__)
DEFAULT_PORT = 8181  # the port Iceberg's REST catalogs usually take
HOLD_COOKIE_AGE_S = 86_400  # a client's hold outlives its query: it is also the client's floor (never back)
STORAGE_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hadoop.", "py-io-impl", "io-impl")
# A storage property whose name holds one of these is a credential: sent only where credentials are vended.
CREDENTIAL_MARKERS = ("access-key", "secret", "session-token", "token", "password", "account-key", "sas", "credential")
VENDED_CREDENTIALS = "vended-credentials"  # the X-Iceberg-Access-Delegation a client asks for credentials with
SERVED_TTL_S = 1.0  # a served version's answer is kept this long (its snapshots never change)
SERVED_KEPT = 10_000  # answers kept at most (all dropped beyond)
LOAD_WAIT_S = 5.0  # a request waits this long for another's load of the same answer, then loads it itself
CATALOG_WAIT_S = 60.0  # a request waits this long at most for a backing-catalog client another one is using
CATALOG_POOL = 8  # backing-catalog clients kept for the worker threads (each made on first need)
START_TIMEOUT_S = 30.0
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


class CatalogServer:
    """A read-only Iceberg REST catalog serving consistent versions (module docstring).

    :param served: the versions to serve (it owns the backing catalog's and ZooKeeper's sessions).
    :param host: the address to listen on.
    :param port: the port (0: a free one; ``url`` says which).
    :param auth: who may read (default: anyone).
    :param tls: a server-side SSL context (``tls_context``), None for plain HTTP.
    :param storage_config: hand engines the backing catalog's object-store settings with each table.
    :param vend_credentials_to_anyone: hand its credentials too, to every client, authenticated or not (with no
        authentication configured, the only way any client gets them).
    :param credentials: what credentials are vended (default: read-only STS ones for the table's files).
    :param max_connections: open connections at most: a request beyond them is answered 503.
    :raises OSError: the address cannot be listened on.
    """

    served: ServedVersions
    auth: ServerAuth
    registry: CollectorRegistry
    storage_config: bool
    vend_credentials_to_anyone: bool
    credentials: CredentialVending

    def __init__(self, served: ServedVersions, *, host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                 auth: Optional[ServerAuth] = None, tls: Optional[ssl.SSLContext] = None,
                 storage_config: bool = True, vend_credentials_to_anyone: bool = False,
                 credentials: Optional[CredentialVending] = None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        self.served, self.auth, self.storage_config = served, auth or ServerAuth(), storage_config
        self.vend_credentials_to_anyone = vend_credentials_to_anyone
        self.credentials = credentials or CredentialVending()
        self.registry = CollectorRegistry()
        self.requests = Counter("tidemark_serve_requests", "Requests answered, by route and HTTP status",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram("tidemark_serve_request_duration_seconds", "Time to answer a request, by route",
                                 ["route"], registry=self.registry,
                                 buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10))
        self.stale = Counter("tidemark_serve_stale_tables", "Tables served while ZooKeeper was unreachable (the "
                             "last version known)", registry=self.registry)
        self.registry.register(_ServedCollector(served))
        self._bodies: dict[_BodyKey, tuple[float, Encoded]] = {}
        self._bodies_lock = threading.Lock()
        self._loading: dict[_BodyKey, threading.Event] = {}
        self._catalogs: LifoQueue[Catalog] = LifoQueue()
        self._catalogs_made = 0
        self._catalogs_lock = threading.Lock()
        self._socket = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET,
                                            backlog=2048)  # hundreds of clients connect at once
        self.scheme = "https" if tls is not None else "http"
        self._uvicorn: uvicorn.Server = run_server(build_app(self), tls, max_connections)
        self._thread: Optional[threading.Thread] = None

    @property
    def url(self) -> str:
        """Where engines point: ``http(s)://host:port`` as bound (the port chosen when it was given as 0)."""
        host, port = self._socket.getsockname()[:2]
        return f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{port}"

    def start(self) -> CatalogServer:
        """Serve in a background (daemon) thread once listening, and return this server; ``stop`` ends it.

        :raises RuntimeError: the server did not start within ``START_TIMEOUT_S``."""
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self._socket]},
                                        name="tidemark-serve", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("tidemark serve did not start (see the log)")
            time.sleep(0.01)
        return self

    def serve_forever(self) -> None:
        """Serve until ``shut_down`` is called (a signal handler may), then return once the requests in flight are
        answered. ``KeyboardInterrupt`` (Ctrl-C) shuts down the same way."""
        self.start()
        assert self._thread is not None
        try:
            while self._thread.is_alive():
                self._thread.join(0.5)
        except KeyboardInterrupt:
            self.shut_down()
            self._thread.join()

    def shut_down(self) -> None:
        """Stop accepting connections and end the server once the requests in flight are answered (safe in a
        signal handler: it only sets a flag)."""
        self._uvicorn.should_exit = True

    def stop(self) -> None:
        """``shut_down``, wait for it, then close ``served`` (its ZooKeeper session)."""
        self.shut_down()
        if self._thread is not None:
            self._thread.join()
        self._socket.close()
        self.served.close()

    def prefix_of(self, warehouse: Optional[str]) -> str:
        """The prefix of a client that never asked ``/v1/config`` (its warehouse in the URI's path, if any).

        :raises RestError: 400 for a warehouse outside the grammar (``scope.py``)."""
        return _scope_from_warehouse(warehouse).prefix

    def vends_credentials(self, authenticated: bool, delegation: Optional[str]) -> bool:
        """Whether a client gets the object store's credentials with each table: it authenticated and asked for them
        (``X-Iceberg-Access-Delegation: vended-credentials``), or the operator vends them to anyone."""
        asked = VENDED_CREDENTIALS in (delegation or "").lower().replace(" ", "").split(",")
        return self.storage_config and (self.vend_credentials_to_anyone or (authenticated and asked))

    def credentials_go_to(self) -> str:
        """Who ``vends_credentials`` hands them to, and which, in words (the start-up line says it)."""
        if not self.storage_config:
            return "nobody (--no-storage-config)"
        if self.vend_credentials_to_anyone:
            return f"anyone (--unsafe-vend-credentials-to-anyone): {self.credentials.describe()}"
        if not self.auth.required:
            return "nobody (no authentication)"
        return f"authenticated clients that ask: {self.credentials.describe()}"

    # -- the backing catalog, shared by the worker threads --------------------------------

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

    def config(self, warehouse: Optional[str], wait: bool = True) -> Encoded:
        """``GET /v1/config``: the read endpoints, and the warehouse's scope as the ``prefix`` override, a
        ``@pinned`` scope pinned at the version newest now.

        :param warehouse: the client's warehouse (its query parameter, else the URI's ``/w/<warehouse>``), if any.
        :param wait: False: from memory alone (``WouldWait`` for a ``@pinned`` scope, pinned by a resolution).
        :raises RestError: 400 for a warehouse outside the grammar (``scope.py``); 503 for ``@pinned`` when
            ZooKeeper is unreachable and the job graph was never read.
        """
        scope = _scope_from_warehouse(warehouse)
        if scope.pinned_at_config and not wait:
            raise WouldWait
        if scope.pinned_at_config:
            scope = scope.with_pin(self._unavailable_as_503(lambda: self.served.pin_now(scope)))
        response = ConfigResponse(defaults={}, overrides={"prefix": scope.prefix}, endpoints=READ_ENDPOINTS)
        # The endpoints as the spec writes them ("GET /v1/..."), not as pyiceberg's model dumps its Endpoint objects.
        return Encoded(json.dumps({**response.model_dump(exclude={"endpoints"}),
                                   "endpoints": [str(e) for e in response.endpoints or ()]}).encode())

    def namespaces(self, parent: Optional[str]) -> ListNamespaceResponse:
        """``GET /v1/{prefix}/namespaces``: the backing catalog's namespaces, under ``parent`` when given.

        :param parent: a namespace, its parts separated by ``\\x1f`` as the REST spec encodes them.
        :raises RestError: 503 when the backing catalog cannot be reached.
        """
        with self.catalog() as catalog:
            found = self._backing(lambda: catalog.list_namespaces(_namespace(parent) if parent else ()))
        return ListNamespaceResponse(namespaces=list(found))

    def namespace(self, namespace: str) -> NamespaceResponse:
        """``GET|HEAD /v1/{prefix}/namespaces/{namespace}``: the namespace and its properties, as the backing
        catalog has them.

        :raises RestError: 404 when the backing catalog has no such namespace, 503 when it cannot be reached.
        """
        properties = self._in_namespace(namespace, lambda catalog, ns: catalog.load_namespace_properties(ns))
        return NamespaceResponse(namespace=_namespace(namespace), properties=dict(properties))

    def tables(self, namespace: str) -> ListTablesResponse:
        """``GET /v1/{prefix}/namespaces/{namespace}/tables``: every table the backing catalog lists there.

        :raises RestError: 404 when the backing catalog has no such namespace, 503 when it cannot be reached.
        """
        found = self._in_namespace(namespace, lambda catalog, ns: catalog.list_tables(ns))
        return ListTablesResponse(identifiers=[ListTableResponseEntry(namespace=t[:-1], name=t[-1]) for t in found])

    def views(self) -> ListViewsResponse:
        """``GET /v1/{prefix}/namespaces/{namespace}/views``: none (views are not served)."""
        return ListViewsResponse(identifiers=[])

    def view(self, namespace: str, name: str) -> NoReturn:
        """``GET /v1/{prefix}/namespaces/{namespace}/views/{view}``.

        :raises RestError: 404, always: views are not served."""
        raise RestError(404, "NoSuchViewException", f"view {_dotted(namespace)}.{name} does not exist")

    def write(self) -> NoReturn:
        """Any write: the catalog is read-only.

        :raises RestError: 403, naming the backing catalog, where to write."""
        raise RestError(403, "ForbiddenException", "tidemark serve is a read-only catalog of consistent versions: "
                        f"write through the backing catalog ({self.served.settings.describe()}), where Tidemark's "
                        "jobs write")

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
              vended: bool = False, wait: bool = True) -> tuple[Encoded, dict[str, str], Choice]:
        """The table's LoadTableResult at its served version, its headers (``Tidemark-*``, and ``Set-Cookie`` with the
        client's hold), and the choice made.

        :param cookies: the cookies the client sent: its hold for the table's group among them (``hold.py``).
        :param vended: the object store's credentials go with the table (``vends_credentials``).
        :param wait: False: from memory alone, on the event loop: ``WouldWait`` where the answer needs a resolution,
            a catalog load or a lock another request holds (then ask again in a worker thread).

        A served version's answer is kept ``SERVED_TTL_S`` (``_kept``): the snapshots it shows never change, only what
        the backing catalog may change beside them (properties, schema, tags) is up to twice that late."""
        scope = _scope_from_prefix(prefix)
        identifier = f"{_dotted(namespace)}.{name}"
        # a first resolution loads a table per job (``Resolver``: its tidemarks checked against an older copy's)
        choice = self._unavailable_as_503(lambda: self._backing(lambda: self._choose(
            scope, identifier, client, arrived_ms, refresh, cookies, wait)))
        headers: dict[str, str] = {}
        version = choice.version
        if not choice.passthrough and version is not None and version.epoch is not None:
            headers["Tidemark-Epoch"] = str(version.epoch)
            headers["Tidemark-Version-Age-Ms"] = str(max(0, int(time.time() * 1000) - version.epoch))
        refs_only = snapshots == "refs"
        if choice.passthrough:
            if not wait:
                raise WouldWait
            return self._load_table(identifier, choice, refs_only, vended), headers, choice
        key = (identifier, choice.snapshot_id, refs_only, vended)
        body = self._kept(key, lambda: self._load_table(identifier, choice, refs_only, vended), wait)
        if choice.stale:  # counted once the answer is at hand (not for an attempt from memory that would wait)
            headers["Tidemark-Stale"] = "zookeeper-unreachable"
            self.stale.inc()
        hold = self.served.answered(scope, client, choice)
        if hold is not None and choice.group is not None:
            headers["Set-Cookie"] = (f"{cookie_name(scope.prefix, choice.group)}={hold.encode()}; Path=/; "
                                     f"Max-Age={HOLD_COOKIE_AGE_S}; HttpOnly")
        return body, headers, choice

    def _kept(self, key: _BodyKey, load: Callable[[], Encoded], wait: bool = True) -> Encoded:
        """The answer kept for ``key``, else ``load()``'s, kept ``SERVED_TTL_S``. One load per answer: the clients
        asking meanwhile wait for it (a new version's herd), up to ``LOAD_WAIT_S``, then load it themselves. An
        answer expired less than ``SERVED_TTL_S`` ago is still given while one worker loads it again behind it, so a
        table read all the time never makes a client wait for the backing catalog, only a new version does. Without
        ``wait``, ``WouldWait`` where a client would wait or load."""
        waited_out = False
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
                if not wait:
                    raise WouldWait
                owner = loading is None
                if owner:
                    self._loading[key] = threading.Event()
            if owner or waited_out:  # waited out: the other load is late (a slow catalog), this request's own beside
                return self._load_and_keep(key, load, owner)
            assert loading is not None
            waited_out = not loading.wait(LOAD_WAIT_S)

    def _reload(self, key: _BodyKey, load: Callable[[], Encoded]) -> None:
        try:
            self._load_and_keep(key, load, owner=True)
        except Exception as exc:  # noqa: BLE001 - the answer expires; the next request loads it and answers the error
            log.warning("tidemark serve: reloading %s failed: %s: %s", key[0], type(exc).__name__, first_line(exc))

    def _load_and_keep(self, key: _BodyKey, load: Callable[[], Encoded], owner: bool) -> Encoded:
        """``load()``'s answer, kept; ``owner``: this load is the one registered for ``key`` (others wait for it)."""
        try:
            body = load()
            with self._bodies_lock:
                if len(self._bodies) > SERVED_KEPT:
                    self._bodies.clear()
                self._bodies[key] = (time.monotonic() + SERVED_TTL_S, body)
            return body
        finally:
            if owner:
                with self._bodies_lock:
                    self._loading.pop(key).set()

    def _load_table(self, identifier: str, choice: Choice, refs_only: bool, vended: bool) -> Encoded:
        with self.catalog() as catalog:
            try:
                table = self._backing(lambda: load_table(catalog, self.served.settings, identifier))
            except (TableNotFound, InvalidName):
                raise RestError(404, "NoSuchTableException", f"table {identifier} does not exist in the backing "
                                f"catalog ({self.served.settings.describe()})") from None
        metadata = table.metadata
        # A table of a Tidemark job missing from the graph is served as its catalog has it only once its writer
        # released it: until the job is back its current snapshot may be behind what was served ("When ZooKeeper
        # loses its state" in docs/design.md), the rule a Resolver follows too.
        if choice.passthrough and WRITER_PROPERTY in metadata.properties and not is_released(metadata.properties):
            raise RestError(503, "ServiceUnavailableException", f"table {identifier} is written by Tidemark job "
                            f"{metadata.properties[WRITER_PROPERTY]!r}, which is not registered in ZooKeeper now and "
                            "did not release it: retry once the job has registered again (ZooKeeper's state lost), "
                            "or, for a job unregistered by an earlier Tidemark release, "
                            f"`tidemark release {identifier}`")
        if not choice.passthrough:
            behind = self.served.behind_iceberg(choice.table, table)
            if behind is not None:
                raise RestError(503, "ServiceUnavailableException", f"table {identifier}: {behind}")
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
        credentials: list[StorageCredential] = []
        if vended:
            try:
                vended_keys = self.credentials.for_table(table.io.properties, metadata.location)
            except StorageError as exc:
                log.warning("tidemark serve: %s", first_line(exc))
                raise RestError(503, "ServiceUnavailableException", first_line(exc)) from None
            # The spec's storage-credentials (for the table's files: DuckDB scopes its secret by them), and the
            # config too, where engines that predate them look.
            config.update(vended_keys)
            if vended_keys:
                credentials.append(StorageCredential(prefix=metadata.location, config={**config, **vended_keys}))
        response = TableResponse(**{"metadata-location": table.metadata_location, "metadata": metadata,
                                    "config": config, "storage-credentials": credentials})
        return Encoded(response.model_dump_json().encode())

    def token(self, form: Mapping[str, str], authorization: Optional[str]) -> TokenResponse:
        """``POST /v1/oauth/tokens``: a bearer token (``ServerAuth.issue``) for OAuth2 client credentials.

        :param form: the request's form fields, decoded (``grant_type``, ``client_id``, ``client_secret``).
        :param authorization: the ``Authorization`` header: ``Basic`` credentials there win over the form's.
        :raises OAuthError: ``unsupported_grant_type`` for a grant other than ``client_credentials``,
            ``invalid_request`` for unreadable ``Basic`` credentials, ``invalid_client`` for invalid ones.
        """
        if form.get("grant_type") != "client_credentials":
            raise OAuthError("unsupported_grant_type", "only the client_credentials grant is supported")
        client_id, secret = form.get("client_id", ""), form.get("client_secret", "")
        if authorization and authorization[:6].lower() == "basic ":
            try:
                client_id, _, secret = base64.b64decode(authorization[6:], validate=True).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                raise OAuthError("invalid_request", "the Basic credentials are not base64 of id:secret") from None
            client_id, secret = unquote(client_id), unquote(secret)  # RFC 6749 2.3.1: form-encoded, then base64
        return TokenResponse(access_token=self.auth.issue(client_id, secret), token_type="bearer",
                             expires_in=TOKEN_LIFETIME_S,
                             issued_token_type="urn:ietf:params:oauth:token-type:access_token")

    def _choose(self, scope: Scope, identifier: str, client: str, arrived_ms: Optional[int], refresh: bool,
                cookies: Optional[Mapping[str, str]], wait: bool) -> Choice:
        try:
            return self.served.choose(scope, identifier, client, now_ms=arrived_ms, refresh=refresh, cookies=cookies,
                                      wait=wait)
        except VersionNotFound as exc:
            # Empty tables are no consistent version either (a derived table may hold a row for an empty source).
            raise RestError(503, "ServiceUnavailableException", f"no consistent version of table {identifier} "
                            f"({scope.describe()}) can be served: {first_line(exc)}") from None

    def _backing(self, call: Any) -> Any:
        try:
            return call()
        except RestError:
            raise
        except Exception as exc:
            if is_catalog_outage(exc) or isinstance(exc, ConfigurationError):
                raise RestError(503, "ServiceUnavailableException",
                                f"the backing catalog ({self.served.settings.describe()}) cannot be reached: "
                                f"{type(exc).__name__}: {first_line(exc)}; retry") from None
            raise

    @staticmethod
    def _unavailable_as_503(call: Any) -> Any:
        try:
            return call()
        except ZooKeeperUnavailable as exc:
            raise RestError(503, "ServiceUnavailableException", first_line(exc)) from None


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



def storage_config(properties: Mapping[str, str], with_credentials: bool = False) -> dict[str, str]:
    """The object-store settings of the backing catalog's FileIO for engines (the ``config`` of a loaded table), under
    pyiceberg's names and Iceberg Java's (``client.region``, ``io-impl``, the path style said aloud: Java's S3FileIO
    and DuckDB default to virtual hosts, pyiceberg to paths on a custom endpoint).

    :param with_credentials: the credentials too (keys, tokens: ``CREDENTIAL_MARKERS``)."""
    python = {k: str(v) for k, v in properties.items() if k.startswith(STORAGE_PREFIXES)}
    java = {k: v for k, v in java_properties(python).items() if k.startswith(STORAGE_PREFIXES)}
    return {k: v for k, v in {**python, **java}.items() if with_credentials or not is_credential(k)}


def is_credential(key: str) -> bool:
    """Whether a storage property is a credential (a key, a secret, a token), sent only where credentials are vended."""
    return any(marker in key.lower() for marker in CREDENTIAL_MARKERS)


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


def _namespace(text: str) -> tuple[str, ...]:
    return tuple(text.split(NAMESPACE_SEPARATOR))


def _dotted(namespace: str) -> str:
    return ".".join(_namespace(namespace))


__all__ = ["DEFAULT_PORT", "CatalogServer", "Encoded", "storage_config", "tls_context"]
