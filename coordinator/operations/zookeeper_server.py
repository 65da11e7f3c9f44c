"""A real standalone ZooKeeper server on a loopback port, for local runs, the demo and tests.

    with EmbeddedZooKeeper(port=2181) as zk:
        tm = Tidemark.connect(zk.connect_string)

    with ZooKeeperEnsemble(base_dir) as ensemble:      # three servers on loopback: a real quorum
        tm = Tidemark.connect(ensemble.connect_string)
        ensemble.leader().kill()                       # fault tests: lose the leader, then restart it

The server is Debian's ZooKeeper 3.8 (``/usr/share/java/zookeeper.jar``, whose manifest
brings its dependencies) run in the background with its own session, so it outlives the
process that started it until ``stop()``. Its pid, port and data directory are recorded in
``<data_dir>/server.json`` so that ``tidemark zk stop`` ends exactly that process.

With ``require_auth`` the server refuses clients without an identity: it closes the session of
any client whose request comes before a digest authentication (ZooKeeper 3.8's
``enforce.auth.enabled``, ``enforce.auth.schemes=digest``), so nobody without credentials can
create znodes outside Tidemark's tree or watch what is readable.

With ``tls=ServerTls(...)`` the server also listens for TLS on ``secure_port``
(ZooKeeper's ``secureClientPort``, served by Netty), next to the plaintext ``port``:

    with EmbeddedZooKeeper(port, tls=ServerTls(keystore, truststore), secure_port=other) as zk:
        tm = Tidemark.connect(zk.secure_connect_string, tls=TlsSettings(ca="ca.pem"))
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from coordinator.errors import ConfigurationError, ZooKeeperUnavailable
from coordinator.settings import Settings

DEFAULT_PORT = 2181
MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
QUORUM_MAIN_CLASS = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
STATE_FILE = "server.json"
# A small tick keeps the minimum session timeout low (2 ticks) so fault tests run quickly.
TICK_MS = 200
# Netty, which serves TLS, needs these next to the jars zookeeper.jar's manifest lists.
NETTY_EXTRA_JARS = ("/usr/share/java/netty-codec.jar", "/usr/share/java/netty-resolver.jar")
# ZooKeeper logs through SLF4J, and Debian's ZooKeeper puts no binding on its class path: without this one (from
# libslf4j-java, which the zookeeper package depends on) the server logs nothing at all.
SLF4J_BINDING = Path("/usr/share/java/slf4j-simple.jar")
# What the server's log holds: its warnings, and how a quorum forms and breaks (elections, who follows whom).
LOG_SETTINGS = ("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-Dorg.slf4j.simpleLogger.log.org.apache.zookeeper.server.quorum=info",
                "-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd HH:mm:ss,SSS")
# Lines of the server's log that mean it will never serve, though the JVM may linger (a non-daemon thread
# outliving a main thread that died): waiting for the start timeout then helps nobody.
# A port another process bound first: a quorum peer that cannot bind its election port never serves.
BIND_FAILED = "java.net.BindException"
# How often a first start on ports chosen free is tried again on new ones, when another process took one first.
PORT_ATTEMPTS = 3
FATAL_LOG_LINES = ("Error: Could not find or load main class", "Exception in thread \"main\"",
                   "Error: Unable to access jarfile", "Unable to start ZooKeeper server", "Invalid config, exiting",
                   "Error: Could not create the Java Virtual Machine", BIND_FAILED)
# zoo.cfg lines of a server that closes the session of a client that has not authenticated by digest.
AUTH_REQUIRED_LINES = ("enforce.auth.enabled=true", "enforce.auth.schemes=digest",
                       "authProvider.1=org.apache.zookeeper.server.auth.DigestAuthenticationProvider")


@dataclass(frozen=True)
class ServerTls:
    """TLS on the server's secure client port, from PEM files.

    ``keystore`` holds the server's private key followed by its certificate; ``truststore`` the
    CA certificates a client certificate must be signed by; ``client_auth`` is ZooKeeper's
    ``ssl.clientAuth`` (``none``, ``want`` or ``need`` a client certificate).
    """

    keystore: Path
    truststore: Path
    client_auth: str = "none"

    def config_lines(self, secure_port: int) -> list[str]:
        """The ``zoo.cfg`` lines that serve TLS on ``secure_port`` (through Netty)."""
        return [f"secureClientPort={secure_port}",
                "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory",
                f"ssl.keyStore.location={self.keystore}", "ssl.keyStore.type=PEM",
                f"ssl.trustStore.location={self.truststore}", "ssl.trustStore.type=PEM",
                f"ssl.clientAuth={self.client_auth}"]


def zookeeper_classpath() -> str:
    configured = Settings.from_env().zk_classpath
    if configured:
        return configured
    jar = Path("/usr/share/java/zookeeper.jar")
    if not jar.is_file():
        raise ConfigurationError(f"ZooKeeper's jars are not installed ({jar} is missing): "
                                 "apt-get install zookeeper (make setup does), or set TIDEMARK_ZK_CLASSPATH")
    return f"{jar}:{SLF4J_BINDING}" if SLF4J_BINDING.is_file() else str(jar)


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if not java or not Path(java).is_file():
        raise ConfigurationError("Java not found: install a Java 17 runtime "
                                 "(apt-get install openjdk-17-jre-headless; make setup does) or set JAVA_HOME")
    return java


def four_letter_word(host: str, port: int, word: bytes = b"ruok", timeout: float = 1.0) -> Optional[bytes]:
    """Send a ZooKeeper four-letter command; None when nothing answers."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(word)
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
            return b"".join(chunks)
    except OSError:
        return None


def _port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass(frozen=True)
class QuorumPeer:
    """One member of an ensemble: its id (``myid``), its three ports and the address it listens on."""

    server_id: int
    client_port: int
    quorum_port: int
    election_port: int
    host: str = "127.0.0.1"

    @property
    def config_line(self) -> str:
        """Its ``server.<id>=<host>:<quorum_port>:<election_port>`` line of ``zoo.cfg``."""
        return f"server.{self.server_id}={self.host}:{self.quorum_port}:{self.election_port}"


@dataclass
class ServerState:
    """What ``<data_dir>/server.json`` records of a started server: its pid, client port, data directory and
    start time (ms since the Unix epoch)."""

    pid: int
    port: int
    data_dir: str
    started_ms: int


class EmbeddedZooKeeper:
    """One standalone ZooKeeper server process bound to ``host`` (127.0.0.1 unless told).

    ``start()`` refuses a port already in use and waits (up to ``start_timeout``) until the
    server answers ``ruok``; ``stop()`` ends it with SIGTERM, then SIGKILL after a deadline;
    ``kill()`` is ``kill -9`` for fault tests. The data directory survives a stop, so a
    restart on the same directory brings back every znode and live session.

    With ``quorum`` (every member of an ensemble, this one being ``server_id``) it runs as one
    peer of that ensemble (``ZooKeeperEnsemble`` builds them); ``start(wait=False)`` then lets
    the caller start the other peers before the quorum can serve. ``launcher`` is a command the
    JVM runs under, which must exec it (``ip netns exec <namespace>``: a server in a network
    namespace of its own, listening on ``host`` there).
    """

    def __init__(self, port: int = DEFAULT_PORT, data_dir: Optional[os.PathLike] = None,
                 start_timeout: float = 30.0, tls: Optional[ServerTls] = None,
                 secure_port: Optional[int] = None, quorum: Sequence[QuorumPeer] = (),
                 server_id: Optional[int] = None, require_auth: bool = False, host: str = "127.0.0.1",
                 launcher: Sequence[str] = ()) -> None:
        if (tls is None) != (secure_port is None):
            raise ConfigurationError("a TLS ZooKeeper needs both tls=ServerTls(...) and secure_port")
        self.port, self.host, self.launcher = port, host, tuple(launcher)
        self.data_dir = Path(data_dir or Settings.from_env().home / "zookeeper").absolute()
        self.start_timeout = start_timeout
        self.tls, self.secure_port = tls, secure_port
        self.quorum, self.server_id = tuple(quorum), server_id
        self.require_auth = require_auth
        self._process: Optional[subprocess.Popen] = None
        self._log_offset = 0  # where this start's lines begin in zookeeper.log (it is appended to)

    @property
    def connect_string(self) -> str:
        """``host:port`` of its plaintext client port."""
        return f"{self.host}:{self.port}"

    @property
    def secure_connect_string(self) -> str:
        """``127.0.0.1:<secure_port>``: its TLS client port (on loopback, whatever ``host`` is)."""
        return f"127.0.0.1:{self.secure_port}"

    @property
    def state_path(self) -> Path:
        """``<data_dir>/server.json``: the ``ServerState`` of the server started there."""
        return self.data_dir / STATE_FILE

    @property
    def log_path(self) -> Path:
        """``<data_dir>/zookeeper.log``, which every start appends to."""
        return self.data_dir / "zookeeper.log"

    @classmethod
    def on_free_port(cls, data_dir: os.PathLike, **options: Any) -> EmbeddedZooKeeper:
        """A started server on a loopback port chosen free (``options`` as the constructor's). Another process may
        bind the port before the server does (a busy machine): the start is then tried again on a new port, up to
        ``PORT_ATTEMPTS`` times, as ``ZooKeeperEnsemble`` does.

        :raises ConfigurationError: as ``start``, for anything but a port taken.
        :raises ZooKeeperUnavailable: as ``start``; or the port was taken ``PORT_ATTEMPTS`` times.
        """
        for _ in range(PORT_ATTEMPTS - 1):
            server = cls(port=free_port(), data_dir=data_dir, **options)
            try:
                return server.start()
            except (ConfigurationError, ZooKeeperUnavailable):
                if not (server.bind_failed() or _port_in_use(server.port)):
                    raise
        return cls(port=free_port(), data_dir=data_dir, **options).start()

    def start(self, wait: bool = True) -> EmbeddedZooKeeper:
        """Write ``zoo.cfg`` and start the server's JVM in the background, in a session of its own.

        :param wait: wait until it serves (False: return at once, for the peers of an ensemble).
        :raises ConfigurationError: a server already runs with this data directory, the port or the secure port
            is in use, Java or ZooKeeper's jars are missing, or the data directory cannot be used.
        :raises ZooKeeperUnavailable: with ``wait``, the server failed at once or did not serve within
            ``start_timeout``.
        """
        recorded = self.running_state()
        if recorded is not None:
            raise ConfigurationError(f"a ZooKeeper server (pid {recorded.pid}) already runs on port "
                                     f"{recorded.port} with data dir {self.data_dir}: `tidemark zk stop` first")
        if _port_in_use(self.port) or (self.secure_port is not None and _port_in_use(self.secure_port)):
            raise ConfigurationError(f"port {self.port} (or the secure port) on 127.0.0.1 is already in use: "
                                     "pick another with "
                                     "--port, or stop what listens there")
        java, classpath = java_executable(), zookeeper_classpath()
        if self.tls is not None:
            classpath = ":".join([classpath, *(jar for jar in NETTY_EXTRA_JARS if Path(jar).is_file())])
        config = self.data_dir / "zoo.cfg"
        lines = [
            f"tickTime={TICK_MS}", f"dataDir={self.data_dir / 'data'}", f"clientPort={self.port}",
            f"clientPortAddress={self.host}", "maxClientCnxns=0", f"minSessionTimeout={2 * TICK_MS}",
            "maxSessionTimeout=60000", "admin.enableServer=false", "4lw.commands.whitelist=ruok,srvr,mntr,stat",
            "autopurge.snapRetainCount=3", "autopurge.purgeInterval=1", *self._quorum_config(),
            *(AUTH_REQUIRED_LINES if self.require_auth else ()),
            *(self.tls.config_lines(self.secure_port) if self.tls and self.secure_port else []), "",  # both or none
        ]
        try:
            (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
            if self.quorum:
                (self.data_dir / "data" / "myid").write_text(f"{self.server_id}\n")
            config.write_text("\n".join(lines))
            log = open(self.log_path, "ab")  # noqa: SIM115 - the server process inherits it
            self._log_offset = log.tell()
        except OSError as exc:
            raise ConfigurationError(f"cannot use {self.data_dir} as ZooKeeper's data directory "
                                     f"({exc.strerror or exc}): "
                                     "pick another with --data-dir") from None
        main_class = QUORUM_MAIN_CLASS if self.quorum else MAIN_CLASS
        try:
            self._process = subprocess.Popen(
                [*self.launcher, java, "-Xmx256m", "-Dzookeeper.jmx.log4j.disable=true", *LOG_SETTINGS,
                 "-cp", classpath, main_class, str(config)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self._write_state(ServerState(self._process.pid, self.port, str(self.data_dir), int(time.time() * 1000)))
        if wait:
            self.wait_until_serving()
        return self

    def _quorum_config(self) -> list[str]:
        if not self.quorum:
            return []
        # Limits in ticks: generous enough that a loaded machine does not drop a follower by itself.
        return ["initLimit=25", "syncLimit=10", *(peer.config_line for peer in self.quorum)]

    def mode(self) -> Optional[str]:
        """``standalone``, ``leader`` or ``follower`` while serving; None otherwise."""
        reply = (four_letter_word(self.host, self.port, b"srvr") or b"").decode(errors="replace")
        return next((line.split(":", 1)[1].strip() for line in reply.splitlines() if line.startswith("Mode:")), None)

    def wait_until_serving(self) -> None:
        """Wait until the server accepts sessions; fail as soon as its JVM exits or its log says it never will."""
        failed: list[str] = []

        # "ruok" answers before the server accepts sessions; "srvr" reports a Mode only once it does.
        def serving() -> Optional[bytes]:
            exit_code = self._process.poll() if self._process is not None else None
            fatal = self._fatal_log_line()
            if exit_code is not None or fatal is not None:
                failed.append(f"Java exited with status {exit_code}" if exit_code is not None else "Java failed")
                failed.extend([fatal] if fatal else [])
                return None
            return four_letter_word(self.host, self.port, b"srvr")

        retrying = Retrying(stop=stop_after_delay(self.start_timeout), wait=wait_fixed(0.1),
                            retry=retry_if_result(lambda r: not failed and b"Mode:" not in (r or b"")),
                            retry_error_callback=lambda s: None)
        reply = retrying(serving)
        if reply is None or b"Mode:" not in reply:
            self.stop()
            if self._process is not None and self._process.poll() is None:  # a JVM lingering after its main died
                self._process.kill()
                self._process.wait()
            why = (f"it failed at once ({': '.join(failed)})" if failed
                   else f"it did not serve within {self.start_timeout:.0f}s")
            raise ZooKeeperUnavailable(f"ZooKeeper on port {self.port} did not start: {why}; see {self.log_path} "
                                       "(a wrong TIDEMARK_ZK_CLASSPATH or Java version shows there)")

    def bind_failed(self) -> bool:
        """Whether this start's log says a port could not be bound (another process took it)."""
        return BIND_FAILED in self._log_since_start()

    def _log_since_start(self) -> str:
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return log.read(1 << 20).decode(errors="replace")
        except OSError:
            return ""

    def _fatal_log_line(self) -> Optional[str]:
        """The first line of this start's log saying the server will never serve (``FATAL_LOG_LINES``)."""
        lines = self._log_since_start().splitlines()
        for at, line in enumerate(lines):
            if any(marker in line for marker in FATAL_LOG_LINES):
                cause = next((c.strip() for c in lines[at + 1:at + 4] if c.strip().startswith("Caused by")), "")
                return " ".join(f"{line.strip()} {cause}".split())[:300]
        return None

    def recorded_state(self) -> Optional[ServerState]:
        """The ``ServerState`` the last start recorded (None: none, or unreadable), whether or not that server
        still runs."""
        try:
            return ServerState(**json.loads(self.state_path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def running_state(self) -> Optional[ServerState]:
        """The server recorded in ``data_dir`` while it lives (this process's or another's), else None."""
        recorded = self.recorded_state()
        return recorded if recorded is not None and _is_our_server(recorded) else None

    def _write_state(self, state: ServerState) -> None:
        self.state_path.write_text(json.dumps(state.__dict__))

    def stop(self, timeout: float = 10.0) -> bool:
        """End the recorded server (SIGTERM, then SIGKILL); False when none was running."""
        return self._signal(signal.SIGTERM, timeout)

    def kill(self) -> bool:
        """``kill -9`` the server, as a crash would."""
        return self._signal(signal.SIGKILL, 10.0)

    def _signal(self, sig: int, timeout: float) -> bool:
        state = self.recorded_state()
        if state is None or not _is_our_server(state):
            self.state_path.unlink(missing_ok=True)
            return False
        os.kill(state.pid, sig)
        if self._process is not None and self._process.pid == state.pid:
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(state.pid, signal.SIGKILL)
                self._process.wait()
        else:
            Retrying(stop=stop_after_delay(timeout), wait=wait_fixed(0.1), retry=retry_if_result(bool),
                     retry_error_callback=lambda s: os.kill(state.pid, signal.SIGKILL))(_is_our_server, state)
        self._process = None
        self.state_path.unlink(missing_ok=True)
        return True

    def __enter__(self) -> EmbeddedZooKeeper:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _has_live_thread(pid: int) -> bool:
    """Whether any thread of process ``pid`` still runs. The process's own state is not enough: a JVM's main thread
    ends first, and the process shows as a zombie for the seconds its shutdown hooks run in other threads."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for task in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        if stat.rsplit(")", 1)[1].split()[0] != "Z":  # the state follows the name, which may hold spaces
            return True
    return False


def _is_our_server(state: ServerState) -> bool:
    """True when ``state.pid`` is still a live ZooKeeper server using ``state.data_dir``'s config."""
    try:
        cmdline = Path(f"/proc/{state.pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if not _has_live_thread(state.pid):
        return False
    config = str(Path(state.data_dir) / "zoo.cfg").encode()
    return (MAIN_CLASS.encode() in cmdline or QUORUM_MAIN_CLASS.encode() in cmdline) and config in cmdline


class ZooKeeperEnsemble:
    """``size`` ZooKeeper servers forming one quorum, each in ``<base_dir>/server-<id>``: on loopback, or each where
    ``placement`` says (its address, and the command its JVM runs under: see ``EmbeddedZooKeeper``).

    ``start()`` launches every peer, then waits until each serves (a peer serves only once a
    quorum has elected a leader); ``leader()`` and ``followers()`` ask each peer its mode, so a
    fault test can stop exactly the member it means to. A stopped member is restarted with its
    own ``start()``; it rejoins the quorum from its data directory.

    The ports are free when chosen, and another process may bind one before its server does (a busy machine): a
    first ``start()`` that finds a port taken, or a peer that could not bind one (``BindException``), starts the
    ensemble again on new ports, up to ``PORT_ATTEMPTS`` times. Once it served, its ports are its own.
    """

    members: list[EmbeddedZooKeeper]

    def __init__(self, base_dir: os.PathLike, size: int = 3, start_timeout: float = 60.0,
                 placement: Sequence[tuple[str, Sequence[str]]] = ()) -> None:
        if size < 3 or size % 2 == 0:
            raise ConfigurationError(f"an ensemble needs an odd number of servers, at least 3; got {size}")
        if placement and len(placement) != size:
            raise ConfigurationError(f"placement gives {len(placement)} places for {size} servers")
        self._base_dir, self._start_timeout = Path(base_dir), start_timeout
        self._places = list(placement) or [("127.0.0.1", ())] * size
        self._served = False
        self._choose_ports()

    def _choose_ports(self) -> None:
        peers = [QuorumPeer(i, free_port(), free_port(), free_port(), host)
                 for i, (host, _) in enumerate(self._places, 1)]
        self.members = [EmbeddedZooKeeper(p.client_port, self._base_dir / f"server-{p.server_id}",
                                          self._start_timeout, quorum=peers, server_id=p.server_id, host=p.host,
                                          launcher=launcher)
                        for p, (_, launcher) in zip(peers, self._places)]

    @property
    def connect_string(self) -> str:
        """Every member's ``host:port``, comma-separated."""
        return ",".join(m.connect_string for m in self.members)

    def start(self) -> ZooKeeperEnsemble:
        """Start every peer, then wait until each serves; if one fails, stop them all.

        :raises ConfigurationError: as ``EmbeddedZooKeeper.start``.
        :raises ZooKeeperUnavailable: a peer failed or did not serve within ``start_timeout`` (a lost port:
            ``PORT_ATTEMPTS`` times).
        """
        for attempt in range(1, PORT_ATTEMPTS + 1):
            ports = (port for p in self.members[0].quorum for port in (p.client_port, p.quorum_port, p.election_port))
            if not self._served and any(_port_in_use(port) for port in ports):
                self._choose_ports()
                continue
            try:
                for member in self.members:
                    member.start(wait=False)
                for member in self.members:
                    member.wait_until_serving()
            except ZooKeeperUnavailable:
                self.stop()
                if self._served or attempt == PORT_ATTEMPTS or not any(m.bind_failed() for m in self.members):
                    raise
                for member in self.members:  # a quorum that never formed: start the next one from nothing
                    shutil.rmtree(member.data_dir / "data", ignore_errors=True)
                self._choose_ports()
                continue
            except BaseException:
                self.stop()
                raise
            self._served = True
            return self
        raise ZooKeeperUnavailable(f"the ensemble's ports were taken by other processes {PORT_ATTEMPTS} times "
                                   "before its servers bound them: a machine short of free ports")

    def stop(self) -> None:
        """Stop every member (SIGTERM, then SIGKILL); their data directories stay."""
        for member in self.members:
            member.stop()

    def leader(self) -> EmbeddedZooKeeper:
        """The member that leads the quorum now (``ZooKeeperUnavailable`` while none does)."""
        for member in self.members:
            if member.mode() == "leader":
                return member
        raise ZooKeeperUnavailable("no member of the ensemble is leading right now (an election is under way)")

    def followers(self) -> list[EmbeddedZooKeeper]:
        """The members that follow the quorum's leader now (each asked its mode)."""
        return [m for m in self.members if m.mode() == "follower"]

    def __enter__(self) -> ZooKeeperEnsemble:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
