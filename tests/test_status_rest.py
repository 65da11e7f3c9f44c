"""Jobs at rest on purpose (``tidemark pause``, ``retire``, ``resume``) and freshness scoped to live jobs.

Real ZooKeeper, a real SQLite catalog and real ``EpochWriter`` loops (pyiceberg, no Spark).
"""
from __future__ import annotations

import json
import time
from typing import Any

import pytest

from coordinator.errors import InvalidArgument, JobNotFound, JobRetired, RegistrationError
from coordinator.operations.exporter import view_families
from coordinator.records import now_ms
from tests.helpers.background import InBackground
from tests.helpers.cli import run_cli
from tests.helpers.present import present
from tests.helpers.wait import wait_for
from tests.test_status_waiting import INTERVAL, append_epoch, writer
from tests.test_status_waiting import lake as lake  # the fixture: tables in this test's namespace


def exported(status, label: str = "tidemark_job") -> dict[tuple, float]:
    return {(s.name, s.labels.get(label)): s.value for family in view_families(status, time.time())
            for s in family.samples}


def test_a_paused_stream_is_not_stale_and_leaves_the_live_consistent_epoch_until_a_leader_runs_it(
        tm, connect, catalog_settings, lake, zk_connect, capsys):
    stream_table, live_table, batch_table = lake("stream", "live", "batch")
    stream = InBackground(writer(connect(), catalog_settings, "stream", [], [stream_table]), append_epoch(stream_table))
    live = InBackground(writer(connect(), catalog_settings, "live", [], [live_table]), append_epoch(live_table))
    try:
        done = writer(connect(), catalog_settings, "batch", [], [batch_table])
        batch_epochs = done.run(append_epoch(batch_table), max_epochs=2, stop_on_sigterm=False)
        wait_for(lambda: stream.writer.committed, "the stream's first epoch")
        stream.stop()
        stopped_at = present(tm.tidemarks([stream_table])[stream_table]).epoch
        status = tm.status()
        assert status.job("stream").stale and status.job("stream").state == "no leader"

        code, out, _ = run_cli(capsys, "--zk", zk_connect, "pause", "stream", "--reason", "maintenance", "--dry-run")
        assert code == 0 and out.startswith("pause job stream until resumed: ") and "dry run: nothing changed" in out
        code, _, err = run_cli(capsys, "--zk", zk_connect, "pause", "stream")  # no terminal, no --yes: refused
        assert code == 1 and err.count("\n") == 1 and "pass --yes to pause job stream" in err
        assert tm.status().job("stream").stale
        code, out, _ = run_cli(capsys, "--zk", zk_connect, "pause", "stream", "--reason", "maintenance", "--by", "ops",
                               "--yes")
        assert code == 0 and out.startswith("job stream paused until `tidemark resume`")

        # The live consistent epoch is live's alone: it moves on while the paused and finished jobs' tables stay.
        passed = max(stopped_at, batch_epochs[-1])
        status = wait_for(lambda: (s := tm.status()).live_consistent_epoch is not None
                          and s.live_consistent_epoch > passed and s, "the live consistent epoch to move on")
        job = status.job("stream")
        assert job.state == "paused" and job.at_rest and not job.stale and job.committed_epoch == stopped_at
        assert (job.paused.by, job.paused.reason, job.paused.until_ms) == ("ops", "maintenance", None)
        assert status.job("batch").state == "finished" and status.job("batch").at_rest
        assert status.job("live").state == "leading" and not status.job("live").at_rest
        assert [j.name for j in status.jobs if j.stale] == []
        assert status.live_consistent_epoch == status.job("live").consistent_epoch
        # A reader of all three tables gets at most the paused stream's last epoch: the truth for that reader.
        assert status.consistent_epoch is None or status.consistent_epoch <= stopped_at
        samples = exported(status)
        assert samples[("tidemark_job_paused", "stream")] == 1 and samples[("tidemark_job_live", "stream")] == 0
        assert samples[("tidemark_job_finished", "batch")] == 1 and samples[("tidemark_job_live", "batch")] == 0
        assert samples[("tidemark_job_live", "live")] == 1 and samples[("tidemark_job_stale", "stream")] == 0
        # Each job is a pipeline of its own: the live one's freshness is reported, the stream's at rest is not.
        by_pipeline = exported(status, "tidemark_pipeline")
        assert by_pipeline[("tidemark_consistent_epoch_timestamp_seconds", "live")] == \
            status.pipeline("live").live_consistent_epoch / 1000 == status.live_consistent_epoch / 1000
        assert by_pipeline[("tidemark_consistent_lag_seconds", "live")] < 30
        assert ("tidemark_consistent_epoch_timestamp_seconds", "stream") not in by_pipeline
        assert status.pipeline("stream").consistent_epoch == stopped_at
        assert samples[("tidemark_job_bounds_consistent_epoch", "stream")] == 0  # at rest: bounds nothing live

        report = json.loads(run_cli(capsys, "--zk", zk_connect, "status", "--json")[1])
        jobs = {j["name"]: j for j in report["jobs"]}
        assert jobs["stream"]["state"] == "paused" and jobs["stream"]["at_rest"] is True
        assert jobs["stream"]["paused"]["reason"] == "maintenance" and report["stale_jobs"] == []
        assert report["live_jobs"] == ["live"] and report["live_consistent_epoch"] is not None
        text = run_cli(capsys, "--zk", zk_connect, "status")[1]
        assert text.splitlines()[0] == f"grid: {INTERVAL} ms   pipelines: 3"
        headline = {line.split()[1]: line for line in text.splitlines() if line.startswith("pipeline ")}
        assert headline["stream"].startswith(f"pipeline stream (1 job): consistent epoch {stopped_at} (")
        assert "without the jobs at rest" not in headline["stream"]  # at rest altogether: its epoch is the truth
        assert headline["live"].startswith("pipeline live (1 job): consistent epoch 1")
        assert headline["batch"].startswith(f"pipeline batch (1 job): consistent epoch {batch_epochs[-1]} (")
        line = next(line for line in text.splitlines() if line.startswith("stream:"))
        assert line.startswith(f"stream: term 1, paused by ops (maintenance), committed {stopped_at}")
        assert "STALE" not in line

        # A leader that runs it again makes the job live (a standby taking over while the drivers stop, say),
        # but the pause stays the operator's: once nobody runs the job, it is paused again, not stale.
        again = InBackground(writer(connect(), catalog_settings, "stream", [], [stream_table]),
                             append_epoch(stream_table))
        wait_for(lambda: again.writer.committed, "the stream to run again")
        running_again = tm.status()
        assert running_again.job("stream").state == "leading" and "stream" in running_again.to_dict()["live_jobs"]
        again.stop()
        assert tm.status().job("stream").state == "paused" and not tm.status().job("stream").stale
        code, out, _ = run_cli(capsys, "--zk", zk_connect, "resume", "stream", "--yes")
        assert code == 0 and "resumed (it was paused)" in out and tm.status().job("stream").stale
    finally:
        live.stop()


def test_a_pause_ends_by_itself_and_bad_durations_are_one_line_errors(tm, zk_connect, capsys):
    tm.register_job("idle", sources=[], sinks=["lake.db.idle"])
    assert tm.status().job("idle").stale
    with pytest.raises(InvalidArgument, match="a pause must end after it starts"):
        tm.pause_job("idle", until_ms=now_ms() - 1)
    bad_arguments: list[dict[str, Any]] = [{"until_ms": "soon"}, {"by": None}, {"reason": 7}, {"until_ms": True}]
    for arguments in bad_arguments:
        with pytest.raises(InvalidArgument):
            tm.pause_job("idle", **arguments)
    with pytest.raises(JobNotFound):
        tm.pause_job("nojob")
    for bad in ("0s", "soon", "1x"):
        code, _, err = run_cli(capsys, "--zk", zk_connect, "pause", "idle", "--for", bad, "--yes")
        assert code == 1 and err.count("\n") == 1 and err.startswith("tidemark: error: "), (bad, err)
    code, _, err = run_cli(capsys, "--zk", zk_connect, "pause", "idle", "--reason", "x" * 1001, "--yes")
    assert code == 1 and "at most 1000 characters" in err and err.count("\n") == 1
    code, _, err = run_cli(capsys, "--zk", zk_connect, "retire", "nojob", "--yes")
    assert code == 1 and "not registered" in err and err.count("\n") == 1
    assert tm.get(tm.paths.paused("idle")) is None  # nothing changed by any of them

    until = now_ms() + 4000  # long enough to read it in force on a busy machine
    tm.pause_job("idle", reason="short", until_ms=until)
    job = tm.status().job("idle")
    assert job.state == "paused" and not job.stale and job.paused.until_ms == until
    status = wait_for(lambda: (s := tm.status()).job("idle").stale and s, "the pause to end", timeout=30)
    job = status.job("idle")
    assert job.state == "no leader" and job.paused is None and job.pause_ended.until_ms == until
    assert "its pause ended at" in job.stale_reason
    code, out, _ = run_cli(capsys, "--zk", zk_connect, "resume", "idle", "--yes")
    assert code == 0 and "resumed (it was paused)" in out
    code, out, _ = run_cli(capsys, "--zk", zk_connect, "resume", "idle", "--yes")
    assert code == 0 and "was not paused or retired; nothing changed" in out


def test_a_retired_job_is_refused_while_it_runs_and_its_drivers_refuse_to_lead_it(
        tm, connect, catalog_settings, lake, zk_connect, capsys):
    [table] = lake("old")
    running = writer(connect(), catalog_settings, "old", [], [table])
    running.open(leader_timeout=30)
    try:
        code, _, err = run_cli(capsys, "--zk", zk_connect, "retire", "old", "--yes")
        assert code == 1 and err.count("\n") == 1 and "has a live leader" in err and "stop its drivers" in err
        with pytest.raises(RegistrationError):
            tm.retire_job("old")
    finally:
        running.close()
    assert tm.status().job("old").stale
    tm.pause_job("old", reason="first paused")
    code, out, _ = run_cli(capsys, "--zk", zk_connect, "retire", "old", "--reason", "replaced", "--yes")
    assert code == 0 and "retired" in out
    job = tm.status().job("old")
    assert job.state == "retired" and not job.stale and job.retired.reason == "replaced"
    assert tm.get(tm.paths.paused("old")) is None  # retiring replaced the pause

    refused = writer(connect(), catalog_settings, "old", [], [table])
    with pytest.raises(JobRetired, match="tidemark resume old"):
        refused.run(append_epoch(table), max_epochs=1, stop_on_sigterm=False)
    assert refused.committed == [] and tm.status().job("old").state == "retired"

    code, out, _ = run_cli(capsys, "--zk", zk_connect, "resume", "old", "--yes")
    assert code == 0 and "resumed (it was retired)" in out and tm.status().job("old").stale
    assert len(writer(connect(), catalog_settings, "old", [], [table]).run(
        append_epoch(table), max_epochs=1, stop_on_sigterm=False)) == 1
    assert tm.status().job("old").state == "finished"

    # Unregistering removes the marks with the job: a new registration starts with none.
    tm.retire_job("old")
    tm.unregister_job("old", confirm=True, catalog=catalog_settings)
    tm.register_job("old", sources=[], sinks=[table])
    assert tm.get(tm.paths.retired("old")) is None and tm.status().job("old").state == "no leader"


def test_a_job_downstream_of_a_paused_job_waits_for_it_and_says_so(tm, connect, catalog_settings, lake):
    up_table, down_table = lake("up", "down")
    tm.register_job("down", sources=[up_table], sinks=[down_table])
    upstream = InBackground(writer(connect(), catalog_settings, "up", [], [up_table]), append_epoch(up_table))
    down = InBackground(writer(connect(), catalog_settings, "down", [up_table], [down_table]),
                        lambda ctx: ctx.append(down_table, ctx.changes(up_table)))
    try:
        wait_for(lambda: down.writer.committed, "the derived job's first epoch")
        upstream.stop()
        tm.pause_job("up", reason="upgrade")
        last = present(tm.tidemarks([up_table])[up_table]).epoch
        wait_for(lambda: down.writer.committed[-1:] == [last], "down to catch up with the paused upstream")
        status = tm.status()
        [blocker] = status.job("down").waiting_for
        assert blocker.writer_state == "paused" and not blocker.writer_live
        assert status.job("down").reasons()[0].endswith("written by job up, which has no live leader (an operator "
                                                        "paused it)")
        assert not status.job("down").stale and not status.job("up").stale
        # down is live and reads up's table: the live consistent epoch waits with it (the truth about down).
        assert status.live_consistent_epoch == last
    finally:
        down.stop()
