"""Every setting Tidemark takes from the environment, read in one place.

    settings = Settings.from_env()            # os.environ, parsed and checked once
    settings.zk_connect, settings.catalog_uri, settings.metrics_port, ...
    Settings.from_env({"TIDEMARK_ZK": "zk1:2181/tidemark"})   # any mapping, e.g. in a test

Each field names its variable (``Settings.variables()`` lists them; the README's configuration table
documents the same list, and a test checks that they agree). The modules that need a setting call
``Settings.from_env()`` when they are built, so a changed environment is seen by the next
``Tidemark.connect()``, never half-way through one; an explicit argument always wins over the
environment. An empty variable counts as unset.

Failure behaviour: a value that cannot be used (a port that is not a number, a yes/no flag that is
neither) raises ``ConfigurationError`` naming the variable and what it accepts.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Optional

from coordinator.errors import ConfigurationError

DEFAULT_CONNECT = "127.0.0.1:2181"
DEFAULT_CATALOG = "lake"
DEFAULT_SPARK_MASTER = "local[2]"
DEFAULT_METRICS_ADDRESS = "0.0.0.0"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class Settings:
    """The environment's settings, parsed: the defaults of ``Tidemark.connect``, the catalog, Spark and drivers."""

    zk_connect: str = field(metadata={"env": "TIDEMARK_ZK"})
    zk_user: Optional[str] = field(metadata={"env": "TIDEMARK_ZK_USER"})
    zk_password: str = field(metadata={"env": "TIDEMARK_ZK_PASSWORD"})
    zk_reader_user: Optional[str] = field(metadata={"env": "TIDEMARK_ZK_READER_USER"})
    zk_reader_password: str = field(metadata={"env": "TIDEMARK_ZK_READER_PASSWORD"})
    zk_tls: Optional[bool] = field(metadata={"env": "TIDEMARK_ZK_TLS"})  # None: on with a CA, cert or key
    zk_tls_ca: Optional[str] = field(metadata={"env": "TIDEMARK_ZK_TLS_CA"})
    zk_tls_cert: Optional[str] = field(metadata={"env": "TIDEMARK_ZK_TLS_CERT"})
    zk_tls_key: Optional[str] = field(metadata={"env": "TIDEMARK_ZK_TLS_KEY"})
    zk_tls_key_password: Optional[str] = field(metadata={"env": "TIDEMARK_ZK_TLS_KEY_PASSWORD"})
    zk_tls_verify: bool = field(metadata={"env": "TIDEMARK_ZK_TLS_VERIFY"})
    zk_tls_check_hostname: bool = field(metadata={"env": "TIDEMARK_ZK_TLS_CHECK_HOSTNAME"})
    zk_classpath: Optional[str] = field(metadata={"env": "TIDEMARK_ZK_CLASSPATH"})
    catalog_name: str = field(metadata={"env": "TIDEMARK_CATALOG_NAME"})
    catalog_uri: Optional[str] = field(metadata={"env": "TIDEMARK_CATALOG_URI"})
    warehouse: Optional[str] = field(metadata={"env": "TIDEMARK_WAREHOUSE"})
    home: Path = field(metadata={"env": "TIDEMARK_HOME"})
    cache: Path = field(metadata={"env": "TIDEMARK_CACHE"})
    spark_master: Optional[str] = field(metadata={"env": "TIDEMARK_SPARK_MASTER"})
    spark_jars: tuple[str, ...] = field(metadata={"env": "TIDEMARK_SPARK_JARS"})
    spark_home: Optional[str] = field(metadata={"env": "SPARK_HOME"})
    java_home: Optional[str] = field(metadata={"env": "JAVA_HOME"})
    metrics_port: Optional[int] = field(metadata={"env": "TIDEMARK_METRICS_PORT"})
    metrics_address: str = field(metadata={"env": "TIDEMARK_METRICS_ADDRESS"})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Settings:
        """Parse ``environ``; ``ConfigurationError`` names the first variable whose value is unusable."""
        def get(name: str) -> Optional[str]:
            value = environ.get(name, "").strip()
            return value or None

        def flag(name: str) -> Optional[bool]:
            value = get(name)
            if value is None:
                return None
            if value.lower() not in _TRUE + _FALSE:
                raise ConfigurationError(f"{name}={value!r} is not a yes/no value: use 1 or 0")
            return value.lower() in _TRUE

        def port(name: str) -> Optional[int]:
            value = get(name)
            if value is None:
                return None
            if not value.isdigit() or int(value) > 65535:
                raise ConfigurationError(f"{name}={value!r} is not a port number (0-65535; unset it to serve "
                                         "no metrics)")
            return int(value)

        def directory(name: str, xdg: str, fallback: str) -> Path:
            configured = get(name)
            if configured:
                return Path(configured).absolute()
            return Path(get(xdg) or os.path.expanduser(fallback)) / "tidemark"

        jars = get("TIDEMARK_SPARK_JARS")
        return cls(
            zk_connect=get("TIDEMARK_ZK") or DEFAULT_CONNECT,
            zk_user=get("TIDEMARK_ZK_USER"), zk_password=environ.get("TIDEMARK_ZK_PASSWORD", ""),
            zk_reader_user=get("TIDEMARK_ZK_READER_USER"),
            zk_reader_password=environ.get("TIDEMARK_ZK_READER_PASSWORD", ""),
            zk_tls=flag("TIDEMARK_ZK_TLS"), zk_tls_ca=get("TIDEMARK_ZK_TLS_CA"),
            zk_tls_cert=get("TIDEMARK_ZK_TLS_CERT"), zk_tls_key=get("TIDEMARK_ZK_TLS_KEY"),
            zk_tls_key_password=get("TIDEMARK_ZK_TLS_KEY_PASSWORD"),
            zk_tls_verify=flag("TIDEMARK_ZK_TLS_VERIFY") is not False,
            zk_tls_check_hostname=flag("TIDEMARK_ZK_TLS_CHECK_HOSTNAME") is not False,
            zk_classpath=get("TIDEMARK_ZK_CLASSPATH"),
            catalog_name=get("TIDEMARK_CATALOG_NAME") or DEFAULT_CATALOG,
            catalog_uri=get("TIDEMARK_CATALOG_URI"), warehouse=get("TIDEMARK_WAREHOUSE"),
            home=directory("TIDEMARK_HOME", "XDG_DATA_HOME", "~/.local/share"),
            cache=directory("TIDEMARK_CACHE", "XDG_CACHE_HOME", "~/.cache"),
            spark_master=get("TIDEMARK_SPARK_MASTER"),
            spark_jars=tuple(j.strip() for j in jars.split(",") if j.strip()) if jars else (),
            spark_home=get("SPARK_HOME"), java_home=get("JAVA_HOME"),
            metrics_port=port("TIDEMARK_METRICS_PORT"),
            metrics_address=get("TIDEMARK_METRICS_ADDRESS") or DEFAULT_METRICS_ADDRESS,
        )

    @classmethod
    def variables(cls) -> list[str]:
        """The environment variables the settings read, in field order."""
        return [f.metadata["env"] for f in fields(cls)]
