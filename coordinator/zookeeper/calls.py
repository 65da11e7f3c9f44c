"""Deadline-bounded requests: each is retried on connection loss and timeouts, with jittered backoff, until the
session's ``operation_timeout``, then raises ``ZooKeeperUnavailable``; and the session's retry counts.

``Calls.with_deadline`` is the one retry loop for requests (``call``, ``get``, ``get_many``, ``read``,
``children`` and ``multi`` are built on it); ``count_retries`` is the hook every retry loop counts with,
this one's as ``zookeeper`` (``races.py`` for the others).
"""
from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Optional, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    BadArgumentsError,
    ConnectionLoss,
    InvalidACLError,
    NoAuthError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    SessionClosedRequireSaslError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_random_exponential
from tenacity.stop import stop_base

from coordinator.errors import ConfigurationError, MultiFailed, PermissionDenied, ZooKeeperUnavailable
from coordinator.records import JsonRecord
from coordinator.zookeeper.acls import Acls
from coordinator.zookeeper.clock import ServerClock
from coordinator.zookeeper.connection import ConnectionState
from coordinator.zookeeper.ops import Create, Op

R = TypeVar("R", bound=JsonRecord)
RETRYABLE = (ConnectionLoss, OperationTimeoutError, KazooTimeoutError, SessionExpiredError)


class Calls:
    """A session's requests, each within ``operation_timeout``, and its retries counted per operation.

    A refusal by a znode's ACL is ``PermissionDenied``; ZooKeeper's other answers (no node, node exists, bad
    version) reach the caller, which decides what they mean.
    """

    client: KazooClient
    connection: ConnectionState
    acls: Acls
    operation_timeout: float
    server_clock: ServerClock  # ZooKeeper's time, observed from the stamps of each multi
    _retries: Counter[str]
    _lock: threading.Lock

    def __init__(self, client: KazooClient, connection: ConnectionState, acls: Acls, operation_timeout: float,
                 server_clock: ServerClock) -> None:
        self.client = client
        self.connection = connection
        self.acls = acls
        self.operation_timeout = operation_timeout
        self.server_clock = server_clock
        self._retries = Counter()
        self._lock = threading.Lock()

    # -- retries ---------------------------------------------------------------------------

    def count_retries(self, operation: str) -> Callable[[RetryCallState], None]:
        """A tenacity ``before_sleep`` hook that counts each retry of ``operation`` (see ``retry_counts``)."""
        def count(_: RetryCallState) -> None:
            with self._lock:
                self._retries[operation] += 1
        return count

    def retry_counts(self) -> dict[str, int]:
        """Retries so far, per operation (``zookeeper``, ``barriers``, ``leader_election``, ...)."""
        with self._lock:
            return dict(self._retries)

    # -- deadline-bounded operations -------------------------------------------------------

    def with_deadline(self, what: str, attempt: Callable[[], Any]) -> Any:
        """Run ``attempt``, retrying transient failures until ``operation_timeout``.

        :param what: the request, as messages name it.
        :raises ZooKeeperUnavailable: not done by the deadline, or the session was closed or gave up (the process
            is stopping); the error that ended the session (``ZooKeeperRebuilt``) once it ended.
        :raises PermissionDenied: a znode's ACL refused it, or the server requires an identity.
        :raises ConfigurationError: the server refused the identity or the request as malformed.
        """
        connection = self.connection
        ended = connection.ended_error()
        if ended is not None:
            raise ended
        retrying = Retrying(stop=stop_after_delay(self.operation_timeout) | _GaveUp(connection),
                            wait=wait_random_exponential(multiplier=0.05, max=1.0),
                            retry=retry_if_exception_type(RETRYABLE), reraise=True,
                            before_sleep=self.count_retries("zookeeper"))
        try:
            return retrying(attempt)
        except RETRYABLE as exc:
            ended = connection.ended_error()
            if ended is not None:
                raise ended from None
            if connection.closing:
                raise ZooKeeperUnavailable(f"this ZooKeeper session was closed: {what} not done") from None
            if connection.gave_up():
                raise ZooKeeperUnavailable(f"ZooKeeper is unreachable and this process is stopping: {what} not "
                                           "done") from None
            raise ZooKeeperUnavailable(f"ZooKeeper did not complete {what} within {self.operation_timeout:.0f}s "
                                       f"({type(exc).__name__}); check that the ensemble is up") from None
        except NoAuthError:
            raise self.acls.denied(what) from None
        except SessionClosedRequireSaslError:  # the server's enforce.auth closed a session with no identity
            raise PermissionDenied(
                f"ZooKeeper at {','.join(f'{h}:{p}' for h, p in self.client.hosts)} closed the session of "
                f"{self.acls.credentials.identity} ({what}): the server requires authentication: set "
                "TIDEMARK_ZK_USER and TIDEMARK_ZK_PASSWORD (or the reader identity, "
                "TIDEMARK_ZK_READER_USER/_PASSWORD)") from None
        except (InvalidACLError, AuthFailedError) as exc:
            raise ConfigurationError(f"ZooKeeper refused {what} for {self.acls.credentials.identity} "
                                     f"({type(exc).__name__}): check TIDEMARK_ZK_USER and TIDEMARK_ZK_PASSWORD"
                                     ) from None
        except BadArgumentsError:
            raise ConfigurationError(f"ZooKeeper refused {what} as malformed (BadArguments): check the connect "
                                     "string's chroot and the root") from None

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a kazoo async call and wait for it, retrying transient failures until the deadline."""
        return self.with_deadline(what, lambda: fn(*args).get(timeout=self.operation_timeout))

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
        return self.with_deadline(f"{len(paths)} reads", attempt)

    def read(self, path: str, record: type[R]) -> Optional[tuple[R, Any]]:
        """Decode ``path`` as ``record`` (``CorruptState`` naming the znode if it cannot be)."""
        found = self.get(path)
        return None if found is None else (record.from_json(found[0], path), found[1])

    def children(self, path: str) -> list[str]:
        """The names of ``path``'s children ([] when it does not exist)."""
        try:
            return self.call(f"list {path}", self.client.get_children_async, path)
        except NoNodeError:
            return []

    def multi(self, ops: Iterable[Op]) -> list[Any]:
        """Apply ``ops`` atomically (a created znode gets ``Acls.acl_for`` its path).

        :raises MultiFailed: naming the first failing operation.
        :raises PermissionDenied: a znode's ACL refused one of them.
        """
        ops = list(ops)

        def attempt() -> list[Any]:
            tx = self.client.transaction()
            for op in ops:
                if isinstance(op, Create):
                    op.add_to(tx, self.acls.acl_for(op.path))
                else:
                    op.add_to(tx)
            sent = time.monotonic()
            answer = tx.commit_async().get(timeout=self.operation_timeout)
            stamps = [r.mtime for r in answer if isinstance(r, ZnodeStat)]
            if stamps:  # the server stamped the multi's changes as it took it (the first is as good as any)
                self.server_clock.observe(sent, time.monotonic(), stamps[0])
            return answer
        results = self.with_deadline(f"a {len(ops)}-operation multi", attempt)
        for op, result in zip(ops, results):
            if isinstance(result, NoAuthError):
                raise self.acls.denied(f"{op.kind} {op.path}")
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise MultiFailed(op, result)
        return results


class _GaveUp(stop_base):
    """A tenacity stop condition: ``ConnectionState.gave_up()``."""

    def __init__(self, connection: ConnectionState) -> None:
        self.connection = connection

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.connection.gave_up()


__all__ = ["RETRYABLE", "Calls"]
