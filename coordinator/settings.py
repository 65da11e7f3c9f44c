"""Every environment variable Tidemark reads, in one place: ``Settings.from_env()``.

    settings = Settings.from_env()          # reads os.environ once; or from_env({"TIDEMARK_ZK": ...})
    settings.zk_connect, settings.catalog_uri, settings.home, settings.cache

Entry points (``Tidemark.connect``, ``CatalogSettings.from_env``, ``build_spark_session``, the
``tidemark`` command, a driver's metrics) read a ``Settings`` and take their defaults from it;
explicit arguments always win over the environment. ``VARIABLES`` documents each variable; the
README's table lists the same ones (a test keeps them in step).

Failure behaviour: a value that cannot be used (a port that is not a number, a yes/no flag that
is neither, a malformed ZooKeeper connect string) raises ``ConfigurationError`` naming the
variable, before anything connects.
"""
from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from coordinator.errors import ConfigurationError

DEFAULT_CONNECT = "127.0.0.1:2181"
DEFAULT_CATALOG = "lake"
DEFAULT_METRICS_ADDRESS = "0.0.0.0"  # a driver's metrics are scraped from outside its pod
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")
_HOST = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::(\d{1,5}))?$")  # name, IPv4 or [IPv6], then :port
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# name -> (default, what it does): the README's "Configuration" table says the same.
VARIABLES: dict[str, tuple[str, str]] = {
    "TIDEMARK_ZK": (f"`{DEFAULT_CONNECT}`", "ZooKeeper connect string, `host:port[,host:port...][/chroot]`"),
    "TIDEMARK_ZK_USER": ("none", "writer identity (ZooKeeper digest user); with it, every znode gets its ACL"),
    "TIDEMARK_ZK_PASSWORD": ("none", "the writer identity's password"),
    "TIDEMARK_ZK_READER_USER": ("none", "reader identity, granted read access to every znode"),
    "TIDEMARK_ZK_READER_PASSWORD": ("none", "the reader identity's password"),
    "TIDEMARK_ZK_JOB_USER": ("none", "this job's own identity: only it and the operator change its znodes"),
    "TIDEMARK_ZK_JOB_PASSWORD": ("none", "the job identity's password"),
    "TIDEMARK_ZK_OPERATOR_USER": ("none: the writer", "operator identity, which may change every job's znodes"),
    "TIDEMARK_ZK_OPERATOR_PASSWORD": ("none", "the operator identity's password (operators only)"),
    "TIDEMARK_ZK_TLS": ("on if a TLS file is set", "`1` to connect with TLS, `0` to refuse it"),
    "TIDEMARK_ZK_TLS_CA": ("none", "CA bundle (PEM) that signed ZooKeeper's certificate"),
    "TIDEMARK_ZK_TLS_CERT": ("none", "client certificate (PEM), for servers that require one"),
    "TIDEMARK_ZK_TLS_KEY": ("none", "the client certificate's key (PEM)"),
    "TIDEMARK_ZK_TLS_KEY_PASSWORD": ("none", "the key's password"),
    "TIDEMARK_ZK_TLS_VERIFY": ("`1`", "`0` accepts any server certificate (testing only)"),
    "TIDEMARK_ZK_TLS_CHECK_HOSTNAME": ("`1`", "`0` skips the host name check of the server certificate"),
    "TIDEMARK_ZK_CLASSPATH": ("Debian's `/usr/share/java/zookeeper.jar`",
                              "class path of the ZooKeeper server that `tidemark zk start` and the tests run"),
    "TIDEMARK_CATALOG_NAME": (f"`{DEFAULT_CATALOG}`", "Iceberg catalog name (the first part of table names)"),
    "TIDEMARK_CATALOG_URI": ("pyiceberg's configuration of the catalog, else the embedded SQLite catalog",
                             "catalog URI: SQL (`sqlite:///...`, `postgresql://...`) or REST (`http(s)://...`)"),
    "TIDEMARK_WAREHOUSE": ("`$TIDEMARK_HOME/warehouse` (a REST catalog: the server's)",
                           "warehouse location (`file://...`, `s3://...`) of the catalog"),
    "TIDEMARK_HOME": ("`$XDG_DATA_HOME/tidemark` or `~/.local/share/tidemark`",
                      "where the embedded defaults live (catalog, warehouse, local ZooKeeper's data)"),
    "TIDEMARK_CACHE": ("`$XDG_CACHE_HOME/tidemark` or `~/.cache/tidemark`",
                       "where `make setup` keeps the Spark jars from Maven Central (`<cache>/maven`)"),
    "TIDEMARK_SPARK_MASTER": ("`local[2]`", "Spark master of `build_spark_session` (unless `SPARK_HOME` is set: "
                                            "then `spark-defaults.conf` decides)"),
    "TIDEMARK_SPARK_JARS": ("the jars in `<cache>/maven`, else `spark.jars.packages`",
                            "Iceberg's Spark runtime jar(s) and JDBC drivers, comma separated"),
    "TIDEMARK_METRICS_PORT": ("unset: no endpoint", "port of a driver's `/metrics` and `/healthz`"),
    "TIDEMARK_METRICS_ADDRESS": (f"`{DEFAULT_METRICS_ADDRESS}`", "address that endpoint listens on"),
    "TIDEMARK_CRASH_AT": ("unset", "fault tests only: `<step>[:<nth>]` makes the driver SIGKILL itself there"),
    "TIDEMARK_DEBUG": ("`0`", "`1`: a script's uncaught Tidemark error prints its traceback, not one line"),
}


@dataclass(frozen=True)
class Settings:
    """The environment's configuration, typed; see ``VARIABLES`` for what each field does."""

    zk_connect: str = DEFAULT_CONNECT
    zk_user: Optional[str] = None
    zk_password: str = ""
    zk_reader_user: Optional[str] = None
    zk_reader_password: str = ""
    zk_job_user: Optional[str] = None
    zk_job_password: str = ""
    zk_operator_user: Optional[str] = None
    zk_operator_password: Optional[str] = None
    zk_tls: Optional[bool] = None                 # None: on when a TLS file is set
    zk_tls_ca: Optional[str] = None
    zk_tls_cert: Optional[str] = None
    zk_tls_key: Optional[str] = None
    zk_tls_key_password: Optional[str] = None
    zk_tls_verify: bool = True
    zk_tls_check_hostname: bool = True
    zk_classpath: Optional[str] = None
    catalog_name: str = DEFAULT_CATALOG
    catalog_uri: Optional[str] = None
    warehouse: Optional[str] = None
    home: Path = field(default_factory=lambda: Path.home() / ".local" / "share" / "tidemark")
    cache: Path = field(default_factory=lambda: Path.home() / ".cache" / "tidemark")
    spark_master: Optional[str] = None
    spark_jars: tuple[str, ...] = ()
    metrics_port: Optional[int] = None
    metrics_address: str = DEFAULT_METRICS_ADDRESS
    crash_at: Optional[str] = None
    debug: bool = False

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> Settings:
        """Read ``environ`` (default ``os.environ``) once; ``ConfigurationError`` names a variable that is unusable."""
        env = os.environ if environ is None else environ

        def text(name: str) -> Optional[str]:
            value = env.get(name, "").strip()
            return value or None

        data_base = text("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
        cache_base = text("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
        home = text("TIDEMARK_HOME")
        cache = text("TIDEMARK_CACHE")
        return cls(
            zk_connect=check_connect_string(text("TIDEMARK_ZK") or DEFAULT_CONNECT, "TIDEMARK_ZK"),
            zk_user=text("TIDEMARK_ZK_USER"),
            zk_password=env.get("TIDEMARK_ZK_PASSWORD", ""),
            zk_reader_user=text("TIDEMARK_ZK_READER_USER"),
            zk_reader_password=env.get("TIDEMARK_ZK_READER_PASSWORD", ""),
            zk_job_user=text("TIDEMARK_ZK_JOB_USER"),
            zk_job_password=env.get("TIDEMARK_ZK_JOB_PASSWORD", ""),
            zk_operator_user=text("TIDEMARK_ZK_OPERATOR_USER"),
            zk_operator_password=env.get("TIDEMARK_ZK_OPERATOR_PASSWORD"),
            zk_tls=_flag(env, "TIDEMARK_ZK_TLS"),
            zk_tls_ca=text("TIDEMARK_ZK_TLS_CA"),
            zk_tls_cert=text("TIDEMARK_ZK_TLS_CERT"),
            zk_tls_key=text("TIDEMARK_ZK_TLS_KEY"),
            zk_tls_key_password=text("TIDEMARK_ZK_TLS_KEY_PASSWORD"),
            zk_tls_verify=_flag(env, "TIDEMARK_ZK_TLS_VERIFY") is not False,
            zk_tls_check_hostname=_flag(env, "TIDEMARK_ZK_TLS_CHECK_HOSTNAME") is not False,
            zk_classpath=text("TIDEMARK_ZK_CLASSPATH"),
            catalog_name=text("TIDEMARK_CATALOG_NAME") or DEFAULT_CATALOG,
            catalog_uri=text("TIDEMARK_CATALOG_URI"),
            warehouse=text("TIDEMARK_WAREHOUSE"),
            home=Path(home).absolute() if home else Path(data_base) / "tidemark",
            cache=Path(cache).absolute() if cache else Path(cache_base) / "tidemark",
            spark_master=text("TIDEMARK_SPARK_MASTER"),
            spark_jars=tuple(j.strip() for j in env.get("TIDEMARK_SPARK_JARS", "").split(",") if j.strip()),
            metrics_port=_port(env, "TIDEMARK_METRICS_PORT"),
            metrics_address=text("TIDEMARK_METRICS_ADDRESS") or DEFAULT_METRICS_ADDRESS,
            crash_at=text("TIDEMARK_CRASH_AT"),
            debug=_flag(env, "TIDEMARK_DEBUG") is True,
        )

    @property
    def tls_enabled(self) -> bool:
        """TLS was asked for, explicitly or by naming a TLS file."""
        if self.zk_tls is not None:
            return self.zk_tls
        return bool(self.zk_tls_ca or self.zk_tls_cert or self.zk_tls_key)


def check_connect_string(connect: str, variable: Optional[str] = None) -> str:
    """``connect`` if it is a ZooKeeper connect string ``host:port[,host:port...][/chroot]``, else
    ``ConfigurationError`` saying what is wrong. kazoo would accept ``h:2181/bad//chroot`` as ``/bad/chroot``
    and ``h:2181,`` as ``h:2181``: a typo must not quietly point at another tree."""
    where = f" ({variable})" if variable else ""

    def malformed(why: str) -> ConfigurationError:
        return ConfigurationError(f"ZooKeeper connect string {connect!r}{where} is malformed: {why}; use "
                                  "host:port[,host:port...][/chroot], e.g. zk1:2181,zk2:2181/tidemark")
    hosts, slash, chroot = connect.partition("/")
    for host in hosts.split(","):
        match = _HOST.match(host)
        if match is None:
            raise malformed(f"{host!r} is not host:port" if host else "a host is missing")
        if match.group(2) is not None and not 0 < int(match.group(2)) < 65536:
            raise malformed(f"port {match.group(2)} is not 1-65535")
    parts = chroot.split("/") if slash and chroot else []  # "host:2181/" has no chroot
    if any(part in ("", ".", "..") for part in parts) or _CONTROL.search(chroot):
        raise malformed(f"the chroot /{chroot} has an empty, '.' or '..' part or a control character")
    return connect


def _flag(env: Mapping[str, str], name: str) -> Optional[bool]:
    value = env.get(name, "").strip().lower()
    if not value:
        return None
    if value not in _TRUE + _FALSE:
        raise ConfigurationError(f"{name}={env[name]!r} is not a yes/no value: use 1 or 0")
    return value in _TRUE


def _port(env: Mapping[str, str], name: str) -> Optional[int]:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit() or int(raw) > 65535:
        raise ConfigurationError(f"{name}={raw!r} is not a port number (0-65535; unset it to serve no metrics)")
    return int(raw)
