"""``python -m bench [SUITE ...] [options]``: run the named benchmark suites (with no name, all of them).

Options (``--engine spark``, ``--minutes 1``, ``--smoke``, ...) go to every suite named; each suite's
own ``--help`` lists them, e.g. ``python -m bench scale --help``.
"""
import importlib
import sys
from typing import Callable, Optional

# name -> (module, one line on what it measures)
SUITES: dict[str, tuple[str, str]] = {
    "coordination": ("coordination", "ZooKeeper round trips per epoch, epochs/s by sink count, status of 1,000 jobs"),
    "iceberg": ("iceberg", "resolution latency for 10-1,000 tables, publish latency, marking an empty epoch"),
    "spark": ("spark", "a Tidemark epoch vs a plain Iceberg append of the same DataFrame (Spark)"),
    "pipeline": ("pipeline", "a 3-job cascade against the clock: freshness, overload, catch-up (python or spark)"),
    "takeover": ("takeover", "kill -9 of a leader to the standby's first commit, warm vs cold"),
    "retention": ("retention", "the default policy at 2 s barriers vs every version tagged vs no GC; 10,000 epochs "
                               "with GC on its schedule vs without"),
    "serve": ("serve", "tidemark serve: loadTable through it vs the catalog directly, 200 clients beside the writers, "
                       "a Trino join"),
    "scale": ("scale", "many pipelines on one ZooKeeper: isolation, cost per job, catch-up, mixed cadence, "
                       "overload, idle epochs"),
}


def usage() -> str:
    width = max(map(len, SUITES))
    lines = [__doc__.strip(), "", "Suites:"]
    lines += [f"  {name:<{width}}  {what}" for name, (_, what) in SUITES.items()]
    lines += ["", "Examples:", "  python -m bench coordination iceberg", "  python -m bench scale --smoke",
              "  python -m bench pipeline --engine python --scenario catchup --pause 60"]
    return "\n".join(lines)


def runner(name: str) -> Callable[[list[str]], Optional[int]]:
    module = importlib.import_module(f"bench.{SUITES[name][0]}")
    return module.main


def main(args: list[str]) -> int:
    split = next((i for i, a in enumerate(args) if a.startswith("-")), len(args))
    names, options = args[:split], args[split:]
    if not names and options and options[0] in ("-h", "--help"):
        print(usage())
        return 0
    unknown = [n for n in names if n not in SUITES]
    if unknown:
        print(f"unknown benchmark {unknown}; choose from {list(SUITES)}\n\n{usage()}", file=sys.stderr)
        return 2
    if options and not names:
        print(f"name the suites the options {options} are for\n\n{usage()}", file=sys.stderr)
        return 2
    for name in names or list(SUITES):
        code = runner(name)(options)
        if code:
            return int(code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
