"""Prometheus metrics: the cluster status as gauges, read from ZooKeeper at scrape time.

    tidemark metrics --port 9464          # serve /metrics for Prometheus
    registry = status_registry(tm)         # or register the collector in your own process

Each scrape reads ``tm.status()`` (a few pipelined ZooKeeper batches), so the figures are
never staler than the scrape. A job shows as stale when it has no live leader or its
committed epoch lags the newest barrier by more than three intervals.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class StatusCollector(Collector):
    def __init__(self, tm) -> None:
        self.tm = tm

    def collect(self):
        status = self.tm.status()
        committed = GaugeMetricFamily("tidemark_job_committed_epoch_ms",
                                      "Highest epoch committed in every sink of the job", labels=["job"])
        lag = GaugeMetricFamily("tidemark_job_lag_ms", "Newest barrier minus the job's committed epoch",
                                labels=["job"])
        term = GaugeMetricFamily("tidemark_job_term", "Fencing term of the job's leadership", labels=["job"])
        leading = GaugeMetricFamily("tidemark_job_leader_live", "1 when the job has a live, unfenced leader",
                                    labels=["job"])
        stale = GaugeMetricFamily("tidemark_job_stale", "1 when the job holds back consistent reads",
                                  labels=["job"])
        for job in status.jobs:
            if job.committed_epoch is not None:
                committed.add_metric([job.name], job.committed_epoch)
            if status.lag_ms(job) is not None:
                lag.add_metric([job.name], status.lag_ms(job))
            if job.term is not None:
                term.add_metric([job.name], job.term)
            leading.add_metric([job.name], 1 if job.leader_state == "leading" else 0)
            stale.add_metric([job.name], 1 if status.is_stale(job) else 0)
        yield from (committed, lag, term, leading, stale)
        jobs = GaugeMetricFamily("tidemark_jobs", "Registered jobs")
        jobs.add_metric([], len(status.jobs))
        yield jobs
        if status.consistent_epoch is not None:
            yield GaugeMetricFamily("tidemark_consistent_epoch_ms", "Minimum committed epoch over all jobs",
                                    value=status.consistent_epoch)
        if status.newest_barrier is not None:
            yield GaugeMetricFamily("tidemark_newest_barrier_ms", "Newest agreed barrier",
                                    value=status.newest_barrier)


def status_registry(tm) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(StatusCollector(tm))
    return registry
