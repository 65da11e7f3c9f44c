"""The jars a local SparkSession needs for Iceberg, and how ``make setup`` builds them.

In production, add ``org.apache.iceberg:iceberg-spark-runtime-3.5_2.12`` as usual and point
``TIDEMARK_SPARK_JARS`` at your jars (comma separated). On a machine that reaches only PyPI
and Debian, ``install()`` takes Iceberg's official runtime jar from the PyPI package
``snowpark-connect-deps-iceberg`` and relocates Spark's own Jackson jars to
``org.apache.iceberg.shaded.com.fasterxml.jackson`` (which that jar lacks) with jarjar.

Run ``python -m spark_hooks.jars install`` (``make setup`` does) to build the cache.
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

ICEBERG_PACKAGE = "snowpark-connect-deps-iceberg==1.0.3"
ICEBERG_RUNTIME = "iceberg-spark-runtime-3.5_2.12-1.10.2.jar"
JACKSON_MODULES = ("jackson-core", "jackson-databind", "jackson-annotations")
RELOCATION_RULE = "rule com.fasterxml.jackson.** org.apache.iceberg.shaded.com.fasterxml.jackson.@1\n"
JARJAR = Path("/usr/share/java/jarjar.jar")
JDBC_DRIVERS = (Path("/usr/share/java/sqlite-jdbc.jar"), Path("/usr/share/java/postgresql.jar"))
JNI_DIR = Path("/usr/lib/x86_64-linux-gnu/jni")


def cache_dir() -> Path:
    base = os.environ.get("TIDEMARK_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tidemark")
    return Path(base) / "jars"


def spark_jars() -> list[str]:
    """The jars to put on the driver and executor class path, or a ConfigurationError saying how to get them."""
    configured = os.environ.get("TIDEMARK_SPARK_JARS")
    if configured:
        jars = [j.strip() for j in configured.split(",") if j.strip()]
        missing = [j for j in jars if not Path(j).is_file()]
        if missing:
            raise ConfigurationError(f"TIDEMARK_SPARK_JARS names jars that do not exist: {', '.join(missing)}")
        return jars
    cache = cache_dir()
    wanted = [cache / ICEBERG_RUNTIME] + [cache / f"{m}-relocated.jar" for m in JACKSON_MODULES]
    if not all(p.is_file() for p in wanted):
        raise ConfigurationError(
            f"Iceberg's Spark runtime jars are not in {cache}: run `make setup` "
            "(or `python -m spark_hooks.jars install`), or set TIDEMARK_SPARK_JARS to your own "
            "iceberg-spark-runtime-3.5_2.12 jar(s), comma separated")
    return [str(p) for p in wanted] + [str(p) for p in JDBC_DRIVERS if p.is_file()]


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
        print("usage: python -m spark_hooks.jars install", file=sys.stderr)
        return 2
    try:
        print(f"jars: ready in {install()}")
    except ConfigurationError as exc:
        print(f"jars: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
