"""``tidemark status`` tells a leader that commits from one that only holds the leader znode (issue 22).

In the zombie stall a replica won the election, created the leader znode and then waited, silently, on a
catalog lock: every reader of the znode saw a live leader. Status compares the znode's creation (the
takeover) with the sinks' last commit. Real ZooKeeper and a real SQLite catalog.
"""
from __future__ import annotations

from coordinator.records import now_ms
from tests.helpers.lake import SCHEMA, create_table, lead_job
from tests.helpers.wait import wait_for


def test_a_leader_that_committed_nothing_since_it_took_over_is_shown_stuck(tm, connect, catalog_settings, namespace):
    raw, out = f"lake.{namespace}.raw", f"lake.{namespace}.out"
    catalog = catalog_settings.load()
    create_table(catalog, catalog_settings.identifier(out))
    catalog.create_table(catalog_settings.identifier(raw), schema=SCHEMA)  # no snapshot: it never changes
    writer = lead_job(tm, catalog_settings, "quiet", [out], sources=(raw,))
    last = tm.barriers.grid().floor(now_ms())
    writer.commit_idle(last)
    job = tm.status().job("quiet")
    assert job.leader_since_ms is not None and not job.stale
    writer.close()

    # Another replica takes over, holds the leader znode and commits nothing.
    stuck = connect().leadership("quiet")
    assert stuck.acquire(timeout=30) == 2
    try:
        job = wait_for(lambda: (j := tm.status().job("quiet")).stale and j, "the job to be stale", 30)
        assert job.leader_state == "leading"
        assert "has committed nothing since it took over" in (job.stale_reason or ""), job.stale_reason
        assert job.leader is not None and job.leader.term == 2 and job.leader.member in job.stale_reason
    finally:
        stuck.release()


def test_a_leader_that_committed_since_it_took_over_is_only_slow(tm, catalog_settings, namespace):
    raw, out = f"lake.{namespace}.raw", f"lake.{namespace}.out"
    catalog = catalog_settings.load()
    create_table(catalog, catalog_settings.identifier(out))
    catalog.create_table(catalog_settings.identifier(raw), schema=SCHEMA)  # no snapshot: it never changes
    writer = lead_job(tm, catalog_settings, "slow", [out], sources=(raw,))
    try:
        writer.commit_idle(tm.barriers.grid().floor(now_ms()))
        job = wait_for(lambda: (j := tm.status().job("slow")).stale and j, "the job to be stale", 30)
        assert "lags" in (job.stale_reason or "") and "committed nothing" not in (job.stale_reason or "")
    finally:
        writer.close()
