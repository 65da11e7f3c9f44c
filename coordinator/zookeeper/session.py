"""The connection to ZooKeeper: ``connect()`` and the deadline-bounded operations every recipe uses.

    session = ZooKeeperSession.connect("zk1:2181,zk2:2181/tidemark-prod", session_timeout=10)
    session.multi([Create(session.paths.job("word_counts"), record.to_json())])

Users get this through ``coordinator.Tidemark``, which adds the recipes; recipes take a
``ZooKeeperSession`` and never the other way round.

Failure behaviour: every operation is retried through tenacity on connection loss and
timeouts until ``operation_timeout`` passes, then raises ``ZooKeeperUnavailable``. The
connection itself is re-established in the background for as long as the object is open
(ZooKeeper sessions survive short outages that way); state changes are recorded by a
listener that never blocks, and recipes (leadership) read them. A server found behind this
session (its data deleted or restored while this process was connected) ends the session:
kazoo is stopped and every operation raises ``ZooKeeperRebuilt`` at once, saying to restart
the process (``ZooKeeperSession._watch_connection`` says how it is found). A process that is
stopping calls ``stop_waiting()``: while the connection is down, operations then fail at once.

Logging: one line per connection state change (``coordinator.zookeeper.session``: a warning
when the connection is suspended or the session lost, an info line when it is back), except
during ``connect``'s first request. kazoo's own lines, one per reconnection attempt
(``Connection dropped: ...``), go to the logger ``coordinator.zookeeper.kazoo``, which passes
only errors; lower its level to see them. Nothing here configures the root logger.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Optional, TypeVar, Union

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    AuthFailedError,
    BadArgumentsError,
    ConnectionLoss,
    InvalidACLError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
    OperationTimeoutError,
    RolledBackError,
    SessionClosedRequireSaslError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import ZnodeStat
from kazoo.retry import KazooRetry
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from coordinator.errors import (
    ConfigurationError,
    MultiFailed,
    PermissionDenied,
    TidemarkError,
    ZooKeeperRebuilt,
    ZooKeeperUnavailable,
)
from coordinator.names import validate_chroot
from coordinator.records import JsonRecord, TopologyVersion
from coordinator.settings import Settings, check_connect_string
from coordinator.zookeeper.clock import ServerClock
from coordinator.zookeeper.ops import Create, Op
from coordinator.zookeeper.paths import Paths
from coordinator.zookeeper.security import Credentials, TlsSettings, diagnose_tls, is_open

log = logging.getLogger(__name__)
# kazoo logs every reconnection attempt at WARNING (20 lines per job in one outage); the state listener says
# what matters in one line per change, so kazoo's logger passes errors only. A level on our own logger, not on
# kazoo's or the root logger: an application that wants the attempts lowers it.
KAZOO_LOG = logging.getLogger("coordinator.zookeeper.kazoo")
# Not the state-change logger: that one says one line per connection change, and a retried attempt is none.
RECONNECT_LOG = logging.getLogger("coordinator.zookeeper.session.reconnect")
KAZOO_LOG.setLevel(logging.ERROR)
R = TypeVar("R", bound=JsonRecord)
S = TypeVar("S", bound="ZooKeeperSession")
RETRYABLE = (ConnectionLoss, OperationTimeoutError, KazooTimeoutError, SessionExpiredError)
# A healthy session comes up in milliseconds; after this long, look for a TLS mismatch instead of waiting it out.
TLS_DIAGNOSIS_AFTER_S = 1.0
# Every server refusing connections this long after that: none runs (a newcomer without `tidemark zk start`, a
# wrong port); say so then instead of after the connect timeout. A server restarting listens again sooner.
REFUSED_FOR_S = 2.0
# A rebuilt server: how long a fresh client may take to connect and read, and how often to look again meanwhile.
PROBE_TIMEOUT_S = 5.0
PROBE_EVERY_S = 1.0
PROBE_CANCEL_CHECK_S = 0.25  # ... and how soon a probe under way gives up once the process is stopping
# ... after the connection has been down this fraction of the session timeout. A server that answers a synced read
# below the session's zxid lost committed data: waiting longer adds no certainty, only recovery time (a restarted
# driver must commit within 3 session timeouts and an epoch, issue 20), while short blips cost no probe.
PROBE_AFTER = 0.5
__all__ = ["ZooKeeperSession"]


class ZooKeeperSession:
    """A ZooKeeper session plus the Tidemark znode layout under ``root``: what every recipe is given.

    It counts its retries per operation and its connection state changes (``retry_counts``,
    ``connection_changes``) for the driver's metrics.
    """

    def __init__(self, client: KazooClient, *, root: str = "/tidemark", operation_timeout: float = 30.0,
                 session_timeout: float = 10.0, member: Optional[str] = None,
                 credentials: Optional[Credentials] = None, read_only: bool = False) -> None:
        self.client = client
        self.credentials = credentials or Credentials()
        # An observer's session creates no tree, so it may run before there is one (see _look_at_new_session).
        self.read_only = read_only or self.credentials.read_only
        # The ACL of the znodes of this session's job, with a job identity (``_learn_operator``); else None.
        self.owned_acl: Optional[list] = None
        self.session_timeout = session_timeout
        self.paths = Paths(root)
        self.operation_timeout = operation_timeout
        self.member = member or f"{socket.gethostname()}-{os.getpid()}"
        self.server_clock = ServerClock()  # ZooKeeper's time, from the stamps of this session's writes
        self._state = KazooState.CONNECTED if client.connected else KazooState.LOST
        self._state_listeners: list[Callable[[str], None]] = []
        self._lock = threading.Lock()
        self._retries: Counter[str] = Counter()
        self._state_changes: Counter[str] = Counter()
        self._closing = False
        self._quiet = False  # connection changes go unlogged (``connect``, until the server answered a request)
        # Set once this session can never come back (a rebuilt server, or the process stopping with ZooKeeper
        # down): (error class, message), raised by every operation from then on.
        self._ended: Optional[tuple[type[TidemarkError], str]] = None
        self._stopping = False
        self._down_since: Optional[float] = None   # time.monotonic() when the connection went down
        self._seen_zxid = client.last_zxid or 0     # the newest transaction this session saw, before any expiry
        self._new_session = False                  # a new session after an expiry: look at the server once
        self._wake = threading.Event()
        client.add_listener(self._on_state_change)
        self._watchdog = threading.Thread(target=self._watch_connection, name="tidemark-zk-watchdog", daemon=True)
        self._watchdog.start()

    @classmethod
    def connect(cls: type[S], hosts: Optional[str] = None, *, root: str = "/tidemark", session_timeout: float = 10.0,
                connect_timeout: float = 15.0, operation_timeout: float = 30.0,
                auth: Optional[tuple[str, str]] = None, reader: Optional[tuple[str, str]] = None,
                tls: Optional[TlsSettings] = None, member: Optional[str] = None,
                read_only: bool = False, job: Optional[tuple[str, str]] = None,
                operator: Optional[Union[str, tuple[str, str]]] = None) -> S:
        """Connect to ``hosts`` (``host:port,...[/chroot]``; default ``TIDEMARK_ZK``, else 127.0.0.1:2181).

        ``auth`` is the writer identity, a digest ``(user, password)`` (default
        ``TIDEMARK_ZK_USER`` / ``TIDEMARK_ZK_PASSWORD``), and ``reader`` the reader identity
        (default ``TIDEMARK_ZK_READER_USER`` / ``TIDEMARK_ZK_READER_PASSWORD``); see
        ``coordinator.zookeeper.security`` for the ACLs they give. With the writer identity, top-level
        znodes that anyone may change are repaired, or ``PermissionDenied`` says what to do.
        ``job`` is this job's own identity (default ``TIDEMARK_ZK_JOB_USER``/``_PASSWORD``) and
        ``operator`` the operator identity's name, or ``(user, password)`` for an operator's
        session (default ``TIDEMARK_ZK_OPERATOR_USER``/``_PASSWORD``): a session with a job
        identity gives the znodes of its job ACLs that only it and the operator may change.
        ``tls`` defaults to ``TlsSettings.from_env()``. ``read_only`` creates and repairs nothing
        (neither the chroot nor the layout), whatever the identity, for observers such as the exporter.

        Raises ``ZooKeeperUnavailable`` when no server answers within ``connect_timeout``,
        ``TlsError`` for a certificate or protocol mismatch (within about a second),
        ``ConfigurationError`` for a malformed connect string and ``InvalidName`` for a bad root.
        """
        settings = Settings.from_env()
        hosts = check_connect_string(hosts) if hosts else settings.zk_connect
        env = Credentials.from_env(settings)
        user, password = _identity(auth, "auth") if auth is not None else (env.user, env.password)
        reader_user, reader_password = (_identity(reader, "reader") if reader is not None
                                        else (env.reader_user, env.reader_password))
        job_user, job_password = _identity(job, "job") if job is not None else (env.job_user, env.job_password)
        operator_user, operator_password = ((operator, None) if isinstance(operator, str) else
                                            _identity(operator, "operator") if operator is not None
                                            else (env.operator_user, env.operator_password))
        credentials = Credentials(user, password, reader_user, reader_password, job_user, job_password,
                                  operator_user, operator_password)
        tls = tls if tls is not None else TlsSettings.from_env(settings)
        paths = Paths(root)  # InvalidName before any connection
        kwargs: dict[str, Any] = {"auth_data": credentials.auth_data(), "default_acl": credentials.default_acl()}
        if tls is not None:
            tls.context()  # a missing or unreadable CA, certificate or key: say so now, not after the timeout
            kwargs.update(tls.kazoo_kwargs())
        try:
            client = KazooClient(
                hosts=hosts, timeout=session_timeout, logger=KAZOO_LOG,
                # Reconnection keeps the session alive through short outages; it runs in the
                # background and never blocks a caller. Operations have their own deadline.
                connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2),
                command_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=1, deadline=operation_timeout),
                **kwargs)
        except ValueError as exc:
            raise ConfigurationError(f"ZooKeeper connect string {hosts!r} is invalid ({exc}): use "
                                     "host:port[,host:port...][/chroot]") from None
        # Connect outside the chroot so we can create it; "host:2181/" has none.
        chroot, client.chroot = ("" if client.chroot == "/" else client.chroot), ""
        if chroot:
            validate_chroot(chroot)
        _start(client, hosts, tls, connect_timeout)
        tm = cls(client, root=paths.root, operation_timeout=operation_timeout, session_timeout=session_timeout,
                 member=member, credentials=credentials, read_only=read_only)
        try:
            # A server that requires authentication closes a session with no identity at its first request: that
            # is one error (PermissionDenied), not a lost connection to log and reconnect from. ``exists`` needs no
            # permission on ``/`` (a shared ensemble may lock it down). On failure the session stays quiet: the
            # dropped connection may reach the listener after the error, and close() follows.
            tm._quiet = True
            tm.call("exists /", client.exists_async, "/")
            tm._quiet = False
            if chroot and not tm.read_only:
                tm.ensure_path(chroot)
            client.chroot = chroot
            if not read_only:
                tm.ensure_layout()
                if credentials.is_job:
                    tm._learn_operator()
        except BaseException:
            tm.close()
            raise
        return tm

    # -- lifecycle and connection state --------------------------------------------------

    def close(self) -> None:
        """End the session for good: kazoo stops, and the server deletes the session's ephemeral znodes (a leader
        znode, election contenders, reader pins). Operations after this raise ``ZooKeeperUnavailable`` (or the
        ``ZooKeeperRebuilt`` that ended the session)."""
        self._closing = True  # the LOST that stop() causes is no news
        self._wake.set()
        if self._ended is not None and threading.current_thread() is not self._watchdog:
            self._watchdog.join(PROBE_TIMEOUT_S + 15)  # it is stopping kazoo: close() may not overtake it
        self.client.stop()
        self.client.close()

    def stop_waiting(self) -> None:
        """This process is stopping (SIGTERM): from now on, while the connection is down, every operation fails
        at once with ``ZooKeeperUnavailable`` and the session ends (kazoo's own waits end with it), instead of
        waiting out ``operation_timeout``. Operations on a connected session go on, so a leader still finishes
        its epoch. Safe to call from a signal handler."""
        self._stopping = True
        self._wake.set()

    def ended_error(self) -> Optional[TidemarkError]:
        """The error every operation raises once this session can never come back, or None."""
        ended = self._ended
        return None if ended is None else ended[0](ended[1])

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def connection_state(self) -> str:
        """kazoo's state of the connection as the last change left it: ``CONNECTED``, ``SUSPENDED`` or ``LOST``."""
        return self._state

    def add_state_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(state)`` runs on kazoo's event thread: it must not block."""
        with self._lock:
            self._state_listeners.append(listener)

    def remove_state_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener`` (a listener never added is ignored)."""
        with self._lock:
            if listener in self._state_listeners:
                self._state_listeners.remove(listener)

    def _on_state_change(self, state: str) -> None:
        previous, self._state = self._state, state
        # Read before kazoo resets it for a new session (it calls listeners first): a server behind this is rebuilt.
        self._seen_zxid = max(self._seen_zxid, self.client.last_zxid or 0)
        if state == KazooState.CONNECTED:
            self._down_since = None
            self._new_session = self._new_session or previous == KazooState.LOST
        elif self._down_since is None:
            self._down_since = time.monotonic()
        self._wake.set()  # the watchdog thread looks (nothing here blocks kazoo's event thread)
        if not self._closing and not self._quiet and self._ended is None and state != previous:
            _log_state_change(self.client, self.session_timeout, previous, state)
        with self._lock:
            self._state_changes[state] += 1
            listeners = list(self._state_listeners)
        for listener in listeners:
            try:
                listener(state)
            except Exception:  # a listener's bug must not break the session
                log.exception("state listener %r failed", listener)

    def _watch_connection(self) -> None:
        """The session's helper thread: end the session when the server is behind it, or when the process is
        stopping with the connection down.

        A rebuilt server: a ZooKeeper server whose data was deleted (or restored from an older copy) while this
        process was connected refuses the session for good, since it has seen newer transactions than the
        server's own ("Refusing session request ... as it has seen zxid ..."), and kazoo would retry forever.
        This thread (never kazoo's) watches for it: once the connection has been down for half the session
        timeout (a short blip costs no probe), it connects a fresh, session-less client to the same servers
        (within ``PROBE_TIMEOUT_S``, again every second) and compares the zxid it sees, after a ``sync`` (so a
        follower answers with at least what the quorum committed), with the newest this session saw. A server
        that answers and is behind this session (on an ensemble, in as many probes in a row as it has servers,
        each starting at the next server, so that no single server answering from the past decides) ends it:
        kazoo is stopped (no more reconnection attempts) and every operation raises ``ZooKeeperRebuilt`` at once,
        saying to restart the process. So does a new session (after an expiry) on a server that went backwards
        (after a sync) or lost this session's tree. A server that does not answer is an outage: operations keep
        raising ``ZooKeeperUnavailable`` after their deadline. A server that answers the probe while this
        session is still reconnecting means kazoo's attempt is stuck (it waits for a handshake's answer for the
        whole session timeout, and a restarted server can take the connection and never answer): the thread
        shuts that attempt's socket down, and kazoo tries again at once, keeping the session. A process that is
        stopping calls ``stop_waiting()`` (the writer does on SIGTERM): while the connection is down, operations
        then fail at once instead of waiting out their deadline, and a probe under way gives up within
        ``PROBE_CANCEL_CHECK_S`` while it connects (a server that takes the connection and then does not answer
        holds it up to ``PROBE_TIMEOUT_S``).
        """
        next_probe = 0.0
        behind = 0  # consecutive probes that found the server behind this session
        while not self._closing and self._ended is None:
            self._wake.wait(PROBE_EVERY_S)
            self._wake.clear()
            if self._closing:
                return
            if self._state == KazooState.CONNECTED:
                behind = 0
                if self._new_session:
                    self._new_session = False
                    self._look_at_new_session()
                continue
            if self._stopping:
                self._end(ZooKeeperUnavailable, "ZooKeeper is unreachable and this process is stopping: not "
                                                "waiting for it (a new leader recovers any epoch in flight)")
                return
            down_since = self._down_since
            if down_since is None or time.monotonic() - down_since < PROBE_AFTER * self.session_timeout \
                    or time.monotonic() < next_probe:
                continue
            attempt = _attempt_socket(self.client)
            server = _probe_zxid(self.client, PROBE_TIMEOUT_S, first=behind,
                                 cancelled=lambda: self._stopping or self._closing)
            next_probe = time.monotonic() + PROBE_EVERY_S
            if server is not None and server >= self._seen_zxid and self._state != KazooState.CONNECTED \
                    and not self._closing:
                self._drop_stuck_attempt(attempt)
            if server is None or server >= self._seen_zxid or self._state == KazooState.CONNECTED or self._closing:
                behind = 0
                continue
            behind += 1
            # One answer per server of an ensemble, each probe starting at the next one: a server that answers a
            # synced read from the past only briefly (a leader cut off from its quorum that has not yet noticed)
            # ends no session, as long as another server answers ahead of it.
            if behind >= len(self.client.hosts):
                self._end_rebuilt(f"it refuses this session, which has seen transaction {self._seen_zxid:#x}, "
                                  f"while its own newest is {server:#x} (a fresh client connects at once)")

    def _drop_stuck_attempt(self, attempt: Optional[socket.socket]) -> None:
        """The server serves (a fresh client just connected and read), yet this session is still not back: kazoo's
        connection attempt is stuck. kazoo waits for the answer to its handshake for the whole session timeout (over
        the number of servers), and a restarted server can take the connection and never answer it: the session
        would then expire waiting (seen after ZooKeeper restarts, in CI and in the fault suite's observer). Shut
        the attempt's socket down: kazoo sees the connection dropped and tries again at once, keeping its session.
        Only ``attempt``, the one under way before the probe began: a newer attempt is not stuck (it may be
        completing its handshake right now)."""
        if attempt is None or attempt is not _attempt_socket(self.client):
            return
        RECONNECT_LOG.info("ZooKeeper at %s serves, but this session's reconnection has not finished: trying again",
                           _servers(self.client))
        try:
            attempt.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed meanwhile: kazoo is trying again already

    def _look_at_new_session(self) -> None:
        """After an expiry, kazoo's new session may be on a server that went backwards or lost the tree."""
        try:
            # A new session may be on a follower that lags (kazoo connects it with no zxid, so no server refuses
            # it): sync first, so that the server answers with at least what the quorum committed.
            self.client.sync_async("/").get(timeout=PROBE_TIMEOUT_S)
            exists = self.client.exists_async(self.paths.topology).get(timeout=PROBE_TIMEOUT_S)
        except (KazooException, KazooTimeoutError):
            return  # down again: the next connection change looks again
        server = self.client.last_zxid or 0
        if server < self._seen_zxid:
            self._end_rebuilt(f"its newest transaction, {server:#x}, is older than {self._seen_zxid:#x}, which this "
                              "process's expired session had seen")
        elif exists is None and not self.read_only:
            self._end_rebuilt(f"this process's session expired and its tree ({self.paths.topology}) is gone")

    def _end_rebuilt(self, why: str) -> None:
        servers = _servers(self.client)
        self._end(ZooKeeperRebuilt, f"the ZooKeeper server at {servers} is behind this process's session: {why}. "
                                    "Its data was rebuilt or restored, so this session can never come back")
        log.error("%s", self.ended_error())

    def _end(self, error: type[TidemarkError], message: str) -> None:
        """End the session for good: every operation raises ``error`` from now on, and stopping kazoo ends its
        reconnection attempts and every request waiting for a connection (on this thread, never kazoo's)."""
        self._ended = (error, message)
        try:
            self.client.stop()
        except Exception as exc:  # noqa: BLE001 - the session is over either way; close() tries again
            log.debug("stopping the ended session: %s", exc)

    def connection_changes(self) -> dict[str, int]:
        """How many times the connection entered each state (``CONNECTED``, ``SUSPENDED``, ``LOST``)."""
        with self._lock:
            return dict(self._state_changes)

    # -- retries ---------------------------------------------------------------------------

    def count_retries(self, operation: str) -> Callable[[RetryCallState], None]:
        """A tenacity ``before_sleep`` hook that counts each retry of ``operation`` (see ``retry_counts``)."""
        def count(_: RetryCallState) -> None:
            with self._lock:
                self._retries[operation] += 1
        return count

    def retry_counts(self) -> dict[str, int]:
        """Retries so far in this session, per operation (``zookeeper``, ``barriers``, ``leader_election``, ...)."""
        with self._lock:
            return dict(self._retries)

    # -- deadline-bounded operations -------------------------------------------------------

    def with_deadline(self, what: str, attempt: Callable[[], Any]) -> Any:
        """Run ``attempt``, retrying transient failures until ``operation_timeout``, then ``ZooKeeperUnavailable``.

        A refusal by the znode's ACL is ``PermissionDenied``; ZooKeeper's other answers
        (no node, node exists, bad version) reach the caller, which decides what they mean.
        """
        ended = self.ended_error()
        if ended is not None:
            raise ended
        retrying = Retrying(stop=stop_after_delay(self.operation_timeout) | _GaveUp(self),
                            wait=wait_random_exponential(multiplier=0.05, max=1.0),
                            retry=retry_if_exception_type(RETRYABLE), reraise=True,
                            before_sleep=self.count_retries("zookeeper"))
        try:
            return retrying(attempt)
        except RETRYABLE as exc:
            ended = self.ended_error()
            if ended is not None:
                raise ended from None
            if self._closing:
                raise ZooKeeperUnavailable(f"this ZooKeeper session was closed: {what} not done") from None
            if self.gave_up():
                raise ZooKeeperUnavailable(f"ZooKeeper is unreachable and this process is stopping: {what} not "
                                           "done") from None
            raise ZooKeeperUnavailable(f"ZooKeeper did not complete {what} within {self.operation_timeout:.0f}s "
                                       f"({type(exc).__name__}); check that the ensemble is up") from None
        except NoAuthError:
            raise self.denied(what) from None
        except SessionClosedRequireSaslError:  # the server's enforce.auth closed a session with no identity
            raise PermissionDenied(
                f"ZooKeeper at {','.join(f'{h}:{p}' for h, p in self.client.hosts)} closed the session of "
                f"{self.credentials.identity} ({what}): the server requires authentication: set TIDEMARK_ZK_USER "
                "and TIDEMARK_ZK_PASSWORD (or the reader identity, TIDEMARK_ZK_READER_USER/_PASSWORD)") from None
        except (InvalidACLError, AuthFailedError) as exc:
            raise ConfigurationError(f"ZooKeeper refused {what} for {self.credentials.identity} "
                                     f"({type(exc).__name__}): check TIDEMARK_ZK_USER and TIDEMARK_ZK_PASSWORD"
                                     ) from None
        except BadArgumentsError:
            raise ConfigurationError(f"ZooKeeper refused {what} as malformed (BadArguments): check the connect "
                                     "string's chroot and the root") from None

    def gave_up(self) -> bool:
        """Whether to stop retrying: the session ended or was closed, or the process is stopping while the
        connection is down."""
        return (self._ended is not None or self._closing
                or (self._stopping and self._state != KazooState.CONNECTED))

    def denied(self, what: str) -> PermissionDenied:
        """The ``PermissionDenied`` for ``what``, refused by a znode's ACL, saying which identity to use (returned,
        for the caller to raise)."""
        hint = ("set TIDEMARK_ZK_USER and TIDEMARK_ZK_PASSWORD to the writer identity this tree is secured with"
                if not self.credentials.is_writer else
                "a job identity changes only its own job's znodes: run this as that job, or as the operator "
                "(TIDEMARK_ZK_OPERATOR_USER/_PASSWORD)" if self.credentials.is_job else
                "this tree is secured with another writer identity, or the znode is a job's that has its own "
                "identity: use that one (TIDEMARK_ZK_USER/_PASSWORD), or the operator's "
                "(TIDEMARK_ZK_OPERATOR_USER/_PASSWORD)")
        return PermissionDenied(f"ZooKeeper refused {what} to {self.credentials.identity} (NoAuth): {hint}")

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
        """Apply ``ops`` atomically; raises ``MultiFailed`` naming the first failing operation."""
        ops = list(ops)

        def attempt() -> list[Any]:
            tx = self.client.transaction()
            for op in ops:
                if isinstance(op, Create):
                    op.add_to(tx, self.acl_for(op.path))
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
                raise self.denied(f"{op.kind} {op.path}")
            if isinstance(result, Exception) and not isinstance(result, RolledBackError):
                raise MultiFailed(op, result)
        return results

    def acl_for(self, path: str) -> Optional[list]:
        """The ACL a znode created at ``path`` gets: its job's (``owned_acl``) for a job's znode in a session with a
        job identity, else the session's default (None)."""
        return self.owned_acl if self.owned_acl is not None and self.paths.job_owned(path) else None

    def may_change(self, path: str, perms: int) -> bool:
        """Whether ``path``'s ACL gives one of this session's identities ``perms`` (kazoo ``Permissions``): a check
        before a change that starts outside ZooKeeper (the server still decides the change itself)."""
        found = self.call(f"read the ACL of {path}", self.client.get_acls_async, path)
        return self.credentials.may_change(found[0], perms)

    def _learn_operator(self) -> None:
        """Find the operator identity's entry (its digest) in the ACL of ``/jobs``, which an operator's session
        gave it, for the ACL of this job's znodes; ``ConfigurationError`` while no operator session connected."""
        acl = self.call(f"read the ACL of {self.paths.jobs}", self.client.get_acls_async, self.paths.jobs)[0]
        entry = self.credentials.operator_entry(acl)
        if entry is None:
            full = (self.client.chroot or "") + self.paths.jobs
            raise ConfigurationError(
                f"{full} does not name the operator identity {self.credentials.operator_user!r}, so the znodes of "
                f"job identity {self.credentials.job_user!r} could not be given to it: run `tidemark init` once as "
                "the operator (TIDEMARK_ZK_USER/_PASSWORD with TIDEMARK_ZK_OPERATOR_USER/_PASSWORD), then start "
                "the job again")
        self.owned_acl = self.credentials.owned_acl(entry)

    def ensure_path(self, path: str, data: bytes = b"", acl: Optional[list] = None) -> None:
        """Create ``path`` (with its missing parents) holding ``data`` unless it exists; a concurrent creation is
        fine.

        :param acl: the ACL it gets (None: the session's default).
        """
        # Look first: creating an existing znode under another user's ACL fails with NoAuth, not NodeExists.
        if self.call(f"exists {path}", self.client.exists_async, path) is not None:
            return
        try:
            self.call(f"create {path}", self.client.create_async, path, data, acl, False, False, True)
        except NodeExistsError:
            pass

    def ensure_layout(self) -> None:
        """Create the top-level znodes once (idempotent, safe to race) and, with the writer identity, secure them.

        A read-only session (only the reader identity) creates nothing.
        """
        if self.credentials.read_only:
            return
        self.ensure_path(self.paths.topology, TopologyVersion(0).to_json())
        for path in self.paths.top_level():
            self.ensure_path(path, acl=self._acl_of(path))
        if self.credentials.is_writer:
            self._repair_open_acls()

    def _acl_of(self, path: str) -> Optional[list]:
        return self.credentials.readers_acl() if path == self.paths.readers else self.credentials.default_acl()

    def _repair_open_acls(self) -> None:
        """Give the writer's ACL to every top-level znode anyone may change (an unauthenticated client made it)."""
        nodes = [self.paths.topology, *self.paths.top_level()]
        if self.paths.root != "/":
            nodes.insert(0, self.paths.root)

        def read_acls() -> list:
            pending = [self.client.get_acls_async(path) for path in nodes]
            return [result.get(timeout=self.operation_timeout)[0] for result in pending]
        for path, acl in zip(nodes, self.with_deadline("reading the top-level ACLs", read_acls)):
            if not is_open(acl):
                if self.credentials.lacks_operator(acl):  # made before the operator identity came: add it
                    self.call(f"set the ACL of {path}", self.client.set_acls_async, path, self._acl_of(path))
                    log.info("%s: gave the operator identity %r every permission", path,
                             self.credentials.operator_user)
                continue
            try:
                self.call(f"set the ACL of {path}", self.client.set_acls_async, path, self._acl_of(path))
            except PermissionDenied:
                full = (self.client.chroot or "") + path
                raise PermissionDenied(
                    f"{full} was created by an unauthenticated client, anyone may change it, and ZooKeeper does "
                    f"not let {self.credentials.identity} repair its ACL: have a ZooKeeper admin run "
                    f"`setAcl {full} digest:{self.credentials.user}:<digest>:cdrwa,world:anyone:r` (zkCli.sh), "
                    "or delete the tree if it holds nothing yet, then connect again") from None
            log.warning("%s was open to anyone (created by an unauthenticated client): gave it the writer's ACL",
                        path)


class _GaveUp(stop_base):
    """A tenacity stop condition: ``session.gave_up()``."""

    def __init__(self, session: ZooKeeperSession) -> None:
        self.session = session

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.session.gave_up()


def _servers(client: KazooClient, hosts: Optional[Sequence[tuple[str, int]]] = None) -> str:
    return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                    for host, port in (client.hosts if hosts is None else hosts))


def _attempt_socket(client: KazooClient) -> Optional[socket.socket]:
    """The socket of kazoo's current connection or connection attempt (kazoo offers no call for it)."""
    return getattr(getattr(client, "_connection", None), "_socket", None)


def _probe_zxid(client: KazooClient, timeout: float, first: int, cancelled: Callable[[], bool]) -> Optional[int]:
    """The newest transaction a fresh, session-less client sees on ``client``'s servers (its TLS settings and
    identities), trying them in order from the ``first``-th, or None when none answers within ``timeout`` (to
    connect, and again to sync) or once ``cancelled()`` (checked every ``PROBE_CANCEL_CHECK_S`` while it
    connects): a server the client's own session cannot reach but this one can, and that is behind it, lost its
    data."""
    start = first % len(client.hosts)
    hosts = _servers(client, client.hosts[start:] + client.hosts[:start])
    probe = KazooClient(hosts=hosts, randomize_hosts=False, timeout=max(timeout, 2.0), logger=KAZOO_LOG,
                        auth_data=list(client.auth_data), use_ssl=client.use_ssl, ca=client.ca,
                        certfile=client.certfile, keyfile=client.keyfile, keyfile_password=client.keyfile_password,
                        verify_certs=client.verify_certs, check_hostname=client.check_hostname,
                        sasl_options=getattr(client._connection, "sasl_options", None))
    try:
        connected, deadline = probe.start_async(), time.monotonic() + timeout
        while not connected.wait(PROBE_CANCEL_CHECK_S):
            if cancelled() or time.monotonic() >= deadline:
                return None
        probe.sync_async("/").get(timeout=timeout)  # its reply carries the server's newest zxid
        return probe.last_zxid or 0
    except (KazooException, KazooTimeoutError, OSError):
        return None
    finally:
        probe.stop()
        probe.close()


def _log_state_change(client: KazooClient, session_timeout: float, previous: str, state: str) -> None:
    """One line per connection state change (on kazoo's event thread: logging never blocks for long)."""
    servers = _servers(client) + (client.chroot or "")
    if state == KazooState.SUSPENDED:
        log.warning("ZooKeeper connection to %s lost: reconnecting; the session survives if it is back within "
                    "%.0f s", servers, session_timeout)
    elif state == KazooState.LOST:
        log.warning("ZooKeeper session on %s ended (expired): its leaderships, locks and pins are gone; "
                    "reconnecting with a new session", servers)
    elif previous == KazooState.LOST:
        log.info("ZooKeeper connection to %s is back, with a new session", servers)
    else:
        log.info("ZooKeeper connection to %s is back (session kept)", servers)


def _identity(pair: object, what: str) -> tuple[str, str]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ConfigurationError(f"{what} must be a (user, password) pair")
    return pair[0], pair[1]


def _start(client: KazooClient, hosts: str, tls: Optional[TlsSettings], connect_timeout: float) -> None:
    """Start the session; a TLS mismatch is reported within about a second, servers that all refuse connections
    within about ``TLS_DIAGNOSIS_AFTER_S + REFUSED_FOR_S``, silence after ``connect_timeout``."""
    started = client.start_async()
    if not started.wait(min(TLS_DIAGNOSIS_AFTER_S, connect_timeout)):
        mismatch = diagnose_tls(client.hosts, tls)
        if mismatch is not None:
            client.stop()
            client.close()
            raise mismatch
        deadline, refused_since = time.monotonic() + connect_timeout - TLS_DIAGNOSIS_AFTER_S, time.monotonic()
        while not client.connected and time.monotonic() < deadline:
            refusals = _refusals(client.hosts)
            if refusals is None:
                refused_since = time.monotonic()
            elif time.monotonic() - refused_since >= REFUSED_FOR_S:
                client.stop()
                client.close()
                raise ZooKeeperUnavailable(
                    f"no ZooKeeper server runs at {hosts} ({refusals}): start one (`tidemark zk start` for a local "
                    "one), or point TIDEMARK_ZK (--zk) at yours")
            started.wait(min(0.25, max(0.0, deadline - time.monotonic())))
    if not client.connected:
        client.stop()
        client.close()
        raise ZooKeeperUnavailable(
            f"no ZooKeeper server answered at {hosts} within {connect_timeout:.0f}s: check TIDEMARK_ZK, "
            "that the servers run (`tidemark zk start` for a local one) and the network")


def _refusals(hosts: Sequence[tuple[str, int]]) -> Optional[str]:
    """Why no server can be reached when each refuses the connection or has a name that does not resolve (what to
    report at once), else None: one listens, or the network is silent (which only the connect timeout tells)."""
    reasons = []
    for host, port in hosts:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return None
        except ConnectionRefusedError:
            reasons.append(f"{host}:{port} refused the connection")
        except socket.gaierror:
            reasons.append(f"{host} is not a known host name")
        except OSError:
            return None
    return "; ".join(reasons)
