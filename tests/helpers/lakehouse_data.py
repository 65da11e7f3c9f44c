"""Where a test keeps a lakehouse's data: in memory (``/dev/shm``) when it has room, else in the test's own
temporary directory.

SeaweedFS writes nothing while its disk is nearly full (``coordinator.operations.lakehouse_server.disk_room``: 1% of
the disk and a volume), and a CI machine's disk can be (seen: every test on the lakehouse timed out in uploads,
and nothing else failed). A test lakehouse holds a few MiB, so memory keeps the suite independent of the disk's
last per cent. Taken out on exit, the server stopped first.

    with lakehouse_data_dir(tmp_path_factory.mktemp("lakehouse")) as data, EmbeddedLakehouse(data) as lakehouse:
        ...
"""
from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from coordinator.operations.lakehouse_server import disk_room

MEMORY = Path("/dev/shm")
MARGIN = 2**30  # beyond what one server needs: several run at once, each holding a few MiB


@contextmanager
def lakehouse_data_dir(fallback: Path) -> Iterator[Path]:
    room = disk_room(MEMORY) if MEMORY.is_dir() else None
    if room is None or room.free < room.needed + MARGIN:
        yield fallback
        return
    data = Path(tempfile.mkdtemp(prefix="tidemark-lakehouse-", dir=MEMORY))
    try:
        yield data
    finally:
        shutil.rmtree(data, ignore_errors=True)
