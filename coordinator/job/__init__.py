"""What runs inside a job's driver: the epoch loop (``writer``), a leader's term (``term``), the
terms' contention (``supervisor``), its commit path (``commit``), its Prometheus metrics
(``driver_metrics``) and their HTTP endpoint (``metrics_server``). (The crash points the fault tests use are
``coordinator.crashpoints``, below every layer.)

May import every sub-package above it (foundation, ``zookeeper``, ``iceberg``, ``protocol``,
``history``); Spark stays out (``spark_hooks`` drives this loop from PySpark).
"""
