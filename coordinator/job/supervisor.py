"""The supervisor around a job's epoch loop: it keeps this replica contending and leading through everything
that ends a leadership, and ends the run on what must end it.

    supervisor = Supervisor("counts", stopping, take_over=open_term, step_down=close_term,
                            still_leading=leadership.confirm)
    supervisor.run(lead, exit_on_rebuilt=True)   # lead(): process epochs for one term, return when done

One term at a time: ``take_over()`` (contend, then recover the last epoch), ``lead()``, then
``step_down()`` whatever happened; ``run`` returns once ``lead()`` returns, or once ``stopping`` is set.
``EpochWriter.run`` is its one caller.

Failure behaviour, by what ends a term:

- fenced, or the session expired, while taking over or leading (``still_leading()`` says so after the
  error): one warning, then contend again. The epoch in flight is recovered by whoever leads next;
- ``JobNotFound`` while taking over (an operator unregistered the job while this replica waited):
  step down and contend again; ``take_over`` registers the job again, with terms above the fence;
- the catalog's database unreachable (``is_catalog_outage``: restarted, failing over): step down, pause
  ``CATALOG_RETRY_S``, contend again; once it has been unreachable for ``CATALOG_OUTAGE_TIMEOUT_S`` the
  error is raised;
- a rebuilt ZooKeeper (``ZooKeeperRebuilt``: its data deleted or restored while this process was
  connected): step down, then ``start_over()`` (a new session, as a restarted process would open) and
  contend again: the next take-over registers the job anew and resumes from Iceberg. Where it cannot
  (``start_over`` returns False, or none is given): one error line, then
  ``SystemExit(EXIT_ZOOKEEPER_REBUILT)`` with ``exit_on_rebuilt``, for the process's supervisor
  (Kubernetes) to restart it, else raised;
- stopping (SIGTERM) while ZooKeeper is unreachable: one line, and ``run`` returns at once;
- not elected within the caller's leader timeout (``NotLeader`` from ``take_over``), or any other error
  while this replica still leads: raised.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Optional

from coordinator.errors import Fenced, JobNotFound, NotLeader, ZooKeeperRebuilt, ZooKeeperUnavailable
from coordinator.iceberg.catalog import is_catalog_outage

log = logging.getLogger("coordinator.job.writer")  # the writer's log: one place to read a job's life
CATALOG_RETRY_S = 1.0  # a leader that lost the catalog steps down, and contends again after this pause
CATALOG_OUTAGE_TIMEOUT_S = 300.0  # ... until the catalog has been unreachable this long: then run() raises
# The exit status of a driver whose ZooKeeper server was rebuilt (sysexits' EX_TEMPFAIL: restart me).
EXIT_ZOOKEEPER_REBUILT = 75


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


class Supervisor:
    """Contend, lead, step down, again, for job ``job`` until ``stopping`` is set (module docstring)."""

    def __init__(self, job: str, stopping: threading.Event, *, take_over: Callable[[], None],
                 step_down: Callable[[], None], still_leading: Callable[[], bool],
                 start_over: Optional[Callable[[], bool]] = None) -> None:
        self.job, self.stopping = job, stopping
        self.take_over, self.step_down, self.still_leading = take_over, step_down, still_leading
        self.start_over = start_over

    def run(self, lead: Callable[[], None], exit_on_rebuilt: bool = False) -> None:
        """Take over, ``lead()`` and step down, term after term, until ``lead()`` returns or ``stopping`` is set;
        the module docstring says which errors end a term and which end the run.

        :param lead: processes epochs for one term; returning ends the run.
        :param exit_on_rebuilt: on a ``ZooKeeperRebuilt`` it cannot start over from, exit the process with
            ``EXIT_ZOOKEEPER_REBUILT`` (a ``SystemExit``) instead of raising.
        :raises ZooKeeperRebuilt: the ZooKeeper server was rebuilt under the session and this process cannot start
            over (without ``exit_on_rebuilt``).
        :raises NotLeader: not elected within the caller's leader timeout (``take_over``'s).
        :raises Exception: the catalog stayed unreachable longer than ``CATALOG_OUTAGE_TIMEOUT_S``, or any other
            error of ``take_over``, or of ``lead`` while this replica still leads, as raised.
        """
        while True:
            try:
                self._supervise(lead)
                return
            except ZooKeeperRebuilt as exc:
                self.step_down()
                if not self.stopping.is_set() and self.start_over is not None and self.start_over():
                    log.warning("job %s: %s; started over in this process on a new session: registering the job "
                                "again, to resume from its sinks' Iceberg metadata", self.job, exc)
                    continue
                log.error("job %s: stopping: %s", self.job, exc)
                if exit_on_rebuilt:
                    raise SystemExit(EXIT_ZOOKEEPER_REBUILT) from None
                raise

    def _supervise(self, lead: Callable[[], None]) -> None:
        outage_since: Optional[float] = None
        while not self.stopping.is_set():
            try:
                self.take_over()
            except NotLeader as exc:
                if self.stopping.is_set():
                    break
                if not isinstance(exc, Fenced):
                    raise  # not elected within the caller's leader timeout
                log.warning("job %s: leadership lost while taking over (%s); contending again", self.job,
                            _first_line(exc))
                continue
            except JobNotFound as exc:
                self.step_down()
                if self.stopping.is_set():
                    break
                log.warning("job %s: %s; registering it again", self.job, _first_line(exc))
                continue
            except ZooKeeperRebuilt:
                raise
            except Exception as exc:  # noqa: BLE001 - re-raised unless the catalog is unreachable
                if self._stopped_without_zookeeper(exc):
                    break
                outage_since = self._ride_out_catalog_outage(exc, outage_since)
                continue
            outage_since, outage = None, None
            try:
                lead()
                break
            except ZooKeeperRebuilt:
                raise
            except Exception as exc:
                if self._stopped_without_zookeeper(exc):
                    break
                if is_catalog_outage(exc):
                    outage = exc
                elif self.still_leading():
                    raise
                else:
                    log.warning("job %s: leadership lost (%s: %s); stepping down to contend again", self.job,
                                type(exc).__name__, _first_line(exc))
            finally:
                self.step_down()
            if outage is not None:
                outage_since = self._ride_out_catalog_outage(outage, outage_since)

    def _stopped_without_zookeeper(self, exc: Exception) -> bool:
        """Stopping (SIGTERM) while ZooKeeper is unreachable: say so and end the run (no traceback); the next
        leader recovers the epoch in flight."""
        if not (self.stopping.is_set() and isinstance(exc, (ZooKeeperUnavailable, NotLeader))):
            return False
        log.warning("job %s: stopped while ZooKeeper was unreachable (%s); the next leader recovers any epoch in "
                    "flight", self.job, _first_line(exc))
        return True

    def _ride_out_catalog_outage(self, exc: Exception, since: Optional[float]) -> float:
        """After stepping down for a catalog outage, pause before contending again (the epoch in flight is
        recovered by whoever leads next); re-raise ``exc`` if it is not an outage, or the catalog has been
        unreachable for ``CATALOG_OUTAGE_TIMEOUT_S``. Returns when the outage began."""
        now = time.monotonic()
        since = now if since is None else since
        if not is_catalog_outage(exc) or now - since > CATALOG_OUTAGE_TIMEOUT_S:
            raise exc
        log.warning("job %s: the catalog is unreachable (%s: %s); contending again in %.0f s", self.job,
                    type(exc).__name__, _first_line(exc), CATALOG_RETRY_S)
        self.stopping.wait(CATALOG_RETRY_S)
        return since


__all__ = ["CATALOG_OUTAGE_TIMEOUT_S", "CATALOG_RETRY_S", "EXIT_ZOOKEEPER_REBUILT", "Supervisor"]
