"""Reading and keeping consistent versions: resolving a consistent version across tables
(``resolve``), reading one with pandas, polars, DuckDB, Spark SQL or Trino (``readers``), checking one
(``checker``), the retention policy, retained versions and their Iceberg tags, and garbage collection
(``gc``, ``gc_schedule``).

May import the foundation, ``coordinator.zookeeper``, ``coordinator.iceberg`` and ``coordinator.protocol``.
"""
