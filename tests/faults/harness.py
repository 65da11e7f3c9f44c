"""The fault harness: one run of the cascade on real processes, with faults injected and everything measured.

    with Environment(base_dir) as env:                       # one ZooKeeper server, one PostgreSQL server
        with Cascade(env, "kill-9", run=0, seed=1, crash_plan=plan) as cascade:
            cascade.start()
            fault = cascade.inject("zk-restart", job=None, act=env.restart_zookeeper)
            cascade.wait_recovered(fault)
            result = cascade.finish()                        # drain, final exactly-once check, stop

A run deploys the cascade of ``tests/faults/cascade.py`` in a fresh ZooKeeper chroot and a fresh
catalog namespace, with two replicas (a leader and a standby) of each job as separate
processes (``tests/faults/driver.py``), a producer thread that appends to the root table and
logs every row it wrote, and four threads watching it:

- the **supervisor** restarts every replica that exits, as Kubernetes would, with the next crash
  point of the crash plan in its environment; a replica that died at a crash point is a fault
  (``kill -9 at <step>``), an exit with a status the scenario expects (``expected_exits``: a driver whose
  ZooKeeper server was rebuilt exits 75) is counted in ``restarted``, any other exit not caused by the
  harness is recorded as unexpected;
- the **tracker** follows each job's tidemark on a session of its own whose reads give up after a second: a
  fault is recovered at the first commit of every affected job after the fault was injected (recovery time =
  that commit's time - injection time; a commit the tracker could not see at once counts at the newest one it
  saw, so a recovery is never measured quicker than it was);
- the **checker** (``coordinator.history.checker``) resolves and checks every consistent version it can;
- the **producer** (seeded) appends batches in bursts, so that some epochs are idle.

``finish`` stops the producer, waits until every job committed a barrier past the last row, checks
that version and counts duplicates and losses against the producer's own log, checks that no sink
published under a term older than one it had published under already (a leader publishing after its
term was taken), then stops the drivers. Every wait polls a condition with a deadline.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional

import pyarrow as pa
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from coordinator import CatalogSettings, EmbeddedZooKeeper, EpochRecord, EpochState, Tidemark, TidemarkError
from coordinator.history.checker import ConsistencyChecker, Inconsistency, exactly_once
from coordinator.history.resolve import Resolver
from coordinator.iceberg.snapshots import EPOCH_KEY, TERM_KEY
from coordinator.operations.lakehouse_server import EmbeddedLakehouse
from coordinator.protocol.held_epochs import newest_common_epoch
from coordinator.records import LeaderRecord, now_ms
from tests.faults.cascade import JOBS, SRC_SCHEMA, Tables, counts_of, invariant
from tests.helpers.lakehouse_data import lakehouse_data_dir
from tests.helpers.network import TestNetwork
from tests.helpers.postgres import PostgresServer
from tests.helpers.served import ServedReader, ServeProcess, own_storage
from tests.helpers.skewclock import SkewedClock
from tests.helpers.wait import wait_for
from tests.helpers.zookeeper_tree import delete_tree, rebuild_server

log = logging.getLogger("faults")
REPO = Path(__file__).resolve().parents[2]
SESSION_TIMEOUT = 3.0       # the drivers' ZooKeeper session timeout (s)
INTERVAL_MS = 1000
GRACE_MS = 300
RECOVERY_DEADLINE = 90.0    # a fault not recovered by then fails the run
# The tracker's reads each give up after this: a read on a session the fault broke would wait out the harness's
# 10 s, then see only the newest commit, and a recovery would look that much slower than it was.
TRACKER_READ_TIMEOUT_S = 1.0
DRAIN_DEADLINE = 120.0
BATCH_PROPERTY = "faults.batch"
KEYS = [f"k{i}" for i in range(8)]
DASHBOARDS = 2  # readers through `tidemark serve`, each its own client: never back is per client


@dataclass
class Fault:
    kind: str
    job: Optional[str]           # the affected job; None: every job
    injected_ms: int
    recovered_ms: Optional[int] = None

    @property
    def recovery_s(self) -> Optional[float]:
        return None if self.recovered_ms is None else max(0, self.recovered_ms - self.injected_ms) / 1000


@dataclass
class RunResult:
    scenario: str
    seed: int
    faults: list[Fault]
    epochs_committed: int
    produced: int
    duplicates: int
    losses: int
    checked: int
    inconsistencies: list[Inconsistency]
    unexpected_exits: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)   # a run that could not finish says why
    unreadable: list[str] = field(default_factory=list)  # checks the checker could not make (an outage)
    served_reads: int = 0   # reads through `tidemark serve` by pyiceberg's RestCatalog (URI only), each checked

    @property
    def passed(self) -> bool:
        return (not self.problems and self.duplicates == 0 and self.losses == 0 and not self.inconsistencies
                and all(f.recovered_ms is not None for f in self.faults))


class Environment:
    """The servers every run shares: a standalone ZooKeeper and a PostgreSQL catalog database; and, started for
    the first scenario that runs on it, a lakehouse (an S3 object store and a REST catalog: ``lakehouse()``)."""

    def __init__(self, base: Path) -> None:
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.zookeeper: EmbeddedZooKeeper  # started by __enter__, on a port free then
        self.postgres = PostgresServer()
        self._lakehouse: Optional[EmbeddedLakehouse] = None
        self._lakehouse_data = contextlib.ExitStack()
        self.cascade: Optional[Cascade] = None   # the latest run, for reporting one that broke off

    def __enter__(self) -> Environment:
        self.zookeeper = EmbeddedZooKeeper.on_free_port(self.base / "zookeeper")
        self.postgres.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.zookeeper.stop()
        self.postgres.close()
        if self._lakehouse is not None:
            self._lakehouse.stop()
        self._lakehouse_data.close()

    def run_dir(self, scenario: str, run: int) -> Path:
        """Where run ``run`` of ``scenario`` keeps its processes' logs."""
        return self.base / f"{scenario}-{run}"

    @property
    def server_logs(self) -> list[Path]:
        """The logs of the servers every run shares: ZooKeeper's, and the lakehouse's once it started."""
        return [self.zookeeper.log_path, *([self._lakehouse.log_path] if self._lakehouse is not None else [])]

    def catalog(self) -> CatalogSettings:
        return CatalogSettings(name="pg", uri=self.postgres.uri, warehouse=f"file://{self.base / 'warehouse'}")

    def lakehouse(self) -> EmbeddedLakehouse:
        """The lakehouse, running (started again if a fault left it down)."""
        if self._lakehouse is None:
            data = self._lakehouse_data.enter_context(lakehouse_data_dir(self.base / "lakehouse"))
            self._lakehouse = EmbeddedLakehouse(data)
        if self._lakehouse.running_pid() is None:
            self._lakehouse.start()
        return self._lakehouse


class Replica:
    """One driver process of ``job``; its stderr goes to ``<run dir>/<member>.log``."""

    def __init__(self, cascade: Cascade, job: str, slot: int, crash_at: Optional[str]) -> None:
        cascade.started += 1
        self.job, self.slot, self.crash_at = job, slot, crash_at
        self.member = f"{job}-{slot}-{cascade.started}"
        self.log_path = cascade.dir / f"{self.member}.log"
        self.session_file = cascade.dir / f"{self.member}.session"
        self.expected_exit = False   # set when the harness itself stops or kills it
        self.host = cascade.network.host(f"{job}-{slot}") if cascade.network is not None else None
        settings = cascade.driver_settings
        config = {"job": job, "connect": cascade.driver_connect, "session_timeout": SESSION_TIMEOUT,
                  "member": self.member,
                  "catalog": {"name": settings.name, "uri": settings.uri, "warehouse": settings.warehouse,
                              "python_properties": dict(settings.python_properties)},
                  "namespace": cascade.tables.namespace, "interval_ms": INTERVAL_MS, "grace_ms": GRACE_MS,
                  "every": cascade.every.get(job), "session_file": str(self.session_file)}
        env = {k: v for k, v in os.environ.items() if k != "TIDEMARK_CRASH_AT"}
        if crash_at:
            env["TIDEMARK_CRASH_AT"] = crash_at
        env["PYTHONPATH"] = str(REPO)
        if cascade.skewed_clocks:
            env.update(cascade.clock(job, slot).env())
        with open(self.log_path, "w") as err:
            self.proc = subprocess.Popen([*(self.host.command if self.host else []), sys.executable, "-m",
                                          "tests.faults.driver", json.dumps(config)], cwd=REPO, env=env,
                                         stdout=subprocess.DEVNULL, stderr=err, stdin=subprocess.DEVNULL)

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def crash_line(self) -> Optional[str]:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return None
        return next((line for line in reversed(text.splitlines()) if line.startswith("tidemark: crash point")), None)

    def log_lines_since(self, offset: int) -> list[str]:
        """The lines of its log after byte ``offset`` (``log_size()`` at some moment)."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(offset)
                return log_file.read().decode(errors="replace").splitlines()
        except OSError:
            return []

    def log_size(self) -> int:
        try:
            return self.log_path.stat().st_size
        except OSError:
            return 0

    def last_line(self) -> str:
        try:
            lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "(no log)"
        return lines[-1][:300] if lines else "(empty log)"

    def session(self) -> Optional[tuple[int, bytes]]:
        try:
            sid, password = self.session_file.read_text().split()
        except (OSError, ValueError):
            return None
        return int(sid), bytes.fromhex(password)


class Cascade:
    """One run of the cascade (see the module docstring). ``crash_plan(job)`` gives the crash point of each
    replica started (``None``: none). With ``network``, each replica slot runs in a host of its own on that test
    network and reaches ZooKeeper at its ``ZOOKEEPER`` address and the catalog (and object store) at its
    ``LAKEHOUSE`` address, so that a scenario can cut one replica from either; the harness's own clients (the
    producer, the checker, the tracker) stay on loopback, never cut. With ``skewed_clocks``, each replica slot's
    processes run under a wall clock of its own (``clock(job, slot)``, ``tests/helpers/skewclock.py``), right until
    a scenario moves it."""

    def __init__(self, env: Environment, scenario: str, run: int, seed: int, *, hosts: Optional[str] = None,
                 crash_plan: Callable[[str], Optional[str]] = lambda job: None, replicas: int = 2,
                 every: Optional[dict[str, int]] = None, expected_exits: frozenset[int] = frozenset(),
                 settings: Optional[CatalogSettings] = None, network: Optional[TestNetwork] = None,
                 skewed_clocks: bool = False) -> None:
        self.env, self.scenario, self.seed = env, scenario, seed
        self.rng = random.Random(seed)
        self.dir = env.run_dir(scenario, run)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hosts = hosts or env.zookeeper.connect_string
        self.chroot = f"/faults-{scenario}-{run}-{seed}"
        self.connect = self.hosts + self.chroot
        self.settings = settings or env.catalog()
        self.network = network
        self.driver_connect, self.driver_settings = self.connect, self.settings
        if network is not None:
            self.driver_connect = network.reach(self.connect, network.ZOOKEEPER)
            self.driver_settings = replace(
                self.settings, uri=self.settings.uri and network.reach(self.settings.uri, network.LAKEHOUSE),
                python_properties={k: network.reach(v, network.LAKEHOUSE)
                                   for k, v in self.settings.python_properties.items()})
        self.tables = Tables(self.settings.name, f"f_{scenario.replace('-', '_')}_{run}_{seed}")
        self.crash_plan, self.replicas = crash_plan, replicas
        self.every = every or {}     # a job's cadence in ms (absent: every grid point)
        self.skewed_clocks = skewed_clocks
        self._clocks: dict[tuple[str, int], SkewedClock] = {}
        self.started = 0
        self.slots: dict[tuple[str, int], Replica] = {}
        self.held = False            # while True the supervisor does not restart exited replicas
        self.faults: list[Fault] = []
        self.unexpected: list[str] = []
        self.expected_exits = expected_exits
        self.restarted: list[str] = []   # replicas that exited with an expected status, and the line they said it in
        self.commits: set[tuple[str, int]] = set()
        self.produced: list[tuple[int, str]] = []
        self.last_append_ms = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._stop_producing = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.tm: Optional[Tidemark] = None
        self.tracker_tm: Optional[Tidemark] = None  # the tracker's own session: reads that never wait long
        self.checker: Optional[ConsistencyChecker] = None
        # Readers that know nothing of Tidemark: pyiceberg's RestCatalog through `tidemark serve`, beside the checker.
        self.endpoint = ServeProcess(self.settings, self.connect, self.dir / "serve")
        self.dashboards: list[ServedReader] = []
        env.cascade = self

    # -- lifecycle ------------------------------------------------------------------------------

    def __enter__(self) -> Cascade:
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        self._stop_producing.set()
        for thread in self._threads:
            thread.join(30)
        self.stop_drivers()
        self.endpoint.stop()
        for session in (self.tm, self.tracker_tm):
            if session is not None:
                session.close()

    def start(self) -> None:
        self.endpoint.start()  # before the drivers: its start-up must not delay the producer behind their first epochs
        self.tables.create(self.settings.load())
        self.tm = Tidemark.connect(self.connect, session_timeout=10, operation_timeout=10)
        self.tracker_tm = self._tracker_session()
        self.deploy(self.tm)
        self.start_drivers()
        self.checker = ConsistencyChecker(Resolver(self.settings.load(), self.settings, self.tm), self.tables.all,
                                          invariant(self.tables))
        self.dashboards = [ServedReader(self.endpoint.url, self.tables.all, invariant(self.tables),
                                        storage=own_storage(self.settings))
                           for _ in range(DASHBOARDS)]
        targets: list[tuple[Callable[..., None], tuple]] = [
            (self._produce, ()), (self._supervise, ()), (self._track, ()), (self._check, ()),
            *((self._read_served, (dashboard,)) for dashboard in self.dashboards)]
        for target, args in targets:
            thread = threading.Thread(target=target, args=args, name=target.__name__, daemon=True)
            thread.start()
            self._threads.append(thread)
        wait_for(lambda: all(self.committed_after(job, 0) for job in JOBS), "every job's first commit",
                   RECOVERY_DEADLINE, every=0.1, seen=self.progress)

    def deploy(self, tm: Tidemark) -> None:
        """Register the pipeline before any driver starts (a job started before its upstream's registration
        would read the upstream's table as a root table)."""
        for job in JOBS:
            sources, sinks = self.tables.job(job)
            tm.register_job(job, sources=sources, sinks=sinks)

    def start_drivers(self) -> None:
        for job in JOBS:
            for slot in range(self.replicas):
                self.slots[(job, slot)] = Replica(self, job, slot, self.crash_plan(job))

    def stop_drivers(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Stop every replica (SIGTERM: each finishes its epoch in flight; SIGKILL after ``timeout``)."""
        replicas = list(self.slots.values())
        for replica in replicas:
            replica.expected_exit = True
            replica.signal(signal.SIGCONT)
            replica.signal(sig)
        for replica in replicas:
            try:
                replica.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                replica.signal(signal.SIGKILL)
                replica.proc.wait(30)

    # -- faults -----------------------------------------------------------------------------------

    def inject(self, kind: str, job: Optional[str], act: Callable[[], object]) -> Fault:
        """Record a fault injected now, then inject it with ``act``."""
        fault = Fault(kind, job, now_ms())
        with self._lock:
            self.faults.append(fault)
        act()
        return fault

    def wait_recovered(self, fault: Fault, timeout: float = RECOVERY_DEADLINE) -> None:
        wait_for(lambda: fault.recovered_ms is not None, f"recovery from {fault.kind}", timeout)

    def hold_catalog_row(self, table: str) -> Callable[[], None]:
        """Leave a catalog session in the middle of a commit of ``table``: its row updated, not committed, what a
        writer paused (or cut off) between the two leaves behind; every other commit to ``table`` waits on it.
        The session is opened as a writer's (the catalog's own connection settings). Returns the release."""
        from sqlalchemy import create_engine, text
        engine = create_engine(self.settings.python_catalog_properties()["uri"])
        connection = engine.connect()
        _, namespace, name = table.split(".")
        try:
            # Behind a writer that was itself paused mid-commit: not forever.
            connection.execute(text("SET lock_timeout = '30s'"))
            connection.execute(text("UPDATE iceberg_tables SET table_name = table_name WHERE catalog_name = :c "
                                    "AND table_namespace = :n AND table_name = :t"),
                               {"c": self.settings.name, "n": namespace, "t": name})
        except BaseException:
            engine.dispose()
            raise

        def release() -> None:
            try:
                connection.close()  # rolled back; or the server ended the session already
            except Exception as exc:  # noqa: BLE001 - ended by the server: nothing to roll back
                log.info("catalog row holder: %s", type(exc).__name__)
            engine.dispose()
        return release

    def clock(self, job: str, slot: int) -> SkewedClock:
        """The wall clock of replica slot ``slot`` of ``job`` (with ``skewed_clocks``): kept across restarts."""
        if (job, slot) not in self._clocks:
            directory = self.dir / f"clock-{job}-{slot}"
            directory.mkdir(exist_ok=True)
            self._clocks[(job, slot)] = SkewedClock(directory)
        return self._clocks[(job, slot)]

    def leader_replica(self, job: str) -> Replica:
        """The replica that leads ``job`` now (waits until one does)."""
        def find() -> Optional[Replica]:
            try:
                found = self.tm.get(self.tm.paths.leader(job))  # type: ignore[union-attr]
            except TidemarkError:
                return None
            if found is None:
                return None
            member = LeaderRecord.from_json(found[0]).member
            return next((r for r in self.slots.values() if r.member == member and r.proc.poll() is None), None)
        return wait_for(find, f"a live leader of job {job}", RECOVERY_DEADLINE)

    def expire_session(self, replica: Replica) -> None:
        """Expire ``replica``'s ZooKeeper session on the server: a second client attaches to the same session
        and closes it, as Curator's KillSession does; the replica's next request finds it expired."""
        def attach_and_close() -> bool:
            session = replica.session()
            if session is None:
                return False
            client = KazooClient(hosts=self.hosts, client_id=session, timeout=SESSION_TIMEOUT)
            try:
                client.start(timeout=2 * SESSION_TIMEOUT)
            except KazooTimeoutError:
                # That session had expired already (the last fault's): the replica reports its new one shortly.
                return False
            finally:
                client.stop()
                client.close()
            return True
        wait_for(attach_and_close, f"{replica.member}'s current session to be attached to and closed", 30)

    def wipe_zookeeper(self) -> None:
        """Delete the run's whole ZooKeeper tree (what rebuilding an ensemble or a new chroot amounts to).

        The newest epochs then exist only in ZooKeeper's lost records when they were idle (Iceberg records an
        idle epoch once per ``marker_every``, a minute), yet no consistent read may step back: the checker keeps
        its history across the wipe (docs/design.md, "When ZooKeeper loses its state")."""
        delete_tree(self.hosts, self.chroot)

    def rebuild_zookeeper(self) -> None:
        """Stop the ZooKeeper server, delete its data and start it again empty on the same address, as rebuilding
        or restoring an ensemble from nothing does, leaving every driver running: the server refuses their sessions
        (they saw newer transactions), and each must find out and start over in its process on a new session, then
        register its job again and resume from Iceberg. No person acts: the harness only reconnects its own
        observer session (refused too) and re-creates nothing else; no consistent read may step back, as after a
        wipe."""
        rebuild_server(self.env.zookeeper)
        old, self.tm = self.tm, Tidemark.connect(self.connect, session_timeout=10, operation_timeout=10)
        old_tracker, self.tracker_tm = self.tracker_tm, self._tracker_session()
        if self.checker is not None:
            self.checker.resolver = Resolver(self.settings.load(), self.settings, self.tm)
        for session in (old, old_tracker):
            if session is not None:
                session.close()

    def _tracker_session(self) -> Tidemark:
        return Tidemark.connect(self.connect, session_timeout=10, operation_timeout=TRACKER_READ_TIMEOUT_S)

    def restart_every_driver(self) -> None:
        """kill -9 every replica, deploy the pipeline again and start fresh replicas (held meanwhile)."""
        self.held = True
        try:
            self.stop_drivers(signal.SIGKILL)
            self.wipe_zookeeper()  # anything a dying replica re-created
            with Tidemark.connect(self.connect, session_timeout=10, operation_timeout=10) as tm:  # re-creates the root
                self.deploy(tm)
            self.start_drivers()
        finally:
            self.held = False

    def take_down(self, job: str, down_s: float, crash_at: Optional[str]) -> int:
        """kill -9 every replica of ``job``, keep it down ``down_s`` seconds while the rest of the cascade goes
        on, then start its replicas again with crash point ``crash_at``; returns its last epoch before the
        downtime, committed or in flight: the next leader finishes an epoch in flight (rolls it forward or
        recomputes it from its recorded inputs) before it catches up."""
        self.held = True
        try:
            for replica in [r for r in self.slots.values() if r.job == job]:
                replica.expected_exit = True
                replica.signal(signal.SIGCONT)
                replica.signal(signal.SIGKILL)
                replica.proc.wait(30)
            before = max(self.epochs_of(job, committed_only=False), default=0)
            threading.Event().wait(down_s)
            for slot in range(self.replicas):
                self.slots[(job, slot)] = Replica(self, job, slot, crash_at)
        finally:
            self.held = False
        return before

    def epochs_of(self, job: str, committed_only: bool = True) -> list[int]:
        """The epochs ``job`` committed in this run (every epoch znode is kept: ``driver.HISTORY``), or with
        ``committed_only=False`` every epoch it began."""
        path = self.tm.paths.epochs(job)  # type: ignore[union-attr]
        children = [c for c in self.tm.children(path) if c.isdigit()]  # type: ignore[union-attr]
        found = self.tm.get_many([f"{path}/{c}" for c in children])  # type: ignore[union-attr]
        records = [EpochRecord.from_json(raw[0]) for raw in found if raw is not None]
        return sorted(r.epoch for r in records if r.state == EpochState.COMMITTED or not committed_only)

    def progress(self) -> str:
        """What each job shows now, for a wait that timed out: its tidemark, its leader, each replica's last line."""
        def shown(read: Callable[[], object]) -> str:
            try:
                return str(read())
            except TidemarkError as exc:
                return type(exc).__name__
        tm = self.tm
        assert tm is not None
        return "; ".join(
            f"{job}: tidemark {shown(lambda: tm.tidemarks([self.tables.job(job)[1][0]]))}, leader "
            f"{shown(lambda: tm.get(tm.paths.leader(job)))}, replicas "
            + " | ".join(f"{r.member}: {r.last_line()}" for r in self.slots.values() if r.job == job)
            for job in JOBS)

    def committed_after(self, job: str, since_ms: int) -> Optional[int]:
        """The commit time of ``job``'s newest epoch if it is after ``since_ms``."""
        try:
            mark = self.tm.tidemarks([self.tables.job(job)[1][0]])  # type: ignore[union-attr]
        except TidemarkError:
            return None
        found = next(iter(mark.values()))
        if found is None or found.committed_ms is None or found.committed_ms <= since_ms:
            return None
        return found.committed_ms

    # -- the threads ------------------------------------------------------------------------------

    def _produce(self) -> None:
        """Append batches of 1-4 rows every 150 ms, in bursts of 2-4 s separated by 1-2 s of quiet."""
        rng = random.Random(self.seed)
        table = self.settings.load().load_table(f"{self.tables.namespace}.src")
        next_id, batch = 1, 0
        unsure: Optional[list[tuple[int, str]]] = None  # a batch whose failed append may still have landed
        with open(self.dir / "producer.log", "w") as out:
            while not self._stop_producing.is_set():
                burst_end = time.monotonic() + rng.uniform(2, 4)
                while time.monotonic() < burst_end and not self._stop_producing.wait(0.15):
                    rows = unsure or [(next_id + i, rng.choice(KEYS)) for i in range(rng.randint(1, 4))]
                    if self._append(table, rows, batch, unsure is not None):
                        for row in rows:
                            out.write(json.dumps(row) + "\n")
                        out.flush()
                        self.produced.extend(rows)
                        self.last_append_ms = now_ms()
                        next_id, batch, unsure = next_id + len(rows), batch + 1, None
                    else:
                        unsure = rows
                self._stop_producing.wait(rng.uniform(1, 2))

    def _append(self, table, rows: list[tuple[int, str]], batch: int, tried: bool) -> bool:
        """Append ``rows`` as batch ``batch``; True once it is in the table. A failed commit (catalog down) may
        still have landed: the batch property on the snapshot says, and a batch ``tried`` before is appended
        again only once the table, read again, says it did not land (a producer that appended it again after
        the catalog came back, unread, wrote its rows twice: a duplicate in ``src`` itself)."""
        if tried:
            landed = self._landed(table, batch)
            if landed is not False:
                return bool(landed)
        data = pa.table({"id": [r[0] for r in rows], "k": [r[1] for r in rows], "batch": [batch] * len(rows)},
                        schema=SRC_SCHEMA)
        try:
            table.append(data, snapshot_properties={BATCH_PROPERTY: str(batch)})
            return True
        except Exception as exc:  # noqa: BLE001 - the catalog is down (an injected fault): look, then retry
            log.info("producer: append of batch %s failed (%s)", batch, type(exc).__name__)
        return bool(self._landed(table, batch))

    @staticmethod
    def _landed(table, batch: int) -> Optional[bool]:
        """Whether batch ``batch`` is in ``table``; None when the catalog cannot say (still down)."""
        try:
            table.refresh()
        except Exception:  # noqa: BLE001 - still down: try again later
            return None
        return any(s.summary is not None and s.summary.get(BATCH_PROPERTY) == str(batch) for s in table.snapshots())

    def _supervise(self) -> None:
        while not self._stop.wait(0.05):
            for key, replica in list(self.slots.items()):
                if replica.proc.poll() is None or replica.expected_exit or self.held:
                    continue
                crash = replica.crash_line()
                if crash is not None and replica.proc.returncode == -signal.SIGKILL:
                    injected = int(crash.split(" reached at ")[1].split(":")[0])
                    step = crash.split()[3]
                    with self._lock:
                        self.faults.append(Fault(f"kill -9 at {step.split('#')[0]}", replica.job, injected))
                elif replica.proc.returncode in self.expected_exits:
                    self.restarted.append(f"{replica.member} exited with {replica.proc.returncode}: "
                                          f"{replica.last_line()}")
                    log.info("expected exit, restarting: %s", self.restarted[-1])
                else:
                    self.unexpected.append(f"{replica.member} exited with {replica.proc.returncode}: "
                                           f"{replica.last_line()}")
                    log.warning("unexpected exit: %s", self.unexpected[-1])
                replica.expected_exit = True
                self.slots[key] = Replica(self, replica.job, replica.slot, self.crash_plan(replica.job))

    def _track(self) -> None:
        """Follow each job's tidemark: record commits, and close the faults they recover."""
        while not self._stop.wait(0.05):
            times = {}
            for job in JOBS:
                try:
                    mark = self.tracker_tm.tidemarks([self.tables.job(job)[1][0]])  # type: ignore[union-attr]
                except TidemarkError:
                    continue
                found = next(iter(mark.values()))
                if found is not None and found.epoch is not None:
                    self.commits.add((job, found.epoch))
                    times[job] = found.committed_ms or 0
            with self._lock:
                for fault in self.faults:
                    if fault.recovered_ms is not None:
                        continue
                    affected = [fault.job] if fault.job else list(JOBS)
                    if all(times.get(j, 0) > fault.injected_ms for j in affected):
                        fault.recovered_ms = max(times[j] for j in affected)

    def _check(self) -> None:
        """Check every consistent version the checker can resolve (at most one read every 0.5 s)."""
        while not self._stop.wait(0.5):
            try:
                self.checker.observe()  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - an injected outage; a real bug shows as an inconsistency
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    def _read_served(self, dashboard: ServedReader) -> None:
        """Read through the endpoint as a dashboard does, with the URI alone: one table alone (a panel), then every
        table (at most one of each every 0.5 s), each read checked by the tables' rule."""
        while not self._stop.wait(0.5):
            dashboard.panel()
            dashboard.observe()

    def served_reads(self) -> int:
        return sum(dashboard.reads for dashboard in self.dashboards)

    def served_problems(self) -> list[Inconsistency]:
        """What the reads through the endpoint found wrong: a broken rule, tables at two epochs, a step back."""
        return [Inconsistency(None, f"through tidemark serve: {p}")
                for served in self.dashboards
                for p in (*served.failures, *served.mixed,
                          *(f"the served epoch stepped back {s}" for s in served.stepped_back))]

    # -- the end of a run --------------------------------------------------------------------------

    def finish(self) -> RunResult:
        """Stop producing, wait until every job committed past the last row, check exactly-once, stop."""
        problems: list[str] = []
        self._stop_producing.set()
        next(t for t in self._threads if t.name == "_produce").join(30)
        target = self.last_append_ms + GRACE_MS
        try:
            # Each job past the last row, and an epoch past it that every table holds (jobs at different
            # cadences commit different barriers): the final consistent read must hold every row.
            wait_for(lambda: all((self._epoch_of(job) or 0) > target for job in JOBS) and
                     (self._consistent_epoch() or 0) > target,
                     "every job to commit a barrier after the last produced row", DRAIN_DEADLINE, every=0.2)
            wait_for(lambda: all(f.recovered_ms is not None for f in self.faults),
                       "recovery from the last faults", RECOVERY_DEADLINE, every=0.2)
        except AssertionError as exc:  # a wait that timed out
            problems.append(str(exc))
        self.held = True  # a crash point reached from now on is after the measurement: not a fault of the run
        # A run whose faults kept the endpoint's reads failing (a store stopped for most of it) still reads through it
        # before it ends, after the drain: the newest versions are checked there too.
        reads = self.served_reads()
        try:
            wait_for(lambda: not self.dashboards or self.served_reads() >= max(2, reads + 1),
                     "reads through tidemark serve after the drain", RECOVERY_DEADLINE, every=0.2)
        except AssertionError as exc:
            problems.append(str(exc))
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        with self._lock:
            unrecovered = [f for f in self.faults if f.recovered_ms is None]
        problems += [f"{f.kind} ({f.job or 'every job'}) never recovered" for f in unrecovered]
        # Reads stay monotonic, across a wipe too: a table's peers keep its newest epoch (lists, epoch records), and
        # a job resumed from Iceberg reads nothing below its read floor.
        problems += [f"the consistent epoch stepped back from {newest} to {older}"
                     for newest, older in self.checker.stepped_back]  # type: ignore[union-attr]
        duplicates = losses = 0
        try:
            version = self.checker.resolver.resolve(self.tables.all)  # type: ignore[union-attr]
            frames, _ = self.checker.check(version)  # type: ignore[union-attr]
            ids = frames[self.tables.ids]
            rows = exactly_once(self.produced, zip(ids.column("id").to_pylist(), ids.column("k").to_pylist()))
            counted = exactly_once(_per_key(counts_of(pa.table({"id": [r[0] for r in self.produced],
                                                                 "k": [r[1] for r in self.produced]}))),
                                   _per_key(frames[self.tables.counts]))
            duplicates, losses = max(rows.duplicates, counted.duplicates), max(rows.losses, counted.losses)
            problems += published_out_of_term_order(self.settings.load(),
                                                    [t for job in JOBS for t in self.tables.job(job)[1]])
        except Exception as exc:  # noqa: BLE001 - reported as the run's problem
            problems.append(f"final check failed: {type(exc).__name__}: {exc}")
        self.stop_drivers()
        served_errors = [e for dashboard in self.dashboards for e in dashboard.errors]
        if self.dashboards and self.served_reads() == 0:
            problems.append(f"no read through tidemark serve succeeded: {served_errors[-3:]}")
        return RunResult(self.scenario, self.seed, list(self.faults), self._epochs_committed(), len(self.produced),
                         duplicates, losses, self.checker.checked,  # type: ignore[union-attr]
                         [*self.checker.failures, *self.served_problems()],  # type: ignore[union-attr]
                         list(self.unexpected), problems, [*self.errors, *served_errors], self.served_reads())

    def broken_off(self, problem: str) -> RunResult:
        """The result of a run that could not finish: what it saw until then, and why it stopped."""
        checker = self.checker
        return RunResult(self.scenario, self.seed, list(self.faults), len(self.commits), len(self.produced), 0, 0,
                         checker.checked if checker else 0, list(checker.failures) if checker else [],
                         list(self.unexpected), [problem], list(self.errors))

    def _consistent_epoch(self) -> Optional[int]:
        try:
            marks = self.tm.tidemarks([t for job in JOBS for t in self.tables.job(job)[1]])  # type: ignore[union-attr]
        except TidemarkError:
            return None
        return newest_common_epoch(marks.values())

    def _epoch_of(self, job: str) -> Optional[int]:
        try:
            mark = self.tm.tidemarks([self.tables.job(job)[1][0]])  # type: ignore[union-attr]
        except TidemarkError:
            return None
        found = next(iter(mark.values()))
        return None if found is None else found.epoch

    def _epochs_committed(self) -> int:
        """Epochs committed by every job of the run: those seen by the tracker and those still in ZooKeeper."""
        return len(set(self.commits) | {(job, epoch) for job in JOBS for epoch in self.epochs_of(job)})


def published_out_of_term_order(catalog, sinks: list[str]) -> list[str]:
    """Each sink's history (its current snapshot and its ancestors, oldest first) must be in non-decreasing terms:
    a snapshot of an older term after a newer one is a leader that published after its term was taken."""
    found = []
    for sink in sinks:
        table = catalog.load_table(sink.split(".", 1)[1])  # without the catalog's name
        by_id = {s.snapshot_id: s for s in table.snapshots()}
        chain, at = [], table.current_snapshot()
        while at is not None:
            chain.append(at)
            at = by_id.get(at.parent_snapshot_id) if at.parent_snapshot_id is not None else None
        newest = 0
        for snapshot in reversed(chain):
            summary = snapshot.summary
            term = int(summary.get(TERM_KEY) or 0) if summary is not None else 0
            if term and term < newest:
                found.append(f"{sink}: snapshot {snapshot.snapshot_id} (epoch {summary.get(EPOCH_KEY)}) published "
                             f"under term {term} after term {newest} had published")
            newest = max(newest, term)
    return found


MID_EPOCH = (EpochState.STARTED, EpochState.PRECOMMITTED)


def newest_epoch_state(tm: Tidemark, job: str) -> Optional[EpochState]:
    """The state of ``job``'s newest epoch record (None: none, or ZooKeeper unreachable)."""
    try:
        epochs = [int(c) for c in tm.children(tm.paths.epochs(job)) if c.isdigit()]
        found = tm.read(tm.paths.epoch(job, max(epochs)), EpochRecord) if epochs else None
    except TidemarkError:
        return None
    return found[0].state if found is not None else None


def _per_key(counts: pa.Table) -> list[tuple[str, int]]:
    """Counts as a multiset of keys (``k`` repeated ``cnt`` times), for ``exactly_once``."""
    return [(k, i) for k, cnt in zip(counts.column("k").to_pylist(), counts.column("cnt").to_pylist())
            for i in range(cnt)]

