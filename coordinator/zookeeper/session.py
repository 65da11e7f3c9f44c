"""The connection to ZooKeeper: ``connect()`` and the deadline-bounded operations every recipe uses.

    session = ZooKeeperSession.connect("zk1:2181,zk2:2181/tidemark-prod", session_timeout=10)
    session.multi([Create(session.paths.job("word_counts"), record.to_json())])

Users get this through ``coordinator.Tidemark``, which adds the recipes; recipes take a
``ZooKeeperSession`` and never the other way round. ``ZooKeeperSession`` is the one facade of
parts that each do one job: ``connect.py`` (opening the connection), ``connection.py`` (its
state and listeners), ``watchdog.py`` (the thread that ends a session that can never come
back), ``calls.py`` (deadline-bounded requests, retry counts), ``races.py`` (compare-and-set
retried), ``acls.py`` and ``layout.py`` (ACLs and the tree's top-level znodes).

Failure behaviour: every operation is retried through tenacity on connection loss and
timeouts until ``operation_timeout`` passes, then raises ``ZooKeeperUnavailable``. The
connection itself is re-established in the background for as long as the object is open
(ZooKeeper sessions survive short outages that way); state changes are recorded by a
listener that never blocks, and recipes (leadership) read them. A server found behind this
session (its data deleted or restored while this process was connected) ends the session:
kazoo is stopped and every operation raises ``ZooKeeperRebuilt`` at once (``watchdog.Watchdog``
says how it is found); ``reopen`` then gives a new session with the same settings. A process that is
stopping calls ``stop_waiting()``: while the connection is down, operations then fail at once.

Logging: one line per connection state change (``coordinator.zookeeper.session``: a warning
when the connection is suspended or the session lost, an info line when it is back), except
during ``connect``'s first request. kazoo's own lines, one per reconnection attempt
(``Connection dropped: ...``), go to the logger ``coordinator.zookeeper.kazoo``, which passes
only errors; lower its level to see them. Nothing here configures the root logger.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from typing import Any, Callable, Optional, TypeVar, Union

from kazoo.client import KazooClient
from tenacity import RetryCallState

from coordinator.errors import ConfigurationError, PermissionDenied, TidemarkError
from coordinator.records import JsonRecord
from coordinator.settings import Settings, check_connect_string
from coordinator.zookeeper.acls import Acls
from coordinator.zookeeper.calls import Calls
from coordinator.zookeeper.clock import ServerClock
from coordinator.zookeeper.connect import credentials_from, new_client, start
from coordinator.zookeeper.connection import ConnectionState
from coordinator.zookeeper.layout import Layout
from coordinator.zookeeper.logs import KAZOO_LOG
from coordinator.zookeeper.ops import Op
from coordinator.zookeeper.paths import Paths
from coordinator.zookeeper.races import retry_races
from coordinator.zookeeper.security import Credentials, TlsSettings
from coordinator.zookeeper.watchdog import Watchdog

R = TypeVar("R", bound=JsonRecord)
S = TypeVar("S", bound="ZooKeeperSession")
T = TypeVar("T")
__all__ = ["KAZOO_LOG", "ZooKeeperSession"]


class ZooKeeperSession:
    """A ZooKeeper session plus the Tidemark znode layout under ``root``: what every recipe is given.

    It counts its retries per operation and its connection state changes (``retry_counts``,
    ``connection_changes``) for the driver's metrics.
    """

    client: KazooClient
    credentials: Credentials
    read_only: bool              # creates and repairs nothing (an observer's session, or the reader identity)
    session_timeout: float
    paths: Paths
    operation_timeout: float
    member: str                  # this process, as election contenders and leader znodes name it
    server_clock: ServerClock    # ZooKeeper's time, from the stamps of this session's writes
    _reopen: Optional[Callable[[], ZooKeeperSession]]  # ``connect`` with this session's arguments (``reopen``)
    _connection_state: ConnectionState
    _acls: Acls
    _calls: Calls
    _layout: Layout
    _watchdog: Watchdog

    def __init__(self, client: KazooClient, *, root: str = "/tidemark", operation_timeout: float = 30.0,
                 session_timeout: float = 10.0, member: Optional[str] = None,
                 credentials: Optional[Credentials] = None, read_only: bool = False) -> None:
        self.client = client
        self.credentials = credentials or Credentials()
        # An observer's session creates no tree, so it may run before there is one (see Watchdog).
        self.read_only = read_only or self.credentials.read_only
        self.session_timeout = session_timeout
        self.paths = Paths(root)
        self.operation_timeout = operation_timeout
        self.member = member or f"{socket.gethostname()}-{os.getpid()}"
        self.server_clock = ServerClock()
        self._reopen = None
        self._connection_state = ConnectionState(client, session_timeout)
        self._acls = Acls(self.credentials, self.paths)
        self._calls = Calls(client, self._connection_state, self._acls, operation_timeout, self.server_clock)
        self._layout = Layout(client, self._calls, self._acls)
        self._watchdog = Watchdog(client, self._connection_state, topology=self.paths.topology,
                                  session_timeout=session_timeout, read_only=self.read_only)
        client.add_listener(self._connection_state.changed)
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
        credentials = credentials_from(settings, auth=auth, reader=reader, job=job, operator=operator)
        tls = tls if tls is not None else TlsSettings.from_env(settings)
        paths = Paths(root)  # InvalidName before any connection
        client, chroot = new_client(hosts, credentials, tls, session_timeout=session_timeout,
                                    operation_timeout=operation_timeout)
        start(client, hosts, tls, connect_timeout)
        tm = cls(client, root=paths.root, operation_timeout=operation_timeout, session_timeout=session_timeout,
                 member=member, credentials=credentials, read_only=read_only)
        try:
            # A server that requires authentication closes a session with no identity at its first request: that
            # is one error (PermissionDenied), not a lost connection to log and reconnect from. ``exists`` needs no
            # permission on ``/`` (a shared ensemble may lock it down). On failure the session stays quiet: the
            # dropped connection may reach the listener after the error, and close() follows.
            tm._connection_state.quiet = True
            tm.call("exists /", client.exists_async, "/")
            tm._connection_state.quiet = False
            if chroot and not tm.read_only:
                tm.ensure_path(chroot)
            client.chroot = chroot
            if not read_only:
                tm.ensure_layout()
                if credentials.is_job:
                    tm._layout.learn_operator()
        except BaseException:
            tm.close()
            raise
        tm._reopen = lambda: cls.connect(hosts, root=root, session_timeout=session_timeout,
                                         connect_timeout=connect_timeout, operation_timeout=operation_timeout,
                                         auth=auth, reader=reader, tls=tls, member=tm.member, read_only=read_only,
                                         job=job, operator=operator)
        return tm

    def reopen(self: S) -> S:
        """A new session on the same servers with this one's settings (identity, TLS, timeouts, member name), for a
        process that starts over after ``ZooKeeperRebuilt``; this one is closed first.

        :raises ConfigurationError: this session was not opened by ``connect``, so its settings are unknown.
        :raises ZooKeeperUnavailable: no server answers within the connect timeout.
        """
        if self._reopen is None:
            raise ConfigurationError("this ZooKeeper session was not opened by connect(), so it cannot be opened "
                                     "again: restart the process")
        self.close()
        return self._reopen()  # type: ignore[return-value]

    # -- lifecycle and connection state (connection.py, watchdog.py) ----------------------

    def close(self) -> None:
        """End the session for good: kazoo stops, and the server deletes the session's ephemeral znodes (a leader
        znode, election contenders, reader pins). Operations after this raise ``ZooKeeperUnavailable`` (or the
        ``ZooKeeperRebuilt`` that ended the session)."""
        self._connection_state.closing = True  # the LOST that stop() causes is no news
        self._watchdog.close()
        self.client.stop()
        self.client.close()

    def stop_waiting(self) -> None:
        """This process is stopping (SIGTERM): from now on, while the connection is down, every operation fails
        at once with ``ZooKeeperUnavailable`` and the session ends (kazoo's own waits end with it), instead of
        waiting out ``operation_timeout``. Operations on a connected session go on, so a leader still finishes
        its epoch. Safe to call from a signal handler."""
        self._connection_state.stopping = True
        self._watchdog.wake()

    def ended_error(self) -> Optional[TidemarkError]:
        """The error every operation raises once this session can never come back, or None."""
        return self._connection_state.ended_error()

    def gave_up(self) -> bool:
        """Whether to stop retrying: the session ended or was closed, or the process is stopping while the
        connection is down."""
        return self._connection_state.gave_up()

    def __enter__(self: S) -> S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def connection_state(self) -> str:
        """kazoo's state of the connection as the last change left it: ``CONNECTED``, ``SUSPENDED`` or ``LOST``."""
        return self._connection_state.state

    def add_state_listener(self, listener: Callable[[str], None]) -> None:
        """``listener(state)`` runs on kazoo's event thread: it must not block."""
        self._connection_state.add_listener(listener)

    def remove_state_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener`` (a listener never added is ignored)."""
        self._connection_state.remove_listener(listener)

    def connection_changes(self) -> dict[str, int]:
        """How many times the connection entered each state (``CONNECTED``, ``SUSPENDED``, ``LOST``)."""
        return self._connection_state.changes()

    # -- retries (calls.py, races.py) -----------------------------------------------------

    def count_retries(self, operation: str) -> Callable[[RetryCallState], None]:
        """A tenacity ``before_sleep`` hook that counts each retry of ``operation`` (see ``retry_counts``)."""
        return self._calls.count_retries(operation)

    def retry_counts(self) -> dict[str, int]:
        """Retries so far in this session, per operation (``zookeeper``, ``barriers``, ``leader_election``, ...)."""
        return self._calls.retry_counts()

    def retry_races(self, message: str, attempt: Callable[[], T], *, counter: Optional[str] = None) -> T:
        """Run ``attempt`` again while it raises ``races.Raced`` (its compare-and-set lost a race: it decides again
        on what is there now), with jittered backoff, until ``operation_timeout``. It sleeps: never call it on
        kazoo's event thread (a watch or a state listener).

        :param message: what the ``ZooKeeperUnavailable`` at the deadline says: what kept racing, what to do.
        :param counter: the ``retry_counts`` operation each retry counts as (None: not counted).
        :raises ZooKeeperUnavailable: it still lost at the deadline (``message``), or ZooKeeper did not answer.
        """
        return retry_races(attempt, deadline=self.operation_timeout, message=message,
                           on_retry=None if counter is None else self.count_retries(counter))

    # -- deadline-bounded operations (calls.py) -------------------------------------------

    def with_deadline(self, what: str, attempt: Callable[[], Any]) -> Any:
        """Run ``attempt``, retrying transient failures until ``operation_timeout``, then ``ZooKeeperUnavailable``.

        A refusal by the znode's ACL is ``PermissionDenied``; ZooKeeper's other answers
        (no node, node exists, bad version) reach the caller, which decides what they mean.
        """
        return self._calls.with_deadline(what, attempt)

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a kazoo async call and wait for it, retrying transient failures until the deadline."""
        return self._calls.call(what, fn, *args)

    def get(self, path: str) -> Optional[tuple[bytes, Any]]:
        """Data and stat of ``path``, or None when it does not exist."""
        return self._calls.get(path)

    def get_many(self, paths: Sequence[str]) -> list[Optional[tuple[bytes, Any]]]:
        """Pipelined gets: one round trip's latency for any number of znodes."""
        return self._calls.get_many(paths)

    def read(self, path: str, record: type[R]) -> Optional[tuple[R, Any]]:
        """Decode ``path`` as ``record`` (``CorruptState`` naming the znode if it cannot be)."""
        return self._calls.read(path, record)

    def children(self, path: str) -> list[str]:
        """The names of ``path``'s children ([] when it does not exist)."""
        return self._calls.children(path)

    def multi(self, ops: Iterable[Op]) -> list[Any]:
        """Apply ``ops`` atomically; raises ``MultiFailed`` naming the first failing operation."""
        return self._calls.multi(ops)

    # -- ACLs and the tree's layout (acls.py, layout.py) ----------------------------------

    @property
    def owned_acl(self) -> Optional[list]:
        """The ACL of the znodes of this session's job, with a job identity (learnt at ``connect``); else None."""
        return self._acls.owned

    @owned_acl.setter
    def owned_acl(self, acl: Optional[list]) -> None:
        self._acls.owned = acl

    def denied(self, what: str) -> PermissionDenied:
        """The ``PermissionDenied`` for ``what``, refused by a znode's ACL, saying which identity to use (returned,
        for the caller to raise)."""
        return self._acls.denied(what)

    def acl_for(self, path: str) -> Optional[list]:
        """The ACL a znode created at ``path`` gets: its job's (``owned_acl``) for a job's znode in a session with a
        job identity, else the session's default (None)."""
        return self._acls.acl_for(path)

    def may_change(self, path: str, perms: int) -> bool:
        """Whether ``path``'s ACL gives one of this session's identities ``perms`` (kazoo ``Permissions``): a check
        before a change that starts outside ZooKeeper (the server still decides the change itself)."""
        return self._layout.may_change(path, perms)

    def ensure_path(self, path: str, data: bytes = b"", acl: Optional[list] = None) -> None:
        """Create ``path`` (with its missing parents) holding ``data`` unless it exists; a concurrent creation is
        fine.

        :param acl: the ACL it gets (None: the session's default).
        """
        self._layout.ensure_path(path, data, acl)

    def ensure_layout(self) -> None:
        """Create the top-level znodes once (idempotent, safe to race) and, with the writer identity, secure them.

        A read-only session (only the reader identity) creates nothing.
        """
        self._layout.ensure_layout()
