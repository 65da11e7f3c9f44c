"""The loggers of a ZooKeeper session, named once here for every part of it.

``SESSION_LOG`` (``coordinator.zookeeper.session``) says one line per connection state change (``connection.py``)
and what the session does on its own (``watchdog.py``, ``layout.py``); ``RECONNECT_LOG`` a stuck reconnection
the watchdog retried; ``KAZOO_LOG`` takes kazoo's own lines. Nothing here configures the root logger.
"""
from __future__ import annotations

import logging

SESSION_LOG = logging.getLogger("coordinator.zookeeper.session")
# kazoo logs every reconnection attempt at WARNING (20 lines per job in one outage); the state listener says
# what matters in one line per change, so kazoo's logger passes errors only. A level on our own logger, not on
# kazoo's or the root logger: an application that wants the attempts lowers it.
KAZOO_LOG = logging.getLogger("coordinator.zookeeper.kazoo")
# Not the state-change logger: that one says one line per connection change, and a retried attempt is none.
RECONNECT_LOG = logging.getLogger("coordinator.zookeeper.session.reconnect")
KAZOO_LOG.setLevel(logging.ERROR)
__all__ = ["KAZOO_LOG", "RECONNECT_LOG", "SESSION_LOG"]
