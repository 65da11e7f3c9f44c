"""A pure-Python driver process (``EpochWriter``, no Spark) for the fault tests of tests/test_writer_faults.py.

    python -m tests.helpers.python_driver CONFIG_JSON

CONFIG_JSON holds ``mode``, ``connect``, ``session_timeout``, ``catalog`` ({name, uri, warehouse}) and per mode:

- ``count``: job ``counter`` reads the root table ``source`` (``k`` string, ``n`` int64) and writes two
  sinks: ``log`` (the rows appended in the epoch, appended) and ``counts`` (rows per ``k`` except ``noise``:
  an overwrite of the previous counts plus the epoch's; not written in an epoch with nothing to count, so
  the sink publishes nothing then and its committed epoch is marked in Iceberg instead; at every epoch, or every
  ``marker_every``). Runs ``max_epochs`` epochs and prints ``{"committed": [...]}``. The test's ``crash_at`` (which sets
  ``TIDEMARK_CRASH_AT=<step>:2``) makes it SIGKILL itself during its second computed epoch:
  ``staged-one`` (the first sink staged), ``staged`` (sinks staged, nothing precommitted), ``precommitted`` (before
  any publish), ``published-one`` (one of the two sinks published), ``committed`` (ZooKeeper commit done, Iceberg not
  marked yet) or ``none``.
- ``serve``: job ``job`` with no source appends one row (epoch, term, member) per epoch to ``log``, unbounded
  (until SIGTERM). Prints ``READY <member>`` once connected and ``EXIT ok`` when ``run`` returns.
- ``copy``: job ``job`` reads ``source`` (a ``serve`` job's sink) and appends each epoch's new rows to ``log``,
  unbounded (until SIGTERM).
Crashes are injected from the environment (``TIDEMARK_CRASH_AT``, see coordinator/crashpoints.py), set by the
test that starts this process; nothing here is patched.
"""
from __future__ import annotations

import faulthandler
import json
import signal
import sys
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc

from coordinator import CatalogSettings, EpochWriter, Tidemark

SOURCE_SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("n", pa.int64())])
COUNT_SCHEMA = pa.schema([pa.field("k", pa.string()), pa.field("cnt", pa.int64())])
NOISE = "noise"  # rows the count table does not count
EPOCH_SCHEMA = pa.schema([pa.field("epoch", pa.int64()), pa.field("term", pa.int64()), pa.field("member", pa.string())])


def new_counts(ctx, rows: pa.Table, sink: str) -> pa.Table:
    """The counts at the job's last committed epoch (the snapshot its tidemark names) plus ``rows``."""
    writer = ctx.writer
    previous = COUNT_SCHEMA.empty_table()
    snapshot_id = writer.epochs.mark(sink).snapshot_id
    if snapshot_id is not None:
        table = writer.table(sink)
        if table.snapshot_by_id(snapshot_id) is None:
            table.refresh()
        previous = table.scan(snapshot_id=snapshot_id).to_arrow().select(["k", "cnt"]).cast(COUNT_SCHEMA)
    delta = rows.group_by("k").aggregate([("n", "count")]).rename_columns(["k", "cnt"])
    both = pa.concat_tables([previous, delta.select(["k", "cnt"]).cast(COUNT_SCHEMA)])
    summed = both.group_by("k").aggregate([("cnt", "sum")]).rename_columns(["k", "cnt"])
    return summed.select(["k", "cnt"]).cast(COUNT_SCHEMA)


def run_count(config: dict, tm: Tidemark, settings: Optional[CatalogSettings]) -> None:
    source, log_sink, counts_sink = config["source"], config["log"], config["counts"]
    # marker_every None (unless the test gives one): a marker at every epoch that leaves a sink unchanged, so Iceberg
    # alone records every epoch and the test can compare it with ZooKeeper's (the default marks once a minute).
    writer = EpochWriter(tm, "counter", sources=[source], sinks=[log_sink, counts_sink], catalog=settings,
                         interval_ms=1000, grace_ms=200, marker_every=config.get("marker_every"))
    computed: list[int] = []

    def step(ctx) -> None:
        computed.append(ctx.epoch)
        changes = ctx.changes(source).select(["k", "n"]).cast(SOURCE_SCHEMA)
        ctx.append(log_sink, changes)
        counted = changes.filter(pc.not_equal(changes["k"], NOISE))
        if counted.num_rows:  # otherwise the count table does not change: it publishes nothing in this epoch
            ctx.overwrite(counts_sink, new_counts(ctx, counted, counts_sink))

    committed = writer.run(step, max_epochs=config["max_epochs"], leader_timeout=120)
    print(json.dumps({"committed": committed, "computed": computed}), flush=True)


def run_copy(config: dict, tm: Tidemark, settings: Optional[CatalogSettings]) -> None:
    source, sink = config["source"], config["log"]
    writer = EpochWriter(tm, config["job"], sources=[source], sinks=[sink], catalog=settings, interval_ms=1000,
                         grace_ms=200)
    writer.run(lambda ctx: ctx.append(sink, ctx.changes(source).select(EPOCH_SCHEMA.names).cast(EPOCH_SCHEMA)))


def run_serve(config: dict, tm: Tidemark, settings: Optional[CatalogSettings]) -> None:
    log_sink = config["log"]
    writer = EpochWriter(tm, config["job"], sources=[], sinks=[log_sink], catalog=settings, interval_ms=1000,
                         grace_ms=200)

    def step(ctx) -> None:
        ctx.append(log_sink, pa.table({"epoch": [ctx.epoch], "term": [ctx.writer.term], "member": [tm.member]},
                                      schema=EPOCH_SCHEMA))

    print("READY", tm.member, flush=True)
    writer.run(step)
    print("EXIT ok", flush=True)


def main() -> None:
    # A test whose driver does not end in time sends SIGUSR1 for every thread's stack in the driver's log.
    faulthandler.register(signal.SIGUSR1)
    config = json.loads(sys.argv[1])
    catalog = config.get("catalog")
    settings = CatalogSettings(**catalog) if catalog else None
    tm = Tidemark.connect(config["connect"], session_timeout=config.get("session_timeout", 3.0),
                          operation_timeout=config.get("operation_timeout", 30.0))
    try:
        if config["mode"] == "count":
            run_count(config, tm, settings)
        elif config["mode"] == "copy":
            run_copy(config, tm, settings)
        else:
            run_serve(config, tm, settings)
    finally:
        tm.close()


if __name__ == "__main__":
    main()
