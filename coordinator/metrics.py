"""Prometheus metrics: the cluster status as gauges, read from ZooKeeper at scrape time, in base units.

    tidemark metrics --port 9464          # serve /metrics for Prometheus
    registry = status_registry(tm)         # or register the collector in your own process

Each scrape reads ``tm.status()`` (a few pipelined ZooKeeper batches), so the figures are
never staler than the scrape. Epochs are exported as Unix timestamps in seconds (an epoch
is a barrier time in milliseconds) and lags in seconds against the wall clock at the scrape.
A job is stale when it holds consistent reads back (see ``coordinator.status``): no live
leader and no finished bounded run, or a live leader lagging by several intervals with
nothing upstream to explain it.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from .status import FINISHED, LEADING


class StatusCollector(Collector):
    def __init__(self, tm) -> None:
        self.tm = tm

    def collect(self):
        status = self.tm.status()

        def job_gauge(name: str, documentation: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, documentation, labels=["job"])
        committed = job_gauge("tidemark_job_committed_epoch_timestamp_seconds",
                              "Epoch committed in every sink of the job, as a Unix timestamp")
        lag = job_gauge("tidemark_job_lag_seconds", "Wall clock minus the job's committed epoch")
        pending = job_gauge("tidemark_job_pending_barriers", "Agreed barriers after the job's committed epoch")
        term = job_gauge("tidemark_job_term", "Fencing term of the job's leadership")
        leading = job_gauge("tidemark_job_leader_live", "1 when the job has a live, unfenced leader")
        finished = job_gauge("tidemark_job_finished",
                             "1 when the job's last leader finished a bounded run and no leader runs it now")
        stale = job_gauge("tidemark_job_stale", "1 when the job holds back consistent reads")
        holds_back = job_gauge("tidemark_job_holds_back_seconds",
                               "For a stale job: how far it holds the consistent epoch back")
        for job in status.jobs:
            if job.committed_epoch is not None:
                committed.add_metric([job.name], job.committed_epoch / 1000)
            if job.lag_ms is not None:
                lag.add_metric([job.name], job.lag_ms / 1000)
            if job.pending_barriers is not None:
                pending.add_metric([job.name], job.pending_barriers)
            if job.term is not None:
                term.add_metric([job.name], job.term)
            leading.add_metric([job.name], 1 if job.leader_state == LEADING else 0)
            finished.add_metric([job.name], 1 if job.state == FINISHED else 0)
            stale.add_metric([job.name], 1 if job.stale else 0)
            if job.holds_back_ms is not None:
                holds_back.add_metric([job.name], job.holds_back_ms / 1000)
        yield from (committed, lag, pending, term, leading, finished, stale, holds_back)
        jobs = GaugeMetricFamily("tidemark_jobs", "Registered jobs")
        jobs.add_metric([], len(status.jobs))
        yield jobs
        if status.consistent_epoch is not None:
            yield GaugeMetricFamily("tidemark_consistent_epoch_timestamp_seconds",
                                    "Minimum committed epoch over all jobs, as a Unix timestamp",
                                    value=status.consistent_epoch / 1000)
            yield GaugeMetricFamily("tidemark_consistent_lag_seconds",
                                    "Wall clock minus the consistent epoch", value=status.consistent_lag_ms / 1000)
        if status.newest_barrier is not None:
            yield GaugeMetricFamily("tidemark_newest_barrier_timestamp_seconds",
                                    "Newest agreed barrier, as a Unix timestamp", value=status.newest_barrier / 1000)


def status_registry(tm) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(StatusCollector(tm))
    return registry
