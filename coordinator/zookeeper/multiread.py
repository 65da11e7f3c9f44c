"""Reading many znodes in a few requests: ZooKeeper's ``multiRead`` (3.6 and later), which kazoo does not expose.

    read_many(tm, paths)      # [(data, stat) | None, ...], like tm.get_many, in one request per 256 paths

A cold resolution of 1,000 tables reads 1,000 tidemarks. Pipelined ``get_async`` calls cost one request
each, and kazoo wakes its connection thread once per request (a byte on a socket pair, a thread switch):
most of the time of a cold read went there. ``multiRead`` carries many reads in one request and one
reply; unlike a write ``multi`` it is not atomic, and each read answers on its own (a missing znode is
None here). Batches of ``BATCH`` paths keep each reply well under ZooKeeper's 1 MB packet limit (a
tidemark is a few KiB at most), and are pipelined. A server older than 3.6 answers ``Unimplemented``:
the reads then go one request each (``ZooKeeperSession.get_many``), and the session remembers it.

The request is built from kazoo's own serialization parts and queued with its client's ``_call`` (the one
private call kazoo's recipes use too); the reply is decoded here, so nothing else of kazoo is changed.
"""
from __future__ import annotations

import weakref
from collections import namedtuple
from collections.abc import Sequence
from typing import Any, Optional

from kazoo.exceptions import EXCEPTIONS, NoNodeError, UnimplementedError
from kazoo.protocol.serialization import GetData, MultiHeader, int_struct, multiheader_struct, read_buffer, stat_struct
from kazoo.protocol.states import ZnodeStat

from coordinator.zookeeper.session import ZooKeeperSession

BATCH = 256
_UNSUPPORTED: weakref.WeakSet[ZooKeeperSession] = weakref.WeakSet()  # sessions whose server has no multiRead


class _MultiRead(namedtuple("_MultiRead", "paths")):
    type = 22  # ZooDefs.OpCode.multiRead

    def serialize(self) -> bytearray:
        b = bytearray()
        for path in self.paths:
            b.extend(MultiHeader(GetData.type, False, -1).serialize() + GetData(path, None).serialize())
        return b + multiheader_struct.pack(-1, True, -1)

    @classmethod
    def deserialize(cls, raw: bytes, offset: int) -> list[Any]:
        results: list[Any] = []
        header, offset = MultiHeader.deserialize(raw, offset)
        while not header.done:
            if header.type == GetData.type:
                data, offset = read_buffer(raw, offset)
                results.append((data, ZnodeStat._make(stat_struct.unpack_from(raw, offset))))
                offset += stat_struct.size
            else:  # an error for this read alone
                results.append(EXCEPTIONS[int_struct.unpack_from(raw, offset)[0]]())
                offset += int_struct.size
            header, offset = MultiHeader.deserialize(raw, offset)
        return results


def read_many(tm: ZooKeeperSession, paths: Sequence[str]) -> list[Optional[tuple[bytes, Any]]]:
    """Data and stat of every path (None where a znode does not exist), within the session's deadline."""
    if not paths or tm in _UNSUPPORTED:
        return tm.get_many(paths)
    client = tm.client
    root = client.chroot or ""

    def attempt() -> list[Optional[tuple[bytes, Any]]]:
        pending = []
        for start in range(0, len(paths), BATCH):
            result = client.handler.async_result()
            client._call(_MultiRead([root + p for p in paths[start:start + BATCH]]), result)
            pending.append(result)
        found: list[Optional[tuple[bytes, Any]]] = []
        for result in pending:
            for one in result.get(timeout=tm.operation_timeout):
                if isinstance(one, NoNodeError):
                    found.append(None)
                elif isinstance(one, Exception):
                    raise one  # NoAuth: PermissionDenied from the deadline wrapper, like any read
                else:
                    found.append(one)
        return found
    try:
        return tm.with_deadline(f"{len(paths)} reads", attempt)
    except UnimplementedError:
        _UNSUPPORTED.add(tm)
        return tm.get_many(paths)


__all__ = ["read_many"]
