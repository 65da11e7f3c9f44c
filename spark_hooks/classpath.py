"""Iceberg's Spark runtime for the installed pyspark: which Maven artifacts, and how Spark gets them.

    runtime = IcebergRuntime.for_spark("4.1")     # or IcebergRuntime.installed(): the installed pyspark's
    runtime.coordinates()                          # ('org.apache.iceberg:iceberg-spark-runtime-4.1_2.13:1.12.0', ...)
    classpath = spark_classpath(settings, {"jdbc:sqlite:/data/catalog.db"})
    classpath.spark_conf()                         # spark.driver.extraClassPath=... or spark.jars.packages=...

Users get Iceberg the way Spark users do: by Maven coordinates. ``spark_classpath`` chooses, in order:

1. ``TIDEMARK_SPARK_JARS``: the jars you name (comma separated), put on the driver's and executors'
   class path as they are (your image's jars, or a mirror's).
2. The jars ``make setup`` downloaded from Maven Central into ``<cache>/maven`` (``TIDEMARK_CACHE``), laid
   out as a Maven repository, when every one this Spark needs is there.
3. Otherwise ``spark.jars.packages``: Spark itself resolves the coordinates from Maven Central (or the
   repositories in ``spark.jars.repositories``) when the session starts, and caches them in Ivy's cache.

The artifacts are Iceberg's Spark runtime for the installed Spark and Scala versions, ``iceberg-aws-bundle``
(``S3FileIO``: object storage) of the same Iceberg release, and the JDBC driver of each SQL catalog the
session names (SQLite's, PostgreSQL's). Spark releases without an official Iceberg runtime are refused.

Failure behaviour: ``ConfigurationError`` naming the Spark version and the ones supported when no Iceberg
runtime exists for it, and naming the missing files when ``TIDEMARK_SPARK_JARS`` names jars that do not exist.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from coordinator.errors import ConfigurationError
from coordinator.settings import Settings

MAVEN_CENTRAL = "https://repo1.maven.org/maven2"
ICEBERG_GROUP = "org.apache.iceberg"
# Spark minor version -> (Scala binary version, the newest Iceberg release with a runtime for it). Iceberg 1.12
# dropped Spark 4.0, and no release has a runtime for Spark 4.2 yet (the 4.1 runtime fails on it:
# IncompatibleClassChangeError, apache/iceberg#17959); pyproject.toml's spark extra pins the same range.
ICEBERG_RUNTIMES: dict[str, tuple[str, str]] = {
    "3.5": ("2.12", "1.12.0"),
    "4.0": ("2.13", "1.11.0"),
    "4.1": ("2.13", "1.12.0"),
}


@dataclass(frozen=True)
class MavenArtifact:
    """One jar in a Maven repository, by its coordinates."""

    group: str
    artifact: str
    version: str
    packaging: str = "jar"  # the file's extension: "tar.gz" for a server's tarball, "zip" for a Trino plugin

    @property
    def coordinate(self) -> str:
        """Its Maven coordinate, ``group:artifact:version`` (as ``spark.jars.packages`` lists it)."""
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def path(self) -> str:
        """Its place in a Maven repository's layout (Maven Central's, or ``<cache>/maven``)."""
        return (f"{self.group.replace('.', '/')}/{self.artifact}/{self.version}/"
                f"{self.artifact}-{self.version}.{self.packaging}")


# The JDBC driver of a SQL catalog, by the subprotocol of its JDBC URI (jdbc:<subprotocol>:...). Maven's
# sqlite-jdbc carries its native libraries, so nothing else is needed on the machine.
JDBC_DRIVERS: dict[str, MavenArtifact] = {
    "sqlite": MavenArtifact("org.xerial", "sqlite-jdbc", "3.54.1.0"),
    "postgresql": MavenArtifact("org.postgresql", "postgresql", "42.7.14"),
}


@dataclass(frozen=True)
class IcebergRuntime:
    """Iceberg's artifacts for one Spark minor version."""

    spark_version: str
    scala_version: str
    iceberg_version: str

    @classmethod
    def for_spark(cls, spark_version: str) -> IcebergRuntime:
        """The runtime of Spark ``spark_version`` (``"3.5.7"`` or ``"3.5"``); ``ConfigurationError`` if none exists."""
        minor = ".".join(spark_version.split(".")[:2])
        if minor not in ICEBERG_RUNTIMES:
            raise ConfigurationError(
                f"Iceberg publishes no Spark runtime for Spark {spark_version}: install pyspark "
                f"{', '.join(ICEBERG_RUNTIMES)} (the package's spark extra picks one), or set "
                "TIDEMARK_SPARK_JARS to runtime jars you built for it")
        scala, iceberg = ICEBERG_RUNTIMES[minor]
        return cls(minor, scala, iceberg)

    @classmethod
    def installed(cls) -> IcebergRuntime:
        """The runtime of the installed pyspark."""
        try:
            import pyspark
        except ImportError:
            raise ConfigurationError("pyspark is not installed: install the package with its spark extra "
                                     "(pip install '.[spark]' in a clone)") from None
        return cls.for_spark(pyspark.__version__)

    def artifacts(self) -> tuple[MavenArtifact, ...]:
        """Iceberg's Spark runtime and ``iceberg-aws-bundle`` (S3FileIO) of the same release."""
        runtime = f"iceberg-spark-runtime-{self.spark_version}_{self.scala_version}"
        return (MavenArtifact(ICEBERG_GROUP, runtime, self.iceberg_version),
                MavenArtifact(ICEBERG_GROUP, "iceberg-aws-bundle", self.iceberg_version))

    def coordinates(self) -> tuple[str, ...]:
        """The Maven coordinates of ``artifacts()``, the runtime's first."""
        return tuple(a.coordinate for a in self.artifacts())


@dataclass(frozen=True)
class SparkClasspath:
    """How a session gets its jars: files on the JVMs' class path, or Maven coordinates for Spark to resolve."""

    jars: tuple[str, ...] = ()
    packages: tuple[str, ...] = ()

    def spark_conf(self) -> dict[str, str]:
        """The session settings: ``spark.jars.packages`` for coordinates, else the jars on the driver's and the
        executors' own class path (``spark.driver.extraClassPath``, ``spark.executor.extraClassPath``)."""
        if self.packages:
            return {"spark.jars.packages": ",".join(self.packages)}
        # On the JVMs' own class path, not spark.jars: the class loader every JDBC DriverManager lookup sees.
        joined = ":".join(self.jars)
        return {"spark.driver.extraClassPath": joined, "spark.executor.extraClassPath": joined}


def jdbc_drivers(jdbc_uris: Iterable[str]) -> tuple[MavenArtifact, ...]:
    """The JDBC driver of each ``jdbc:<subprotocol>:...`` URI that Tidemark knows a driver for, once each."""
    found: dict[str, MavenArtifact] = {}
    for uri in jdbc_uris:
        subprotocol = uri.split(":")[1] if uri.startswith("jdbc:") and uri.count(":") >= 2 else ""
        if subprotocol in JDBC_DRIVERS:
            found[subprotocol] = JDBC_DRIVERS[subprotocol]
    return tuple(found.values())


def cached_jar(settings: Settings, artifact: MavenArtifact) -> Path:
    """Where ``make setup`` keeps ``artifact``: ``<cache>/maven``, in a Maven repository's layout."""
    return settings.cache / "maven" / artifact.path


def spark_classpath(settings: Optional[Settings] = None, jdbc_uris: Iterable[str] = ()) -> SparkClasspath:
    """The jars of ``TIDEMARK_SPARK_JARS``, else those cached by ``make setup``, else Maven coordinates for Spark."""
    settings = settings or Settings.from_env()
    if settings.spark_jars:
        missing = [j for j in settings.spark_jars if not Path(j).is_file()]
        if missing:
            raise ConfigurationError(f"TIDEMARK_SPARK_JARS names jars that do not exist: {', '.join(missing)}")
        return SparkClasspath(jars=settings.spark_jars)
    needed = IcebergRuntime.installed().artifacts() + jdbc_drivers(jdbc_uris)
    cached = [cached_jar(settings, a) for a in needed]
    if all(path.is_file() for path in cached):
        return SparkClasspath(jars=tuple(str(path) for path in cached))
    return SparkClasspath(packages=tuple(a.coordinate for a in needed))
