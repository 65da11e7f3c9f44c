"""The session's watchdog thread: it finds a server rebuilt under the session (its data deleted or restored while
this process was connected) and ends the session, ends it too when the process is stopping with ZooKeeper down,
and unsticks a reconnection that a restarted server never answers.

``Watchdog`` owns the thread and listens to the session's ``ConnectionState``; ``probe_zxid`` is how it asks the
servers, with a fresh client, for their newest transaction.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Callable, Optional

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError

from coordinator.errors import TidemarkError, ZooKeeperRebuilt, ZooKeeperUnavailable
from coordinator.zookeeper.connect import servers
from coordinator.zookeeper.connection import ConnectionState
from coordinator.zookeeper.logs import KAZOO_LOG, RECONNECT_LOG, SESSION_LOG

# A rebuilt server: how long a fresh client may take to connect and read, and how often to look again meanwhile.
PROBE_TIMEOUT_S = 5.0
PROBE_EVERY_S = 1.0
PROBE_CANCEL_CHECK_S = 0.25  # ... and how soon a probe under way gives up once the process is stopping
# ... after the connection has been down this fraction of the session timeout. A server that answers a synced read
# below the session's zxid lost committed data: waiting longer adds no certainty, only recovery time (a restarted
# driver must commit within 3 session timeouts and an epoch, issue 20), while short blips cost no probe.
PROBE_AFTER = 0.5


class Watchdog:
    """The session's helper thread: end the session when the server is behind it, or when the process is stopping
    with the connection down.

    A rebuilt server: a ZooKeeper server whose data was deleted (or restored from an older copy) while this
    process was connected refuses the session for good, since it has seen newer transactions than the server's
    own ("Refusing session request ... as it has seen zxid ..."), and kazoo would retry forever. This thread
    (never kazoo's) watches for it: once the connection has been down for half the session timeout (a short blip
    costs no probe), it connects a fresh, session-less client to the same servers (within ``PROBE_TIMEOUT_S``,
    again every second) and compares the zxid it sees, after a ``sync`` (so a follower answers with at least what
    the quorum committed), with the newest this session saw. A server that answers and is behind this session (on
    an ensemble, in as many probes in a row as it has servers, each starting at the next server, so that no single
    server answering from the past decides) ends it: kazoo is stopped (no more reconnection attempts) and every
    operation raises ``ZooKeeperRebuilt`` at once, saying to restart the process. So does a new session (after an
    expiry) on a server that went backwards (after a sync) or lost this session's tree. A server that does not
    answer is an outage: operations keep raising ``ZooKeeperUnavailable`` after their deadline. A server that
    answers the probe while this session is still reconnecting means kazoo's attempt is stuck (it waits for a
    handshake's answer for the whole session timeout, and a restarted server can take the connection and never
    answer): the thread shuts that attempt's socket down, and kazoo tries again at once, keeping the session. A
    process that is stopping calls ``stop_waiting()`` (the writer does on SIGTERM): while the connection is down,
    operations then fail at once instead of waiting out their deadline, and a probe under way gives up within
    ``PROBE_CANCEL_CHECK_S`` while it connects (a server that takes the connection and then does not answer holds
    it up to ``PROBE_TIMEOUT_S``).
    """

    client: KazooClient
    connection: ConnectionState
    topology: str            # the path of ``/topology``: a new session that does not find it lost the tree
    session_timeout: float
    read_only: bool          # an observer's session creates no tree, so it may run before there is one
    _thread: threading.Thread
    _wake: threading.Event
    _previous: str               # the connection state before the last change
    _down_since: Optional[float]  # time.monotonic() when the connection went down
    _seen_zxid: int              # the newest transaction this session saw, before any expiry
    _new_session: bool           # a new session after an expiry: look at the server once

    def __init__(self, client: KazooClient, connection: ConnectionState, *, topology: str, session_timeout: float,
                 read_only: bool) -> None:
        self.client = client
        self.connection = connection
        self.topology = topology
        self.session_timeout = session_timeout
        self.read_only = read_only
        self._wake = threading.Event()
        self._previous = connection.state
        self._down_since = None
        self._seen_zxid = client.last_zxid or 0
        self._new_session = False
        connection.add_listener(self._on_state_change)
        self._thread = threading.Thread(target=self._watch, name="tidemark-zk-watchdog", daemon=True)

    def start(self) -> None:
        """Start the thread (once)."""
        self._thread.start()

    def wake(self) -> None:
        """Look now (the process is stopping, or the session closing) instead of at the next tick."""
        self._wake.set()

    def is_alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()

    def close(self) -> None:
        """The session closes: wake the thread so that it returns, and while it is ending the session (stopping
        kazoo) wait for that, unless called on the thread itself: ``close()`` may not overtake it."""
        self._wake.set()
        if self.connection.ended is not None and threading.current_thread() is not self._thread:
            self._thread.join(PROBE_TIMEOUT_S + 15)

    def _on_state_change(self, state: str) -> None:
        previous, self._previous = self._previous, state
        # Read before kazoo resets it for a new session (it calls listeners first): a server behind this is rebuilt.
        self._seen_zxid = max(self._seen_zxid, self.client.last_zxid or 0)
        if state == KazooState.CONNECTED:
            self._down_since = None
            self._new_session = self._new_session or previous == KazooState.LOST
        elif self._down_since is None:
            self._down_since = time.monotonic()
        self._wake.set()  # the thread looks (nothing here blocks kazoo's event thread)

    def _watch(self) -> None:
        connection = self.connection
        next_probe = 0.0
        behind = 0  # consecutive probes that found the server behind this session
        while not connection.closing and connection.ended is None:
            self._wake.wait(PROBE_EVERY_S)
            self._wake.clear()
            if connection.closing:
                return
            if connection.state == KazooState.CONNECTED:
                behind = 0
                if self._new_session:
                    self._new_session = False
                    self._look_at_new_session()
                continue
            if connection.stopping:
                self._end(ZooKeeperUnavailable, "ZooKeeper is unreachable and this process is stopping: not "
                                                "waiting for it (a new leader recovers any epoch in flight)")
                return
            down_since = self._down_since
            if down_since is None or time.monotonic() - down_since < PROBE_AFTER * self.session_timeout \
                    or time.monotonic() < next_probe:
                continue
            attempt = attempt_socket(self.client)
            server = probe_zxid(self.client, PROBE_TIMEOUT_S, first=behind,
                                cancelled=lambda: connection.stopping or connection.closing)
            next_probe = time.monotonic() + PROBE_EVERY_S
            if server is not None and server >= self._seen_zxid and connection.state != KazooState.CONNECTED \
                    and not connection.closing:
                self._drop_stuck_attempt(attempt)
            if server is None or server >= self._seen_zxid or connection.state == KazooState.CONNECTED \
                    or connection.closing:
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
        if attempt is None or attempt is not attempt_socket(self.client):
            return
        RECONNECT_LOG.info("ZooKeeper at %s serves, but this session's reconnection has not finished: trying again",
                           servers(self.client))
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
            exists = self.client.exists_async(self.topology).get(timeout=PROBE_TIMEOUT_S)
        except (KazooException, KazooTimeoutError):
            return  # down again: the next connection change looks again
        server = self.client.last_zxid or 0
        if server < self._seen_zxid:
            self._end_rebuilt(f"its newest transaction, {server:#x}, is older than {self._seen_zxid:#x}, which this "
                              "process's expired session had seen")
        elif exists is None and not self.read_only:
            self._end_rebuilt(f"this process's session expired and its tree ({self.topology}) is gone")

    def _end_rebuilt(self, why: str) -> None:
        self._end(ZooKeeperRebuilt, f"the ZooKeeper server at {servers(self.client)} is behind this process's "
                                    f"session: {why}. Its data was rebuilt or restored, so this session can never "
                                    "come back")
        SESSION_LOG.error("%s", self.connection.ended_error())

    def _end(self, error: type[TidemarkError], message: str) -> None:
        """End the session for good: every operation raises ``error`` from now on, and stopping kazoo ends its
        reconnection attempts and every request waiting for a connection (on this thread, never kazoo's)."""
        self.connection.ended = (error, message)
        try:
            self.client.stop()
        except Exception as exc:  # noqa: BLE001 - the session is over either way; close() tries again
            SESSION_LOG.debug("stopping the ended session: %s", exc)


def attempt_socket(client: KazooClient) -> Optional[socket.socket]:
    """The socket of kazoo's current connection or connection attempt (kazoo offers no call for it)."""
    return getattr(getattr(client, "_connection", None), "_socket", None)


def probe_zxid(client: KazooClient, timeout: float, first: int, cancelled: Callable[[], bool]) -> Optional[int]:
    """The newest transaction a fresh, session-less client sees on ``client``'s servers (its TLS settings and
    identities), trying them in order from the ``first``-th, or None when none answers within ``timeout`` (to
    connect, and again to sync) or once ``cancelled()`` (checked every ``PROBE_CANCEL_CHECK_S`` while it
    connects): a server the client's own session cannot reach but this one can, and that is behind it, lost its
    data."""
    start = first % len(client.hosts)
    hosts = servers(client, client.hosts[start:] + client.hosts[:start])
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


__all__ = ["PROBE_AFTER", "PROBE_CANCEL_CHECK_S", "PROBE_EVERY_S", "PROBE_TIMEOUT_S", "Watchdog", "attempt_socket",
           "probe_zxid"]
