"""The tiered retention policy: which consistent versions a deployment keeps (docs/history.md; the reasoning
in docs/design.md, "Retention and garbage collection").

    policy = RetentionPolicy.parse("all:1h,hourly:48h,daily:30d,weekly:52w,monthly:24mo,tags:hourly")
    kept = policy.keep(epochs, now_ms=clock())     # {epoch: tier that keeps it}
    tagged = policy.tagged(epochs, now_ms=clock()) # the kept versions that get an Iceberg tag
    policy.max_tags()                              # at most this many tags per table, whatever the cadence
    store_policy(tm, policy); read_policy(tm)      # one policy per deployment, in /versions

A tier ``<every>:<for>`` (``Tier``) keeps the **oldest** version of every ``<every>`` bucket for as long as
that version is at most ``<for>`` old. Buckets are fixed calendar intervals in UTC: ``all`` (every
version), ``minutely``, ``hourly``, ``daily``, ``weekly`` (weeks start on Monday), ``monthly``,
or any fixed length such as ``15m`` or ``6h``. ``<for>`` is a length: ``30s``, ``90m``, ``48h``,
``30d``, ``52w`` or ``24mo`` (a month is 30 days here, a year ``1y`` 365 days).

The policy applies to each pipeline's versions on their own. ``tags:<every>`` (default ``tags:hourly``) says
which kept versions also get the Iceberg tag ``tidemark-<pipeline>-<T>`` on every table they cover: those kept
by a tier whose buckets are ``<every>`` or coarser (``tags:all``: every tier; ``tags:none``: none), plus the
newest consistent version (GC adds it). A tag is a ref in the table's metadata, which every commit rewrites, so
by default only the coarse tiers are tagged: a table then carries at most ``max_tags()`` = 160 tags plus the
newest, however fine its cadence.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable, Optional

from coordinator.errors import ConfigurationError, CorruptState
from coordinator.zookeeper.session import ZooKeeperSession

SECOND_MS = 1000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS
WEEK_MS = 7 * DAY_MS
MONDAY_OFFSET_MS = 4 * DAY_MS  # 1970-01-01 was a Thursday; weeks start on Monday
LENGTH_UNITS = {"s": SECOND_MS, "m": MINUTE_MS, "h": HOUR_MS, "d": DAY_MS, "w": WEEK_MS, "mo": 30 * DAY_MS,
                "y": 365 * DAY_MS}
NAMED_BUCKETS = {"minutely": MINUTE_MS, "hourly": HOUR_MS, "daily": DAY_MS}
DEFAULT_TAGS = "hourly"  # tag only the versions of tiers of an hour or longer (see the module docstring)
DEFAULT_POLICY = f"all:1h,hourly:48h,daily:30d,weekly:52w,monthly:24mo,tags:{DEFAULT_TAGS}"
SHORTEST_MONTH_MS = 28 * DAY_MS


def parse_length(text: str) -> int:
    """``"48h"`` -> milliseconds; ``ConfigurationError`` naming the accepted units otherwise."""
    match = re.fullmatch(r"(\d+)(s|m|h|d|w|mo|y)", text.strip())
    if not match or int(match.group(1)) <= 0:
        raise ConfigurationError(f"{text!r} is not a length: write a positive number and a unit, one of "
                                 f"{', '.join(LENGTH_UNITS)} (e.g. 90m, 48h, 30d, 52w, 24mo)")
    return int(match.group(1)) * LENGTH_UNITS[match.group(2)]


def _month(epoch_ms: int) -> int:
    moment = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    return moment.year * 12 + moment.month - 1


@dataclass(frozen=True)
class Tier:
    """Keep the oldest version of every ``every`` bucket while it is at most ``keep_for_ms`` old."""

    every: str
    keep_for_ms: int

    def __post_init__(self) -> None:
        self.bucket_of(0)  # validates ``every``
        if self.keep_for_ms <= 0:
            raise ConfigurationError(f"tier {self.every!r} must keep versions for a positive time")

    @property
    def name(self) -> str:
        """The tier's name: its ``every`` (``hourly``, ``15m``, ``all``)."""
        return self.every

    def bucket_of(self, epoch: int) -> Optional[int]:
        """The bucket ``epoch`` falls in (None for ``all``: every version is its own bucket)."""
        return self._bucketer()(epoch)

    def _bucketer(self) -> Callable[[int], Optional[int]]:
        if self.every == "all":
            return lambda epoch: None
        if self.every == "weekly":
            return lambda epoch: (epoch - MONDAY_OFFSET_MS) // WEEK_MS
        if self.every == "monthly":
            return _month
        length = self.min_bucket_ms  # a fixed length: every bucket is that long
        return lambda epoch: epoch // length

    @property
    def min_bucket_ms(self) -> int:
        """The shortest a bucket of this tier can be (0 for ``all``; a month can be 28 days)."""
        if self.every == "all":
            return 0
        if self.every == "weekly":
            return WEEK_MS
        if self.every == "monthly":
            return SHORTEST_MONTH_MS
        return NAMED_BUCKETS.get(self.every) or parse_length(self.every)

    def max_kept(self) -> Optional[int]:
        """At most how many versions this tier keeps at once (None for ``all``: one per epoch). Kept versions
        are at most ``keep_for`` old and one per bucket, and a window meets at most ceil(window/bucket) + 1
        buckets."""
        if self.every == "all":
            return None
        return -(-self.keep_for_ms // self.min_bucket_ms) + 1

    def keep(self, epochs: list[int], now_ms: int) -> list[int]:
        """The versions this tier keeps from ``epochs`` (sorted, oldest first)."""
        bucketer, seen, kept = self._bucketer(), set(), []
        for epoch in epochs:
            bucket = bucketer(epoch)
            if bucket is None or bucket not in seen:
                seen.add(bucket)
                if now_ms - epoch <= self.keep_for_ms:
                    kept.append(epoch)
        return kept

    def to_text(self) -> str:
        """The tier as a policy spells it, ``<every>:<for>``: the length in the largest of ``w``, ``d``, ``h``,
        ``m``, ``s`` that divides it (``hourly:48h`` reads ``hourly:2d``, ``monthly:24mo`` ``monthly:720d``)."""
        return f"{self.every}:{_length_text(self.keep_for_ms)}"


def _length_text(ms: int) -> str:
    for unit in ("w", "d", "h", "m", "s"):
        if ms % LENGTH_UNITS[unit] == 0:
            return f"{ms // LENGTH_UNITS[unit]}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class RetentionPolicy:
    """Tiers, finest first; a version is kept while any tier keeps it. ``tags``: the versions of the tiers whose
    buckets are this one or coarser get an Iceberg tag (``all``: every tier; ``none``: no tier)."""

    tiers: tuple[Tier, ...]
    tags: str = DEFAULT_TAGS

    def __post_init__(self) -> None:
        if not self.tiers:
            raise ConfigurationError("a retention policy needs at least one tier, e.g. all:1h")
        if self.tags != "none":
            try:
                Tier(self.tags, DAY_MS)
            except ConfigurationError:
                raise ConfigurationError(f"tags:{self.tags} names no bucket: write tags:all, tags:none, tags:hourly, "
                                         "tags:daily, ... or a length such as tags:6h") from None

    @property
    def tagged_tiers(self) -> tuple[Tier, ...]:
        """The tiers whose versions get a tag."""
        if self.tags == "none":
            return ()
        least = Tier(self.tags, DAY_MS).min_bucket_ms
        return tuple(t for t in self.tiers if t.min_bucket_ms >= least)

    @classmethod
    def parse(cls, text: str) -> RetentionPolicy:
        """``"all:1h,hourly:48h,daily:30d,weekly:52w,monthly:24mo"`` (tiers separated by commas), with an optional
        ``tags:<every>`` (default ``tags:hourly``)."""
        tiers, tags = [], DEFAULT_TAGS
        for part in filter(None, (p.strip() for p in text.split(","))):
            every, sep, keep_for = part.partition(":")
            if not sep:
                raise ConfigurationError(f"retention tier {part!r} must be <every>:<for>, e.g. hourly:48h")
            if every.strip() == "tags":
                tags = keep_for.strip()
                continue
            try:
                tiers.append(Tier(every.strip(), parse_length(keep_for)))
            except ConfigurationError as exc:
                raise ConfigurationError(f"retention tier {part!r}: {exc}") from None
        return cls(tuple(tiers), tags)

    @classmethod
    def default(cls) -> RetentionPolicy:
        """Every version for 1 h, hourly for 48 h, daily for 30 days, weekly for 52 weeks, monthly for 24 months;
        tags on the hourly and coarser ones only (``tags:hourly``)."""
        return cls.parse(DEFAULT_POLICY)

    def to_text(self) -> str:
        """The policy as ``parse`` reads it: its tiers' ``to_text`` and ``tags:<every>``, separated by commas."""
        return ",".join([*(t.to_text() for t in self.tiers), f"tags:{self.tags}"])

    def keep(self, epochs: Iterable[int], now_ms: int) -> dict[int, str]:
        """``{epoch: name of the finest tier keeping it}`` for the versions the policy keeps at ``now_ms``.

        Each tier keeps the oldest version of each bucket: that choice never changes once made (new versions only
        arrive later), and a version a coarser tier keeps is the oldest of its finer buckets too, so it is never
        dropped in between. Applied again and again to what earlier runs left (``tidemark gc`` on a schedule), it
        therefore keeps exactly what one pass over the full history would, for any policy whose windows grow with
        its buckets (a coarser tier keeps for longer than a finer one, by more than a bucket), as the default
        does. Otherwise a version kept by a finer tier can stand in for its bucket's dropped oldest version in a
        coarser tier a little longer than the full history would keep it.
        """
        ordered = sorted(set(epochs))
        kept: dict[int, str] = {}
        for tier in self.tiers:
            for epoch in tier.keep(ordered, now_ms):
                kept.setdefault(epoch, tier.name)
        return kept

    def tagged(self, epochs: Iterable[int], now_ms: int) -> set[int]:
        """The versions kept by a tagged tier: those that carry their tag (GC adds the newest consistent
        version, which it always keeps)."""
        ordered = sorted(set(epochs))
        return {epoch for tier in self.tagged_tiers for epoch in tier.keep(ordered, now_ms)}

    def max_tags(self) -> Optional[int]:
        """At most how many versions ``tagged`` names at once (None: unbounded, a tagged ``all`` tier)."""
        bounds = [t.max_kept() for t in self.tagged_tiers]
        return None if None in bounds else sum(b for b in bounds if b is not None)


def read_policy(tm: ZooKeeperSession) -> RetentionPolicy:
    """The deployment's policy recorded in ``/versions`` (the default when none was recorded)."""
    found = tm.get(tm.paths.versions)
    if found is None or not found[0]:
        return RetentionPolicy.default()
    try:
        text = json.loads(found[0])["policy"]
        return RetentionPolicy.parse(text)
    except (ValueError, KeyError, TypeError, ConfigurationError) as exc:
        raise CorruptState(f"{tm.paths.versions}: not a retention policy ({exc}); set one with "
                           "`tidemark gc --policy SPEC`") from None


def store_policy(tm: ZooKeeperSession, policy: RetentionPolicy) -> None:
    """Record ``policy`` as the deployment's (every later GC, from any process, applies it)."""
    tm.ensure_path(tm.paths.versions)
    tm.call(f"set {tm.paths.versions}", tm.client.set_async, tm.paths.versions,
            json.dumps({"policy": policy.to_text()}).encode())


__all__ = ["DEFAULT_POLICY", "DEFAULT_TAGS", "RetentionPolicy", "Tier", "parse_length", "read_policy", "store_policy"]
