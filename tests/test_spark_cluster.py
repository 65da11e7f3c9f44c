"""The word-count cascade on a Spark standalone cluster: a master and two workers on loopback, started from
pyspark's own launcher, every executor a JVM of its own, as Kubernetes users run it (a driver with executor pods).

The drivers are processes of ``tests/helpers/spark_driver.py`` (``EpochJob``), started the way the chart
starts them in its image: ``SPARK_HOME`` set, the master and the executors' settings in the
``spark-defaults.conf`` of ``SPARK_CONF_DIR``, the driver's address in ``PYSPARK_SUBMIT_ARGS``; and
``build_spark_session`` adds Iceberg's runtime (``spark.executor.extraClassPath``: the jars ``make setup``
prepared, the image's in a pod). The tests show the executors load Iceberg's write classes
from those jars; WAP staging, the ``MERGE`` commit properties and ``foreachBatch`` work there; an executor
killed (kill -9) while it runs an epoch's task is replaced by Spark with nothing lost or repeated; and a
driver killed mid-epoch, with its JVM, is taken over by a standby driver that has executors of its own.
Every produced row is checked to be in the sinks exactly once.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pytest

from coordinator import CatalogSettings, Tidemark
from coordinator.history.checker import exactly_once
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.iceberg.snapshots import main_lineage, snapshot_progress, wap_id
from coordinator.records import LeaderRecord, now_ms
from tests.helpers.crash import crash_env
from tests.helpers.present import present
from tests.helpers.spark_cluster import SparkCluster, spark_home
from tests.helpers.spark_driver import COUNTS, LOG, WORDS
from tests.helpers.wait import wait_for

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.spark

WORD = pa.schema([pa.field("word", pa.string())])
COUNT = pa.schema([pa.field("word", pa.string()), pa.field("cnt", pa.int64())])
JOB = "counter"
# Small executors, two per application (one on each worker), few shuffle partitions: a 2-core machine.
# spark.executor.defaultJavaOptions logs every class an executor JVM loads, and from which jar, to its stdout
# (<worker dir>/<app id>/<executor id>/stdout); build_spark_session's extraJavaOptions add to it.
SPARK_DEFAULTS = {"spark.submit.deployMode": "client", "spark.executor.memory": "512m", "spark.executor.cores": "1",
                  "spark.cores.max": "2", "spark.sql.shuffle.partitions": "2",
                  "spark.executor.defaultJavaOptions": "-Xlog:class+load=info"}
ICEBERG_WRITE_LOADED = re.compile(r"org\.apache\.iceberg\.spark\.source\.SparkWrite\S* source: \S*"
                                  r"iceberg-spark-runtime-3\.5_2\.12-[\d.]+\.jar")
STARTUP = 240.0  # a Spark application's start on a loaded 2-core machine, with its executors


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as running:
        yield running


@dataclass
class Lake:
    home: Path
    settings: CatalogSettings
    words: object   # the root table, pyiceberg


@pytest.fixture
def lake(tmp_path) -> Lake:
    settings = CatalogSettings.embedded(tmp_path)
    catalog = settings.load()
    catalog.create_namespace_if_not_exists("kill")
    words = catalog.create_table("kill.words", schema=WORD)
    catalog.create_table("kill.counts", schema=COUNT)
    catalog.create_table("kill.log", schema=WORD)
    return Lake(tmp_path, settings, words)


class Driver:
    """``tests.helpers.spark_driver`` against the cluster, in a process group of its own (with its Spark JVM)."""

    def __init__(self, cluster: SparkCluster, lake: Lake, zk: str, member: str, *args: str,
                 crash_at: str = "none") -> None:
        conf = lake.home / "spark-conf"
        conf.mkdir(exist_ok=True)
        defaults = {"spark.master": cluster.url, "spark.local.dir": str(lake.home / "spark-local"), **SPARK_DEFAULTS}
        (conf / "spark-defaults.conf").write_text("".join(f"{k} {v}\n" for k, v in defaults.items()))
        env = {k: v for k, v in crash_env(crash_at).items() if not k.startswith(("SPARK_", "TIDEMARK_SPARK_"))}
        env.update(SPARK_HOME=str(spark_home()), SPARK_CONF_DIR=str(conf), SPARK_LOCAL_IP="127.0.0.1",
                   PYSPARK_SUBMIT_ARGS="--conf spark.driver.host=127.0.0.1 pyspark-shell",
                   PYSPARK_PYTHON=sys.executable)
        self.member = member
        self.out, self.err = lake.home / f"{member}.out", lake.home / f"{member}.log"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.helpers.spark_driver", str(lake.home), zk, "--member", member, *args],
                cwd=REPO, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)

    def stop(self) -> list[int]:
        """SIGTERM (it finishes its epoch in flight) and the epochs it committed."""
        self.proc.send_signal(signal.SIGTERM)
        return self.wait()

    def wait(self) -> list[int]:
        assert self.proc.wait(180) == 0, self.err.read_text()[-3000:]
        return json.loads(self.out.read_text().strip().splitlines()[-1])["committed"]

    def kill(self) -> None:
        """kill -9 of the whole driver, its Spark JVM included (a lost pod)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


class Producer:
    """Appends one batch of three new words every 0.25 s to the root table, and keeps them."""

    def __init__(self, words) -> None:
        self.words = words
        self.produced: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        batch = 0
        while not self._stop.wait(0.25):
            rows = [f"b{batch}-{i}" for i in range(3)]
            self.words.append(pa.table({"word": rows}, schema=WORD))
            self.produced += rows
            batch += 1

    def stop(self) -> int:
        """Stop, and return the barrier by which the jobs have read every produced row."""
        self._stop.set()
        self._thread.join(30)
        self.words.refresh()
        return -(-present(self.words.current_snapshot()).timestamp_ms // 1000) * 1000


def leader_of(tm: Tidemark) -> Optional[str]:
    found = tm.get(tm.paths.leader(JOB))
    return LeaderRecord.from_json(found[0]).member if found else None


def committed_since(tm: Tidemark, since_ms: int, epoch: int = 0) -> bool:
    """The counter job committed, after ``since_ms``, an epoch at or after ``epoch`` (both sinks: one commit)."""
    mark = tm.tidemarks([LOG])[LOG]
    return mark is not None and (mark.committed_ms or 0) > since_ms and (mark.epoch or 0) >= epoch


@dataclass(frozen=True)
class Task:
    stage: int
    partition: int
    attempt: int
    attempt_id: int   # unique in the application: a rerun has a higher one
    pid: int          # its Python worker's


def tasks(gate: Path) -> list[Task]:
    """The tasks that passed the gate's marker, in the order they created it."""
    found = sorted((p for p in gate.glob("task-*")), key=lambda p: p.stat().st_mtime_ns)
    return [Task(*(int(part) for part in p.name.split("-")[1:])) for p in found]


def check_exactly_once(lake: Lake, zk: str, produced: list[str]):
    """Every produced row once in the log and once in the counts, at the consistent version ZooKeeper and
    Iceberg alone both resolve; returns that version."""
    catalog = lake.settings.load()
    tables = [WORDS, COUNTS, LOG]
    with Tidemark.connect(zk) as tm:
        version = Resolver(catalog, lake.settings, tm).resolve(tables)
    assert version == Resolver(catalog, lake.settings, None).resolve(tables)
    data = read_arrow(Resolver(catalog, lake.settings), version)
    assert sorted(data[WORDS].column("word").to_pylist()) == sorted(produced), "the version misses produced rows"
    logged = exactly_once(produced, data[LOG].column("word").to_pylist())
    counts = data[COUNTS]
    counted = exactly_once(produced, [w for w, n in zip(counts.column("word").to_pylist(),
                                                        counts.column("cnt").to_pylist()) for _ in range(n)])
    assert (logged.duplicates, logged.losses, counted.duplicates, counted.losses) == (0, 0, 0, 0), (logged, counted)
    return version


def check_staged_with_progress(lake: Lake, job: str = JOB, sinks: tuple[str, ...] = ("kill.log", "kill.counts")) -> int:
    """Every snapshot of the sinks' main branch was written by an epoch of ``job``, staged under the epoch's
    ``spark.wap.id``, and carries its progress record (the ``MERGE`` ones through the commit properties);
    returns how many there are."""
    catalog, checked = lake.settings.load(), 0
    for sink in sinks:
        for snapshot in main_lineage(catalog.load_table(sink)):
            record = snapshot_progress(snapshot)
            assert record is not None and record.job == job and record.inputs is not None, (sink, snapshot)
            if job == JOB:
                assert present(record.inputs.sources[WORDS].end) is not None
            assert present(snapshot.summary).get("wap.id") == wap_id(record.epoch, job, record.term), (sink, snapshot)
            checked += 1
    return checked


def iceberg_loaded_by(cluster: SparkCluster, app_id: str) -> set[str]:
    """The executors of ``app_id`` whose JVM loaded Iceberg's Spark write classes from the runtime jar."""
    found = set()
    for worker in range(cluster.workers):
        for stdout in (cluster.worker_dir(worker) / app_id).glob("*/stdout"):
            if ICEBERG_WRITE_LOADED.search(stdout.read_text(errors="replace")):
                found.add(stdout.parent.name)
    return found


@pytest.mark.fault
def test_executors_write_the_epochs_and_one_killed_mid_epoch_is_replaced_by_spark(cluster, lake, zk_connect, tm):
    gate = lake.home / "gate"
    gate.mkdir()
    producer = Producer(lake.words)
    driver = Driver(cluster, lake, zk_connect, "executor-kill", "--task-gate", str(gate))
    try:
        wait_for(lambda: tasks(gate), "a task of the first computed epoch to start on an executor", STARTUP)
        app = wait_for(lambda: cluster.app_id("executor-kill"), "the driver's application", STARTUP)
        executors = wait_for(lambda: len(cluster.executors(app)) == 2 and cluster.executors(app),
                             "the application's two executors", STARTUP)
        held = {t: cluster.executor_of(t.pid) for t in tasks(gate)}
        victim = next(iter(held.values()))
        assert victim in executors.values(), f"task pid {next(iter(held))} is not under an executor: {executors}"
        killed = [t for t, executor in held.items() if executor == victim]
        os.kill(victim, signal.SIGKILL)
        killed_ms = now_ms()
        (gate / "release").touch()
        wait_for(lambda: committed_since(tm, killed_ms), "an epoch committed after the executor kill", 180)
        last = producer.stop()
        wait_for(lambda: committed_since(tm, 0, last), "the epoch holding the last produced row", 180)
        committed = driver.stop()
    finally:
        producer.stop()
        driver.kill()
    # Spark ran each killed task again (in the same stage attempt or a new one), on a live executor.
    for task in killed:
        again = [t for t in tasks(gate) if (t.stage, t.partition) == (task.stage, task.partition)
                 and t.attempt_id > task.attempt_id]
        assert again, f"task {task} of the killed executor was never run again: {tasks(gate)}"
    assert committed and committed == sorted(set(committed))
    version = check_exactly_once(lake, zk_connect, producer.produced)
    assert version.epoch == committed[-1]
    assert check_staged_with_progress(lake) >= 2
    loaded = iceberg_loaded_by(cluster, app)
    assert set(executors) & loaded, f"no executor of {app} loaded Iceberg's write classes ({executors}, {loaded})"
    print(f"executor kill: {len(producer.produced)} rows, {len(committed)} epochs, executor {victim} killed "
          f"({len(killed)} tasks rerun), Iceberg loaded by executors {sorted(loaded)}: 0 duplicates, 0 losses")


def test_foreach_batch_runs_on_the_cluster_one_epoch_per_batch(cluster, lake, zk_connect, tm):
    incoming = lake.home / "incoming"
    incoming.mkdir()
    batches = [["a", "b"], ["c"], ["d", "e", "f"]]
    for i, batch in enumerate(batches):
        (incoming / f"{i}.json").write_text("\n".join(json.dumps({"word": w}) for w in batch))
    committed = Driver(cluster, lake, zk_connect, "stream", "--stream", str(incoming)).wait()
    assert len(committed) == len(batches) and committed == sorted(set(committed)), committed
    catalog = lake.settings.load()
    log = catalog.load_table("kill.log")
    assert sorted(log.scan().to_arrow().column("word").to_pylist()) == ["a", "b", "c", "d", "e", "f"]
    records = [r for r in map(snapshot_progress, main_lineage(log)) if r is not None]
    assert sorted(present(present(r.inputs).batch_id) for r in records) == [0, 1, 2]
    assert all(r.job == "stream" for r in records)
    assert check_staged_with_progress(lake, "stream", ("kill.log",)) == len(batches)
    app = present(cluster.app_id("stream"))
    assert iceberg_loaded_by(cluster, app), f"no executor of {app} loaded Iceberg's write classes"


@pytest.mark.fault
def test_a_driver_killed_mid_epoch_is_taken_over_by_a_standby_with_executors_of_its_own(cluster, lake, zk_connect, tm):
    leader = Driver(cluster, lake, zk_connect, "driver-a", crash_at="published-one")
    standby: Optional[Driver] = None
    producer: Optional[Producer] = None
    try:
        wait_for(lambda: leader_of(tm) == "driver-a", "driver-a to lead", STARTUP)
        standby = Driver(cluster, lake, zk_connect, "driver-b")
        wait_for(lambda: len(tm.children(tm.paths.election(JOB))) == 2, "driver-b to stand by", STARTUP)
        standby_app = wait_for(lambda: cluster.app_id("driver-b"), "the standby's application", STARTUP)
        wait_for(lambda: cluster.executors(standby_app), "the standby's executors", STARTUP)
        # Words only now: driver-a's computed epochs, and so its crash point (its second one), come after the
        # standby is ready.
        producer = Producer(lake.words)
        assert leader.proc.wait(STARTUP) == -signal.SIGKILL, leader.err.read_text()[-3000:]
        crash = re.search(r"crash point published-one#2 reached at (\d+)", leader.err.read_text())
        assert crash, leader.err.read_text()[-3000:]
        leader.kill()  # its Spark JVM too, and with it its executors
        crashed_ms = int(crash[1])
        wait_for(lambda: committed_since(tm, crashed_ms), "the standby to commit after the kill", 120)
        taken_over_s = (present(tm.tidemarks([LOG])[LOG]).committed_ms or 0) / 1000 - crashed_ms / 1000
        assert leader_of(tm) == "driver-b"
        last = producer.stop()
        wait_for(lambda: committed_since(tm, 0, last), "the epoch holding the last produced row", 180)
        committed = standby.stop()
    finally:
        if producer is not None:
            producer.stop()
        for driver in (leader, standby):
            if driver is not None:
                driver.kill()
    assert committed and committed == sorted(set(committed))
    check_exactly_once(lake, zk_connect, producer.produced)
    assert check_staged_with_progress(lake) >= 2
    loaded = iceberg_loaded_by(cluster, standby_app)
    assert loaded, f"no executor of the standby {standby_app} loaded Iceberg's write classes"
    print(f"driver kill: {len(producer.produced)} rows, the standby committed {len(committed)} epochs, its first "
          f"{taken_over_s:.1f} s after the kill: 0 duplicates, 0 losses")

