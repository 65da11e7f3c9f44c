"""A SparkSession with Iceberg's extensions and the Tidemark catalog.

    spark = build_spark_session(CatalogSettings.embedded())   # or CatalogSettings.from_env()

The catalog is configured with ``cache-enabled=false`` so Spark sees the refs that
Tidemark moves from Python when it publishes staged snapshots.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Optional

from coordinator.errors import ConfigurationError
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.settings import DEFAULT_SPARK_MASTER, Settings

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
ICEBERG_RUNTIME_PREFIX = "iceberg-spark-runtime-"
JNI_DIR = Path("/usr/lib/x86_64-linux-gnu/jni")  # where Debian's sqlite-jdbc finds its native library


def spark_jars(settings: Optional[Settings] = None) -> list[str]:
    """The jars for the driver's and executors' class path: ``TIDEMARK_SPARK_JARS``, else every jar in
    ``$TIDEMARK_CACHE/jars``; a ConfigurationError saying how to provide Iceberg's runtime when neither has it."""
    settings = settings or Settings.from_env()
    if settings.spark_jars:
        missing = [j for j in settings.spark_jars if not Path(j).is_file()]
        if missing:
            raise ConfigurationError(f"TIDEMARK_SPARK_JARS names jars that do not exist: {', '.join(missing)}")
        return list(settings.spark_jars)
    cache = settings.cache / "jars"
    jars = sorted(str(p) for p in cache.glob("*.jar")) if cache.is_dir() else []
    if not any(Path(j).name.startswith(ICEBERG_RUNTIME_PREFIX) for j in jars):
        raise ConfigurationError(
            f"Iceberg's Spark runtime jar is not in {cache}: set TIDEMARK_SPARK_JARS to your "
            "iceberg-spark-runtime-3.5_2.12 jar and JDBC driver (comma separated), or, in a clone of "
            "Tidemark, run `make setup` (python -m tools.jars install)")
    return jars


def spark_conf(catalog: CatalogSettings, jars: Optional[list[str]] = None) -> dict[str, str]:
    """Every Spark setting Tidemark needs, as a plain dict (for spark-submit or a Kubernetes manifest)."""
    jars = spark_jars() if jars is None else jars
    classpath = os.pathsep.join(jars)
    # JDBC drivers must be on the JVM class path (DriverManager ignores spark.jars' class loader).
    conf = {
        "spark.driver.extraClassPath": classpath,
        "spark.executor.extraClassPath": classpath,
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.sql.defaultCatalog": catalog.name,
    }
    if JNI_DIR.is_dir():  # Debian's sqlite-jdbc loads its native library from here
        java_opts = f"-Djava.library.path={JNI_DIR}"
        conf["spark.driver.extraJavaOptions"] = java_opts
        conf["spark.executor.extraJavaOptions"] = java_opts
    conf.update(catalog.spark_conf())
    return conf


def build_spark_session(catalog: Optional[CatalogSettings] = None, *, app_name: str = "tidemark",
                        master: Optional[str] = None, jars: Optional[list[str]] = None,
                        extra_conf: Optional[Mapping[str, str]] = None):
    """Create (or return the running) SparkSession configured for Iceberg and ``catalog``."""
    settings = Settings.from_env()
    if shutil.which("java") is None and not settings.java_home:
        raise ConfigurationError("Java not found: install a Java 17 runtime "
                                 "(apt-get install openjdk-17-jre-headless; make setup does) or set JAVA_HOME")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ConfigurationError("pyspark is not installed: pip install 'tidemark[spark]'") from None
    catalog = catalog or CatalogSettings.from_env()
    builder = SparkSession.builder.appName(app_name)
    conf = {"spark.ui.showConsoleProgress": "false"}
    # With SPARK_HOME set (the image) and no master asked for, spark-defaults.conf in SPARK_CONF_DIR names
    # the master and every other setting: builder settings would override it.
    if master or settings.spark_master or not settings.spark_home:
        master = master or settings.spark_master or DEFAULT_SPARK_MASTER
        builder = builder.master(master)
        if master.startswith("local"):
            conf["spark.sql.shuffle.partitions"] = "4"  # Spark's 200 only slow a local session down
    conf.update(spark_conf(catalog, jars))
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    catalog.load()  # creates the catalog tables pyiceberg's way before Spark's JdbcCatalog looks at them
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
