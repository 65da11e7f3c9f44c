"""HAProxy in front of ``tidemark serve``'s replicas, as a Kubernetes Service or a cloud load balancer puts them:
every request balanced round-robin on its own (no affinity), a replica out of rotation while its ``/healthz`` fails.

    with Balancer(work_dir, [replica.port for replica in replicas]) as balancer:
        RestCatalog("lake", uri=balancer.url)
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Optional

from coordinator.operations.zookeeper_server import free_port
from tests.helpers.served import wait_healthy

CONFIG = """global
    maxconn 1024
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    option http-server-close
    retries 3
    option redispatch 1
    retry-on all-retryable-errors
frontend lake
    bind 127.0.0.1:{port}
    default_backend replicas
backend replicas
    balance roundrobin
    option httpchk GET /healthz
{servers}
"""


class Balancer:
    """``haproxy`` (Debian's package) on a free loopback port, balancing each request over ``ports``."""

    def __init__(self, work_dir: Path, ports: list[int]) -> None:
        self.work_dir, self.ports = Path(work_dir), ports
        self.port = free_port()
        self.process: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Balancer:
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.work_dir.mkdir(parents=True, exist_ok=True)
        servers = "\n".join(f"    server replica{i} 127.0.0.1:{port} check inter 300ms fall 1 rise 1"
                            for i, port in enumerate(self.ports))
        config = self.work_dir / "haproxy.cfg"
        config.write_text(CONFIG.format(port=self.port, servers=servers))
        with open(self.work_dir / "haproxy.log", "ab") as log:
            self.process = subprocess.Popen([haproxy, "-db", "-f", str(config)], stdout=log,
                                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        wait_healthy(self.process, f"{self.url}/healthz", "haproxy", self._log_tail)
        return self

    def _log_tail(self) -> str:
        return f"see {self.work_dir / 'haproxy.log'}"

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def __enter__(self) -> Balancer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
