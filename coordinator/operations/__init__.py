"""Operating Tidemark: the ``tidemark`` command, the Prometheus exporter, and the local
ZooKeeper server used by the demo and the tests.

The top of the stack: may import anything in ``coordinator``; nothing in ``coordinator`` imports it
except the package's public re-export of ``EmbeddedZooKeeper``.
"""
