"""A real PostgreSQL server on a loopback port, in a temporary data directory, that tests can restart.

    with PostgresServer() as pg:
        settings = CatalogSettings(name="pg", uri=pg.uri, warehouse=...)
        pg.restart(mode="immediate")      # a crash and recovery from the WAL, as a fault test wants

Debian's PostgreSQL 15 binaries are used; as root the server runs as the ``postgres`` user
(PostgreSQL refuses to run as root). Every wait polls ``pg_isready`` with a deadline.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from coordinator.operations.zookeeper_server import free_port

PG_BIN = Path("/usr/lib/postgresql/15/bin")
DATABASE = "catalog"


def _as_postgres(cmd: list[str], **kwargs) -> subprocess.Popen:
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return subprocess.Popen(cmd, **kwargs)


class PostgresServer:
    """``start()`` initialises a fresh cluster with database ``catalog`` and waits until it accepts
    connections; ``stop(mode)`` is ``pg_ctl stop -m fast|immediate``; ``restart(mode)`` stops and starts
    it on the same data; ``close()`` stops it and removes its directory."""

    def __init__(self, start_timeout: float = 30.0) -> None:
        if not (PG_BIN / "initdb").is_file():
            raise RuntimeError("PostgreSQL is not installed: run `make setup` (it installs Debian's postgresql)")
        self.base = Path(tempfile.mkdtemp(prefix="tidemark-pg-"))
        self.data = self.base / "data"
        self.port = free_port()
        self.start_timeout = start_timeout
        self._server: Optional[subprocess.Popen] = None
        if os.geteuid() == 0:
            shutil.chown(self.base, "postgres")
        initdb = _as_postgres([str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "tidemark"],
                              stdout=subprocess.DEVNULL)
        if initdb.wait() != 0:
            raise RuntimeError(f"initdb failed in {self.data}")

    @property
    def uri(self) -> str:
        return f"postgresql://tidemark@127.0.0.1:{self.port}/{DATABASE}"

    def start(self) -> PostgresServer:
        fresh = not (self.data / "postmaster.opts").exists()
        self._server = _as_postgres([str(PG_BIN / "postgres"), "-D", str(self.data), "-p", str(self.port),
                                     "-h", "127.0.0.1", "-k", str(self.base)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ready = Retrying(stop=stop_after_delay(self.start_timeout), wait=wait_fixed(0.1),
                         retry=retry_if_result(lambda rc: rc != 0))
        ready(lambda: subprocess.call([str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                      stdout=subprocess.DEVNULL))
        if fresh:
            subprocess.check_call([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U",
                                   "tidemark", DATABASE])
        return self

    def stop(self, mode: str = "fast") -> None:
        if self._server is None:
            return
        stop = _as_postgres([str(PG_BIN / "pg_ctl"), "stop", "-D", str(self.data), "-m", mode, "-w"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stop.wait(self.start_timeout)
        self._server.wait(self.start_timeout)
        self._server = None

    def restart(self, mode: str = "fast") -> None:
        self.stop(mode)
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()
