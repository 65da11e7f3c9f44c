"""The coordination recipes over ZooKeeper, one per module: topology, registry (register,
fence, unregister), leadership, barriers, the epoch state machine (``epochs``), tidemarks,
and ``status`` (one consistent read of all of them).

May import the foundation, ``coordinator.zookeeper`` and ``coordinator.iceberg`` (registration
fences sinks and resumes from their Iceberg metadata). Recipes take a ``ZooKeeperSession``.
"""
