"""Shared helpers for the benchmarks: a private ZooKeeper server, timers, and figure printing."""
from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, TextIO

from coordinator import EmbeddedZooKeeper
from coordinator.operations.zookeeper_server import four_letter_word, free_port


def log_each_epoch(writer: Any, ran: set[int], events: TextIO) -> None:
    """Make ``writer`` log every epoch it commits to ``events``, one JSON line each: the epoch, whether the
    function ran (``ran`` holds the epochs it ran for), and when the epoch started and ended. The loop calls
    ``writer.process`` for every path (computed, idle, recomputed), so replacing it logs them all."""
    from coordinator.records import now_ms
    process = writer.process

    def logged(epoch: int, fn: Callable[..., None], *rest: Any, **kwargs: Any) -> Any:
        started = now_ms()
        record = process(epoch, fn, *rest, **kwargs)
        events.write(json.dumps({"epoch": record.epoch, "ran": record.epoch in ran, "start_ms": started,
                                 "end_ms": now_ms()}) + "\n")
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
