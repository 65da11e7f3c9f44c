"""The tree's layout: the top-level znodes every session may create, the repair of their ACLs when anyone may
change them, the operator identity a job's session gives its znodes to, and the check of a znode's ACL before a
change that starts outside ZooKeeper. Requests go through ``calls.py``; which ACL is which is ``acls.py``'s.
"""
from __future__ import annotations

from typing import Optional

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError

from coordinator.errors import ConfigurationError, PermissionDenied
from coordinator.records import TopologyVersion
from coordinator.zookeeper.acls import Acls
from coordinator.zookeeper.calls import Calls
from coordinator.zookeeper.logs import SESSION_LOG
from coordinator.zookeeper.security import is_open


class Layout:
    """Creates and secures one session's tree: ``ensure_path``, ``ensure_layout`` (with ``_repair_open_acls``),
    ``learn_operator`` and ``may_change``."""

    client: KazooClient
    calls: Calls
    acls: Acls

    def __init__(self, client: KazooClient, calls: Calls, acls: Acls) -> None:
        self.client = client
        self.calls = calls
        self.acls = acls

    def ensure_path(self, path: str, data: bytes = b"", acl: Optional[list] = None) -> None:
        """Create ``path`` (with its missing parents) holding ``data`` unless it exists; a concurrent creation is
        fine.

        :param acl: the ACL it gets (None: the session's default).
        """
        # Look first: creating an existing znode under another user's ACL fails with NoAuth, not NodeExists.
        if self.calls.call(f"exists {path}", self.client.exists_async, path) is not None:
            return
        try:
            self.calls.call(f"create {path}", self.client.create_async, path, data, acl, False, False, True)
        except NodeExistsError:
            pass

    def ensure_layout(self) -> None:
        """Create the top-level znodes once (idempotent, safe to race) and, with the writer identity, secure them.

        A read-only session (only the reader identity) creates nothing.
        """
        credentials, paths = self.acls.credentials, self.acls.paths
        if credentials.read_only:
            return
        self.ensure_path(paths.topology, TopologyVersion(0).to_json())
        for path in paths.top_level():
            self.ensure_path(path, acl=self.acls.top_level(path))
        if credentials.is_writer:
            self._repair_open_acls()

    def may_change(self, path: str, perms: int) -> bool:
        """Whether ``path``'s ACL gives one of the session's identities ``perms`` (kazoo ``Permissions``)."""
        found = self.calls.call(f"read the ACL of {path}", self.client.get_acls_async, path)
        return self.acls.credentials.may_change(found[0], perms)

    def learn_operator(self) -> None:
        """Find the operator identity's entry (its digest) in the ACL of ``/jobs``, which an operator's session
        gave it, for the ACL of this job's znodes (``Acls.owned``).

        :raises ConfigurationError: no operator session connected yet.
        """
        credentials, jobs = self.acls.credentials, self.acls.paths.jobs
        acl = self.calls.call(f"read the ACL of {jobs}", self.client.get_acls_async, jobs)[0]
        entry = credentials.operator_entry(acl)
        if entry is None:
            full = (self.client.chroot or "") + jobs
            raise ConfigurationError(
                f"{full} does not name the operator identity {credentials.operator_user!r}, so the znodes of "
                f"job identity {credentials.job_user!r} could not be given to it: run `tidemark init` once as "
                "the operator (TIDEMARK_ZK_USER/_PASSWORD with TIDEMARK_ZK_OPERATOR_USER/_PASSWORD), then start "
                "the job again")
        self.acls.owned = credentials.owned_acl(entry)

    def _repair_open_acls(self) -> None:
        """Give the writer's ACL to every top-level znode anyone may change (an unauthenticated client made it)."""
        credentials, paths = self.acls.credentials, self.acls.paths
        nodes = [paths.topology, *paths.top_level()]
        if paths.root != "/":
            nodes.insert(0, paths.root)

        def read_acls() -> list:
            pending = [self.client.get_acls_async(path) for path in nodes]
            return [result.get(timeout=self.calls.operation_timeout)[0] for result in pending]
        for path, acl in zip(nodes, self.calls.with_deadline("reading the top-level ACLs", read_acls)):
            if not is_open(acl):
                if credentials.lacks_operator(acl):  # made before the operator identity came: add it
                    self._set_acl(path)
                    SESSION_LOG.info("%s: gave the operator identity %r every permission", path,
                                     credentials.operator_user)
                continue
            try:
                self._set_acl(path)
            except PermissionDenied:
                full = (self.client.chroot or "") + path
                raise PermissionDenied(
                    f"{full} was created by an unauthenticated client, anyone may change it, and ZooKeeper does "
                    f"not let {credentials.identity} repair its ACL: have a ZooKeeper admin run "
                    f"`setAcl {full} digest:{credentials.user}:<digest>:cdrwa,world:anyone:r` (zkCli.sh), "
                    "or delete the tree if it holds nothing yet, then connect again") from None
            SESSION_LOG.warning("%s was open to anyone (created by an unauthenticated client): gave it the writer's "
                                "ACL", path)

    def _set_acl(self, path: str) -> None:
        self.calls.call(f"set the ACL of {path}", self.client.set_acls_async, path, self.acls.top_level(path))


__all__ = ["Layout"]
