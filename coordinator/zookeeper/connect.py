"""Opening a session's connection: its identities, its kazoo client, and the start, which reports a TLS mismatch
or servers that all refuse connections within seconds instead of at the connect timeout.

``ZooKeeperSession.connect`` runs ``credentials_from``, ``new_client`` and ``start`` in that order;
``servers`` names a client's servers in messages.
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional, Union

from kazoo.client import KazooClient
from kazoo.retry import KazooRetry

from coordinator.errors import ConfigurationError, ZooKeeperUnavailable
from coordinator.names import validate_chroot
from coordinator.settings import Settings
from coordinator.zookeeper.logs import KAZOO_LOG
from coordinator.zookeeper.security import Credentials, TlsSettings, diagnose_tls

# A healthy session comes up in milliseconds; after this long, look for a TLS mismatch instead of waiting it out.
TLS_DIAGNOSIS_AFTER_S = 1.0
# Every server refusing connections this long after that: none runs (a newcomer without `tidemark zk start`, a
# wrong port); say so then instead of after the connect timeout. A server restarting listens again sooner.
REFUSED_FOR_S = 2.0


def credentials_from(settings: Settings, *, auth: Optional[tuple[str, str]], reader: Optional[tuple[str, str]],
                     job: Optional[tuple[str, str]], operator: Optional[Union[str, tuple[str, str]]]) -> Credentials:
    """The identities ``ZooKeeperSession.connect`` was given, each one not given from the environment.

    :param operator: the operator identity's name alone (a job's session), or its ``(user, password)``.
    :raises ConfigurationError: an identity given is not a ``(user, password)`` pair.
    """
    env = Credentials.from_env(settings)
    user, password = _identity(auth, "auth") if auth is not None else (env.user, env.password)
    reader_user, reader_password = (_identity(reader, "reader") if reader is not None
                                    else (env.reader_user, env.reader_password))
    job_user, job_password = _identity(job, "job") if job is not None else (env.job_user, env.job_password)
    operator_user, operator_password = ((operator, None) if isinstance(operator, str) else
                                        _identity(operator, "operator") if operator is not None
                                        else (env.operator_user, env.operator_password))
    return Credentials(user, password, reader_user, reader_password, job_user, job_password,
                       operator_user, operator_password)


def new_client(hosts: str, credentials: Credentials, tls: Optional[TlsSettings], *, session_timeout: float,
               operation_timeout: float) -> tuple[KazooClient, str]:
    """A kazoo client for ``hosts``, not started, set to connect outside the chroot (so that the session can create
    it), and that chroot ("" for none).

    :raises ConfigurationError: a malformed connect string, or a TLS CA, certificate or key that cannot be read.
    :raises InvalidName: the chroot is not a ZooKeeper path Tidemark accepts.
    """
    kwargs: dict[str, Any] = {"auth_data": credentials.auth_data(), "default_acl": credentials.default_acl()}
    if tls is not None:
        tls.context()  # a missing or unreadable CA, certificate or key: say so now, not after the timeout
        kwargs.update(tls.kazoo_kwargs())
    try:
        client = KazooClient(
            hosts=hosts, timeout=session_timeout, logger=KAZOO_LOG,
            # Reconnection keeps the session alive through short outages; it runs in the
            # background and never blocks a caller. Operations have their own deadline.
            connection_retry=KazooRetry(max_tries=-1, delay=0.1, backoff=2, max_delay=2),
            command_retry=KazooRetry(max_tries=-1, delay=0.05, max_delay=1, deadline=operation_timeout),
            **kwargs)
    except ValueError as exc:
        raise ConfigurationError(f"ZooKeeper connect string {hosts!r} is invalid ({exc}): use "
                                 "host:port[,host:port...][/chroot]") from None
    # Connect outside the chroot so we can create it; "host:2181/" has none.
    chroot, client.chroot = ("" if client.chroot == "/" else client.chroot), ""
    if chroot:
        validate_chroot(chroot)
    return client, chroot


def _stop_and_close(client: KazooClient) -> None:
    client.stop()
    client.close()


def start(client: KazooClient, hosts: str, tls: Optional[TlsSettings], connect_timeout: float) -> None:
    """Start the session; a TLS mismatch is reported within about a second, servers that all refuse connections
    within about ``TLS_DIAGNOSIS_AFTER_S + REFUSED_FOR_S``, silence after ``connect_timeout``. On failure the
    client is stopped and closed (after a mismatch, on a thread of its own, as the error is raised).

    :raises TlsError: a certificate or protocol mismatch.
    :raises ConfigurationError: the address answers as an HTTP server, not ZooKeeper.
    :raises ZooKeeperUnavailable: no server runs at ``hosts``, or none answered within ``connect_timeout``.
    """
    started = client.start_async()
    if not started.wait(min(TLS_DIAGNOSIS_AFTER_S, connect_timeout)):
        mismatch = diagnose_tls(client.hosts, tls)
        if mismatch is not None:
            # kazoo's stop waits out its connect attempt, which a server that is not ZooKeeper may leave unanswered
            # (an HTTP server waits for the end of a request line): the caller is told at once, the client stops
            # behind it
            threading.Thread(target=_stop_and_close, args=(client,), name="tidemark-zk-stop", daemon=True).start()
            raise mismatch
        deadline, refused_since = time.monotonic() + connect_timeout - TLS_DIAGNOSIS_AFTER_S, time.monotonic()
        while not client.connected and time.monotonic() < deadline:
            refused = refusals(client.hosts)
            if refused is None:
                refused_since = time.monotonic()
            elif time.monotonic() - refused_since >= REFUSED_FOR_S:
                client.stop()
                client.close()
                raise ZooKeeperUnavailable(
                    f"no ZooKeeper server runs at {hosts} ({refused}): start one (`tidemark zk start` for a local "
                    "one), or point TIDEMARK_ZK (--zk) at yours")
            started.wait(min(0.25, max(0.0, deadline - time.monotonic())))
    if not client.connected:
        client.stop()
        client.close()
        raise ZooKeeperUnavailable(
            f"no ZooKeeper server answered at {hosts} within {connect_timeout:.0f}s: check TIDEMARK_ZK, "
            "that the servers run (`tidemark zk start` for a local one) and the network")


def refusals(hosts: Sequence[tuple[str, int]]) -> Optional[str]:
    """Why no server can be reached when each refuses the connection or has a name that does not resolve (what to
    report at once), else None: one listens, or the network is silent (which only the connect timeout tells)."""
    reasons = []
    for host, port in hosts:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return None
        except ConnectionRefusedError:
            reasons.append(f"{host}:{port} refused the connection")
        except socket.gaierror:
            reasons.append(f"{host} is not a known host name")
        except OSError:
            return None
    return "; ".join(reasons)


def servers(client: KazooClient, hosts: Optional[Sequence[tuple[str, int]]] = None) -> str:
    """``client``'s servers (or ``hosts``) as a connect string, for messages."""
    return ",".join(f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                    for host, port in (client.hosts if hosts is None else hosts))


def _identity(pair: object, what: str) -> tuple[str, str]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise ConfigurationError(f"{what} must be a (user, password) pair")
    return pair[0], pair[1]


__all__ = ["REFUSED_FOR_S", "TLS_DIAGNOSIS_AFTER_S", "credentials_from", "new_client", "refusals", "servers", "start"]
