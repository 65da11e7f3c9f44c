"""``python -m bench [coordination] [iceberg] [spark] [pipeline] [takeover] [retention] [options]``:
run the named benchmarks.

With no name, all of them. Options (``--engine spark``, ``--minutes 1``, ...) go to the suites
that take them: ``pipeline`` (see ``python -m bench pipeline --help``), ``spark``, ``takeover`` and ``retention``.
"""
import sys
from typing import Callable, Optional

from . import coordination, iceberg, pipeline, retention, spark, takeover

SUITES: dict[str, Callable[[list[str]], Optional[int]]] = {
    "coordination": lambda argv: coordination.main(), "iceberg": lambda argv: iceberg.main(),
    "spark": spark.main, "pipeline": pipeline.main, "takeover": takeover.main, "retention": retention.main}
TAKES_OPTIONS = {"spark", "pipeline", "takeover", "retention"}

if __name__ == "__main__":
    args = sys.argv[1:]
    split = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    names, options = args[:split] or list(SUITES), args[split:]
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        sys.exit(f"unknown benchmark {unknown}; choose from {sorted(SUITES)}")
    if options and not set(names) <= TAKES_OPTIONS:
        sys.exit(f"options {options} are for {sorted(TAKES_OPTIONS)} only; run those suites by name")
    for name in names:
        code = SUITES[name](options)
        if code:
            sys.exit(code)
