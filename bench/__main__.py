"""``python -m bench [coordination] [iceberg] [spark]``: run the named benchmarks (all by default)."""
import sys

from . import coordination, iceberg, spark

SUITES = {"coordination": coordination.main, "iceberg": iceberg.main, "spark": spark.main}

if __name__ == "__main__":
    names = sys.argv[1:] or list(SUITES)
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        sys.exit(f"unknown benchmark {unknown}; choose from {sorted(SUITES)}")
    for name in names:
        SUITES[name]()
