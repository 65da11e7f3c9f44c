"""Counting the requests one ZooKeeper session sends, at the server: ``stat`` lists every client connection
with the packets the server received on it, and a session's connection is found by its local port."""
from __future__ import annotations

from coordinator import EmbeddedZooKeeper
from coordinator.operations.zookeeper_server import four_letter_word
from coordinator.zookeeper.session import ZooKeeperSession


def received(server: EmbeddedZooKeeper, tm: ZooKeeperSession) -> int:
    """Packets the server received on ``tm``'s connection so far (its requests and any pings). The port is
    read from kazoo's connection object: kazoo has no public accessor for it."""
    port = tm.client._connection._socket.getsockname()[1]
    reply = (four_letter_word("127.0.0.1", server.port, b"stat") or b"").decode(errors="replace")
    for line in reply.splitlines():
        if f":{port}[" in line and "recved=" in line:
            return int(line.split("recved=", 1)[1].split(",", 1)[0])
    raise AssertionError(f"the server lists no connection from port {port}:\n{reply}")
