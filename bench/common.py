"""Shared helpers for the benchmarks: a private ZooKeeper server, timers, and figure printing."""
from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Optional, TextIO

from coordinator import CatalogSettings, EmbeddedZooKeeper
from coordinator.operations.lakehouse_server import EmbeddedLakehouse
from coordinator.operations.zookeeper_server import four_letter_word, free_port

CATALOG_FILE = "catalog.json"
STACKS = ("embedded", "lakehouse")  # --stack: where a benchmark's tables live


@contextmanager
def bench_lake(home: Path, stack: str) -> Iterator[CatalogSettings]:
    """The catalog a benchmark writes to, in ``home``: ``embedded`` (SQLite, files on the local disk), or
    ``lakehouse`` (a real S3 object store and Iceberg REST catalog on loopback, SeaweedFS, started here and
    stopped at the end), recorded in ``home`` for the benchmark's own driver processes (``bench_catalog``)."""
    if stack == "embedded":
        yield CatalogSettings.embedded(home)
        return
    with EmbeddedLakehouse(home / "lakehouse") as server:
        settings = server.catalog_settings()
        (home / CATALOG_FILE).write_text(json.dumps({"name": settings.name,
                                                     "python_properties": dict(settings.python_properties)}))
        yield settings


def interleaved(first: Callable[[], object], second: Callable[[], object], warmup: int,
                repeat: int) -> tuple[list[float], list[float]]:
    """The wall times of ``first`` and ``second`` run in turn ``warmup + repeat`` times (a busy machine slows
    both alike), the first ``warmup`` of each left out."""
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(warmup + repeat):
        for function, samples in zip((first, second), times):
            start = time.perf_counter()
            function()
            samples.append(time.perf_counter() - start)
    return times[0][warmup:], times[1][warmup:]


def epoch_ratio_line(rows: int, epoch_s: float, write_s: float, plain_s: float, goal: Optional[float]) -> str:
    """One row of an epoch-vs-plain-append table (``epoch_ratio_header``)."""
    ratio = epoch_s / plain_s
    judged = "" if goal is None else f"<= {goal:g}x: {verdict(ratio <= goal)}"
    return (f"{rows:>9} {epoch_s * 1000:>12.0f} ms {write_s * 1000:>10.0f} ms {plain_s * 1000:>20.0f} ms "
            f"{ratio:>6.2f}  {judged}")


EPOCH_RATIO_HEADER = (f"{'rows':>9} {'Tidemark epoch':>15} {'staged write':>13} {'baseline: plain append':>23} "
                      f"{'ratio':>6}  goal")
EPOCH_RATIO_GOALS = {10_000: 1.5, 1_000_000: 1.15}  # Tidemark epoch / plain append of the same rows (Spark)
# A pure-Python epoch stages with no catalog commit: one commit, as a plain append makes (issue 51's goals).
PYTHON_EPOCH_RATIO_GOALS = {10_000: 1.3, 1_000_000: 1.1}


def bench_catalog(home: Path) -> CatalogSettings:
    """The catalog ``bench_lake`` made in ``home``, as a benchmark's driver process opens it."""
    recorded = home / CATALOG_FILE
    if recorded.is_file():
        return CatalogSettings(**json.loads(recorded.read_text()))
    return CatalogSettings.embedded(home)


def log_each_epoch(writer: Any, ran: set[int], events: TextIO) -> None:
    """Make ``writer`` log every epoch it commits to ``events``, one JSON line each: the epoch, whether the
    function ran (``ran`` holds the epochs it ran for), when the epoch started and ended, and the time it spent
    in each phase of the loop (``phases_ms``, from the driver's phase histogram). The loop calls
    ``writer.process`` for every path (computed, idle, recomputed), so replacing it logs them all."""
    from coordinator.job.driver_metrics import PHASES
    from coordinator.records import now_ms
    process = writer.process
    registry = writer.metrics.registry

    def phase_totals() -> dict[str, float]:
        return {phase: registry.get_sample_value("tidemark_driver_epoch_phase_duration_seconds_sum",
                                                 {"tidemark_job": writer.name, "phase": phase}) or 0.0
                for phase in PHASES}
    before = phase_totals()

    def logged(epoch: int, fn: Callable[..., None], *rest: Any, **kwargs: Any) -> Any:
        nonlocal before
        started = now_ms()
        record = process(epoch, fn, *rest, **kwargs)
        after = phase_totals()
        events.write(json.dumps({"epoch": record.epoch, "ran": record.epoch in ran, "start_ms": started,
                                 "end_ms": now_ms(),
                                 "phases_ms": {p: round((after[p] - before[p]) * 1000, 1) for p in PHASES}}) + "\n")
        before = after
        return record
    writer.process = logged


def stop_drivers(drivers: Mapping[str, subprocess.Popen], timeout: float, tail: Callable[[str], str]) -> None:
    """SIGTERM every driver process (each finishes its epoch), wait ``timeout`` seconds, then kill; a driver that
    exits with an error is reported with ``tail(name)``, its log's end."""
    for proc in drivers.values():
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for name, proc in drivers.items():
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        if code != 0:
            print(f"  driver {name} exited with {code}:\n{tail(name)}", flush=True)


def remove_run_dir(home: Path) -> None:
    """Delete a run's directory, unless ``TIDEMARK_BENCH_KEEP`` is set (then say where it is)."""
    if os.environ.get("TIDEMARK_BENCH_KEEP"):
        print(f"  (kept {home})")
    else:
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def zookeeper() -> Iterator[EmbeddedZooKeeper]:
    with tempfile.TemporaryDirectory(prefix="tidemark-bench-zk-") as data, \
            EmbeddedZooKeeper(port=free_port(), data_dir=Path(data)) as server:
        yield server


def packets_received(server: EmbeddedZooKeeper) -> int:
    """The server's count of requests received (``mntr``, which counts itself too), to count real round trips."""
    reply = four_letter_word("127.0.0.1", server.port, b"mntr") or b""
    for line in reply.decode().splitlines():
        key, _, value = line.partition("\t")
        if key == "zk_packets_received":
            return int(value)
    raise RuntimeError("mntr did not report zk_packets_received")


class RoundTrips:
    """Counts the client requests the server receives between calls of ``take()``, without the ``mntr``
    requests that read the counter (each one is a packet too)."""

    def __init__(self, server: EmbeddedZooKeeper) -> None:
        self.server = server
        self.last = packets_received(server)

    def take(self) -> int:
        """Requests since the previous ``take()`` (or since the counter was made)."""
        now = packets_received(self.server)
        count, self.last = now - self.last - 1, now
        return count


def run_until_stopped(threads: list[threading.Thread], stop: threading.Event, join_s: float) -> None:
    """Start ``threads``, wait until ``stop`` is set (a bench process's SIGTERM handler sets it), then join them
    (each for at most ``join_s``)."""
    for thread in threads:
        thread.start()
    while not stop.wait(0.5):
        pass
    for thread in threads:
        thread.join(join_s)


def timed(function: Callable[[], object], repeat: int) -> list[float]:
    """Wall seconds of ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return samples


def ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"median {statistics.median(samples) * 1000:8.2f} ms  p95 {p95 * 1000:8.2f} ms  (n={len(samples)})"


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by rank; NaN when there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def verdict(ok: bool) -> str:
    return "MET" if ok else "MISSED"


def header(title: str) -> None:
    print(f"\n== {title} ==", flush=True)
