"""Losing ZooKeeper's state in a test: the whole chroot deleted, as an ensemble that lost its data would."""
from __future__ import annotations

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError

from tests.helpers.wait import wait_for


def wipe_zookeeper(zk_server, zk_connect: str) -> None:
    """Delete the test's whole chroot (``zk_connect``'s path), retrying while live sessions create nodes in it."""
    wiper = KazooClient(hosts=zk_server.connect_string)
    wiper.start(30)
    chroot = "/" + zk_connect.split("/", 1)[1]

    def wiped() -> bool:
        try:
            wiper.delete(chroot, recursive=True)
        except (NotEmptyError, NoNodeError):
            pass  # a node was created during the recursive delete: delete again
        return wiper.exists(chroot) is None
    try:
        wait_for(wiped, "the whole tree to be deleted", 30)
    finally:
        wiper.stop()
        wiper.close()
