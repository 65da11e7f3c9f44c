"""The connection to ZooKeeper: ``Tidemark.connect()`` and the deadline-bounded operations every recipe uses.

    tm = Tidemark.connect("zk1:2181,zk2:2181/tidemark-prod", session_timeout=10)
    tm.register_job("word_counts", sources=["lake.db.words"], sinks=["lake.db.word_counts"])

Failure behaviour: every operation is retried through tenacity on connection loss and
timeouts until ``operation_timeout`` passes, then raises ``ZooKeeperUnavailable``. The
connection itself is re-established in the background for as long as the object is open
(ZooKeeper sessions survive short outages that way); state changes are recorded by a
listener that never blocks, and recipes (leadership) read them.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (ConnectionLoss, NodeExistsError, NoNodeError, OperationTimeoutError, RolledBackError,
                              SessionExpiredError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry
from kazoo.security import make_acl, make_digest_acl
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential

from .errors import ConfigurationError, ZooKeeperUnavailable
from .paths import Paths
from .records import JsonRecord, TopologyVersion

log = logging.getLogger(__name__)
R = TypeVar("R", bound=JsonRecord)
DEFAULT_CONNECT = "127.0.0.1:2181"
RETRYABLE = (ConnectionLoss, OperationTimeoutError, KazooTimeoutError, SessionExpiredError)


@dataclass(frozen=True)
class TlsSettings:
    """TLS towards ZooKeeper's secure client port (``secureClientPort``)."""

    ca: Optional[str] = None
    certfile: Optional[str] = None
    keyfile: Optional[str] = None
    verify_certs: bool = True


@dataclass(frozen=True)
class Op:
    """One operation of a ZooKeeper multi; build them with the helpers below."""

    kind: str
    path: str
    data: bytes = b""
    version: int = -1
    ephemeral: bool = False


def create(path: str, data: bytes = b"", ephemeral: bool = False) -> Op:
    return Op("create", path, data, ephemeral=ephemeral)


def set_data(path: str, data: bytes, version: int = -1) -> Op:
    return Op("set", path, data, version)


def check(path: str, version: int) -> Op:
    return Op("check", path, version=version)


def delete(path: str, version: int = -1) -> Op:
    return Op("delete", path, version=version)


class MultiFailed(Exception):
    """A multi was rolled back: ``op`` is the operation that failed, ``error`` the ZooKeeper error."""

    def __init__(self, op: Op, error: Exception) -> None:
        super().__init__(f"{op.kind} {op.path}: {type(error).__name__}")
        self.op, self.error = op, error


class Tidemark:
    """A ZooKeeper session plus the Tidemark znode layout under ``root``."""

    def __init__(self, client: KazooClient, *, root: str = "/tidemark", operation_timeout: float = 30.0,
                 session_timeout: float = 10.0, member: Optional[str] = None) -> None:
        self.client = client
        self.session_timeout = session_timeout
        self.paths = Paths(root)
        self.operation_timeout = operation_timeout
        self.member = member or f"{socket.gethostname()}-{os.getpid()}"
        self._state = KazooState.CONNECTED if client.connected else KazooState.LOST
        self._state_listeners: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._topology = None  # the last topology read (coordinator.topology keeps it fresh)
        client.add_listener(self._on_state_change)

    @classmethod
    def connect(cls, hosts: Optional[str] = None, *, root: str = "/tidemark", session_timeout: float = 10.0,
                connect_timeout: float = 15.0, operation_timeout: float = 30.0,
                auth: Optional[tuple[str, str]] = None, tls: Optional[TlsSettings] = None,
                member: Optional[str] = None) -> "Tidemark":
        """Connect to ``hosts`` (``host:port,...[/chroot]``; default ``TIDEMARK_ZK``, else 127.0.0.1:2181).

        ``auth`` is a digest ``(user, password)`` (default ``TIDEMARK_ZK_USER`` /
        ``TIDEMARK_ZK_PASSWORD``): znodes are then created writable by that user only and
        readable by everyone. Raises ``ZooKeeperUnavailable`` when no server
        answers within ``connect_timeout``.
        """
        hosts = hosts or os.environ.get("TIDEMARK_ZK") or DEFAULT_CONNECT
        if auth is None and os.environ.get("TIDEMARK_ZK_USER"):
            auth = (os.environ["TIDEMARK_ZK_USER"], os.environ.get("TIDEMARK_ZK_PASSWORD", ""))
        kwargs: dict[str, Any] = {}
        if auth is not None:
            user, password = auth
            kwargs["auth_data"] = [("digest", f"{user}:{password}")]
            kwargs["default_acl"] = [make_digest_acl(user, password, all=True), make_acl("world", "anyone", read=True)]
        if tls is not None:
            kwargs.update(use_ssl=True, ca=tls.ca, certfile=tls.certfile, keyfile=tls.keyfile,
                          verify_certs=tls.verify_certs)
        client = KazooClient(
            hosts=hosts, timeout=session_timeout,
            # Reconnection keeps the session alive through short outages; it runs in the
            # background and never blocks a caller. Operations have their own deadline.
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2),
            command_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=1, deadline=operation_timeout),
            **kwargs)
        chroot, client.chroot = client.chroot, ""  # connect outside the chroot so we can create it
        try:
            client.start(timeout=connect_timeout)
            if chroot:
                client.ensure_path(chroot)
        except KazooTimeoutError:
            client.close()
            raise ZooKeeperUnavailable(
                f"no ZooKeeper server answered at {hosts} within {connect_timeout:.0f}s: check TIDEMARK_ZK, "
                "that the servers run (`tidemark zk start` for a local one) and the network") from None
        except ValueError as exc:
            raise ConfigurationError(f"ZooKeeper connect string {hosts!r} is invalid: {exc}") from None
        client.chroot = chroot
        tm = cls(client, root=root, operation_timeout=operation_timeout, session_timeout=session_timeout,
                 member=member)
        tm.ensure_layout()
        return tm

    # -- lifecycle and connection state --------------------------------------------------

    def close(self) -> None:
        self.client.stop()
        self.client.close()

    def __enter__(self) -> "Tidemark":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    @property
    def connection_state(self) -> str:
        return self._state

    def add_state_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(state)`` runs on kazoo's event thread: it must not block."""
        with self._lock:
            self._state_listeners.append(listener)

    def remove_state_listener(self, listener: Callable[[str], None]) -> None:
        with self._lock:
            if listener in self._state_listeners:
                self._state_listeners.remove(listener)

    def _on_state_change(self, state: str) -> None:
        self._state = state
        with self._lock:
            listeners = list(self._state_listeners)
        for listener in listeners:
            try:
                listener(state)
            except Exception:  # noqa: BLE001 - a listener's bug must not break the session
                log.exception("state listener %r failed", listener)

    # -- deadline-bounded operations -------------------------------------------------------

    def _with_deadline(self, what: str, attempt: Callable[[], Any]) -> Any:
        """Run ``attempt``, retrying transient failures until ``operation_timeout``, then ``ZooKeeperUnavailable``."""
        retrying = Retrying(stop=stop_after_delay(self.operation_timeout),
                            wait=wait_random_exponential(multiplier=0.05, max=1.0),
                            retry=retry_if_exception_type(RETRYABLE), reraise=True)
        try:
            return retrying(attempt)
        except RETRYABLE as exc:
            raise ZooKeeperUnavailable(f"ZooKeeper did not complete {what} within {self.operation_timeout:.0f}s "
                                       f"({type(exc).__name__}); check that the ensemble is up") from None

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a kazoo async call and wait for it, retrying transient failures until the deadline."""
        return self._with_deadline(what, lambda: fn(*args).get(timeout=self.operation_timeout))

    def get(self, path: str) -> Optional[tuple[bytes, Any]]:
        """Data and stat of ``path``, or None when it does not exist."""
        try:
            return self.call(f"get {path}", self.client.get_async, path)
        except NoNodeError:
            return None

    def get_many(self, paths: Sequence[str]) -> list[Optional[tuple[bytes, Any]]]:
        """Pipelined gets: one round trip's latency for any number of znodes."""
        def attempt() -> list[Optional[tuple[bytes, Any]]]:
            pending = [self.client.get_async(p) for p in paths]
            results: list[Optional[tuple[bytes, Any]]] = []
            for result in pending:
                try:
                    results.append(result.get(timeout=self.operation_timeout))
                except NoNodeError:
                    results.append(None)
            return results
        return self._with_deadline(f"{len(paths)} reads", attempt)

    def read(self, path: str, record: type[R]) -> Optional[tuple[R, Any]]:
        """Decode ``path`` as ``record`` (``CorruptState`` naming the znode if it cannot be)."""
        found = self.get(path)
        return None if found is None else (record.from_json(found[0], path), found[1])

    def children(self, path: str) -> list[str]:
        try:
            return self.call(f"list {path}", self.client.get_children_async, path)
        except NoNodeError:
            return []

    def multi(self, ops: Iterable[Op]) -> list[Any]:
        """Apply ``ops`` atomically; raises ``MultiFailed`` naming the first failing operation."""
        ops = list(ops)

        def attempt() -> list[Any]:
            tx = self.client.transaction()
            for op in ops:
                if op.kind == "create":
                    tx.create(op.path, op.data, ephemeral=op.ephemeral)
                elif op.kind == "set":
                    tx.set_data(op.path, op.data, op.version)
                elif op.kind == "check":
                    tx.check(op.path, op.version)
                else:
                    tx.delete(op.path, op.version)
            return tx.commit_async().get(timeout=self.operation_timeout)
        results = self._with_deadline(f"a {len(ops)}-operation multi", attempt)
        for op, result in zip(ops, results):
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise MultiFailed(op, result)
        return results

    def ensure_path(self, path: str, data: bytes = b"") -> None:
        # Look first: creating an existing znode under another user's ACL fails with NoAuth, not NodeExists.
        if self.call(f"exists {path}", self.client.exists_async, path) is not None:
            return
        try:
            self.call(f"create {path}", self.client.create_async, path, data, None, False, False, True)
        except NodeExistsError:
            pass

    def ensure_layout(self) -> None:
        """Create the top-level znodes once (idempotent, safe to race)."""
        self.ensure_path(self.paths.topology, TopologyVersion(0).to_json())
        for path in self.paths.top_level():
            self.ensure_path(path)

    # -- the recipes (each in its own module) ------------------------------------------------

    def topology(self):
        from .topology import read_topology
        return read_topology(self)

    def register_job(self, name: str, *, sources: Iterable[str], sinks: Iterable[str], replace: bool = False):
        from .registry import register_job
        return register_job(self, name, sources=sources, sinks=sinks, replace=replace)

    def unregister_job(self, name: str, *, confirm: bool = False, catalog=None):
        """See ``registry.unregister_job``: without ``confirm=True`` it only raises ``UnregisterNotConfirmed``."""
        from .registry import unregister_job
        return unregister_job(self, name, confirm=confirm, catalog=catalog)

    def fence_job(self, name: str, by: str = "operator") -> int:
        from .registry import fence_job
        return fence_job(self, name, by=by)

    def leadership(self, job: str):
        from .leadership import Leadership
        return Leadership(self, job)

    @property
    def barriers(self):
        from .barriers import Barriers
        return Barriers(self)

    def tidemarks(self, tables: Iterable[str]):
        from .tidemarks import read_tidemarks
        return read_tidemarks(self, tables)

    def tidemark_cache(self):
        from .tidemarks import TidemarkCache
        return TidemarkCache(self)

    def status(self):
        from .status import read_status
        return read_status(self)


