"""A catalog's properties, configured once: read from pyiceberg's own configuration, and turned into Spark's.

    pyiceberg_properties("lake")      # .pyiceberg.yaml or PYICEBERG_CATALOG__LAKE__*, as pyiceberg reads them
    java_properties({"type": "rest", "uri": "http://rest:8181", "s3.endpoint": "http://s3:9000", ...})
        # {"type": "rest", "uri": ..., "s3.endpoint": ..., "s3.path-style-access": "true",
        #  "io-impl": "org.apache.iceberg.aws.s3.S3FileIO", ...}: spark.sql.catalog.<name>.* without the prefix

pyiceberg and Iceberg's Java catalogs name most properties alike (``uri``, ``warehouse``, ``credential``,
``token``, ``scope``, ``oauth2-server-uri``, ``prefix``, ``header.*``, ``rest.sigv4-enabled``,
``rest.signing-region``, ``rest.signing-name``, ``s3.endpoint``, ``s3.access-key-id``,
``s3.secret-access-key``, ``s3.session-token``): those pass as they are. What differs is translated here,
in one place:

- ``s3.region`` is Java's ``client.region``;
- pyiceberg addresses buckets by path unless ``s3.force-virtual-addressing`` is true; Java's S3FileIO does the
  opposite unless ``s3.path-style-access`` is true: with an ``s3.endpoint`` (MinIO, SeaweedFS, Ceph), Java is
  given pyiceberg's choice, so both reach the same URLs;
- a warehouse or properties on S3 need Java's ``S3FileIO`` (``io-impl``; its classes are in
  ``iceberg-aws-bundle``, which ``make setup`` and ``spark.jars.packages`` bring beside the runtime);
- Python-only properties (``py-io-impl``, ``py-catalog-impl``) are left out;
- ``type`` is Java's for REST, Glue and Hive; pyiceberg's ``sql`` catalog is given to Tidemark as
  ``TIDEMARK_CATALOG_URI`` instead (it knows the JDBC form), and any other type needs Spark's properties
  given explicitly (``CatalogSettings.custom``).
"""
from __future__ import annotations

from collections.abc import Mapping

from coordinator.errors import ConfigurationError

S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
JAVA_CATALOG_TYPES = ("rest", "glue", "hive")
_RENAMED = {"s3.region": "client.region"}
_PYTHON_ONLY = ("py-io-impl", "py-catalog-impl", "s3.force-virtual-addressing")


def pyiceberg_properties(name: str) -> dict[str, str]:
    """The properties pyiceberg's configuration gives catalog ``name``, read now (a ``.pyiceberg.yaml`` in
    ``PYICEBERG_HOME``, the home or the working directory, then ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables);
    empty when it names no such catalog."""
    from pyiceberg.utils.config import Config
    try:
        found = Config().get_catalog_config(name)
    except Exception as exc:  # noqa: BLE001 - a malformed YAML file or variable: one readable line
        raise ConfigurationError(f"pyiceberg's configuration cannot be read: {type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0] if str(exc) else ''}; fix .pyiceberg.yaml or the "
                                 "PYICEBERG_* variables") from None
    return _flatten(found or {})


def java_properties(python: Mapping[str, str]) -> dict[str, str]:
    """Spark's (Iceberg Java's) catalog properties for a catalog pyiceberg opens with ``python``."""
    kind = python.get("type", "rest" if "uri" in python else None)
    if kind is not None and kind not in JAVA_CATALOG_TYPES:
        raise ConfigurationError(
            f"Tidemark cannot derive Spark's properties of a pyiceberg catalog of type {kind!r}: give a SQL catalog "
            "as TIDEMARK_CATALOG_URI (sqlite:///... or postgresql://...), or both libraries' properties with "
            "CatalogSettings.custom(name, spark_properties=..., python_properties=...)")
    java = {_RENAMED.get(key, key): value for key, value in python.items() if key not in _PYTHON_ONLY}
    if kind is not None:
        java["type"] = kind
    for key, value in s3_file_io(python).items():
        java.setdefault(key, value)  # an io-impl or path style given explicitly wins
    return java


def s3_file_io(python: Mapping[str, str]) -> dict[str, str]:
    """Java's FileIO settings for a catalog whose files are on S3: its warehouse is an ``s3://`` location, or it
    names no file system (a REST catalog's warehouse may be a name) and has ``s3.*`` settings. None for a catalog
    on another file system (``file://``, ``gs://``, ...), whatever ``s3.*`` settings come with it."""
    warehouse = str(python.get("warehouse", ""))
    scheme = warehouse.split("://", 1)[0] if "://" in warehouse else None
    on_s3 = scheme in ("s3", "s3a") or (scheme is None and any(key.startswith("s3.") for key in python))
    if not on_s3:
        return {}
    java = {"io-impl": S3_FILE_IO}
    if "s3.endpoint" in python and "s3.path-style-access" not in python:
        virtual = str(python.get("s3.force-virtual-addressing", "false")).lower() in ("true", "1", "yes")
        java["s3.path-style-access"] = "false" if virtual else "true"
    return java


def _flatten(found: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """YAML may nest (``s3: {endpoint: ...}``): the dotted keys both libraries use."""
    flat: dict[str, str] = {}
    for key, value in found.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


__all__ = ["S3_FILE_IO", "java_properties", "pyiceberg_properties", "s3_file_io"]
