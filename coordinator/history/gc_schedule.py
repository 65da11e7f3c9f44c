"""Garbage collection on a schedule, run by one elected driver at a time.

    schedule = GcSchedule(tm, settings, every_s=600).start()   # in every driver that may run it
    ...
    schedule.stop()

Every process with a schedule wakes every ``every_s`` seconds and, when the last run (by
anyone) is at least ``every_s`` old, takes the GC lock (``GarbageCollector.exclusive``, also
taken by ``tidemark gc``) without waiting: one process wins, runs ``GarbageCollector.run()``
and records the time in ``/gc``; the others see the recorded run and sleep again. A driver
that dies mid-run loses the lock with its session and the next due process runs GC again (a
run is safe to repeat).

Failure behaviour: an error of a run is logged and kept in ``last_error``; the schedule goes
on (GC is housekeeping: it must never stop the driver's epochs). A ZooKeeper server found behind
the session (rebuilt or restored: ``ZooKeeperRebuilt``, which the session logs) ends the schedule
with one line: that session can never run GC again, and the driver it runs in exits for a restart.
``stop`` returns promptly even with ZooKeeper down once the process is stopping
(``ZooKeeperSession.stop_waiting``, which the writer calls on SIGTERM).
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Callable, Optional

from coordinator.errors import CorruptState, GcRunning, InvalidArgument, ZooKeeperRebuilt
from coordinator.history.gc import GarbageCollector, GcReport
from coordinator.history.retention import RetentionPolicy
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.records import now_ms
from coordinator.zookeeper.session import ZooKeeperSession

log = logging.getLogger(__name__)


class GcSchedule:
    """Runs ``GarbageCollector.run()`` on a daemon thread when it is due, in whichever process with a schedule wins
    the GC lock (module docstring); ``runs``, ``last_report`` and ``last_error`` say how it went.

        schedule = GcSchedule(tm, settings, every_s=600).start()
        ...
        schedule.stop()

    Lifecycle: ``start`` starts the thread, which looks every ``every_s`` seconds until ``stop``, or until a
    ``ZooKeeperRebuilt`` ends it. ``run_if_due`` is one such look, on the calling thread.

    :param settings: the catalog (default: the environment's); ``policy`` the retention policy (default: the
        deployment's, ``/versions``); ``clock`` the time GC plans at and records.

    Failure behaviour: the thread logs an error of a run, keeps it in ``last_error`` and goes on. The constructor
    raises ``InvalidArgument`` for ``every_s`` not positive and ``ConfigurationError`` for a catalog that cannot
    be opened.
    """

    def __init__(self, tm: ZooKeeperSession, settings: Optional[CatalogSettings] = None, *, every_s: float = 600.0,
                 policy: Optional[RetentionPolicy] = None, clock: Callable[[], int] = now_ms) -> None:
        if every_s <= 0:
            raise InvalidArgument(f"every_s must be positive, got {every_s}")
        self.tm, self.every_s, self.clock = tm, every_s, clock
        self.collector = GarbageCollector(tm, settings, policy=policy, clock=clock)
        self.runs = 0
        self.last_report: Optional[GcReport] = None
        self.last_error: Optional[Exception] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> GcSchedule:
        """Start the thread that runs GC when it is due; returns the schedule."""
        self._thread = threading.Thread(target=self._loop, name="tidemark-gc", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop waking up; waits for a run in progress to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_if_due()
            except ZooKeeperRebuilt as exc:
                self.last_error = exc
                log.error("gc: the schedule stops: %s", exc)
                return
            except Exception as exc:  # noqa: BLE001 - housekeeping never takes the driver down
                self.last_error = exc
                log.warning("gc: run failed (%s: %s); trying again in %.0f s", type(exc).__name__, exc, self.every_s)
            self._stop.wait(self.every_s)

    def run_if_due(self) -> Optional[GcReport]:
        """Run GC if no process ran it in the last ``every_s`` seconds and this one wins the lock; the report, or
        None when it was not due or another process holds the lock. A failed run's error propagates.

        :raises CorruptState: the ``/gc`` znode does not hold a GC record.
        """
        if not self._due():
            return None
        try:
            with self.collector.exclusive(wait_s=0):
                if not self._due():  # it ran between our look and our lock
                    return None
                report = self.collector.run()
                self.tm.call(f"set {self.tm.paths.gc}", self.tm.client.set_async, self.tm.paths.gc,
                             json.dumps({"last_run_ms": self.clock(), "by": self.tm.member}).encode())
        except GcRunning:
            return None  # another process is running it
        self.runs += 1
        self.last_report, self.last_error = report, None
        return report

    def _due(self) -> bool:
        found = self.tm.get(self.tm.paths.gc)
        try:
            last = json.loads(found[0])["last_run_ms"] if found is not None and found[0] else None
        except (ValueError, KeyError, TypeError):
            raise CorruptState(f"{self.tm.paths.gc}: not a GC record; delete the znode") from None
        return last is None or self.clock() - last >= self.every_s * 1000


__all__ = ["GcSchedule"]
