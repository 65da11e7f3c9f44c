"""Takeover: from kill -9 of a job's leader to the first epoch committed by its standby, warm vs cold.

    python -m bench takeover [--engine spark|python] [--rounds 3] [--interval-ms 2000]

Two driver processes run the same job (a root job appending each epoch's new rows); a producer
keeps the root table changing. Each round kills the leader with SIGKILL and measures the time
until the standby has committed an epoch (polling the sink's tidemark every 50 ms), then
starts a new standby. It runs once with warm standbys (``while_standby`` keeps the engine warm)
and, as the baseline in the same run, with cold ones. The floor is the ZooKeeper session
timeout (the dead leader's lock is released only when its session expires) plus one epoch.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

import pyarrow as pa

from coordinator import CatalogSettings, Tidemark
from coordinator.records import LeaderRecord

from .common import header, zookeeper

SOURCE, SINK = "lake.bench.events", "lake.bench.copy"
SCHEMA = pa.schema([pa.field("v", pa.int64())])
SESSION_TIMEOUT = 4.0


def drive(args) -> int:
    """One replica: lead (or stand by) and run the job until killed."""
    settings = CatalogSettings.embedded(Path(args.home))
    tm = Tidemark.connect(args.zk, session_timeout=SESSION_TIMEOUT, member=f"replica-{os.getpid()}")
    if args.engine == "spark":
        from spark_hooks import EpochJob, build_spark_session
        spark = build_spark_session(settings, app_name="tidemark-bench-takeover",
                                    extra_conf={"spark.ui.enabled": "false", "spark.driver.memory": "1g"})
        job = EpochJob(spark, tm, "copier", sources=[SOURCE], sinks=[SINK], catalog=settings,
                       interval_ms=args.interval_ms, grace_ms=200)
        job.epoch(lambda ctx: ctx.append(SINK, ctx.changes(SOURCE)))
        if not args.warm:
            # The baseline: a standby that does nothing while it waits (replacing the method is the point).
            job.warm_up = lambda: None  # type: ignore[method-assign]
        job.run()
    else:
        from coordinator import EpochWriter
        writer = EpochWriter(tm, "copier", sources=[SOURCE], sinks=[SINK], catalog=settings,
                             interval_ms=args.interval_ms, grace_ms=200)
        writer.run(lambda ctx: ctx.append(SINK, ctx.changes(SOURCE)))
    return 0


LOGS = Path(tempfile.gettempdir()) / "tidemark-bench-takeover-logs"


def _start(zk: str, home: Path, engine: str, interval_ms: int, warm: bool) -> subprocess.Popen:
    LOGS.mkdir(exist_ok=True)
    with open(LOGS / f"replica-{time.monotonic_ns()}.log", "w") as log:  # the replica keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "bench.takeover", "--driver", "--zk", zk, "--home", str(home),
                                 "--engine", engine, "--interval-ms", str(interval_ms), *([] if warm else ["--cold"])],
                                stdout=log, stderr=subprocess.STDOUT)


def _wait(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what} (replica logs in {LOGS})")


def _leader_pid(tm: Tidemark) -> Optional[int]:
    found = tm.read(tm.paths.leader("copier"), LeaderRecord)
    return int(found[0].member.rsplit("-", 1)[1]) if found else None


def _tidemark(tm: Tidemark) -> Optional[int]:
    mark = tm.tidemarks([SINK])[SINK]
    return mark.epoch if mark else None


def measure(engine: str, rounds: int, interval_ms: int, warm: bool) -> list[float]:
    """Seconds from SIGKILL of the leader to the standby's first committed epoch, per round."""
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-takeover-", ignore_cleanup_errors=True) as tmp, \
            zookeeper() as server:
        home = Path(tmp)
        catalog = CatalogSettings.embedded(home).load()
        catalog.create_namespace("bench")
        source = catalog.create_table("bench.events", schema=SCHEMA)
        catalog.create_table("bench.copy", schema=SCHEMA)
        stop = threading.Event()

        def produce() -> None:
            i = 0
            while not stop.wait(0.3):
                source.append(pa.table({"v": [i]}, schema=SCHEMA))
                i += 1
        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        tm = Tidemark.connect(server.connect_string)
        replicas = [_start(server.connect_string, home, engine, interval_ms, warm) for _ in range(2)]
        samples = []
        try:
            _wait(lambda: _tidemark(tm), 600, "the first committed epoch")
            for _ in range(rounds):
                time.sleep(3 * interval_ms / 1000 + 20)  # the standby has warmed up and the leader is steady
                pid = _wait(lambda: _leader_pid(tm), 60, "a leader")
                before = _tidemark(tm)
                killed_at = time.monotonic()
                os.kill(pid, signal.SIGKILL)
                _wait(lambda: (_leader_pid(tm) not in (None, pid)) and (_tidemark(tm) or 0) > (before or 0)
                      and _leader_pid(tm), 600, "the standby's first commit")
                samples.append(time.monotonic() - killed_at)
                replicas = [r for r in replicas if r.pid != pid]
                replicas.append(_start(server.connect_string, home, engine, interval_ms, warm))
        finally:
            stop.set()
            producer.join()
            for replica in replicas:
                replica.kill()
                replica.wait()
            tm.close()
        return samples


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench takeover")
    parser.add_argument("--engine", choices=["spark", "python"], default="spark")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--driver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cold", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--zk", help=argparse.SUPPRESS)
    parser.add_argument("--home", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.driver:
        args.warm = not args.cold
        sys.exit(drive(args))
    header(f"takeover to first commit ({args.engine}, {args.rounds} kill -9 rounds, barriers every "
           f"{args.interval_ms} ms, session timeout {SESSION_TIMEOUT:.0f} s)")
    print(f"floor: session timeout + one epoch = about {SESSION_TIMEOUT + args.interval_ms / 1000:.1f} s")
    for warm in (True, False):
        samples = measure(args.engine, args.rounds, args.interval_ms, warm)
        label = "warm standby (Tidemark)" if warm else "baseline: cold standby"
        print(f"{label:<26} p50 {statistics.median(samples):6.1f} s   max {max(samples):6.1f} s   "
              f"samples {', '.join(f'{s:.1f}' for s in samples)}", flush=True)


if __name__ == "__main__":
    main()
