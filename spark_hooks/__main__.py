"""``python -m spark_hooks conf``: the Spark settings of ``build_spark_session`` for ``spark-submit``.

    python -m spark_hooks conf > tidemark.conf && spark-submit --properties-file tidemark.conf job.py
    spark-submit $(python -m spark_hooks conf --format args) job.py     # beside an image's spark-defaults.conf

Under ``spark-submit`` the driver's JVM starts before the script does, so the jars a session needs (Iceberg's
runtime, the catalog's JDBC driver) must be on the command line: a script's builder is too late for them. The
settings are ``spark_conf``'s for the catalog the environment names (``CatalogSettings.from_env``), as
``build_spark_session`` sets them. Reads the environment only; creates nothing.

Failure behaviour: one ``python -m spark_hooks: error: ...`` line and exit 1 (no pyspark installed, a Spark with no
Iceberg runtime, a catalog that cannot be configured).
"""
from __future__ import annotations

import argparse
import shlex
import sys
from typing import Optional

from coordinator.errors import TidemarkError
from coordinator.iceberg.catalog import CatalogSettings
from spark_hooks.session import spark_conf

PROG = "python -m spark_hooks"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    conf = commands.add_parser("conf", help="the Spark settings of build_spark_session, for spark-submit",
                               description="the Spark settings of build_spark_session for the catalog the "
                                           "environment names, for spark-submit")
    conf.add_argument("--format", choices=("properties", "args"), default="properties",
                      help="properties: a --properties-file (default); args: --conf arguments, shell-quoted")
    args = parser.parse_args(argv)
    try:
        # The embedded catalog may not exist yet: the job's session creates it (build_spark_session).
        found = spark_conf(CatalogSettings.from_env(create_embedded=True))
    except TidemarkError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    if args.format == "args":
        print(" ".join(f"--conf {shlex.quote(f'{key}={value}')}" for key, value in found.items()))
    else:
        print("\n".join(f"{key} {_escaped(value)}" for key, value in found.items()))
    return 0


def _escaped(value: str) -> str:
    """A value as Java's ``Properties.load`` reads it back (a backslash escapes)."""
    return value.replace("\\", "\\\\")


if __name__ == "__main__":
    sys.exit(main())
