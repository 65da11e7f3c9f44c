"""A SparkSession with Iceberg's extensions and the Tidemark catalog.

    spark = build_spark_session(CatalogSettings.embedded())   # or CatalogSettings.from_env()

The catalog is configured with ``cache-enabled=false`` so Spark sees the refs that
Tidemark moves from Python when it publishes staged snapshots.
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


def spark_conf(catalog: CatalogSettings, jars: Optional[list[str]] = None) -> dict[str, str]:
    """Every Spark setting Tidemark needs, as a plain dict (for spark-submit or a Kubernetes manifest)."""
    classpath = spark_classpath() if jars is None else SparkClasspath(tuple(jars))
    joined = os.pathsep.join(classpath.jars)
    # JDBC drivers must be on the JVM class path (DriverManager ignores spark.jars' class loader).
    conf = {
        "spark.driver.extraClassPath": joined,
        "spark.executor.extraClassPath": joined,
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.sql.defaultCatalog": catalog.name,
    }
    if classpath.java_library_path:  # e.g. Debian's sqlite-jdbc loads its native library from there
        java_opts = f"-Djava.library.path={classpath.java_library_path}"
        conf["spark.driver.extraJavaOptions"] = java_opts
        conf["spark.executor.extraJavaOptions"] = java_opts
    conf.update(catalog.spark_conf())
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
        raise ConfigurationError("pyspark is not installed: pip install 'tidemark-iceberg[spark]'") from None
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
    conf.update(spark_conf(catalog, jars))
    conf.update(extra_conf or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    catalog.load()  # creates the catalog tables pyiceberg's way before Spark's JdbcCatalog looks at them
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
