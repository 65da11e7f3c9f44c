"""A driver process that runs a job and garbage collection on its schedule, for the kill tests of tests/test_gc.py.

    python -m tests.helpers.gc_driver CONFIG_JSON

CONFIG_JSON holds ``connect``, ``catalog`` ({name, uri, warehouse}), ``log`` and ``latest`` (two sinks made by
``tests.helpers.lake.create_table``), ``policy`` (a retention policy text) and ``gc_every_s``. Job ``job`` (no
source) commits every barrier of a 1 s grid: it appends one row to ``log`` and overwrites ``latest`` with it,
so both tables get snapshots every epoch and every GC run expires some in each. A ``GcSchedule`` runs in the
same process, as a driver runs it. Prints ``READY <member>`` once connected. The test sets
``TIDEMARK_CRASH_AT`` (e.g. ``gc-expired:3``) so the process SIGKILLs itself in the middle of a GC run,
between two tables' commits; nothing here is patched.
"""
from __future__ import annotations

import json
import sys

from coordinator import CatalogSettings, EpochWriter, GcSchedule, RetentionPolicy, Tidemark

from .lake import rows_of


def main() -> None:
    config = json.loads(sys.argv[1])
    settings = CatalogSettings(**config["catalog"])
    tm = Tidemark.connect(config["connect"], session_timeout=3.0, operation_timeout=30.0)
    sinks = [config["log"], config["latest"]]
    writer = EpochWriter(tm, "job", sources=[], sinks=sinks, catalog=settings, interval_ms=1000, grace_ms=0)
    schedule = GcSchedule(tm, settings, every_s=config["gc_every_s"],
                          policy=RetentionPolicy.parse(config["policy"])).start()

    def step(ctx) -> None:
        row = rows_of(ctx.epoch, 1)
        ctx.append(config["log"], row)
        ctx.overwrite(config["latest"], row)

    print("READY", tm.member, flush=True)
    try:
        writer.run(step)
    finally:
        schedule.stop()
        tm.close()


if __name__ == "__main__":
    main()
