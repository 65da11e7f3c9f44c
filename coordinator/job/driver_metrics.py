"""A driver's own Prometheus metrics: its epoch loop, leadership, ZooKeeper session, retries and lag
(docs/monitoring.md lists every series with its labels and meaning).

    writer = EpochWriter(tm, "counts", sources=[...], sinks=[...], metrics_port=9465)
    writer.run(step)                   # serves http://0.0.0.0:9465/metrics and /healthz while it runs
    writer.metrics.registry            # or expose the registry yourself (one per writer, never the global one)

The port comes from ``metrics_port`` or else ``TIDEMARK_METRICS_PORT`` (unset: nothing is
served, the registry still counts); ``TIDEMARK_METRICS_ADDRESS`` picks the address (default
``0.0.0.0``); writers of one process given the same port share it. ``/healthz`` answers 200
while a writer's loop runs (a standby waiting for leadership included) and 503 once ``run``
returned or its thread died.

Every series carries the label ``tidemark_job`` (not ``job``, which Prometheus gives the
scrape target), and the consistent epoch's the job's pipeline, ``tidemark_pipeline``. Base units: seconds, and
epochs as Unix timestamps in seconds. ``DriverMetrics`` holds the
histogram of the loop's phases (``PHASES``: disjoint, so they add up to the loop's time) and the counters the
loop's hooks bump; ``_DriverState`` computes the gauges at scrape time from memory: leadership, term, the
session's state, retries and clock skew, and while leading the committed and consistent epochs and their lags.
The writer calls the hooks; the metrics read it only through the ``DriverView`` it gives them.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Optional, Protocol

from kazoo.client import KazooState
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from coordinator.job.metrics_server import MetricsServer
from coordinator.protocol.held_epochs import newest_common_epoch
from coordinator.protocol.leadership import LeaderState
from coordinator.protocol.pipelines import Pipelines
from coordinator.protocol.topology import last_read_topology
from coordinator.settings import Settings

if TYPE_CHECKING:
    from coordinator.records import TableTidemark
    from coordinator.zookeeper.session import ZooKeeperSession

log = logging.getLogger(__name__)

JOB_LABEL = "tidemark_job"
PIPELINE_LABEL = "tidemark_pipeline"
PHASES = ("wait", "compute", "stage", "precommit", "publish", "commit")
# An idle commit takes milliseconds, a Spark epoch can take many minutes: the buckets cover both.
PHASE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
                 1800.0)
CONNECTION_STATES = (KazooState.CONNECTED, KazooState.SUSPENDED, KazooState.LOST)
# What the coordinator retries (client, barriers, leadership, registry modules): exported from 0 so that
# rate() sees the first retry.
RETRIED_OPERATIONS = ("zookeeper", "barriers", "leader_election", "registration")


class DriverView(Protocol):
    """What the metrics read of their driver at scrape time, from its memory only (``EpochWriter`` gives them one):
    its job's name and ZooKeeper session, and while it leads, its term, committed epoch and tidemarks."""

    @property
    def name(self) -> str: ...

    @property
    def tm(self) -> ZooKeeperSession: ...

    def leading_term(self) -> Optional[int]: ...  # while it leads right now (LeaderState.LEADING), else None
    def committed_epoch(self) -> Optional[int]: ...  # the job's last committed epoch while it holds a term
    def tidemarks_in_memory(self) -> Optional[dict[str, Optional[TableTidemark]]]: ...  # EpochWriter's


class DriverMetrics:
    """The metrics of one ``EpochWriter``, in a registry of its own (several writers may share a process).

    :param driver: what the gauges read at scrape time (``DriverView``).
    :param port: where ``serve`` serves them; None: ``TIDEMARK_METRICS_PORT``, and not served when that is unset.
    :param address: the address it binds; None: ``TIDEMARK_METRICS_ADDRESS``, else ``0.0.0.0``.

    Failure behaviour: instrumentation never raises into the epoch loop and a scrape never waits on ZooKeeper:
    the consistent epoch is read from the writer's memory (its sources' tidemarks as the loop's own watches keep
    them, its sinks' as this leader committed them), so the metrics cost no ZooKeeper request at all and a driver
    costs the same whatever the size of the deployment. Only ``serve`` raises, ``ConfigurationError``, for a port
    it cannot bind.
    """

    def __init__(self, driver: DriverView, port: Optional[int] = None, address: Optional[str] = None) -> None:
        self.driver = driver
        self.job = driver.name
        settings = Settings.from_env()  # TIDEMARK_METRICS_PORT / _ADDRESS, unless given
        self.port = port if port is not None else settings.metrics_port
        self.address = address or settings.metrics_address
        self.registry = CollectorRegistry()
        job = [JOB_LABEL]
        phases = Histogram("tidemark_driver_epoch_phase_duration_seconds",
                           "Time spent in each phase of the epoch loop (phases are disjoint)",
                           job + ["phase"], buckets=PHASE_BUCKETS, registry=self.registry)
        self._phases = {phase: phases.labels(self.job, phase) for phase in PHASES}

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, job, registry=self.registry)
        self.committed = counter("tidemark_driver_epochs_committed", "Epochs this replica committed").labels(self.job)
        self.idle = counter("tidemark_driver_epochs_idle",
                            "Epochs committed without computing: no source changed").labels(self.job)
        self.recomputed = counter("tidemark_driver_epochs_recomputed",
                                  "Epochs committed after recomputing them from their recorded inputs "
                                  "(left started or aborted by a failure)").labels(self.job)
        self.rolled_forward = counter("tidemark_driver_epochs_rolled_forward",
                                      "Precommitted epochs this replica published and committed after "
                                      "taking over").labels(self.job)
        self.fencings = counter("tidemark_driver_fencings",
                                "Times this replica's leadership was taken away (fenced by a newer term, or "
                                "its session expired)").labels(self.job)
        changes = Counter("tidemark_driver_leadership_changes", "Times this replica became leader or stepped down",
                          job + ["change"], registry=self.registry)
        self.acquired, self.stepped_down = changes.labels(self.job, "acquired"), changes.labels(self.job,
                                                                                                 "stepped_down")
        self.registry.register(_DriverState(self))
        self._nested = threading.local()
        self._server: Optional[MetricsServer] = None
        self._loop: Optional[threading.Thread] = None

    # -- serving --------------------------------------------------------------------------------

    def serve(self) -> None:
        """Serve ``/metrics`` and ``/healthz`` if a port is configured (once); the calling thread is the loop.

        Writers of one process configured with the same port share its server.
        """
        self._loop = threading.current_thread()
        if self.port is not None and self._server is None:
            self._server = MetricsServer.shared(self.port, self.address)
            self._server.attach(self.registry, healthy=self.healthy)
            self.port = self._server.port
            log.info("job %s: serving metrics on http://%s:%s/metrics", self.job, self.address, self.port)

    def healthy(self) -> bool:
        """The loop runs: its thread is alive and ``run`` has not returned."""
        return self._loop is not None and self._loop.is_alive()

    def loop_ended(self) -> None:
        """Say the writer's loop returned: ``healthy`` is False from now on (until ``serve`` again), so ``/healthz``
        answers 503 unless another writer sharing the port still runs."""
        self._loop = None

    def close(self) -> None:
        """Stop serving (the registry keeps counting)."""
        if self._server is not None:
            self._server.detach(self.registry)
            self._server = None

    # -- hooks the loop calls -------------------------------------------------------------------

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time one phase; time spent in phases nested inside it (staging inside compute) is not counted twice."""
        stack = self._nested.__dict__.setdefault("stack", [])
        stack.append(0.0)
        started = time.perf_counter()
        try:
            yield
        finally:
            elapsed = time.perf_counter() - started
            nested = stack.pop()
            if stack:
                stack[-1] += elapsed
            self._phases[name].observe(max(0.0, elapsed - nested))

    def epoch_committed(self, *, idle: bool = False, recomputed: bool = False, rolled_forward: bool = False) -> None:
        """Count one epoch this replica committed, and of which kind it was.

        :param idle: committed without computing (no source changed).
        :param recomputed: recomputed from its recorded inputs (left started or aborted by a failure).
        :param rolled_forward: a precommitted epoch this replica published and committed after taking over.
        """
        self.committed.inc()
        for happened, counter in ((idle, self.idle), (recomputed, self.recomputed),
                                  (rolled_forward, self.rolled_forward)):
            if happened:
                counter.inc()

    def became_leader(self) -> None:
        """Count one leadership this replica acquired (``change="acquired"``)."""
        self.acquired.inc()

    def stepping_down(self, state: LeaderState) -> None:
        """``state``: the leadership's state when it ends (FENCED or LOST: it was taken away)."""
        self.stepped_down.inc()
        if state in (LeaderState.FENCED, LeaderState.LOST):
            self.fencings.inc()

    def pipeline(self) -> str:
        """The job's pipeline, by the job graph its session last read (no request; the job's own name until one is
        read: a pipeline is named after its first job)."""
        topology = last_read_topology(self.driver.tm)
        found = Pipelines(topology).of_job(self.job) if topology is not None else None
        return found.name if found is not None else self.job

    def consistent_epoch(self) -> Optional[int]:
        """The newest epoch the job's managed sources and its sinks all hold, from the writer's memory (None
        until every one is known)."""
        marks = self.driver.tidemarks_in_memory()
        return None if marks is None else newest_common_epoch(marks.values())


class _DriverState(Collector):
    """The gauges read at scrape time from the driver's and its session's memory."""

    def __init__(self, metrics: DriverMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        metrics, driver = self.metrics, self.metrics.driver
        job, labels = metrics.job, [JOB_LABEL]
        term = driver.leading_term()
        yield _gauge("tidemark_driver_leader", "1 while this replica leads the job", job, 0 if term is None else 1)
        state = driver.tm.connection_state
        connection = GaugeMetricFamily("tidemark_driver_zookeeper_connection_state",
                                       "1 for the ZooKeeper session's current state", labels=labels + ["state"])
        for known in CONNECTION_STATES:
            connection.add_metric([job, known.lower()], 1 if state == known else 0)
        yield connection
        changes = CounterMetricFamily("tidemark_driver_zookeeper_connection_changes",
                                      "Times the ZooKeeper connection entered each state", labels=labels + ["state"])
        counts = driver.tm.connection_changes()
        for known in CONNECTION_STATES:
            changes.add_metric([job, known.lower()], counts.get(known, 0))
        yield changes
        retries = CounterMetricFamily("tidemark_driver_retries",
                                      "Retried operations of this driver's ZooKeeper session, per operation",
                                      labels=labels + ["operation"])
        counts = {operation: 0 for operation in RETRIED_OPERATIONS} | driver.tm.retry_counts()
        for operation, count in sorted(counts.items()):
            retries.add_metric([job, operation], count)
        yield retries
        skew = driver.tm.server_clock.skew_ms()
        if skew is not None:
            yield _gauge("tidemark_driver_clock_skew_seconds",
                         "This host's wall clock minus ZooKeeper's (positive: ahead), from its writes' stamps", job,
                         skew / 1000)
        if term is None:
            return
        now = driver.tm.server_clock.now_ms() / 1000  # ZooKeeper's clock: a lag is true whatever this host's says
        yield _gauge("tidemark_driver_term", "Fencing term this replica leads the job with", job, term)
        committed = driver.committed_epoch()  # None while stepping down or taking over
        if committed is not None:
            yield _gauge("tidemark_driver_committed_epoch_timestamp_seconds",
                         "The job's committed epoch, as a Unix timestamp", job, committed / 1000)
            yield _gauge("tidemark_driver_lag_seconds", "Local lag: ZooKeeper's clock minus the job's committed epoch",
                         job, max(0.0, now - committed / 1000))
        consistent = metrics.consistent_epoch()
        if consistent is not None:
            pipeline = {PIPELINE_LABEL: metrics.pipeline()}
            yield _gauge("tidemark_driver_consistent_epoch_timestamp_seconds",
                         "The job's consistent epoch (the newest its sinks and managed sources all hold), as a Unix "
                         "timestamp", job, consistent / 1000, pipeline)
            yield _gauge("tidemark_driver_consistent_lag_seconds",
                         "The job's consistent lag: ZooKeeper's clock minus its consistent epoch", job,
                         max(0.0, now - consistent / 1000), pipeline)


def _gauge(name: str, documentation: str, job: str, value: float,
           extra: Optional[dict[str, str]] = None) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation, labels=[JOB_LABEL, *(extra or {})])
    family.add_metric([job, *(extra or {}).values()], value)
    return family
