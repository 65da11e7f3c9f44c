"""One driver replica of the fault suite's cascade: a pure-Python ``EpochWriter`` process, run until SIGTERM.

    TIDEMARK_CRASH_AT=staged:2 python -m tests.faults.driver CONFIG_JSON

CONFIG_JSON holds ``job`` (``counter`` or ``totals``), ``connect``, ``session_timeout``, ``member``,
``catalog`` ({name, uri, warehouse, python_properties}), ``namespace``, ``interval_ms``, ``grace_ms``, ``every``
(the job's cadence in ms, or null) and ``session_file``.
The replica writes its ZooKeeper session id and password to ``session_file`` whenever its session
changes (the suite expires that session on the server to inject a real session expiry). Crash
points come from the environment (``coordinator/crashpoints.py``); nothing here is patched.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import threading
from pathlib import Path

from coordinator import CatalogSettings, EpochWriter, Tidemark
from tests.faults.cascade import COUNTER, Tables, count_epoch, total_epoch

HISTORY = 100_000  # keep every epoch znode of a run: the suite counts committed epochs from them


def publish_session(tm: Tidemark, path: Path, stop: threading.Event) -> None:
    """Keep ``path`` holding this process's current session id and password (rewritten atomically)."""
    written = None
    while not stop.wait(0.1):
        session = tm.client.client_id
        if session is None or session == written:
            continue
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{session[0]} {session[1].hex()}")
        tmp.replace(path)
        written = session


def main() -> None:
    config = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {config['member']} %(name)s %(levelname)s %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    tables = Tables(config["catalog"]["name"], config["namespace"])
    settings = CatalogSettings(**config["catalog"])
    tm = Tidemark.connect(config["connect"], session_timeout=config["session_timeout"], operation_timeout=30,
                          member=config["member"])
    stop = threading.Event()
    threading.Thread(target=publish_session, args=(tm, Path(config["session_file"]), stop), daemon=True).start()
    job = config["job"]
    sources, sinks = tables.job(job)
    writer = EpochWriter(tm, job, sources=sources, sinks=sinks, catalog=settings, interval_ms=config["interval_ms"],
                         every=config.get("every"), grace_ms=config["grace_ms"], history=HISTORY)
    compute = count_epoch if job == COUNTER else total_epoch
    print("READY", os.getpid(), flush=True)
    writer.run(lambda ctx: compute(ctx, tables))
    stop.set()
    print("EXIT ok", flush=True)
    tm.close()


if __name__ == "__main__":
    main()
