"""The word-count job of ``tests/helpers/spark_driver.py`` on a ``SparkCluster``: its lake, its driver processes, a
producer, and the checks that every produced row reached the sinks exactly once. Shared by
``tests/test_spark_cluster.py`` and the fault suite's ``spark-cluster`` scenario.

    lake = Lake.create(home)                               # kill.words -> counter -> kill.counts, kill.log
    driver = Driver(cluster, lake, zk, "driver-a")         # its own process group, its Spark JVM included
    producer = Producer(lake.words)                        # three new words every 0.25 s
    last = producer.stop()                                 # the barrier by which every row is read
    tally = Tally.of(lake, zk, producer.produced)          # the resolved version, duplicates and losses
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pyarrow as pa

from coordinator import CatalogSettings, Tidemark
from coordinator.history.checker import ExactlyOnce, exactly_once
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.iceberg.snapshots import main_lineage, snapshot_progress, wap_id
from coordinator.protocol.leadership import current_leader
from coordinator.records import ConsistentVersion
from tests.helpers.crash import crash_env
from tests.helpers.present import present
from tests.helpers.spark_cluster import SparkCluster, spark_home
from tests.helpers.spark_driver import COUNTS, LOG, WORDS

REPO = Path(__file__).resolve().parents[2]
WORD = pa.schema([pa.field("word", pa.string())])
COUNT = pa.schema([pa.field("word", pa.string()), pa.field("cnt", pa.int64())])
JOB = "counter"
TABLES = [WORDS, COUNTS, LOG]
# Small executors, two per application (one on each worker), few shuffle partitions: a 2-core machine.
# spark.executor.defaultJavaOptions logs every class an executor JVM loads, and from which jar, to its stdout
# (<worker dir>/<app id>/<executor id>/stdout); build_spark_session's extraJavaOptions add to it.
SPARK_DEFAULTS = {"spark.submit.deployMode": "client", "spark.executor.memory": "512m", "spark.executor.cores": "1",
                  "spark.cores.max": "2", "spark.sql.shuffle.partitions": "2",
                  "spark.executor.defaultJavaOptions": "-Xlog:class+load=info"}
STARTUP = 240.0  # a Spark application's start on a loaded 2-core machine, with its executors


@dataclass
class Lake:
    home: Path
    settings: CatalogSettings
    words: object   # the root table, pyiceberg

    @classmethod
    def create(cls, home: Path) -> Lake:
        """The job's tables in an embedded catalog under ``home`` (the drivers' own, ``spark_driver``'s)."""
        settings = CatalogSettings.embedded(home)
        catalog = settings.load()
        catalog.create_namespace_if_not_exists("kill")
        words = catalog.create_table("kill.words", schema=WORD)
        catalog.create_table("kill.counts", schema=COUNT)
        catalog.create_table("kill.log", schema=WORD)
        return cls(home, settings, words)


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
    """The member leading the counter job now (None: nobody)."""
    leader = current_leader(tm, JOB)
    return leader.member if leader is not None else None


def committed_since(tm: Tidemark, since_ms: int, epoch: int = 0) -> Optional[int]:
    """When the counter job committed, after ``since_ms``, an epoch at or after ``epoch`` (both sinks: one
    commit); None while it has not."""
    mark = tm.tidemarks([LOG])[LOG]
    done = mark is not None and (mark.committed_ms or 0) > since_ms and (mark.epoch or 0) >= epoch
    return present(mark).committed_ms if done else None


@dataclass(frozen=True)
class Task:
    stage: int
    partition: int
    attempt: int
    attempt_id: int   # unique in the application: a rerun has a higher one
    pid: int          # its Python worker's


def tasks(gate: Path, after_ns: int = 0) -> list[Task]:
    """The tasks that passed the gate's marker (created after ``after_ns``), in the order they created it."""
    found = sorted((p for p in gate.glob("task-*") if p.stat().st_mtime_ns > after_ns),
                   key=lambda p: p.stat().st_mtime_ns)
    return [Task(*(int(part) for part in p.name.split("-")[1:])) for p in found]


def rerun(gate: Path, task: Task) -> bool:
    """Spark ran ``task`` again (in the same stage attempt or a new one): a higher attempt id, same partition."""
    return any((t.stage, t.partition) == (task.stage, task.partition) and t.attempt_id > task.attempt_id
               for t in tasks(gate))


def sinks_agree(frames: Mapping[str, pa.Table]) -> Optional[str]:
    """A consistent version's invariant: the log holds the root table's words as of the version, each once, and
    the counts count the log (a ``ConsistencyChecker`` invariant)."""
    words, logged = Counter(frames[WORDS].column("word").to_pylist()), Counter(frames[LOG].column("word").to_pylist())
    counts = frames[COUNTS]
    counted = Counter(dict(zip(counts.column("word").to_pylist(), counts.column("cnt").to_pylist())))
    if logged != words:
        return f"the log holds {sum(logged.values())} words, the root table {sum(words.values())}"
    if counted != logged:
        return f"the counts sum to {sum(counted.values())} words, the log holds {sum(logged.values())}"
    return None


@dataclass(frozen=True)
class Tally:
    """The consistent version ZooKeeper resolves, the one Iceberg alone resolves, and how the root table, the log
    and the counts at the first differ from what was produced."""
    version: ConsistentVersion
    iceberg_version: ConsistentVersion
    words: ExactlyOnce
    logged: ExactlyOnce
    counted: ExactlyOnce

    @classmethod
    def of(cls, lake: Lake, zk: str, produced: list[str]) -> Tally:
        catalog = lake.settings.load()
        with Tidemark.connect(zk) as tm:
            version = Resolver(catalog, lake.settings, tm).resolve(TABLES)
        data = read_arrow(Resolver(catalog, lake.settings), version)
        counts = data[COUNTS]
        return cls(version, Resolver(catalog, lake.settings, None).resolve(TABLES),
                   exactly_once(produced, data[WORDS].column("word").to_pylist()),
                   exactly_once(produced, data[LOG].column("word").to_pylist()),
                   exactly_once(produced, [w for w, n in zip(counts.column("word").to_pylist(),
                                                             counts.column("cnt").to_pylist()) for _ in range(n)]))


def check_exactly_once(lake: Lake, zk: str, produced: list[str]) -> ConsistentVersion:
    """Every produced row once in the log and once in the counts, at the consistent version ZooKeeper and
    Iceberg alone both resolve; returns that version."""
    tally = Tally.of(lake, zk, produced)
    assert tally.version == tally.iceberg_version
    assert tally.words.holds, "the version misses produced rows"
    logged, counted = tally.logged, tally.counted
    assert (logged.duplicates, logged.losses, counted.duplicates, counted.losses) == (0, 0, 0, 0), (logged, counted)
    return tally.version


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
