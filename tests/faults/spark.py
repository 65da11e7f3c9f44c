"""The ``spark-cluster`` scenario's run: the word-count job of ``tests/test_spark_cluster.py`` on a Spark standalone
cluster (a master and two workers on loopback, every executor a JVM of its own), a leading and a standby driver,
each with executors of its own, and a producer (``tests/helpers/spark_cascade.py``).

    with SparkCluster(dir, workers=2) as cluster, SparkRun(env, cluster, run, seed) as spark:
        spark.start()                      # leader, standby (with executors), producer, checker
        spark.kill_executor(rng)           # kill -9 of an executor running a held task of the leader's epoch
        spark.kill_driver(rng)             # kill -9 of the leader and its JVM at a seeded state of its epoch
        result = spark.finish()            # drain, stop, exactly-once at the final version

Every driver runs with a task gate (``spark_driver --task-gate``) that is open: to kill an executor mid-epoch,
the scenario closes the leader's gate, so that the tasks of its next computed epoch wait on their executors,
kills one of those executors and opens the gate; Spark must run the killed tasks again. A fault recovers at the
job's next commit. A killed driver is replaced by a new standby, as a supervisor would, before the next fault.
A checker thread checks every consistent version the job's tables resolve to (``sinks_agree``).
"""
from __future__ import annotations

import os
import random
import signal
import threading
import time
from typing import Callable, Optional

from coordinator import Tidemark, TidemarkError
from coordinator.history.checker import ConsistencyChecker
from coordinator.history.resolve import Resolver
from coordinator.iceberg.snapshots import main_lineage, snapshot_progress
from coordinator.records import now_ms
from tests.faults.harness import (
    DRAIN_DEADLINE,
    MID_EPOCH,
    RECOVERY_DEADLINE,
    Environment,
    Fault,
    RunResult,
    newest_epoch_state,
)
from tests.helpers.present import present
from tests.helpers.spark_cascade import (
    JOB,
    STARTUP,
    TABLES,
    Driver,
    Lake,
    Producer,
    Tally,
    check_staged_with_progress,
    committed_since,
    leader_of,
    rerun,
    sinks_agree,
    tasks,
)
from tests.helpers.spark_cluster import SparkCluster
from tests.helpers.spark_driver import LOG
from tests.helpers.wait import wait_for

SCENARIO = "spark-cluster"
FILE_TIME_LAG_NS = 20_000_000  # a file's mtime may lag the clock by a timer tick


class SparkRun:
    def __init__(self, env: Environment, cluster: SparkCluster, run: int, seed: int) -> None:
        self.cluster, self.seed = cluster, seed
        home = env.run_dir(SCENARIO, run)
        home.mkdir(parents=True, exist_ok=True)
        self.lake = Lake.create(home)
        self.connect = f"{env.zookeeper.connect_string}/faults-{SCENARIO}-{run}-{seed}"
        self.drivers: dict[str, Driver] = {}     # member: a driver the scenario did not kill
        self.started = 0
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._checking: Optional[threading.Thread] = None
        self.producer: Optional[Producer] = None
        self.tm = Tidemark.connect(self.connect, session_timeout=10, operation_timeout=10)
        self.checker = ConsistencyChecker(Resolver(self.lake.settings.load(), self.lake.settings, self.tm), TABLES,
                                          sinks_agree)

    def __enter__(self) -> SparkRun:
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._checking is not None:
            self._checking.join(60)
        if self.producer is not None:
            self.producer.stop()
        for driver in self.drivers.values():
            driver.kill()
        self.tm.close()

    def start(self) -> None:
        leader = self._start_driver()
        wait_for(lambda: leader_of(self.tm) == leader.member, f"{leader.member} to lead", STARTUP)
        self._start_standby()
        started_ms = now_ms()
        self.producer = Producer(self.lake.words)
        self._checking = threading.Thread(target=self._check, name="check", daemon=True)
        self._checking.start()
        wait_for(lambda: committed_since(self.tm, started_ms), "the first commit with words", RECOVERY_DEADLINE)

    def _start_driver(self) -> Driver:
        self.started += 1
        member = f"driver-{self.started}"
        gate = self.lake.home / f"gate-{member}"
        gate.mkdir()
        (gate / "release").touch()   # open: the scenario closes the leader's to hold an epoch's tasks
        self.drivers[member] = Driver(self.cluster, self.lake, self.connect, member, "--task-gate", str(gate))
        return self.drivers[member]

    def _start_standby(self) -> None:
        """A new driver, once it stands by with executors of its own (its Spark application started)."""
        member = self._start_driver().member
        wait_for(lambda: len(self.tm.children(self.tm.paths.election(JOB))) == 2, f"{member} to stand by", STARTUP)
        app = wait_for(lambda: self.cluster.app_id(member), f"{member}'s application", STARTUP)
        wait_for(lambda: self.cluster.executors(app), f"{member}'s executors", STARTUP)

    def _leader(self) -> Driver:
        return self.drivers[present(leader_of(self.tm))]

    def _inject(self, kind: str, act: Callable[[], object]) -> Fault:
        """Record a fault injected now, and inject it."""
        fault = Fault(kind, JOB, now_ms())
        self.faults.append(fault)
        act()
        return fault

    def _recovered(self, fault: Fault) -> None:
        """Wait for the job's next commit after ``fault``: its recovery."""
        fault.recovered_ms = wait_for(lambda: committed_since(self.tm, fault.injected_ms),
                                      f"the first commit after {fault.kind}", RECOVERY_DEADLINE, every=0.1)

    def kill_executor(self, rng: random.Random) -> None:
        """Close the leader's gate, kill -9 the executor of a seeded one of the tasks of its next computed epoch
        held there, and open the gate: Spark must run that executor's tasks again, and the epoch commit."""
        leader = self._leader()
        gate = self.lake.home / f"gate-{leader.member}"
        held_after = time.time_ns() + FILE_TIME_LAG_NS   # a task marked after this surely waits at the gate
        (gate / "release").unlink()
        try:
            held = wait_for(lambda: tasks(gate, held_after), f"a task of {leader.member}'s next epoch to be held",
                            RECOVERY_DEADLINE)
            executor = {task: self.cluster.executor_of(task.pid) for task in held}
            victim = present(executor[rng.choice(held)])
            fault = self._inject("kill -9 of an executor mid-epoch", lambda: os.kill(victim, signal.SIGKILL))
        finally:
            (gate / "release").touch()
        self._recovered(fault)
        self.problems += [f"task {task} of the killed executor {victim} was never run again"
                          for task, pid in executor.items() if pid == victim and not rerun(gate, task)]

    def kill_driver(self, rng: random.Random) -> None:
        """kill -9 the leading driver, its Spark JVM and executors with it, once its newest epoch is in a seeded
        one of STARTED and PRECOMMITTED; the standby must take over. Then start a new standby."""
        leader = self._leader()
        state = rng.choice(MID_EPOCH)
        wait_for(lambda: newest_epoch_state(self.tm, JOB) == state, f"{leader.member}'s epoch to be {state.value}",
                 RECOVERY_DEADLINE, every=0.01)
        fault = self._inject(f"kill -9 of the leading driver, epoch {state.value}", leader.kill)
        del self.drivers[leader.member]
        self._recovered(fault)
        if leader_of(self.tm) not in self.drivers:
            self.problems.append(f"after {leader.member} was killed, {leader_of(self.tm)} leads, not its standby")
        self._start_standby()

    def _check(self) -> None:
        """Check every consistent version the checker can resolve (at most one read every 0.5 s)."""
        while not self._stop.wait(0.5):
            try:
                self.checker.observe()
            except Exception as exc:  # noqa: BLE001 - a read racing a commit; a real bug shows as an inconsistency
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    def finish(self) -> RunResult:
        """Stop producing, wait for the epoch holding the last row, stop the drivers (SIGTERM), and check that
        every produced row is in the log and the counts exactly once, at the version ZooKeeper and Iceberg alone
        both resolve."""
        producer = present(self.producer)
        last = producer.stop()
        try:
            wait_for(lambda: committed_since(self.tm, 0, last), "the epoch holding the last produced row",
                     DRAIN_DEADLINE, every=0.2)
        except AssertionError as exc:   # a wait that timed out
            self.problems.append(str(exc))
        self._stop.set()
        present(self._checking).join(60)
        unexpected = [f"{member} exited with status {driver.proc.returncode}"
                      for member, driver in self.drivers.items() if driver.proc.poll() is not None]
        for driver in self.drivers.values():
            driver.proc.send_signal(signal.SIGTERM)
        for member, driver in self.drivers.items():
            try:
                driver.wait()
            except AssertionError as exc:
                self.problems.append(f"{member} did not stop cleanly: {' '.join(str(exc).split())[-300:]}")
        self.problems += [f"the consistent epoch stepped back from {newest} to {older}"
                          for newest, older in self.checker.stepped_back]
        duplicates = losses = 0
        try:
            tally = Tally.of(self.lake, self.connect, producer.produced)
            if tally.version != tally.iceberg_version:
                self.problems.append(f"ZooKeeper resolves {tally.version}, Iceberg alone {tally.iceberg_version}")
            if not tally.words.holds:
                self.problems.append(f"the final version's root table differs from the produced rows: {tally.words}")
            duplicates = max(tally.logged.duplicates, tally.counted.duplicates)
            losses = max(tally.logged.losses, tally.counted.losses)
            self.checker.check(tally.version)
            check_staged_with_progress(self.lake)
        except (AssertionError, TidemarkError) as exc:
            self.problems.append(f"final check failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}")
        log = self.lake.settings.load().load_table(LOG.split(".", 1)[1])
        epochs = {record.epoch for record in map(snapshot_progress, main_lineage(log)) if record is not None}
        return RunResult(SCENARIO, self.seed, self.faults, len(epochs), len(producer.produced), duplicates, losses,
                         self.checker.checked, list(self.checker.failures), unexpected, self.problems, self.errors)
