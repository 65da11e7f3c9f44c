"""A test network of real Linux network namespaces, for partitions: drivers in hosts of their own, cut from a
server and healed again by the kernel's routing, not by a proxy that could answer for them.

    with TestNetwork("faults") as net:
        zookeeper = net.expose(zk_port, net.ZOOKEEPER)            # "10.N.0.1:<port>", reached over the bridge
        uri = net.reach("http://127.0.0.1:8181/v1", net.LAKEHOUSE) # every loopback port in it, exposed so
        host = net.host("counter-0")                              # a namespace with one veth on the bridge
        subprocess.Popen([*host.command, sys.executable, ...])    # a process inside it
        net.cut(host, net.ZOOKEEPER)                              # its packets to that address are dropped
        net.heal(host, net.ZOOKEEPER)

The layout: a bridge in this (the root) namespace with two addresses, ``ZOOKEEPER`` (``10.N.0.1``) and
``LAKEHOUSE`` (``10.N.0.2``): the servers the drivers reach, kept apart so that a host can lose one and keep
the other. The servers listen on 127.0.0.1 (every embedded server does), so ``expose`` puts a ``socat``
forwarder on the bridge address in front of each port. Each host is a namespace with loopback and one veth
(``eth0``, ``10.N.0.<10+i>``) on the bridge. ``cut`` points the host's neighbour entry for the server's address
at a link-layer address nothing has: its packets to the server vanish (no reset, no error: TCP retransmits
into the void and a new connection's SYN goes unanswered, as across a failed switch), and what the server
sends is never acknowledged. ``heal`` removes the entry, and TCP's retransmissions get through again. (This
kernel has no ``tc`` actions and the machine no iptables: a neighbour entry drops as silently.)

Needs root, iproute2 and socat (``make setup`` installs both). Each network takes a subnet no live process's
network holds (from one its tag picks), so runs side by side never meet. Everything it made is removed on
exit, and what a killed earlier run left in the subnet it takes is removed first.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
import signal
import socket
import subprocess
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tests.helpers.wait import wait_for

SUBNETS = 150                   # 10.100.0.0/24 to 10.249.0.0/24
NOWHERE = "02:00:00:00:00:01"   # a locally administered link-layer address no interface has


class NetworkUnavailable(RuntimeError):
    """This machine cannot make the test network (not root, no iproute2 or socat, no namespaces)."""


def _ip(*args: str, namespace: Optional[str] = None, check: bool = True) -> subprocess.CompletedProcess:
    command = ["ip", *(["-n", namespace] if namespace else []), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetworkUnavailable(f"`{' '.join(command)}` failed: {done.stderr.strip()}")
    return done


@dataclass(frozen=True)
class Host:
    """A network namespace on the test network: ``command`` runs a program inside it."""

    name: str
    namespace: str
    address: str

    @property
    def command(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]


class TestNetwork:
    __test__ = False  # not a pytest test class

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self._use(100 + zlib.crc32(tag.encode()) % SUBNETS)
        self.hosts: dict[str, Host] = {}
        self._forwarders: list[subprocess.Popen] = []
        self._exposed: dict[tuple[int, str], str] = {}
        self._cut: set[tuple[str, str]] = set()

    def _use(self, number: int) -> None:
        """Subnet ``10.<number>.0.0/24``, and interface names of its own (at most 15 bytes)."""
        self.prefix = f"tm{number}"
        self.subnet = ipaddress.ip_network(f"10.{number}.0.0/24")
        self.ZOOKEEPER = f"10.{number}.0.1"
        self.LAKEHOUSE = f"10.{number}.0.2"
        self.bridge = f"{self.prefix}br"

    def _claim_subnet(self) -> None:
        """The first subnet, from the tag's own on, that no live process's test network holds (its bridge's alias
        is its owner's pid), removing what a dead one left behind; the bridge is made, naming this process."""
        first = zlib.crc32(self.tag.encode()) % SUBNETS
        for step in range(SUBNETS):
            self._use(100 + (first + step) % SUBNETS)
            shown = _ip("-o", "link", "show", self.bridge, check=False)
            owner = re.search(r"alias (\d+)", shown.stdout)
            if owner is not None and Path(f"/proc/{owner.group(1)}").exists():
                continue
            self._remove_leftovers()
            if _ip("link", "add", self.bridge, "type", "bridge", check=False).returncode == 0:
                _ip("link", "set", "dev", self.bridge, "alias", str(os.getpid()))
                return
        raise NetworkUnavailable(f"all {SUBNETS} test subnets are held by live processes")

    def __enter__(self) -> TestNetwork:
        if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("socat"):
            raise NetworkUnavailable("a test network needs root, iproute2 and socat (make setup installs them)")
        self._claim_subnet()
        try:
            for address in (self.ZOOKEEPER, self.LAKEHOUSE):
                _ip("addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        for forwarder in self._forwarders:
            try:
                os.killpg(forwarder.pid, signal.SIGKILL)  # socat and the children it forked per connection
            except ProcessLookupError:
                pass
            forwarder.wait()
        self._forwarders.clear()
        self._exposed.clear()
        self._remove_leftovers()
        self.hosts.clear()

    def _remove_leftovers(self) -> None:
        namespaces = _ip("netns", "list", check=False).stdout.split()
        for namespace in (n for n in namespaces if n.startswith(f"{self.prefix}-")):
            _ip("netns", "del", namespace, check=False)  # its veth end goes with it, and the peer too
        _ip("link", "del", self.bridge, check=False)

    def host(self, name: str) -> Host:
        """The host ``name``, made on first use: a namespace with loopback and one veth on the bridge."""
        if name in self.hosts:
            return self.hosts[name]
        index = len(self.hosts)
        namespace, outside = f"{self.prefix}-{index}", f"{self.prefix}v{index}"
        address = str(self.subnet.network_address + 10 + index)
        _ip("netns", "add", namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", outside, "master", self.bridge, "up")
        _ip("addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0", namespace=namespace)
        _ip("link", "set", "eth0", "up", namespace=namespace)
        _ip("link", "set", "lo", "up", namespace=namespace)
        self.hosts[name] = Host(name, namespace, address)
        return self.hosts[name]

    def reach(self, text: str, address: str) -> str:
        """``text`` (a connect string, a URI) with every ``127.0.0.1:<port>`` in it exposed on ``address``."""
        return re.sub(r"127\.0\.0\.1:(\d+)", lambda m: self.expose(int(m.group(1)), address), text)

    def expose(self, port: int, address: str) -> str:
        """Forward ``address:port`` on the bridge to ``127.0.0.1:port`` (once); returns ``address:port``."""
        if (port, address) in self._exposed:
            return self._exposed[(port, address)]
        forwarder = subprocess.Popen(
            ["socat", f"TCP-LISTEN:{port},bind={address},fork,reuseaddr", f"TCP:127.0.0.1:{port}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._forwarders.append(forwarder)
        wait_for(lambda: forwarder.poll() is not None or _accepts(address, port),
                 f"socat to listen on {address}:{port}", 10)
        if forwarder.poll() is not None:
            raise NetworkUnavailable(f"socat could not listen on {address}:{port} (exit {forwarder.returncode})")
        self._exposed[(port, address)] = f"{address}:{port}"
        return self._exposed[(port, address)]

    def cut(self, host: Host, address: str) -> None:
        """Drop every packet ``host`` sends to ``address`` from now on, silently: the host's neighbour entry for
        the address names a link-layer address nothing on the bridge has, so its frames go nowhere (the sender
        sees no error; a new connection's SYN goes unanswered)."""
        _ip("neigh", "replace", address, "lladdr", NOWHERE, "nud", "permanent", "dev", "eth0",
            namespace=host.namespace)
        self._cut.add((host.namespace, address))

    def heal(self, host: Host, address: str) -> None:
        """Undo ``cut``: the entry goes, the next packet asks ARP again and finds the bridge."""
        if (host.namespace, address) in self._cut:
            _ip("neigh", "del", address, "dev", "eth0", namespace=host.namespace)
            self._cut.discard((host.namespace, address))

def _accepts(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False
