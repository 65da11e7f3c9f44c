"""The operations of a ZooKeeper multi, as small typed records: ``Create``, ``SetData``, ``Check``, ``Delete``.

    tm.multi([Check(paths.term(job), version), SetData(paths.epoch(job, 7), record.to_json(), version=3),
              Create(paths.leader(job), b"", ephemeral=True)])

Each operation adds itself to a kazoo transaction, so an operation of an unknown kind cannot
be built, and ``ZooKeeperSession.multi`` has no fall-through case to get wrong.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Union

from kazoo.client import TransactionRequest
from kazoo.security import ACL


@dataclass(frozen=True)
class Create:
    """Create ``path`` holding ``data`` (ephemeral: deleted when the session ends)."""

    kind: ClassVar[str] = "create"
    path: str
    data: bytes = b""
    ephemeral: bool = False

    def add_to(self, tx: TransactionRequest, acl: Optional[list[ACL]] = None) -> None:
        """``acl``: the session's choice for this path (None: the session's default)."""
        tx.create(self.path, self.data, acl=acl, ephemeral=self.ephemeral)


@dataclass(frozen=True)
class SetData:
    """Replace the data of ``path``, if its version is still ``version`` (-1: any version)."""

    kind: ClassVar[str] = "set"
    path: str
    data: bytes
    version: int = -1

    def add_to(self, tx: TransactionRequest) -> None:
        """Add this set to the kazoo transaction ``tx``."""
        tx.set_data(self.path, self.data, self.version)


@dataclass(frozen=True)
class Check:
    """Require ``path`` to be at ``version``; changes nothing."""

    kind: ClassVar[str] = "check"
    path: str
    version: int

    def add_to(self, tx: TransactionRequest) -> None:
        """Add this check to the kazoo transaction ``tx``."""
        tx.check(self.path, self.version)


@dataclass(frozen=True)
class Delete:
    """Delete ``path``, if its version is still ``version`` (-1: any version)."""

    kind: ClassVar[str] = "delete"
    path: str
    version: int = -1

    def add_to(self, tx: TransactionRequest) -> None:
        """Add this delete to the kazoo transaction ``tx``."""
        tx.delete(self.path, self.version)


Op = Union[Create, SetData, Check, Delete]
