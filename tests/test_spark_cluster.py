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
from typing import Optional

import pytest

from coordinator.iceberg.snapshots import main_lineage, snapshot_progress
from coordinator.records import now_ms
from spark_hooks.classpath import IcebergRuntime
from tests.helpers.present import present
from tests.helpers.spark_cascade import (
    JOB,
    STARTUP,
    Driver,
    Lake,
    Producer,
    check_exactly_once,
    check_staged_with_progress,
    committed_since,
    leader_of,
    rerun,
    tasks,
)
from tests.helpers.spark_cluster import SparkCluster
from tests.helpers.spark_driver import LOG
from tests.helpers.wait import wait_for

pytestmark = pytest.mark.spark

RUNTIME = IcebergRuntime.installed()  # the runtime jar of the installed Spark: 3.5_2.12, 4.1_2.13, ...
ICEBERG_WRITE_LOADED = re.compile(r"org\.apache\.iceberg\.spark\.source\.SparkWrite\S* source: \S*"
                                  + re.escape(f"iceberg-spark-runtime-{RUNTIME.spark_version}_{RUNTIME.scala_version}-")
                                  + r"[\d.]+\.jar")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with SparkCluster(tmp_path_factory.mktemp("spark-cluster"), workers=2) as running:
        yield running


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake.create(tmp_path)


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
        assert rerun(gate, task), f"task {task} of the killed executor was never run again: {tasks(gate)}"
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

