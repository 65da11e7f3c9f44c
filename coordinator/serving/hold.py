"""A client's hold: the version its query in progress reads, and the rule that says when its next query starts.

    rule = HoldRule(query_gap_ms=500, max_hold_ms=30_000)
    bit = table_bit(group, table)                               # the table among its group's
    hold = Hold.decode(cookie_value)                            # None: no hold, or a value never written here
    if hold is not None and rule.continues(hold, bit, now_ms):  # the same query: its version again
        hold = hold.loaded(now_ms, bit)
    else:                                                       # a new query: the newest version, never below
        hold = Hold.taken(newest_epoch, now_ms, bit)            # the hold's
    hold.encode()                                               # the cookie's new value

An engine loads the tables of one query back to back while it plans it (Trino, Spark, DuckDB, pyiceberg loading a
query's tables before reading them), and nothing identifies a query in what it sends. So a load that follows the
answer to the client's previous load by less than ``query_gap_ms`` is the same query, at the same version; so is
the load of a table the query has not loaded yet up to ``LATE_TABLE_GAPS`` query gaps after (DuckDB reads a
table's manifests before it loads the next table, and a loaded machine plans slowly), since a query loads each of
its tables once. The first load after a quieter gap starts the next query, at the newest version. A client kept
busy by concurrent sessions (a Trino coordinator) may never be quiet that long: once its version is
``max_hold_ms`` old, a gap of a tenth of ``query_gap_ms`` before a table it loaded already starts the next query,
and at twice ``max_hold_ms`` its next load does. There a query planned in another session at that moment can
straddle two versions (docs/design.md, "The switch race").

The hold travels in a cookie (``cookie_name``): every engine's HTTP client keeps cookies (Iceberg Java's Apache
client for Trino and Spark, pyiceberg's ``requests`` session), so whichever replica answers a client's next load
continues its query, and a client never gets a version older than its hold: never back, across replicas and
restarts. The value is not secret and needs no signature: a server serves a hold's epoch only after resolving it
as a consistent version, which any client may ask for anyway (``@<epoch>``).
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass, replace
from typing import Optional

COOKIE_PREFIX = "tidemark-hold-"
DEFAULT_QUERY_GAP_MS = 500  # an engine loads a query's tables within milliseconds of each other; a dashboard's
# next panel, or a session's next statement, comes later than this
DEFAULT_MAX_HOLD_MS = 30_000  # a client that is never quiet for a query gap moves on at a shorter gap after this
BUSY_GAP_DIVISOR = 10  # past max_hold_ms, a tenth of the query gap starts a query: a query's own loads come closer
LATE_TABLE_GAPS = 4  # a table the query has not loaded yet still belongs to it this many query gaps after
TABLE_BITS = 64  # the tables a query loaded, one bit each by rank in the group (beyond 64, tables share bits: a
# table taken for one loaded already only shortens its gap, the rule without this refinement)


@dataclass(frozen=True)
class Hold:
    """The version a client holds: its ``epoch``, when the client's query took it (``since_ms``), when it last
    loaded a table at it (``last_ms``), both wall-clock milliseconds so that every replica reads them alike, and the
    tables the query loaded (``tables``: their ``table_bit`` values, or-ed)."""

    epoch: int
    since_ms: int
    last_ms: int
    tables: int = 0

    @classmethod
    def taken(cls, epoch: int, now_ms: int, bit: int) -> Hold:
        """The hold of a query that starts at ``now_ms`` by loading the table of ``bit`` (``table_bit``) at
        ``epoch``."""
        return cls(epoch, now_ms, now_ms, bit)

    @classmethod
    def decode(cls, text: Optional[str]) -> Optional[Hold]:
        """The hold a cookie's value carries; None for none, or for a value this server never wrote."""
        parts = (text or "").split(".")
        if len(parts) != 4 or not all(p.isdigit() and len(p) <= 18 for p in parts[:3]):
            return None
        try:
            tables = int(parts[3], 16) if len(parts[3]) <= TABLE_BITS // 4 else -1
        except ValueError:
            return None
        epoch, since_ms, last_ms = (int(p) for p in parts[:3])
        return cls(epoch, since_ms, last_ms, tables) if since_ms <= last_ms and tables >= 0 else None

    def encode(self) -> str:
        """The cookie's value: ``<epoch>.<since_ms>.<last_ms>.<tables, hexadecimal>``."""
        return f"{self.epoch}.{self.since_ms}.{self.last_ms}.{self.tables:x}"

    def loaded(self, now_ms: int, bit: int = 0) -> Hold:
        """This hold after one more load at ``now_ms`` (of the table of ``bit``, when given)."""
        return replace(self, last_ms=max(self.last_ms, now_ms), tables=self.tables | bit)

    def has_loaded(self, bit: int) -> bool:
        """Whether the held query loaded the table of ``bit`` already (or a table that shares it)."""
        return bool(self.tables & bit)


@dataclass(frozen=True)
class HoldRule:
    """When a client's next load belongs to the query its hold is for (module docstring).

    :param query_gap_ms: a load this long or longer after the client's previous one starts a new query;
        ``LATE_TABLE_GAPS`` times as long for a table the query has not loaded yet (0: every load starts one, and gets
        the newest version).
    :param max_hold_ms: once the client's version is this old, a tenth of ``query_gap_ms`` is gap enough to start a
        new query; at twice this age its next load starts one, however busy the client is.
    """

    query_gap_ms: int = DEFAULT_QUERY_GAP_MS
    max_hold_ms: int = DEFAULT_MAX_HOLD_MS

    def continues(self, hold: Hold, bit: int, now_ms: int, refresh: bool = False) -> bool:
        """Whether a load at ``now_ms`` of the table of ``bit`` (``table_bit``) is the held query's.

        :param refresh: the client reloads a table it holds (Iceberg Java's refresh while Spark plans a scan): part
            of its query however late, up to the hard limit.
        """
        age = now_ms - hold.since_ms
        if self.query_gap_ms <= 0 or age >= 2 * self.max_hold_ms:
            return False
        if refresh:
            return True
        busy = age >= self.max_hold_ms
        if hold.has_loaded(bit):
            gap = max(1, self.query_gap_ms // BUSY_GAP_DIVISOR) if busy else self.query_gap_ms
        else:
            gap = self.query_gap_ms if busy else LATE_TABLE_GAPS * self.query_gap_ms
        return now_ms - hold.last_ms < gap


def table_bit(group: frozenset[str], table: str) -> int:
    """The bit that stands for ``table`` in a hold of ``group``: its rank in the group, so that no two of the
    group's first ``TABLE_BITS`` tables share one, and every replica ranks alike."""
    return _group_bits(group).get(table, 0)


@functools.lru_cache(maxsize=1_024)  # asked at every load
def _group_bits(group: frozenset[str]) -> dict[str, int]:
    return {table: 1 << (rank % TABLE_BITS) for rank, table in enumerate(sorted(group))}


@functools.lru_cache(maxsize=4_096)  # asked at every load: a group of the ``all`` scope may have thousands of tables
def cookie_name(prefix: str, group: frozenset[str]) -> str:
    """The cookie that carries a client's hold for one group of one scope (a client reads several pipelines)."""
    digest = hashlib.sha256("\x1f".join((prefix, *sorted(group))).encode()).hexdigest()[:16]
    return COOKIE_PREFIX + digest


__all__ = ["DEFAULT_MAX_HOLD_MS", "DEFAULT_QUERY_GAP_MS", "Hold", "HoldRule", "cookie_name", "table_bit"]
