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
from coordinator.records import keep_recent
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


def test_the_default_tags_only_the_versions_of_tiers_of_an_hour_or_longer():
    policy = RetentionPolicy.default()
    assert policy.tags == "hourly" and DEFAULT_POLICY.endswith(",tags:hourly")
    assert [t.name for t in policy.tagged_tiers] == ["hourly", "daily", "weekly", "monthly"]
    assert RetentionPolicy.parse("all:1h,hourly:48h,daily:30d,weekly:52w,monthly:24mo") == policy, \
        "a policy written without tags: (as every policy recorded before it existed) tags the same way"
    epochs = list(range(START, START + 400 * DAY_MS, 97 * MINUTE_MS))  # then the last 50 minutes at 2 s
    epochs += list(range(epochs[-1] + 2000, epochs[-1] + 50 * MINUTE_MS, 2000))
    now = epochs[-1] + 5 * MINUTE_MS
    kept = policy.keep(epochs, now)
    tagged = policy.tagged(epochs, now)
    assert tagged == naive_keep(DEFAULT_POLICY, epochs, now, tagged=True) and tagged < set(kept)
    assert {e for e, tier in kept.items() if tier == "all"} - tagged, "the all tier's versions stay untagged"
    assert [t.name for t in RetentionPolicy.parse("all:1h,15m:6h,daily:30d,tags:15m").tagged_tiers] == ["15m", "daily"]
    assert RetentionPolicy.parse("all:1h,daily:30d,tags:all").tagged(epochs, now) == set(
        RetentionPolicy.parse("all:1h,daily:30d").keep(epochs, now))
    assert RetentionPolicy.parse("all:1h,daily:30d,tags:none").tagged(epochs, now) == set()
    assert RetentionPolicy.parse("all:1h,tags:all").max_tags() is None, "a tagged all tier has no bound"


def _tags_after(policy: RetentionPolicy, hours: int, gc_every_ms: int) -> tuple[int, int]:
    """(tagged versions, kept versions) after ``hours`` of 2 s barriers with GC every ``gc_every_ms``, each run
    seeing the candidates GC sees (the retained versions and the tidemarks' recent lists since the newest)."""
    recent: tuple = ()
    retained: set[int] = set()
    tagged: set[int] = set()
    next_gc = START + gc_every_ms
    for epoch in range(START, START + hours * HOUR_MS + 1, 2000):
        recent = keep_recent((*recent, (epoch, epoch)))
        if epoch >= next_gc:
            newest = max(retained, default=0)
            candidates = [*retained, *(e for e, _ in recent if e > newest)]
            retained = set(policy.keep(candidates, epoch)) | {epoch}  # the newest consistent version
            tagged = policy.tagged(candidates, epoch) | {epoch}
            next_gc += gc_every_ms
    return len(tagged), len(retained)


def test_the_default_policys_tag_count_per_table_is_bounded_at_2s_barriers():
    """Issue 19: ``all:1h`` tagged every epoch GC saw, up to 1,800 tags per table per hour at 2 s barriers when GC
    runs at every barrier. By default only the hourly and coarser tiers (and the newest version) are tagged."""
    every_tag = RetentionPolicy.parse("all:1h,tags:all")  # the default's finest tier, all tagged
    assert _tags_after(every_tag, 1, 10_000)[0] >= 1800, "the cost the default avoids (GC sees every epoch)"
    default = RetentionPolicy.default()
    assert default.max_tags() == 49 + 31 + 53 + 27
    for gc_every_ms in (60_000, 600_000):
        tags, versions = _tags_after(default, 2, gc_every_ms)
        assert tags <= 3 and versions > 100, (gc_every_ms, tags, versions)  # 2 whole hours, and the newest

    # Two years at a coarse cadence, the last 2 h at 2 s: every tier full. The tags stay within the bound.
    now = START + 730 * DAY_MS
    epochs = [*range(START, now - 2 * HOUR_MS, 13 * MINUTE_MS), *range(now - 2 * HOUR_MS, now, 2000)]
    tagged, kept, bound = default.tagged(epochs, now), default.keep(epochs, now), default.max_tags()
    assert bound is not None
    assert 120 < len(tagged) + 1 <= bound + 1 < len(kept), (len(tagged), len(kept))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 40 * DAY_MS), min_size=1, max_size=400), st.integers(0, 400 * DAY_MS))
def test_a_policys_tags_never_exceed_its_bound(gaps, after):
    policy = RetentionPolicy.parse("all:2h,15m:6h,hourly:1d,daily:10d,weekly:8w,monthly:6mo,tags:15m")
    epochs, epoch = [], START
    for gap in gaps:
        epoch += gap // 97 + 1
        epochs.append(epoch)
    assert len(policy.tagged(epochs, epoch + after)) <= (policy.max_tags() or 0)


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
    assert RetentionPolicy.parse("all:1h,tags:daily").to_text() == "all:1h,tags:daily"
    for bad in ("hourly", "hourly:48", "fortnightly:1d", "all:0h", "", "all:1h,tags:fortnightly", "tags:hourly"):
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
