"""What runs inside a job's driver: the epoch loop (``writer``), its commit path (``commit``),
its Prometheus metrics and their HTTP endpoint. (The crash points the fault tests use are
``coordinator.crashpoints``, below every layer.)

May import every sub-package above it (foundation, ``zookeeper``, ``iceberg``, ``protocol``,
``history``); Spark stays out (``spark_hooks`` drives this loop from PySpark).
"""
