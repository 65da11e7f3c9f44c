"""A Spark standalone cluster on loopback, started from pyspark's own launcher: a master and workers, every
executor a JVM of its own (``CoarseGrainedExecutorBackend``), as on a real cluster.

    with SparkCluster(tmp_path, workers=2) as cluster:
        cluster.url                           # spark://127.0.0.1:<port>, for TIDEMARK_SPARK_MASTER
        cluster.app_id("driver-a")            # the running application of that name
        cluster.executors(app_id)             # {executor id: pid} of its live executor JVMs

Each daemon is ``$SPARK_HOME/bin/spark-class`` (SPARK_HOME: pyspark's package directory) in a
process group of its own; a worker's executors, and their Python workers, are in the worker's
group, so closing the cluster kills every group and leaves nothing running. Every wait polls the
master's JSON page with a deadline.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Optional

from coordinator.operations.zookeeper_server import free_port
from tests.helpers.wait import wait_for

EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
START_TIMEOUT = 120.0  # JVM start-up on a loaded 2-core machine


def spark_home() -> Path:
    import pyspark
    return Path(pyspark.__file__).parent


class SparkCluster:
    """A master and ``workers`` workers, each offering ``cores`` cores and ``memory`` to executors."""

    def __init__(self, base: Path, workers: int = 2, cores: int = 2, memory: str = "2g") -> None:
        self.base = base
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port, self.ui_port = free_port(), free_port()
        self.processes: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def worker_dir(self, index: int) -> Path:
        """Where worker ``index`` runs its executors: ``<app id>/<executor id>/{stdout,stderr}``."""
        return self.base / f"worker-{index}"

    def env(self) -> dict[str, str]:
        conf = self.base / "conf"  # empty: no spark-defaults.conf or log4j2.properties of the machine's
        conf.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPARK_")}
        env.update(SPARK_HOME=str(spark_home()), SPARK_CONF_DIR=str(conf), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_LOG_DIR=str(self.base / "logs"), SPARK_DAEMON_MEMORY="256m",
                   PYSPARK_PYTHON=sys.executable)
        return env

    def __enter__(self) -> SparkCluster:
        try:
            self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                        "--port", str(self.port), "--webui-port", str(self.ui_port))
            wait_for(lambda: (self.state() or {}).get("status") == "ALIVE", "the Spark master to be up",
                     START_TIMEOUT, every=0.2)
            for index in range(self.workers):
                self.worker_dir(index).mkdir(parents=True, exist_ok=True)
                self._start(f"worker-{index}", "org.apache.spark.deploy.worker.Worker", self.url,
                            "--host", "127.0.0.1", "--port", str(free_port()), "--webui-port", str(free_port()),
                            "--cores", str(self.cores), "--memory", self.memory,
                            "--work-dir", str(self.worker_dir(index)))
            wait_for(lambda: len(self._alive_workers()) == self.workers, f"{self.workers} Spark workers to register",
                     START_TIMEOUT, every=0.2)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _start(self, name: str, main_class: str, *args: str) -> None:
        with open(self.base / f"{name}.log", "w") as out:
            # A process group per daemon: its executors and their Python workers inherit it.
            self.processes.append(subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), main_class, *args], env=self.env(), cwd=self.base,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True))

    def close(self) -> None:
        """kill -9 every daemon's process group (executors included), workers first, and reap the daemons."""
        for proc in reversed(self.processes):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.processes:
            proc.wait(30)
        self.processes = []

    def state(self) -> Optional[dict]:
        """The master's JSON page (workers, applications), or None while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=5) as response:
                return json.load(response)
        except OSError:
            return None

    def _alive_workers(self) -> list[dict]:
        return [w for w in (self.state() or {}).get("workers", []) if w.get("state") == "ALIVE"]

    def app_id(self, name: str) -> Optional[str]:
        """The id of the newest application named ``name`` (``spark.app.name``), running or ended, once the
        master has it."""
        state = self.state() or {}
        apps = [a for a in state.get("activeapps", []) + state.get("completedapps", []) if a.get("name") == name]
        return max(apps, key=lambda a: a.get("starttime", 0))["id"] if apps else None

    def executors(self, app_id: str) -> dict[str, int]:
        """``{executor id: pid}`` of ``app_id``'s live executor JVMs on this cluster's workers."""
        groups = {proc.pid for proc in self.processes}
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
                group = os.getpgid(int(entry.name))
            except (OSError, ProcessLookupError):
                continue  # exited meanwhile
            executor = _arg(args, "--executor-id")
            if EXECUTOR_CLASS in args and group in groups and _arg(args, "--app-id") == app_id and executor:
                found[executor] = int(entry.name)
        return found

    def executor_of(self, pid: int) -> Optional[int]:
        """The executor JVM that ``pid`` (a task's Python worker) runs under: its nearest such ancestor."""
        while pid > 1:
            try:
                status = Path(f"/proc/{pid}/status").read_text()
                args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                return None
            if EXECUTOR_CLASS in args:
                return pid
            pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        return None


def _arg(args: list[str], flag: str) -> Optional[str]:
    return args[args.index(flag) + 1] if flag in args[:-1] else None
