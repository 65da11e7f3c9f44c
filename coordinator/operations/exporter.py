"""``tidemark exporter``: the topology-wide view for Prometheus, served at once whether ZooKeeper is up or not.

    tidemark exporter --port 9464 [--refresh 5] [--zk zk1:2181/tidemark]

A background thread connects (read-only: it creates no znode) and reads the cluster status
(``coordinator.protocol.status``: one or two pipelined ZooKeeper batches) every
``refresh_every`` seconds. A scrape never touches ZooKeeper: it serves the last good view from
memory, with lags measured against the wall clock at the scrape (``Exporter``). Every series is
in base units (seconds; epochs as Unix timestamps in seconds); jobs are labelled ``tidemark_job``
(``job`` is the scrape target's label). ``view_families`` makes the series per job, per table and
overall; ``docs/monitoring.md`` lists every one, the exporter's own included.

Failure behaviour: nothing here raises once started. An unreachable ZooKeeper (at start or
later), an expired session or corrupt znodes make refreshes fail (logged once per kind of
failure, counted in ``tidemark_exporter_refresh_failures_total``) and ``tidemark_up`` 0;
kazoo reconnects in the background and the next refresh after that brings the view back. A
ZooKeeper server found behind the session (its data rebuilt or restored: ``ZooKeeperRebuilt``)
cannot serve that session again: the exporter says so in one line, drops the session and
connects anew at the next refresh. ``close`` (SIGTERM) does not wait for an unreachable
ZooKeeper (``ZooKeeperSession.stop_waiting``).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Callable, Optional

from kazoo.client import KazooState
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from coordinator.errors import TidemarkError, ZooKeeperRebuilt
from coordinator.job.driver_metrics import JOB_LABEL, PIPELINE_LABEL
from coordinator.protocol.status import FINISHED, LEADING, PAUSED, RETIRED, Status, read_status
from coordinator.tidemark import Tidemark

log = logging.getLogger(__name__)


class Exporter(Collector):
    """The exporter's view of the deployment: a thread that reads the cluster status every ``refresh_every``
    seconds, and the Prometheus collector (in ``registry``) that serves the last good view from memory.

        exporter = Exporter(lambda: Tidemark.connect(hosts, read_only=True), refresh_every=5.0, max_age=20.0)
        exporter.start()                      # the background refresher
        MetricsServer(9464).attach(exporter.registry, healthy=exporter.alive)
        exporter.close()                      # on SIGTERM

    Znodes: none of its own; its read-only session reads what ``read_status`` reads.

    States: ``tidemark_up`` (``up``) is 1 only while the session is connected and the last refresh succeeded less
    than ``max_age`` seconds ago (default: three refreshes); otherwise it is 0 and the last view stays exported,
    with ``tidemark_exporter_view_age_seconds`` saying how old it is.

    Failure behaviour: nothing raises once started. A refresh that fails, whatever the reason, keeps the last
    view and counts in ``tidemark_exporter_refresh_failures_total``. On ``ZooKeeperRebuilt`` it closes the session
    and connects anew at the next refresh; a lost session is kazoo's to re-establish, in the background.
    """

    def __init__(self, connect: Callable[[], Tidemark], refresh_every: float = 5.0,
                 max_age: Optional[float] = None, clock: Callable[[], float] = time.time) -> None:
        """``clock``: the wall clock in Unix seconds that views are read and lags measured against (tests that
        simulate idle time pass their own)."""
        self.connect = connect
        self.clock = clock
        self.refresh_every = refresh_every
        self.max_age = max_age if max_age is not None else 3 * refresh_every
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self.tm: Optional[Tidemark] = None
        self._view: Optional[Status] = None
        self._view_at = 0.0          # time.monotonic() when the view was read
        self._last_ok = False        # did the last refresh succeed
        self._refresh_seconds: Optional[float] = None
        self._failures = 0
        self._last_error: Optional[str] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._refresh_forever, name="tidemark-exporter-refresh", daemon=True)

    # -- the background refresh -------------------------------------------------------------------

    def start(self) -> Exporter:
        """Start the background refresher, which refreshes at once and then every ``refresh_every`` seconds."""
        self._thread.start()
        return self

    def alive(self) -> bool:
        """The refresher runs (whatever ZooKeeper's state: that is ``tidemark_up``'s job)."""
        return self._thread.is_alive()

    def close(self) -> None:
        """Stop the refresher (waiting at most ``max_age`` for it) and close the session; a refresh in flight with
        ZooKeeper down ends at once (``ZooKeeperSession.stop_waiting``)."""
        self._stop.set()
        if self.tm is not None:
            self.tm.stop_waiting()  # a refresh in flight with ZooKeeper down ends now, not at its deadline
        self._thread.join(timeout=self.max_age)
        if self.tm is not None:
            self.tm.close()

    def _refresh_forever(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            self._stop.wait(self.refresh_every)

    def refresh(self) -> None:
        """One refresh: connect if needed, read the status; a failure keeps the last view."""
        started = time.monotonic()
        try:
            if self.tm is None:
                self.tm = self.connect()
            view = read_status(self.tm, clock=lambda: int(self.clock() * 1000))
        except Exception as exc:  # noqa: BLE001 - whatever failed, keep serving the last view with tidemark_up 0
            if isinstance(exc, ZooKeeperRebuilt) and self.tm is not None:
                log.warning("tidemark exporter: %s; connecting with a new session", exc.what)
                self.tm.close()
                self.tm = None
            self._last_ok = False
            self._failures += 1
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            if error != self._last_error and not isinstance(exc, ZooKeeperRebuilt):  # that one is said above
                log.warning("tidemark exporter: refresh failed (%s); serving the last view with tidemark_up 0",
                            error if isinstance(exc, TidemarkError) else repr(exc))
            self._last_error = error
            return
        finally:
            self._refresh_seconds = time.monotonic() - started
        if self._last_error is not None:
            log.warning("tidemark exporter: refresh works again")
        self._view, self._view_at, self._last_ok, self._last_error = view, time.monotonic(), True, None

    def up(self) -> bool:
        """``tidemark_up``: the session is connected and the last refresh succeeded within ``max_age`` seconds."""
        tm = self.tm
        return (tm is not None and tm.connection_state == KazooState.CONNECTED and self._last_ok
                and time.monotonic() - self._view_at <= self.max_age)

    # -- the scrape: memory only ------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        """The metric families of the last view, lags measured now: memory only (prometheus-client calls it at
        every scrape)."""
        yield _plain("tidemark_up", "1 when the exporter reads ZooKeeper and its view is fresh", 1 if self.up() else 0)
        failures = CounterMetricFamily("tidemark_exporter_refresh_failures", "Refreshes of the view that failed")
        failures.add_metric([], self._failures)
        yield failures
        if self._refresh_seconds is not None:
            yield _plain("tidemark_exporter_refresh_duration_seconds", "Duration of the last refresh of the view",
                         self._refresh_seconds)
        view = self._view
        if view is None:
            return
        yield _plain("tidemark_exporter_view_age_seconds", "Age of the exported view (grows while tidemark_up is 0)",
                     time.monotonic() - self._view_at)
        yield from view_families(view, self.clock())


def view_families(view: Status, now: float) -> Iterator[Metric]:
    """The status as metric families, lags measured at ``now`` (Unix seconds): per job, per table, then
    overall."""
    yield from _progress_families(view, now)
    yield from _state_families(view)
    yield from _holding_back_families(view)
    yield from _table_families(view, now)
    yield from _deployment_families(view, now)


def _job_gauge(name: str, documentation: str, *extra: str) -> GaugeMetricFamily:
    """A family with a sample per job, labelled ``tidemark_job`` (and ``extra``)."""
    return GaugeMetricFamily(name, documentation, labels=[JOB_LABEL, *extra])


def _progress_families(view: Status, now: float) -> Iterator[GaugeMetricFamily]:
    """Per job: its committed epoch and lag, its cadences and its consistent epoch."""
    committed = _job_gauge("tidemark_job_committed_epoch_timestamp_seconds",
                           "Epoch committed in every sink of the job, as a Unix timestamp")
    lag = _job_gauge("tidemark_job_lag_seconds", "Wall clock minus the job's committed epoch")
    cadence = _job_gauge("tidemark_job_cadence_seconds",
                         "The job's own cadence: its every= setting, or the barrier grid's interval")
    effective = _job_gauge("tidemark_job_effective_cadence_seconds",
                           "The cadence the job's epochs follow: the slowest upstream job's when slower than its own")
    follows = _job_gauge("tidemark_job_paced_by",
                         "1 for the upstream job whose slower cadence the job follows", "pacing_job")
    consistent = _job_gauge("tidemark_job_consistent_epoch_timestamp_seconds",
                            "Newest epoch every sink and managed source of the job holds, as a Unix timestamp")
    for job in view.jobs:
        name = [job.name]
        if (epoch := job.committed_epoch) is not None:
            committed.add_metric(name, epoch / 1000)
            lag.add_metric(name, max(0.0, now - epoch / 1000))
        if job.cadence_ms is not None:
            cadence.add_metric(name, job.cadence_ms / 1000)
        if job.effective_cadence_ms is not None:
            effective.add_metric(name, job.effective_cadence_ms / 1000)
        if job.cadence_from is not None:
            follows.add_metric([job.name, job.cadence_from], 1)
        if job.consistent_epoch is not None:
            consistent.add_metric(name, job.consistent_epoch / 1000)
    yield from (committed, lag, cadence, effective, follows, consistent)


def _state_families(view: Status) -> Iterator[GaugeMetricFamily]:
    """Per job: its term, whether a leader runs it, and whether it is finished, paused, retired or live."""
    term = _job_gauge("tidemark_job_term", "Fencing term of the job's leadership")
    leading = _job_gauge("tidemark_job_leader_live", "1 when the job has a live, unfenced leader")
    finished = _job_gauge("tidemark_job_finished",
                          "1 when the job's last leader finished a bounded run and no leader runs it now")
    paused = _job_gauge("tidemark_job_paused", "1 when an operator paused the job and no leader runs it now")
    retired = _job_gauge("tidemark_job_retired", "1 when an operator retired the job and no leader runs it now")
    live = _job_gauge("tidemark_job_live",
                      "1 when the job should run now: not finished, paused or retired (its tables count in the "
                      "consistent lag)")
    for job in view.jobs:
        name = [job.name]
        if job.term is not None:
            term.add_metric(name, job.term)
        leading.add_metric(name, 1 if job.leader_state == LEADING else 0)
        finished.add_metric(name, 1 if job.state == FINISHED else 0)
        paused.add_metric(name, 1 if job.state == PAUSED else 0)
        retired.add_metric(name, 1 if job.state == RETIRED else 0)
        live.add_metric(name, 0 if job.at_rest else 1)
    yield from (term, leading, finished, paused, retired, live)


def _holding_back_families(view: Status) -> Iterator[GaugeMetricFamily]:
    """Per job: whether and how far it holds the consistent epoch back, and the sources it waits for."""
    stale = _job_gauge("tidemark_job_stale", "1 when the job holds back its pipeline's consistent reads")
    holds_back = _job_gauge("tidemark_job_holds_back_seconds",
                            "For a stale job: how far it holds its pipeline's consistent epoch back")
    bounds = _job_gauge("tidemark_job_bounds_consistent_epoch",
                        "1 when the job is live and has the oldest committed epoch of its pipeline's live jobs: the "
                        "pipeline's consistent epoch cannot pass it until the job commits")
    blocked = _job_gauge("tidemark_job_blocked_by",
                         "1 per managed source that holds no epoch after the job's committed epoch",
                         "source", "source_job")
    jobs = {job.name: job for job in view.jobs}
    oldest: dict[str, Optional[int]] = {}  # per job: the oldest committed epoch of its pipeline's live jobs
    for pipeline in view.pipelines:
        live = [e for n in pipeline.jobs if not jobs[n].at_rest and (e := jobs[n].committed_epoch) is not None]
        oldest.update(dict.fromkeys(pipeline.jobs, min(live, default=None)))
    for job in view.jobs:
        name = [job.name]
        stale.add_metric(name, 1 if job.stale else 0)
        if job.holds_back_ms is not None:
            holds_back.add_metric(name, job.holds_back_ms / 1000)
        if (epoch := job.committed_epoch) is not None:
            bounds.add_metric(name, 1 if epoch == oldest.get(job.name) and not job.at_rest else 0)
        for blocker in job.waiting_for:
            blocked.add_metric([job.name, blocker.table, blocker.writer], 1)
    yield from (stale, holds_back, bounds, blocked)


def _table_families(view: Status, now: float) -> Iterator[GaugeMetricFamily]:
    """Per table (labelled with its writer job): its tidemark and lag."""
    table_epoch = GaugeMetricFamily("tidemark_table_committed_epoch_timestamp_seconds",
                                    "The table's tidemark (its committed epoch), as a Unix timestamp",
                                    labels=["table", JOB_LABEL])
    table_lag = GaugeMetricFamily("tidemark_table_lag_seconds", "Wall clock minus the table's committed epoch",
                                  labels=["table", JOB_LABEL])
    for job in view.jobs:
        for table, mark in sorted(job.tidemarks.items()):
            if mark is not None:
                table_epoch.add_metric([table, job.name], mark / 1000)
                table_lag.add_metric([table, job.name], max(0.0, now - mark / 1000))
    yield from (table_epoch, table_lag)


def _deployment_families(view: Status, now: float) -> Iterator[GaugeMetricFamily]:
    """Overall: the number of jobs, each job's pipeline, each pipeline's live consistent epoch and its lag, and the
    grid's interval in force."""
    yield _plain("tidemark_jobs", "Registered jobs", len(view.jobs))
    member = GaugeMetricFamily("tidemark_job_pipeline", "1 for the pipeline of each job (join on tidemark_job)",
                               labels=[JOB_LABEL, PIPELINE_LABEL])
    # The live consistent epoch: jobs at rest keep their tables readable at their last epoch, and must not
    # make their pipeline look ever staler (their tables' own lag is above).
    consistent = GaugeMetricFamily("tidemark_consistent_epoch_timestamp_seconds",
                                   "The pipeline's live consistent epoch (the newest epoch every table of its live "
                                   "jobs holds), as a Unix timestamp", labels=[PIPELINE_LABEL])
    lag = GaugeMetricFamily("tidemark_consistent_lag_seconds",
                            "Wall clock minus the pipeline's live consistent epoch: its freshness",
                            labels=[PIPELINE_LABEL])
    for pipeline in view.pipelines:
        for job in pipeline.jobs:
            member.add_metric([job, pipeline.name], 1)
        if (epoch := pipeline.live_consistent_epoch) is not None:
            consistent.add_metric([pipeline.name], epoch / 1000)
            lag.add_metric([pipeline.name], max(0.0, now - epoch / 1000))
    yield from (member, consistent, lag)
    if view.interval_ms is not None:
        yield _plain("tidemark_barrier_interval_seconds", "Interval of the barrier grid in force",
                     view.interval_ms / 1000)


def _plain(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
