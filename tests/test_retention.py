"""The retention policy as pure logic: tiers, calendar buckets, and repeated application equal to one over the
full history (what lets ``tidemark gc`` run on a schedule and still keep exactly what the policy says)."""
from __future__ import annotations

from datetime import datetime, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.errors import ConfigurationError
from coordinator.history.retention import (
    DAY_MS,
    DEFAULT_POLICY,
    HOUR_MS,
    MINUTE_MS,
    RetentionPolicy,
    Tier,
    parse_length,
)
from coordinator.history.versions import nearest, parse_version_ref
from tests.helpers.retention import naive_keep

START = int(datetime(2025, 1, 1, tzinfo=timezone.utc).timestamp() * 1000)


def test_default_policy_matches_its_calendar_definition():
    policy = RetentionPolicy.default()
    epochs = list(range(START, START + 400 * DAY_MS, 97 * MINUTE_MS))  # ragged against every bucket
    now = epochs[-1] + 5 * MINUTE_MS
    kept = policy.keep(epochs, now)
    assert set(kept) == naive_keep(DEFAULT_POLICY, epochs, now)
    tiers = list(kept.values())
    assert tiers.count("monthly") >= 1 and tiers.count("weekly") >= 40 and tiers.count("daily") >= 20
    assert all(now - e <= HOUR_MS for e, t in kept.items() if t == "all")


def test_weeks_start_on_monday_and_months_are_calendar_months():
    monday = int(datetime(2025, 3, 3, tzinfo=timezone.utc).timestamp() * 1000)
    weekly = Tier("weekly", 52 * 7 * DAY_MS)
    assert weekly.bucket_of(monday - 1) != weekly.bucket_of(monday) == weekly.bucket_of(monday + 6 * DAY_MS + 1)
    monthly = Tier("monthly", 720 * DAY_MS)
    assert monthly.bucket_of(monday - 2 * DAY_MS - 1) != monthly.bucket_of(monday - 2 * DAY_MS)  # 1 March


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 6 * HOUR_MS), min_size=1, max_size=300), st.lists(st.integers(0, 40), max_size=30))
def test_applying_the_policy_repeatedly_keeps_what_one_pass_over_the_full_history_keeps(gaps, gc_after):
    """GC sees only what earlier runs kept plus the new versions: that must never lose a version the policy wants."""
    policy = RetentionPolicy.parse("all:2h,hourly:1d,daily:10d,weekly:8w,monthly:6mo")
    history, kept, epoch = [], set[int](), START
    runs = {i for i in gc_after}
    for i, gap in enumerate(gaps):
        epoch += gap * 97
        history.append(epoch)
        if i in runs or i == len(gaps) - 1:
            now = epoch + 1
            kept = set(policy.keep(kept | {e for e in history if e > max(kept, default=0)}, now))
            assert kept == set(policy.keep(history, now))


def test_policy_text_round_trips_and_bad_text_says_what_is_accepted():
    policy = RetentionPolicy.parse("all:90m, 15m:6h ,daily:30d,monthly:2y")
    assert RetentionPolicy.parse(policy.to_text()) == policy
    assert parse_length("24mo") == 720 * DAY_MS
    for bad in ("hourly", "hourly:48", "fortnightly:1d", "all:0h", ""):
        with pytest.raises(ConfigurationError):
            RetentionPolicy.parse(bad)


def test_version_refs_and_nearest():
    assert parse_version_ref("tidemark-1700000000000") == parse_version_ref("1700000000000") == 1700000000000
    with pytest.raises(ConfigurationError, match="tidemark versions"):
        parse_version_ref("yesterday")
    assert nearest([10, 20, 30], 25) == (20, 30)
    assert nearest([10, 20, 30], 20) == (10, 30)
    assert nearest([10, 20, 30], 5) == (None, 10)
    assert nearest([], 5) == (None, None)
