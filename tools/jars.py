"""Prepare the jars a local SparkSession needs for Iceberg (``make setup`` runs this; not shipped in the wheel).

    python -m tools.jars install

On a machine that reaches only PyPI and Debian, it takes Iceberg's official runtime jar from the
PyPI package ``snowpark-connect-deps-iceberg`` and relocates Spark's own Jackson jars to
``org.apache.iceberg.shaded.com.fasterxml.jackson`` (which that jar lacks) with jarjar. It adds
Debian's JDBC drivers (SQLite, PostgreSQL) and their native library directory, and writes the
manifest ``<cache>/jars/classpath.json`` that ``spark_hooks.classpath`` reads. In production,
set ``TIDEMARK_SPARK_JARS`` instead.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

from coordinator.errors import ConfigurationError
from coordinator.settings import Settings
from spark_hooks.classpath import SparkClasspath, manifest_path

ICEBERG_PACKAGE = "snowpark-connect-deps-iceberg==1.0.3"
ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
JACKSON_MODULES = ("jackson-core", "jackson-databind", "jackson-annotations")
RELOCATION_RULE = "rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n"
JARJAR = Path("/usr/share/java/jarjar.jar")
JDBC_DRIVERS = (Path("/usr/share/java/sqlite-jdbc.jar"), Path("/usr/share/java/postgresql.jar"))
JNI_DIR = Path("/usr/lib/x86_64-linux-gnu/jni")


def install(settings: Optional[Settings] = None) -> Path:
    """Build the jar cache (idempotent): Iceberg's runtime jar, relocated Jackson, the manifest naming them."""
    settings = settings or Settings.from_env()
    manifest = manifest_path(settings)
    cache = manifest.parent
    cache.mkdir(parents=True, exist_ok=True)
    runtime = cache / ICEBERG_RUNTIME
    if not runtime.is_file():
        _fetch_iceberg_runtime(runtime)
    jars = [runtime]
    for module in JACKSON_MODULES:
        target = cache / f"{module}-relocated.jar"
        if not target.is_file():
            _relocate(_spark_jar(module), target)
        jars.append(target)
    jars += [p for p in JDBC_DRIVERS if p.is_file()]
    classpath = SparkClasspath(tuple(str(j) for j in jars), str(JNI_DIR) if JNI_DIR.is_dir() else None)
    manifest.write_text(classpath.to_json())
    return cache


def _fetch_iceberg_runtime(target: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        print(f"jars: downloading {ICEBERG_PACKAGE} from PyPI for {ICEBERG_RUNTIME}", flush=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, ICEBERG_PACKAGE],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            member = next(n for n in zf.namelist() if n.endswith("/" + ICEBERG_RUNTIME))
            with zf.open(member) as src, open(f"{target}.part", "wb") as dst:
                shutil.copyfileobj(src, dst)
    os.replace(f"{target}.part", target)


def _spark_jar(module: str) -> Path:
    try:
        import pyspark
    except ImportError:
        raise ConfigurationError("pyspark is not installed: pip install 'tidemark-iceberg[spark]'") from None
    found = sorted((Path(pyspark.__file__).parent / "jars").glob(f"{module}-2.*.jar"))
    if not found:
        raise ConfigurationError(f"pyspark ships no {module} jar; set TIDEMARK_SPARK_JARS instead")
    return found[-1]


def _relocate(source: Path, target: Path) -> None:
    if not JARJAR.is_file():
        raise ConfigurationError(f"{JARJAR} not found: apt-get install libjarjar-java (make setup does)")
    if shutil.which("java") is None:
        raise ConfigurationError("java not found on PATH: apt-get install openjdk-17-jre-headless")
    with tempfile.TemporaryDirectory() as tmp:
        # jarjar cannot read the Java 9+ multi-release classes under META-INF/versions.
        flat = Path(tmp) / source.name
        with zipfile.ZipFile(source) as src, zipfile.ZipFile(flat, "w", zipfile.ZIP_DEFLATED) as dst:
            for item in src.infolist():
                if not item.filename.startswith("META-INF/versions/"):
                    dst.writestr(item, src.read(item.filename))
        rules = Path(tmp) / "rules.txt"
        rules.write_text(RELOCATION_RULE)
        subprocess.run(["java", "-jar", str(JARJAR), "process", str(rules), str(flat), f"{target}.part"],
                       check=True)
    os.replace(f"{target}.part", target)


def main(argv: list[str]) -> int:
    if argv[1:] != ["install"]:
        print("usage: python -m tools.jars install", file=sys.stderr)
        return 2
    try:
        print(f"jars: ready in {install()}")
    except ConfigurationError as exc:
        print(f"jars: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
