"""Status that says what each job waits for, staleness by each job's effective cadence, and resolution below
first epochs.

Real ZooKeeper, a real SQLite catalog and real jobs: ``EpochWriter`` with pyiceberg (no Spark).
"""
from __future__ import annotations

import json
import time
from typing import Optional

import pyarrow as pa
import pytest

from coordinator import VersionNotFound
from coordinator.formatting import fmt_time
from coordinator.history.resolve import Resolver, read_arrow
from coordinator.job.writer import EpochContext, EpochWriter
from coordinator.operations.cli import main as cli_main
from coordinator.operations.exporter import view_families
from coordinator.protocol.status import STALE_SLACK_MS
from coordinator.records import now_ms
from tests.helpers.background import InBackground
from tests.helpers.lake import SCHEMA, create_table
from tests.helpers.present import present
from tests.helpers.wait import wait_for

INTERVAL = 200


def rows(epoch: int, n: int = 1) -> pa.Table:
    return pa.table({"epoch": pa.array([epoch] * n, pa.int64()), "row": pa.array(range(n), pa.int64())},
                    schema=SCHEMA)


@pytest.fixture
def lake(catalog_settings, namespace):
    """Create tables in this test's namespace; returns their ``lake.<ns>.<name>`` names."""
    catalog = catalog_settings.load()

    def make(*names: str) -> list[str]:
        for name in names:
            create_table(catalog, f"{namespace}.{name}")
        return [f"{catalog_settings.name}.{namespace}.{name}" for name in names]
    make.catalog = catalog  # type: ignore[attr-defined]  # the tests reach the catalog through the fixture
    return make


def writer(tm, catalog_settings, name: str, sources: list[str], sinks: list[str], every=None) -> EpochWriter:
    return EpochWriter(tm, name, sources=sources, sinks=sinks, catalog=catalog_settings, interval_ms=INTERVAL,
                       every=every, grace_ms=0, log_every=1.0)


def append_epoch(sink: str, stop_after: Optional[EpochWriter] = None):
    def step(ctx: EpochContext) -> None:
        ctx.append(sink, rows(ctx.epoch))
        if stop_after is not None:
            stop_after.stop()  # commit this epoch, then return without finishing a bounded run
    return step


def cli_status(zk_connect: str, capsys, *extra: str) -> str:
    capsys.readouterr()
    assert cli_main(["--zk", zk_connect, "status", *extra]) == 0
    return capsys.readouterr().out


def test_lag_is_wall_clock_seconds_and_a_finished_bounded_run_is_not_stale(tm, connect, catalog_settings, lake,
                                                                          zk_connect, capsys):
    done_table, quit_table = lake("done", "quit")
    done = writer(tm, catalog_settings, "done", [], [done_table])
    epochs = done.run(append_epoch(done_table), max_epochs=2, stop_on_sigterm=False)
    assert len(epochs) == 2
    quitter = writer(connect(), catalog_settings, "quit", [], [quit_table])
    quit_epochs = quitter.run(append_epoch(quit_table, stop_after=quitter), stop_on_sigterm=False)
    assert len(quit_epochs) == 1  # stopped, not a bounded run: no finished marker

    before = now_ms()
    status = tm.status()
    assert before <= status.read_ms <= now_ms()
    job = status.job("done")
    assert job.committed_epoch == epochs[-1]
    assert job.lag_ms == status.read_ms - epochs[-1] and job.lag_seconds == round(job.lag_ms / 1000, 3)
    assert job.state == "finished" and job.finished.epoch == epochs[-1] and not job.stale
    assert status.interval_ms == INTERVAL and job.cadence_ms == job.effective_cadence_ms == INTERVAL
    assert job.stale_after_ms == 3 * INTERVAL + STALE_SLACK_MS  # grace 0

    # Long after its last epoch, the finished job is still not stale; the stopped one is.
    threshold_ms = 3 * INTERVAL + STALE_SLACK_MS
    status = wait_for(lambda: (s := tm.status()).job("done").lag_ms > threshold_ms and s, "the lag to grow")
    done_status, quit_status = status.job("done"), status.job("quit")
    assert done_status.state == "finished" and not done_status.stale
    assert quit_status.state == "no leader" and quit_status.stale and "no live leader" in quit_status.stale_reason
    assert quit_status.holds_back_ms is not None and quit_status.holds_back_ms >= 0
    # quit's one epoch came after done's last (each job's first epoch is after it opened): the two tables hold
    # no epoch in common, so no consistent version spans them; each job's own tables have one.
    assert quit_epochs[0] > epochs[-1] and status.consistent_epoch is None and status.consistent_lag_ms is None
    assert (done_status.consistent_epoch, quit_status.consistent_epoch) == (epochs[-1], quit_epochs[0])

    report = json.loads(cli_status(zk_connect, capsys, "--json"))
    jobs = {j["name"]: j for j in report["jobs"]}
    assert jobs["done"]["state"] == "finished" and jobs["done"]["stale"] is False
    assert isinstance(jobs["done"]["lag_seconds"], float) and jobs["done"]["lag_seconds"] > threshold_ms / 1000
    assert jobs["done"]["finished"]["epoch"] == epochs[-1]
    assert jobs["quit"]["stale"] is True and report["stale_jobs"] == ["quit"]
    assert report["consistent_epoch"] is None and report["interval_ms"] == INTERVAL

    # No consistent epoch spans both tables; the live job's tables (quit's: done is at rest) have one.
    assert status.live_consistent_epoch == quit_epochs[0]
    # Each job is a pipeline of its own: each has its own consistent epoch, and the stale one holds back only its own.
    assert [(p["name"], p["consistent_epoch"], p["stale_jobs"]) for p in report["pipelines"]] == [
        ("done", epochs[-1], []), ("quit", quit_epochs[0], ["quit"])]
    text = cli_status(zk_connect, capsys)
    lines = text.splitlines()
    assert lines[0] == f"grid: {INTERVAL} ms   pipelines: 2"
    assert lines[1].startswith(f"pipeline done (1 job): consistent epoch {epochs[-1]} (") and "held" not in lines[1]
    quit_headline = next(line for line in lines if line.startswith("pipeline quit"))
    assert quit_headline.startswith(f"pipeline quit (1 job): consistent epoch {quit_epochs[0]} (")
    assert quit_headline.endswith("   held back by quit")
    done_line = next(line for line in text.splitlines() if line.startswith("done:"))
    assert f"finished at epoch {epochs[-1]}" in done_line and "STALE" not in done_line
    assert " s" in done_line.split("lag ", 1)[1]
    quit_line = next(line for line in text.splitlines() if line.startswith("quit:"))
    assert "STALE: no live leader" in quit_line and "holds its pipeline's consistent epoch back" in quit_line

    samples = {(s.name, s.labels.get("tidemark_job")): s.value for family in view_families(tm.status(), time.time())
               for s in family.samples}
    assert samples[("tidemark_job_committed_epoch_timestamp_seconds", "done")] == epochs[-1] / 1000
    assert samples[("tidemark_job_finished", "done")] == 1 and samples[("tidemark_job_finished", "quit")] == 0
    assert samples[("tidemark_job_stale", "done")] == 0 and samples[("tidemark_job_stale", "quit")] == 1
    assert samples[("tidemark_job_lag_seconds", "done")] > threshold_ms / 1000
    # The exported consistent epoch is each pipeline's live one: quit's tables (stale, but live: it should run); done
    # is at rest, so its pipeline has none.
    by_pipeline = {(s.name, s.labels.get("tidemark_pipeline")): s.value
                   for family in view_families(tm.status(), time.time()) for s in family.samples}
    assert by_pipeline[("tidemark_consistent_epoch_timestamp_seconds", "quit")] == quit_epochs[0] / 1000
    assert ("tidemark_consistent_epoch_timestamp_seconds", "done") not in by_pipeline
    assert by_pipeline[("tidemark_job_pipeline", "done")] == by_pipeline[("tidemark_job_pipeline", "quit")] == 1
    assert samples[("tidemark_job_live", "done")] == 0 and samples[("tidemark_job_live", "quit")] == 1
    assert samples[("tidemark_job_consistent_epoch_timestamp_seconds", "done")] == epochs[-1] / 1000

    # A leader starting again removes the finished marker.
    again = writer(connect(), catalog_settings, "done", [], [done_table])
    again.open()
    try:
        assert tm.status().job("done").state == "leading" and tm.status().job("done").finished is None
    finally:
        again.close()


def test_a_derived_job_says_which_source_holds_it_back_and_that_its_writer_has_no_live_leader(
        tm, connect, catalog_settings, lake, zk_connect, capsys):
    up_table, down_table = lake("up", "down")
    tm.register_job("down", sources=[up_table], sinks=[down_table])  # the pipeline first: down never reads up by time
    upstream = InBackground(writer(connect(), catalog_settings, "up", [], [up_table]), append_epoch(up_table))
    down_writer = writer(connect(), catalog_settings, "down", [up_table], [down_table])
    running = [InBackground(down_writer, lambda ctx: ctx.append(down_table, ctx.changes(up_table)))]
    try:
        wait_for(lambda: down_writer.committed, "the derived job's first epoch")
        upstream.stop()  # then no live leader
        first = tm.tidemarks([up_table])[up_table].epoch
        wait_for(lambda: down_writer.committed[-1:] == [first] and down_writer.waiting is not None
                 and f"source {up_table} is at epoch {first}" in down_writer.waiting.reason,
                 "the derived job to wait for its upstream")
        status = tm.status()
        down = status.job("down")
        assert down.state == "leading" and down.committed_epoch == first
        assert (down.cadence_ms, down.effective_cadence_ms, down.cadence_from) == (INTERVAL, INTERVAL, None)
        [blocker] = down.waiting_for
        assert (blocker.table, blocker.epoch, blocker.writer, blocker.writer_live) == (up_table, first, "up", False)
        line = down.reasons()[0]
        assert line.startswith(f"waiting for {up_table} (at {fmt_time(first)})")
        assert line.endswith("written by job up, which has no live leader")
        assert not down.stale, "the derived job is held back by its upstream, not stale itself"
        up_status = status.job("up")
        assert up_status.stale and up_status.state == "no leader" and up_status.holds_back_ms > 0
        assert status.consistent_epoch == first == down.consistent_epoch
        # Long past its staleness threshold, the derived job is still only waiting: its source is what lags.
        status = wait_for(lambda: (s := tm.status()).job("down").lag_ms > 2 * s.job("down").stale_after_ms and s,
                          "the derived job's lag to pass twice its staleness threshold")
        down = status.job("down")
        assert not down.stale and down.waiting_for == (blocker,) and down.waiting is None
        assert status.job("up").stale

        text = cli_status(zk_connect, capsys)
        assert f"    waiting for {up_table} (at {fmt_time(first)})" in text
        assert "written by job up, which has no live leader" in text
        down_line = next(line for line in text.splitlines() if line.startswith("down:"))
        assert down_line.startswith("down: term 1, leading") and "STALE" not in down_line
        assert down_line.endswith(f"cadence {INTERVAL}ms")
        assert "lag " in down_line and down_line.split("lag ", 1)[1].split(",")[0].endswith(" s")
        up_line = next(line for line in text.splitlines() if line.startswith("up:"))
        assert "STALE: no live leader" in up_line
        report = json.loads(cli_status(zk_connect, capsys, "--json"))
        down_json = next(j for j in report["jobs"] if j["name"] == "down")
        assert down_json["waiting_for"] == [{"table": up_table, "epoch": first, "writer": "up",
                                             "writer_state": "no leader", "writer_live": False,
                                             "writer_finished_epoch": None}]

        # The upstream runs again, as a bounded run of one epoch: then it has finished, and says so.
        rerun = writer(connect(), catalog_settings, "up", [], [up_table])
        [second] = rerun.run(append_epoch(up_table), max_epochs=1, stop_on_sigterm=False)
        wait_for(lambda: down_writer.committed[-1:] == [second] and down_writer.waiting is not None
                 and f"source {up_table} is at epoch {second}" in down_writer.waiting.reason,
                 "the derived job to catch up with the finished upstream")
        down = tm.status().job("down")
        [blocker] = down.waiting_for
        assert blocker.epoch == second and down.committed_epoch == second
        assert blocker.writer_state == "finished" and blocker.writer_finished_epoch == second
        assert f"which has no live leader (it finished a bounded run at {second}" in down.reasons()[0]
        assert not tm.status().job("up").stale
    finally:
        for job in running:
            job.stop()


def test_a_batch_job_is_stale_only_after_three_of_its_own_cadences_and_its_downstream_follows_its_cadence(
        tm, connect, catalog_settings, lake, zk_connect, capsys):
    """A leading job with every=1s on the 200 ms grid, and a job downstream of it with no cadence of its own."""
    batch_table, report_table = lake("batch", "report")
    tm.register_job("batch", sources=[], sinks=[batch_table])
    report = writer(connect(), catalog_settings, "report", [batch_table], [report_table])
    batch = writer(connect(), catalog_settings, "batch", [], [batch_table], every="1s")
    report.open(leader_timeout=30)
    batch.open(leader_timeout=30)
    try:
        epoch = present(batch.next_barrier())  # the first second after it opened that the clock passed
        assert epoch % 1000 == 0
        batch.process(epoch, append_epoch(batch_table), inputs=batch.inputs_for(epoch))
        assert report.next_barrier() == epoch  # the newest epoch its source holds
        report.process(epoch, lambda ctx: ctx.append(report_table, ctx.changes(batch_table)),
                       inputs=report.inputs_for(epoch))

        # Lagging more than 3 grid intervals (plus slack) but less than 3 of its own cadences: on time.
        grid_threshold = 3 * INTERVAL + STALE_SLACK_MS
        cadence_threshold = 3 * 1000 + STALE_SLACK_MS
        status = wait_for(lambda: (s := tm.status()).job("batch").lag_ms > grid_threshold and s,
                          "the batch job's lag to pass 3 grid intervals")
        job, downstream = status.job("batch"), status.job("report")
        assert job.lag_ms < cadence_threshold, "the machine was too slow to look in time"
        assert job.state == "leading" and not job.stale and job.stale_after_ms == cadence_threshold
        assert (job.cadence_ms, job.effective_cadence_ms, job.cadence_from) == (1000, 1000, None)
        assert job.pacing.every_ms == 1000 and job.describe_cadence() == "cadence 1s"
        # The job downstream follows the batch job's cadence, and is judged by it.
        assert (downstream.cadence_ms, downstream.effective_cadence_ms) == (INTERVAL, 1000)
        assert downstream.cadence_from == "batch" and downstream.stale_after_ms == cadence_threshold
        assert not downstream.stale and downstream.committed_epoch == epoch
        assert [b.table for b in downstream.waiting_for] == [batch_table]
        assert downstream.waiting_for[0].writer_live
        assert status.consistent_epoch == epoch == downstream.consistent_epoch

        text = cli_status(zk_connect, capsys)
        batch_line = next(line for line in text.splitlines() if line.startswith("batch:"))
        assert batch_line.endswith("cadence 1s") and "STALE" not in batch_line
        report_line = next(line for line in text.splitlines() if line.startswith("report:"))
        assert report_line.endswith(f"cadence {INTERVAL}ms, follows the cadence of batch (1s)")
        jobs = {j["name"]: j for j in json.loads(cli_status(zk_connect, capsys, "--json"))["jobs"]}
        assert (jobs["report"]["cadence_ms"], jobs["report"]["effective_cadence_ms"],
                jobs["report"]["cadence_from"]) == (INTERVAL, 1000, "batch")
        assert jobs["batch"]["stale"] is False and jobs["batch"]["stale_after_seconds"] == cadence_threshold / 1000
        samples = {(s.name, *sorted(s.labels.items())): s.value for family in view_families(status, time.time())
                   for s in family.samples}
        assert samples[("tidemark_job_cadence_seconds", ("tidemark_job", "batch"))] == 1.0
        assert samples[("tidemark_job_cadence_seconds", ("tidemark_job", "report"))] == INTERVAL / 1000
        assert samples[("tidemark_job_effective_cadence_seconds", ("tidemark_job", "report"))] == 1.0
        assert samples[("tidemark_job_paced_by", ("pacing_job", "batch"), ("tidemark_job", "report"))] == 1
        assert not any(key[0] == "tidemark_job_paced_by" and ("tidemark_job", "batch") in key
                       for key in samples)
        assert samples[("tidemark_job_stale", ("tidemark_job", "batch"))] == 0

        # Past 3 of its cadences with an epoch available to it, the batch job is stale; the job downstream
        # still only waits for it.
        status = wait_for(lambda: (s := tm.status()).job("batch").lag_ms > cadence_threshold and s,
                          "the batch job's lag to pass 3 of its cadences")
        job, downstream = status.job("batch"), status.job("report")
        assert job.stale and job.stale_reason.startswith("lags ")
        assert job.stale_reason.endswith("more than 3 of its cadence (1s)")
        assert not downstream.stale and [b.writer for b in downstream.waiting_for] == ["batch"]
    finally:
        batch.close()
        report.close()


def test_a_job_catching_up_after_its_upstream_is_not_stale_until_it_dawdles(tm, connect, catalog_settings, lake):
    """Upstream back after a pause commits one epoch (coalescing): the job downstream lags by the pause but only
    just got something to take; it is stale once that epoch has been waiting for it longer than its threshold."""
    up_table, down_table = lake("up", "down")
    tm.register_job("down", sources=[up_table], sinks=[down_table])
    down = writer(connect(), catalog_settings, "down", [up_table], [down_table])
    up = writer(connect(), catalog_settings, "up", [], [up_table])
    down.open(leader_timeout=30)
    up.open(leader_timeout=30)
    try:
        first = present(up.next_barrier())
        up.process(first, append_epoch(up_table), inputs=up.inputs_for(first))
        assert down.next_barrier() == first
        down.process(first, lambda ctx: ctx.append(down_table, ctx.changes(up_table)), inputs=down.inputs_for(first))
        threshold = 3 * INTERVAL + STALE_SLACK_MS
        wait_for(lambda: now_ms() - first > threshold + INTERVAL, "both jobs to lag past their threshold")
        status = tm.status()
        assert status.job("up").stale and not status.job("down").stale  # up paused: it is the one to blame

        second = present(up.next_barrier())  # one epoch covers the pause
        up.process(second, append_epoch(up_table), inputs=up.inputs_for(second))
        status = tm.status()
        job = status.job("down")
        assert job.lag_ms > threshold and job.committed_epoch == first and job.waiting_for == ()
        age = status.read_ms - present(present(tm.tidemarks([up_table])[up_table]).committed_ms)
        assert age <= threshold, "the machine was too slow to look in time"
        assert not job.stale, job
        assert job.waiting is not None and job.waiting.startswith(f"catching up: {up_table} committed its "
                                                                  f"first epoch after {fmt_time(first)} only ")
        assert not status.job("up").stale

        status = wait_for(lambda: (s := tm.status()).job("down").stale and s, "the waiting epoch to go stale")
        job = status.job("down")
        assert job.waiting is None and job.stale_reason.startswith("lags ")
        assert now_ms() - present(tm.tidemarks([up_table])[up_table]).committed_ms > threshold
    finally:
        up.close()
        down.close()


def test_resolution_refuses_epochs_below_a_tables_first_epoch(tm, catalog_settings, lake):
    a, b = lake("a", "b")
    a_epochs = writer(tm, catalog_settings, "a", [], [a]).run(append_epoch(a), max_epochs=3, stop_on_sigterm=False)
    # B's writer starts later, once the clock has passed A's last barrier: its first epoch is above A's tidemark.
    wait_for(lambda: now_ms() >= a_epochs[-1] + INTERVAL, "the clock to pass A's last barrier")
    [b_first] = writer(tm, catalog_settings, "b", [], [b]).run(lambda ctx: None, max_epochs=1,  # writes nothing
                                                               stop_on_sigterm=False)
    assert b_first > a_epochs[-1]
    catalog = lake.catalog
    resolvers = {"zookeeper": Resolver(catalog, catalog_settings, tm),
                 "zookeeper cache": Resolver(catalog, catalog_settings, tm, tm.tidemark_cache()),
                 "iceberg only": Resolver(catalog, catalog_settings, None)}
    for how, resolver in resolvers.items():
        with pytest.raises(VersionNotFound, match=rf"{b} \(first epoch {b_first}\)") as refused:
            resolver.resolve([a, b])
        assert f"{a} at {a_epochs[-1]}" in str(refused.value), how
        with pytest.raises(VersionNotFound, match=rf"{b} \(first epoch {b_first}\)"):
            resolver.resolve([a, b], as_of=a_epochs[1])
        with pytest.raises(VersionNotFound, match=rf"before the first epoch of {a} \(first epoch {a_epochs[0]}\)"):
            resolver.resolve([a], as_of=a_epochs[0] - INTERVAL)  # before any history
        with pytest.raises(VersionNotFound, match=rf"{b} \(first epoch {b_first}\)"):
            resolver.resolve([b], as_of=a_epochs[-1])
    versions = {how: (r.resolve([a]), r.resolve([b]), r.resolve([a], as_of=a_epochs[1]))
                for how, r in resolvers.items()}
    assert all(v == versions["zookeeper"] for v in versions.values()), versions  # every path agrees
    latest_a, only_b, old_a = versions["iceberg only"]
    assert latest_a.epoch == a_epochs[-1] and only_b.epoch == b_first and only_b.snapshots == {b: None}
    data = read_arrow(resolvers["iceberg only"], old_a)[a].to_pylist()
    assert sorted(r["epoch"] for r in data) == a_epochs[:2]
