"""Which ACL a znode a session creates gets, and the ``PermissionDenied`` that says which identity to use when a
znode's ACL refuses a request. No requests here: ``layout.py`` reads and repairs ACLs, ``security.py`` says
what each identity's ACLs are.
"""
from __future__ import annotations

from typing import Optional

from coordinator.errors import PermissionDenied
from coordinator.zookeeper.paths import Paths
from coordinator.zookeeper.security import Credentials


class Acls:
    """The ACLs of one session's znodes, by its identities (``Credentials``) and the tree's ``Paths``.

    ``owned`` is the ACL of the znodes of this session's job, once a session with a job identity learnt the
    operator's entry (``Layout.learn_operator``); else None.
    """

    credentials: Credentials
    paths: Paths
    owned: Optional[list]

    def __init__(self, credentials: Credentials, paths: Paths) -> None:
        self.credentials = credentials
        self.paths = paths
        self.owned = None

    def acl_for(self, path: str) -> Optional[list]:
        """The ACL a znode created at ``path`` gets: its job's (``owned``) for a job's znode in a session with a
        job identity, else the session's default (None)."""
        return self.owned if self.owned is not None and self.paths.job_owned(path) else None

    def top_level(self, path: str) -> Optional[list]:
        """The ACL of the top-level znode ``path``: the readers' for ``/readers``, else the default."""
        return self.credentials.readers_acl() if path == self.paths.readers else self.credentials.default_acl()

    def denied(self, what: str) -> PermissionDenied:
        """The ``PermissionDenied`` for ``what``, refused by a znode's ACL, saying which identity to use (returned,
        for the caller to raise)."""
        credentials = self.credentials
        hint = ("set TIDEMARK_ZK_USER and TIDEMARK_ZK_PASSWORD to the writer identity this tree is secured with"
                if not credentials.is_writer else
                "a job identity changes only its own job's znodes: run this as that job, or as the operator "
                "(TIDEMARK_ZK_OPERATOR_USER/_PASSWORD)" if credentials.is_job else
                "this tree is secured with another writer identity, or the znode is a job's that has its own "
                "identity: use that one (TIDEMARK_ZK_USER/_PASSWORD), or the operator's "
                "(TIDEMARK_ZK_OPERATOR_USER/_PASSWORD)")
        return PermissionDenied(f"ZooKeeper refused {what} to {credentials.identity} (NoAuth): {hint}")


__all__ = ["Acls"]
