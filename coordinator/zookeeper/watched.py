"""A znode's newest data kept in memory by a watch: one read per change, none per look.

    grid = WatchedNode(tm, tm.paths.barriers)
    grid.current()          # (data, stat), or None for a missing znode: from memory once the watch holds it
    grid.close()

A job's loop looks at the barrier grid and the topology's version on every pass while it waits;
reading them each time would cost requests per pass, more the longer it waits. The watch keeps the
value instead. Its callbacks only store what arrived or re-arm the watch with an asynchronous read:
they never block. kazoo drops watches when the connection drops (SUSPENDED), session or not, so
the value is forgotten then and the watch is set again on reconnection. While no value is held,
``current`` reads the znode itself, within the session's deadline (``ZooKeeperUnavailable``).
"""
from __future__ import annotations

import threading
from typing import Any, Optional

from kazoo.client import KazooState
from kazoo.exceptions import NoNodeError
from kazoo.interfaces import IAsyncResult
from kazoo.protocol.states import WatchedEvent

from coordinator.zookeeper.session import ZooKeeperSession

_UNKNOWN = object()


class WatchedNode:
    """One znode's newest data and stat, kept in memory by a watch set when it is made.

        node = WatchedNode(tm, tm.paths.barriers)
        node.current()          # (data, stat), or None for a missing znode: from memory once the watch holds it
        node.close()

    Znodes: reads, never writes, ``path``, and watches it (for its creation while it does not exist).

    Failure behaviour: while no value is held (the first read has not arrived, or connection trouble dropped
    it), ``current`` reads the znode itself within the session's deadline (``ZooKeeperUnavailable``). kazoo drops
    watches when the connection drops (SUSPENDED or LOST), so the value is forgotten then and the watch set again
    once the connection is back (CONNECTED).
    """

    def __init__(self, tm: ZooKeeperSession, path: str) -> None:
        self.tm, self.path = tm, path
        self._lock = threading.Lock()
        self._value: Any = _UNKNOWN
        self._closed = False
        tm.add_state_listener(self._on_state)
        self._arm()

    def _arm(self) -> None:
        if not self._closed:
            self.tm.client.get_async(self.path, watch=self._on_event).rawlink(self._arrived)

    def _arrived(self, result: IAsyncResult) -> None:
        try:
            data, stat = result.get_nowait()
            value: Any = (data or b"", stat)
        except NoNodeError:
            value = None
            self.tm.client.exists_async(self.path, watch=self._on_event)  # told when it is created
        except Exception:  # noqa: BLE001 - connection trouble: read on demand until the watch is set again
            value = _UNKNOWN
        with self._lock:
            self._value = value

    def _on_event(self, event: WatchedEvent) -> None:
        self._arm()

    def _on_state(self, state: str) -> None:
        if state in (KazooState.SUSPENDED, KazooState.LOST):
            with self._lock:
                self._value = _UNKNOWN
        elif state == KazooState.CONNECTED:
            self._arm()

    def current(self) -> Optional[tuple[bytes, Any]]:
        """The znode's data and stat (None: it does not exist), from memory when the watch holds it."""
        with self._lock:
            value = self._value
        if value is _UNKNOWN:
            return self.tm.get(self.path)
        return value

    def close(self) -> None:
        """Stop watching: a watch that fires after this, or a reconnection, sets none again."""
        self._closed = True
        self.tm.remove_state_listener(self._on_state)
