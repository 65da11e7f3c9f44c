"""The connection's state as a session sees it: kazoo's state after the last change, the listeners told of each
change, how often each state was entered (for the metrics), and whether the session is closing, stopping, or
ended for good.

``ConnectionState.changed`` is the session's one kazoo listener and never blocks; the watchdog (``watchdog.py``)
and recipes (leadership, watched znodes) listen to it in turn. It logs one line per change (``log_change``).
"""
from __future__ import annotations

import threading
from collections import Counter
from typing import Callable, Optional

from kazoo.client import KazooClient, KazooState

from coordinator.errors import TidemarkError
from coordinator.zookeeper.connect import servers
from coordinator.zookeeper.logs import SESSION_LOG


class ConnectionState:
    """One session's connection state and its listeners, and the end of the session.

    ``closing``: ``close()`` was called. ``stopping``: the process is stopping (``stop_waiting()``). ``quiet``:
    changes go unlogged (``connect``, until the server answered a request). ``ended``: set once the session can
    never come back (a rebuilt server, or the process stopping with ZooKeeper down), as the error class and message
    every operation raises from then on.
    """

    client: KazooClient
    session_timeout: float
    state: str
    closing: bool
    stopping: bool
    quiet: bool
    ended: Optional[tuple[type[TidemarkError], str]]
    _listeners: list[Callable[[str], None]]
    _entered: Counter[str]
    _lock: threading.Lock

    def __init__(self, client: KazooClient, session_timeout: float) -> None:
        self.client = client
        self.session_timeout = session_timeout
        self.state = KazooState.CONNECTED if client.connected else KazooState.LOST
        self.closing = False
        self.stopping = False
        self.quiet = False
        self.ended = None
        self._listeners = []
        self._entered = Counter()
        self._lock = threading.Lock()

    def changed(self, state: str) -> None:
        """kazoo's listener: record ``state``, log the change and tell every listener (on kazoo's event thread:
        nothing here blocks, and a listener's exception is logged, never raised)."""
        previous, self.state = self.state, state
        if not self.closing and not self.quiet and self.ended is None and state != previous:
            log_change(self.client, self.session_timeout, previous, state)
        with self._lock:
            self._entered[state] += 1
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener(state)
            except Exception:  # noqa: BLE001 - logged with its traceback: a listener's bug must not break the session
                SESSION_LOG.exception("state listener %r failed", listener)

    def add_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(state)`` on every change, on kazoo's event thread: it must not block."""
        with self._lock:
            self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener`` (a listener never added is ignored)."""
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def changes(self) -> dict[str, int]:
        """How many times the connection entered each state (``CONNECTED``, ``SUSPENDED``, ``LOST``)."""
        with self._lock:
            return dict(self._entered)

    def ended_error(self) -> Optional[TidemarkError]:
        """The error every operation raises once the session can never come back, or None."""
        ended = self.ended
        return None if ended is None else ended[0](ended[1])

    def gave_up(self) -> bool:
        """Whether to stop retrying: the session ended or was closed, or the process is stopping while the
        connection is down."""
        return self.ended is not None or self.closing or (self.stopping and self.state != KazooState.CONNECTED)


def log_change(client: KazooClient, session_timeout: float, previous: str, state: str) -> None:
    """One line per connection state change (on kazoo's event thread: logging never blocks for long)."""
    where = servers(client) + (client.chroot or "")
    if state == KazooState.SUSPENDED:
        SESSION_LOG.warning("ZooKeeper connection to %s lost: reconnecting; the session survives if it is back "
                            "within %.0f s", where, session_timeout)
    elif state == KazooState.LOST:
        SESSION_LOG.warning("ZooKeeper session on %s ended (expired): its leaderships, locks and pins are gone; "
                            "reconnecting with a new session", where)
    elif previous == KazooState.LOST:
        SESSION_LOG.info("ZooKeeper connection to %s is back, with a new session", where)
    else:
        SESSION_LOG.info("ZooKeeper connection to %s is back (session kept)", where)


__all__ = ["ConnectionState", "log_change"]
