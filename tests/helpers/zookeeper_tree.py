"""Losing ZooKeeper's state in a test: the whole chroot deleted, as an ensemble that lost its data would, the
server rebuilt empty on the same address, or restored from a copy of its data directory taken earlier."""
from __future__ import annotations

import shutil
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError, NotEmptyError

from coordinator import EmbeddedZooKeeper
from tests.helpers.wait import wait_for


def wipe_zookeeper(zk_server, zk_connect: str) -> None:
    """Delete the test's whole chroot (``zk_connect``'s path), retrying while live sessions create nodes in it."""
    delete_tree(zk_server.connect_string, "/" + zk_connect.split("/", 1)[1])


def delete_tree(hosts: str, chroot: str) -> None:
    """Delete ``chroot`` on ``hosts`` with everything under it, retrying while live sessions create nodes in it."""
    wiper = KazooClient(hosts=hosts)
    wiper.start(30)

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


def rebuild_server(zk: EmbeddedZooKeeper) -> None:
    """What rebuilding or restoring an ensemble from nothing does to a server: its data gone, the same address."""
    zk.stop()
    shutil.rmtree(zk.data_dir / "data")
    zk.start()


def back_up_server(zk: EmbeddedZooKeeper, to: Path) -> None:
    """A copy of the running server's data directory, as a backup of it is taken (its snapshots and transaction
    logs: the server replays them on a restore)."""
    shutil.copytree(zk.data_dir / "data", to)


def restore_server(zk: EmbeddedZooKeeper, backup: Path) -> None:
    """The server restored from ``backup`` (``back_up_server``): stopped, its data replaced, started again."""
    zk.stop()
    shutil.rmtree(zk.data_dir / "data")
    shutil.copytree(backup, zk.data_dir / "data")
    zk.start()
