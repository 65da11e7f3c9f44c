"""The jars a SparkSession needs for Iceberg: ``TIDEMARK_SPARK_JARS``, or the set ``make setup`` prepared.

    classpath = spark_classpath()        # SparkClasspath(jars=(...), java_library_path=...)

In production, add ``org.apache.iceberg:iceberg-spark-runtime-3.5_2.12`` as usual and point
``TIDEMARK_SPARK_JARS`` at the jars (comma separated), or pass ``jars=`` to ``build_spark_session``.
A development machine gets them from ``make setup`` (``tools/jars.py``, not part of the
installed package): it writes ``<cache>/jars/classpath.json``, naming every jar and the JVM's
native library directory, which this module reads.

Failure behaviour: ``ConfigurationError`` saying how to provide the jars when none are configured,
the manifest is unreadable, or a named jar does not exist.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from coordinator.errors import ConfigurationError
from coordinator.settings import Settings

MANIFEST = "classpath.json"


@dataclass(frozen=True)
class SparkClasspath:
    """Jars for the driver's and executors' class path, and where the JVM finds their native libraries."""

    jars: tuple[str, ...]
    java_library_path: Optional[str] = None

    def to_json(self) -> str:
        return json.dumps({"jars": list(self.jars), "java_library_path": self.java_library_path}, indent=2)


def manifest_path(settings: Settings) -> Path:
    return settings.cache / "jars" / MANIFEST


def spark_classpath(settings: Optional[Settings] = None) -> SparkClasspath:
    """``TIDEMARK_SPARK_JARS`` if set, else the jars ``make setup`` prepared; ``ConfigurationError`` otherwise."""
    settings = settings or Settings.from_env()
    if settings.spark_jars:
        return _existing(SparkClasspath(settings.spark_jars), "TIDEMARK_SPARK_JARS")
    manifest = manifest_path(settings)
    if not manifest.is_file():
        raise ConfigurationError(
            f"Iceberg's Spark runtime jars are not prepared ({manifest} is missing): run `make setup`, "
            "or set TIDEMARK_SPARK_JARS to your iceberg-spark-runtime-3.5_2.12 jar(s), comma separated")
    try:
        data = json.loads(manifest.read_text())
        classpath = SparkClasspath(tuple(str(j) for j in data["jars"]), data.get("java_library_path"))
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigurationError(f"{manifest} is unreadable: run `make setup` again") from None
    return _existing(classpath, str(manifest))


def _existing(classpath: SparkClasspath, named_by: str) -> SparkClasspath:
    missing = [j for j in classpath.jars if not Path(j).is_file()]
    if missing:
        raise ConfigurationError(f"{named_by} names jars that do not exist: {', '.join(missing)}")
    return classpath
