"""A catalog's properties, configured once: read from pyiceberg's own configuration, and turned into Spark's.

    pyiceberg_properties("lake")      # .pyiceberg.yaml or PYICEBERG_CATALOG__LAKE__*, as pyiceberg reads them
    pyiceberg_variables("lake", {"s3.endpoint": ...})   # {"PYICEBERG_CATALOG__LAKE__S3__ENDPOINT": ...}
    java_properties({"type": "rest", "uri": "http://rest:8181", "s3.endpoint": "http://s3:9000", ...})
        # {"type": "rest", "uri": ..., "s3.endpoint": ..., "s3.path-style-access": "true",
        #  "io-impl": "org.apache.iceberg.aws.s3.S3FileIO", ...}: spark.sql.catalog.<name>.* without the prefix

pyiceberg and Iceberg's Java catalogs name most properties alike (``uri``, ``warehouse``, ``credential``,
``token``, ``scope``, ``oauth2-server-uri``, ``prefix``, ``header.*``, ``rest.sigv4-enabled``,
``rest.signing-region``, ``rest.signing-name``, ``s3.endpoint``, ``s3.access-key-id``,
``s3.secret-access-key``, ``s3.session-token``): those pass as they are. What differs is translated here,
in one place:

- ``s3.region`` is Java's ``client.region`` (and wins over ``client.region``, as in pyiceberg); pyiceberg's
  ``client.access-key-id``, ``client.secret-access-key`` and ``client.session-token`` are Java's ``s3.*`` ones;
- pyiceberg addresses buckets by path unless ``s3.force-virtual-addressing`` is true; Java's S3FileIO does the
  opposite unless ``s3.path-style-access`` is true: with an ``s3.endpoint`` (MinIO, SeaweedFS, Ceph), Java is
  given pyiceberg's choice, so both reach the same URLs;
- a warehouse or properties on S3 need Java's ``S3FileIO`` (``io-impl``; its classes are in
  ``iceberg-aws-bundle``, which ``make setup`` and ``spark.jars.packages`` bring beside the runtime);
- Python-only properties (``py-io-impl``, ``py-catalog-impl``) are left out;
- ``type`` is Java's for REST, Glue and Hive; without one, pyiceberg's rule infers it from the URI's scheme
  (``http(s)``: REST, ``thrift``: Hive; ``sqlite``/``postgresql``: SQL); a SQL catalog is Tidemark's own
  (``CatalogSettings.from_env`` opens it as ``TIDEMARK_CATALOG_URI``, with its session settings and the JDBC
  form for Spark), and any other type needs Spark's properties given explicitly (``CatalogSettings.custom``).

Not translated (give Spark's properties with ``CatalogSettings.custom`` for them): ``s3.role-arn`` (Java's
``client.assume-role.*`` with its client factory) and server-side encryption (``s3.sse.*``).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

from coordinator.errors import ConfigurationError

S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
JAVA_CATALOG_TYPES = ("rest", "glue", "hive")
# pyiceberg's name -> Java's, in the order applied: where pyiceberg takes an s3.* property over its client.*
# twin, the s3.* one comes later here (or passes through as it is, after these), and wins
_RENAMED = {"client.access-key-id": "s3.access-key-id", "client.secret-access-key": "s3.secret-access-key",
            "client.session-token": "s3.session-token", "client.region": "client.region",
            "s3.region": "client.region"}
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


def pyiceberg_variables(name: str, python: Mapping[str, str]) -> dict[str, str]:
    """Catalog ``name``'s properties ``python`` as the ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables a user exports
    (``s3.access-key-id``: ``S3__ACCESS_KEY_ID``), which ``pyiceberg_properties`` reads back."""
    prefix = f"PYICEBERG_CATALOG__{name.upper()}__"
    return {prefix + key.upper().replace(".", "__").replace("-", "_"): value for key, value in python.items()}


def catalog_type(python: Mapping[str, str]) -> Optional[str]:
    """The catalog's type as pyiceberg infers it: ``type``, else from the URI's scheme (None: neither)."""
    if "type" in python:
        return python["type"].lower()
    uri = python.get("uri")
    if uri is None:
        return None
    scheme = uri.split("://", 1)[0].split("+", 1)[0].lower()
    return {"http": "rest", "https": "rest", "thrift": "hive", "sqlite": "sql", "postgresql": "sql"}.get(scheme, scheme)


def java_properties(python: Mapping[str, str]) -> dict[str, str]:
    """Spark's (Iceberg Java's) catalog properties for a catalog pyiceberg opens with ``python``."""
    kind = catalog_type(python)
    if kind is not None and kind not in JAVA_CATALOG_TYPES:
        raise ConfigurationError(
            f"Tidemark cannot derive Spark's properties of a pyiceberg catalog of type {kind!r}: give a SQL catalog "
            "as TIDEMARK_CATALOG_URI (sqlite:///... or postgresql://...), or both libraries' properties with "
            "CatalogSettings.custom(name, spark_properties=..., python_properties=...)")
    java = {java_name: python[key] for key, java_name in _RENAMED.items() if key in python}
    java.update({key: value for key, value in python.items() if key not in _PYTHON_ONLY and key not in _RENAMED})
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
    on_s3 = scheme in ("s3", "s3a") or (scheme is None and any(key.startswith(("s3.", "client.")) for key in python))
    if not on_s3:
        return {}
    java = {"io-impl": S3_FILE_IO}
    if "s3.endpoint" in python and "s3.path-style-access" not in python:
        java["s3.path-style-access"] = "true" if path_style_addressing(python) else "false"
    return java


def s3_setting(python: Mapping[str, str], name: str) -> Optional[str]:
    """S3 setting ``name`` (``access-key-id``, ``region``, ...) as pyiceberg takes it: ``s3.<name>``, else its
    ``client.<name>`` twin (the rule ``_RENAMED`` applies for Java); None when neither is given."""
    return next((str(python[key]) for key in (f"s3.{name}", f"client.{name}") if python.get(key)), None)


def path_style_addressing(python: Mapping[str, str]) -> bool:
    """Whether pyiceberg addresses buckets by path (``http://endpoint/bucket/key``): unless
    ``s3.force-virtual-addressing`` is true. Java's S3FileIO and DuckDB are given the same choice."""
    return str(python.get("s3.force-virtual-addressing", "false")).lower() not in ("true", "1", "yes")


def _flatten(found: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """YAML may nest (``s3: {endpoint: ...}``): the dotted keys both libraries use."""
    flat: dict[str, str] = {}
    for key, value in found.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value)
    return flat


__all__ = ["S3_FILE_IO", "catalog_type", "java_properties", "path_style_addressing", "pyiceberg_properties",
           "pyiceberg_variables", "s3_file_io", "s3_setting"]
