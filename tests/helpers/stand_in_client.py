"""``StandInClient``: just enough of a ``KazooClient`` for a ``ZooKeeperSession`` that makes no request (a unit test of
pure logic: the retry loop, the watchdog's decision), with the servers, connection and last zxid a test gives."""
from __future__ import annotations

from typing import Callable


class StandInClient:
    """A KazooClient that is never started: ``hosts``, ``connected`` and ``last_zxid`` are what the session reads."""

    chroot = ""

    def __init__(self, servers: int = 1, connected: bool = True, last_zxid: int = 0) -> None:
        self.hosts = tuple((f"zk{i + 1}", 2181) for i in range(servers))
        self.connected = connected
        self.last_zxid = last_zxid

    def add_listener(self, listener: Callable[[str], None]) -> None:
        pass

    def stop(self) -> None:
        pass

    def close(self) -> None:
        pass
