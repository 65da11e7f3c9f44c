"""The test network the partition scenarios cut (``tests/helpers/network.py``): a cut drops a host's packets to one
server silently and leaves the other, and healing it lets a connection that was cut go on."""
from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.helpers.network import Host, TestNetwork
from tests.helpers.wait import wait_for

# Inside the host: connect to ADDRESS:PORT, print how that went, then (on "send") send a line and print the answer.
CLIENT = """
import socket, sys
address, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
try:
    conn = socket.create_connection((address, port), timeout=timeout)
except OSError as exc:
    print(type(exc).__name__, flush=True)
    sys.exit()
print("connected", flush=True)
conn.settimeout(None)
for line in sys.stdin:
    conn.sendall(line.encode())
    print(conn.recv(100).decode().strip(), flush=True)
"""


class Echo:
    """A line echo server on 127.0.0.1 (what the network exposes on its addresses)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    @staticmethod
    def _echo(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(100):
                conn.sendall(data)


@pytest.fixture
def network():
    echo = Echo()
    with TestNetwork("test-network") as net:
        yield net, echo.port
    echo.server.close()


def client(host: Host, address: str, port: int, timeout: float = 2.0) -> subprocess.Popen[str]:
    return subprocess.Popen([*host.command, sys.executable, "-c", CLIENT, address, str(port), str(timeout)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def lines(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    return process.stdout.readline()


def test_a_cut_drops_a_hosts_packets_to_one_server_silently_and_leaves_the_other(network):
    net, port = network
    net.expose(port, net.ZOOKEEPER)
    net.expose(port, net.LAKEHOUSE)
    host = net.host("driver")
    net.cut(host, net.ZOOKEEPER)
    started = time.monotonic()
    cut_off = client(host, net.ZOOKEEPER, port)
    assert lines(cut_off).strip() == "TimeoutError"   # unanswered, not refused nor unreachable
    assert time.monotonic() - started >= 1.9
    other = client(host, net.LAKEHOUSE, port)
    assert lines(other).strip() == "connected"
    other.communicate("still here\n", timeout=10)
    net.heal(host, net.ZOOKEEPER)
    healed = client(host, net.ZOOKEEPER, port)
    assert lines(healed).strip() == "connected"
    healed.communicate("", timeout=10)


def test_a_connection_cut_mid_exchange_goes_on_once_healed(network):
    net, port = network
    net.expose(port, net.ZOOKEEPER)
    host = net.host("driver")
    conn = client(host, net.ZOOKEEPER, port)
    assert lines(conn).strip() == "connected"
    net.cut(host, net.ZOOKEEPER)
    assert conn.stdin is not None
    conn.stdin.write("across the cut\n")
    conn.stdin.flush()
    answers: list[str] = []
    reader = threading.Thread(target=lambda: answers.append(lines(conn).strip()), daemon=True)
    reader.start()
    reader.join(2.0)
    assert answers == []                                     # nothing got through while cut
    net.heal(host, net.ZOOKEEPER)
    wait_for(lambda: answers, "the line to get through once healed (TCP retransmits it)", 30)
    assert answers == ["across the cut"]
    conn.communicate("", timeout=10)
