"""A SparkSession with Iceberg's extensions and the Tidemark catalog.

    spark = build_spark_session(CatalogSettings.embedded())   # or CatalogSettings.from_env()

The catalog is configured with ``cache-enabled=false`` so Spark sees the refs that
Tidemark moves from Python when it publishes staged snapshots. Iceberg's jars come as
``spark_hooks.classpath`` chooses: ``TIDEMARK_SPARK_JARS``, the jars ``make setup`` cached, or
``spark.jars.packages`` with the coordinates that match the installed pyspark.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Optional

from coordinator.errors import ConfigurationError
from coordinator.iceberg.catalog import CatalogSettings
from coordinator.settings import Settings
from spark_hooks.classpath import SparkClasspath, spark_classpath

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
# Settings by which a user's own conf brings jars: Tidemark adds its own to them, unless they name Iceberg's runtime
# already (their image, --packages, a mirror).
USER_CLASSPATH_KEYS = ("spark.jars", "spark.jars.packages", "spark.driver.extraClassPath",
                       "spark.executor.extraClassPath")
ICEBERG_RUNTIME_ARTIFACT = "iceberg-spark-runtime"
# Spark's own pattern, and a REST catalog's OAuth2 client secret (`credential`): values of matching settings are
# hidden in the Spark UI, its REST API and event logs.
REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|credential"


def spark_conf(catalog: CatalogSettings, jars: Optional[list[str]] = None,
               extra_conf: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Every Spark setting Tidemark needs, as a plain dict (for spark-submit or a Kubernetes manifest).

    ``jars``: the jars to put on the class path instead of ``spark_classpath``'s choice. ``extra_conf`` is
    applied last; its SQL catalogs get their JDBC drivers too. Jars or packages it names itself
    (``USER_CLASSPATH_KEYS``) are kept, Tidemark's added before them; when they name Iceberg's Spark runtime
    already, the class path is left to them."""
    conf = {"spark.sql.extensions": ICEBERG_EXTENSIONS, "spark.sql.defaultCatalog": catalog.name,
            "spark.redaction.regex": REDACTION_REGEX}
    conf.update(catalog.spark_conf())
    conf.update(extra_conf or {})
    if jars is None and any(ICEBERG_RUNTIME_ARTIFACT in conf.get(key, "") for key in USER_CLASSPATH_KEYS):
        return conf
    jdbc_uris = [v for k, v in conf.items() if k.startswith("spark.sql.catalog.") and k.endswith(".uri")]
    classpath = spark_classpath(jdbc_uris=jdbc_uris) if jars is None else SparkClasspath(jars=tuple(jars))
    for key, value in classpath.spark_conf().items():
        separator = "," if key == "spark.jars.packages" else os.pathsep
        conf[key] = f"{value}{separator}{conf[key]}" if conf.get(key) else value
    return conf


def build_spark_session(catalog: Optional[CatalogSettings] = None, *, app_name: str = "tidemark",
                        master: Optional[str] = None, jars: Optional[list[str]] = None,
                        extra_conf: Optional[Mapping[str, str]] = None):
    """Create (or return the running) SparkSession configured for Iceberg and ``catalog``."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        raise ConfigurationError("Java not found: install a Java 17 runtime "
                                 "(apt-get install openjdk-17-jre-headless; make setup does) or set JAVA_HOME")
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise ConfigurationError("pyspark is not installed: install the package with its spark extra "
                                 "(pip install '.[spark]' in a clone)") from None
    catalog = catalog or CatalogSettings.from_env()
    builder = SparkSession.builder.appName(app_name)
    conf = {"spark.ui.showConsoleProgress": "false"}
    # With SPARK_HOME set (the image), spark-defaults.conf in SPARK_CONF_DIR names the master and
    # every other setting: builder settings would override it.
    if master or not os.environ.get("SPARK_HOME"):
        master = master or Settings.from_env().spark_master or "local[2]"
        builder = builder.master(master)
        if master.startswith("local"):
            conf["spark.sql.shuffle.partitions"] = "4"  # Spark's 200 only slow a local session down
    conf.update(spark_conf(catalog, jars, extra_conf))
    for key, value in conf.items():
        builder = builder.config(key, value)
    catalog.load()  # creates the catalog tables pyiceberg's way before Spark's JdbcCatalog looks at them
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
