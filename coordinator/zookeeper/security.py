"""Who may change the Tidemark tree, and TLS towards ZooKeeper.

    creds = Credentials.from_env()       # TIDEMARK_ZK_USER/_PASSWORD, TIDEMARK_ZK_READER_USER/_PASSWORD
    tls = TlsSettings.from_env()         # TIDEMARK_ZK_TLS, TIDEMARK_ZK_TLS_CA/_CERT/_KEY, ...
    tm = Tidemark.connect(auth=(creds.user, creds.password), reader=(...), tls=tls)

**Identities.** ZooKeeper digest auth, one *writer* identity (``user``/``password``) shared by
the jobs and operators of one tree, and optionally one *reader* identity for status, metrics
and resolution. A session with the writer identity creates every znode with the ACL
``digest:<writer>:cdrwa`` plus ``digest:<reader>:r`` (or ``world:anyone:r`` when no reader
identity is configured); ``/readers`` also lets the reader identity create and delete its pins. A
session with only the reader identity is read-only: it creates nothing. A session without
credentials creates znodes open to anyone, as ZooKeeper does by default.

**Repair.** A session with the writer identity looks at the top-level znodes when it
connects. One that anyone may change (``world:anyone`` with more than read, left by an
earlier unauthenticated client) gets the writer's ACL; when ZooKeeper does not let the
writer change it, ``connect`` refuses with ``PermissionDenied`` saying what to run.

What the shared secret protects, and what not: see "Security" in the README.

**TLS.** ``TlsSettings`` are kazoo's ``use_ssl``/``ca``/``certfile``/``keyfile``/
``verify_certs``/``check_hostname``. When a session does not come up within a second,
``diagnose_tls`` handshakes with each server itself and turns a certificate or protocol
mismatch into ``TlsError`` naming the likely cause (an HTTP server at the address into a
``ConfigurationError`` quoting its answer), instead of waiting out the timeout.
"""
from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from kazoo.security import ACL, ANYONE_ID_UNSAFE, Permissions, make_acl, make_digest_acl

from coordinator.errors import ConfigurationError, TlsError
from coordinator.settings import Settings

_CHANGES = Permissions.WRITE | Permissions.CREATE | Permissions.DELETE | Permissions.ADMIN


def _identity(user: str, password: str, role: str) -> tuple[str, str]:
    if not isinstance(user, str) or not user or ":" in user or any(c.isspace() for c in user):
        raise ConfigurationError(f"ZooKeeper {role} user {user!r} is not usable: a digest user name is non-empty "
                                 "and has no ':' or spaces")
    if not isinstance(password, str):
        raise ConfigurationError(f"ZooKeeper {role} password must be a string")
    return user, password


@dataclass(frozen=True)
class Credentials:
    """The identities this session authenticates as, and the reader identity granted read access.

    ``user`` is the writer identity; ``job_user`` this job's own identity (its znodes carry its
    ACL, see ``owned_acl``); ``operator_user`` names the operator identity, which may change every
    job's znodes, and ``operator_password`` makes this session the operator's.
    """

    user: Optional[str] = None
    password: str = ""
    reader_user: Optional[str] = None
    reader_password: str = ""
    job_user: Optional[str] = None
    job_password: str = ""
    operator_user: Optional[str] = None
    operator_password: Optional[str] = None

    def __post_init__(self) -> None:
        if self.user is not None:
            _identity(self.user, self.password, "writer")
        if self.reader_user is not None:
            _identity(self.reader_user, self.reader_password, "reader")
        if self.operator_user is not None:
            _identity(self.operator_user, self.operator_password or "", "operator")
        elif self.operator_password is not None:
            raise ConfigurationError("an operator password needs the operator identity's name too "
                                     "(TIDEMARK_ZK_OPERATOR_USER)")
        if (self.operator_password is not None or self.job_user is not None) and self.user is None:
            raise ConfigurationError(
                "a job or operator identity comes with the writer identity (TIDEMARK_ZK_USER/_PASSWORD), which "
                "registration, the barrier grid and GC change: set it too")
        if self.job_user is not None:
            _identity(self.job_user, self.job_password, "job")
            if self.operator_user is None or self.operator_user == self.user:
                raise ConfigurationError(
                    f"job identity {self.job_user!r} needs an operator identity other than the writer's "
                    "(TIDEMARK_ZK_OPERATOR_USER), which may fence and unregister the job")
            if self.job_user in (self.user, self.operator_user):
                raise ConfigurationError(f"the job identity {self.job_user!r} must differ from the writer and "
                                         "operator identities")

    @classmethod
    def from_env(cls, settings: Optional[Settings] = None) -> Credentials:
        """The identities ``TIDEMARK_ZK_USER``/``_PASSWORD``, ``TIDEMARK_ZK_READER_USER``/``_PASSWORD``,
        ``TIDEMARK_ZK_JOB_USER``/``_PASSWORD`` and ``TIDEMARK_ZK_OPERATOR_USER``/``_PASSWORD``."""
        settings = settings or Settings.from_env()
        return cls(settings.zk_user, settings.zk_password, settings.zk_reader_user, settings.zk_reader_password,
                   settings.zk_job_user, settings.zk_job_password, settings.zk_operator_user,
                   settings.zk_operator_password)

    @property
    def is_writer(self) -> bool:
        """Whether the writer identity (``user``, ``TIDEMARK_ZK_USER``) is configured."""
        return self.user is not None

    @property
    def is_job(self) -> bool:
        """This session runs a job with its own identity: the znodes of its job are its and the operator's."""
        return self.job_user is not None

    @property
    def separate_operator(self) -> bool:
        """An operator identity other than the writer's is configured (per-job identities)."""
        return self.operator_user is not None and self.operator_user != self.user

    @property
    def read_only(self) -> bool:
        """Only the reader identity is configured: this session creates and repairs nothing."""
        return self.user is None and self.reader_user is not None

    @property
    def identity(self) -> str:
        """Who this session is, for messages: the job identity, else the operator's (when this session is the
        operator's), else the writer's or the reader's ZooKeeper user, else an unauthenticated client."""
        if self.job_user is not None:
            return f"job identity {self.job_user!r}"
        if self.operator_password is not None and self.separate_operator:
            return f"operator identity {self.operator_user!r}"
        who = self.user or self.reader_user
        return f"ZooKeeper user {who!r}" if who else "an unauthenticated client"

    def auth_data(self) -> list[tuple[str, str]]:
        """The ``(scheme, credential)`` pairs kazoo authenticates with: ``digest`` ``user:password`` for the
        writer (else the reader), the job identity and, when this session is the operator's, the operator."""
        who = (self.user, self.password) if self.user is not None else (self.reader_user, self.reader_password)
        identities = [who, (self.job_user, self.job_password)]
        if self.operator_password is not None and self.separate_operator:
            identities.append((self.operator_user, self.operator_password))
        return [("digest", f"{user}:{password}") for user, password in identities if user is not None]

    def _readers(self, **perms: bool) -> ACL:
        if self.reader_user is None:
            return make_acl("world", "anyone", **perms)
        return make_digest_acl(self.reader_user, self.reader_password, **perms)

    def _operator(self) -> list[ACL]:
        """The operator's entry, when this session is the operator's and the operator is not the writer."""
        if self.operator_password is None or not self.separate_operator:
            return []
        return [make_digest_acl(self.operator_user, self.operator_password, all=True)]

    def default_acl(self) -> Optional[list[ACL]]:
        """The ACL of every znode this session creates (None: ZooKeeper's open default), but a job's own."""
        if self.user is not None:
            return [make_digest_acl(self.user, self.password, all=True), *self._operator(), self._readers(read=True)]
        if self.reader_user is not None:  # its pins: its own, readable by whoever runs retention
            return [make_digest_acl(self.reader_user, self.reader_password, all=True),
                    make_acl("world", "anyone", read=True)]
        return None

    def readers_acl(self) -> Optional[list[ACL]]:
        """``/readers``: the reader identity also creates and deletes its pins there."""
        if self.user is None or self.reader_user is None:
            return self.default_acl()
        return [make_digest_acl(self.user, self.password, all=True), *self._operator(),
                self._readers(read=True, create=True, delete=True)]

    def owned_acl(self, operator: ACL) -> list[ACL]:
        """The ACL of the znodes of this session's job (``Paths.owner``): the job and the operator (``operator``,
        its entry as found in the tree) change them; the writer identity, which every job holds, only reads."""
        if self.job_user is None or self.user is None:
            raise ConfigurationError("only a session with a job identity owns znodes")
        readers = [self._readers(read=True)]
        if self.reader_user is not None:  # other jobs read this job's tidemarks as the writer
            readers.append(make_digest_acl(self.user, self.password, read=True))
        return [make_digest_acl(self.job_user, self.job_password, all=True), operator, *readers]

    def operator_entry(self, acl: Sequence[ACL]) -> Optional[ACL]:
        """The operator identity's entry in ``acl`` (a top-level znode's), given every permission; None if absent."""
        prefix = f"{self.operator_user}:"
        return next((ACL(Permissions.ALL, entry.id) for entry in acl
                     if entry.id.scheme == "digest" and entry.id.id.startswith(prefix)), None)

    def lacks_operator(self, acl: Sequence[ACL]) -> bool:
        """This is the operator's session and ``acl`` (a top-level znode's) does not give the operator everything."""
        wanted = self._operator()
        return bool(wanted) and not any(entry.id == wanted[0].id and entry.perms == Permissions.ALL
                                        for entry in acl)

    def may_change(self, acl: Sequence[ACL], perms: int) -> bool:
        """Whether one of this session's identities has ``perms`` in ``acl`` (as the server would judge it)."""
        mine = {make_digest_acl(user, password).id.id
                for user, password in (tuple(a[1].split(":", 1)) for a in self.auth_data())}
        return any(entry.perms & perms == perms and (entry.id == ANYONE_ID_UNSAFE
                                                     or (entry.id.scheme == "digest" and entry.id.id in mine))
                   for entry in acl)


def is_open(acl: Sequence[ACL]) -> bool:
    """True when anyone at all may change the znode (more than read for ``world:anyone``)."""
    return any(entry.id == ANYONE_ID_UNSAFE and entry.perms & _CHANGES for entry in acl)


@dataclass(frozen=True)
class TlsSettings:
    """TLS towards ZooKeeper's secure client port (``secureClientPort``).

    ``ca`` is the PEM file of the CA that signed the servers' certificates (None: the
    system's CAs); ``certfile``/``keyfile`` a client certificate, for servers with
    ``ssl.clientAuth=need``. ``check_hostname`` checks the certificate names the host in
    the connect string, as ZooKeeper's Java client does by default.
    """

    ca: Optional[str] = None
    certfile: Optional[str] = None
    keyfile: Optional[str] = None
    verify_certs: bool = True
    check_hostname: bool = True
    keyfile_password: Optional[str] = None

    def __post_init__(self) -> None:
        if (self.certfile is None) != (self.keyfile is None):
            raise ConfigurationError("a TLS client certificate needs both --tls-cert and --tls-key "
                                     "(TIDEMARK_ZK_TLS_CERT, TIDEMARK_ZK_TLS_KEY)")
        for what, path in (("CA", self.ca), ("certificate", self.certfile), ("key", self.keyfile)):
            if path is not None and not os.path.isfile(path):
                raise ConfigurationError(f"TLS {what} file {path!r} does not exist")
        if not self.verify_certs:
            object.__setattr__(self, "check_hostname", False)  # kazoo refuses the combination

    @classmethod
    def from_env(cls, settings: Optional[Settings] = None) -> Optional[TlsSettings]:
        """``TIDEMARK_ZK_TLS=1`` or any of ``TIDEMARK_ZK_TLS_CA``/``_CERT``/``_KEY``; None when TLS is off."""
        settings = settings or Settings.from_env()
        if not settings.tls_enabled:
            return None
        return cls(settings.zk_tls_ca, settings.zk_tls_cert, settings.zk_tls_key,
                   verify_certs=settings.zk_tls_verify, check_hostname=settings.zk_tls_check_hostname,
                   keyfile_password=settings.zk_tls_key_password)

    def kazoo_kwargs(self) -> dict:
        """These settings as ``KazooClient``'s keyword arguments (``use_ssl=True``, ``ca``, ``certfile``, ...)."""
        return dict(use_ssl=True, ca=self.ca, certfile=self.certfile, keyfile=self.keyfile,
                    keyfile_password=self.keyfile_password, verify_certs=self.verify_certs,
                    check_hostname=self.check_hostname)

    def context(self) -> ssl.SSLContext:
        """The client context kazoo builds from these settings; ``ConfigurationError`` if a file is unusable."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
        context.check_hostname = self.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED if self.verify_certs else ssl.CERT_NONE
        try:
            if self.ca:
                context.load_verify_locations(self.ca)
            if self.certfile and self.keyfile:
                context.load_cert_chain(self.certfile, self.keyfile, password=self.keyfile_password)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigurationError(f"cannot load the TLS files ({self.ca or '-'}, {self.certfile or '-'}, "
                                     f"{self.keyfile or '-'}): {exc}") from None
        return context


def diagnose_tls(hosts: Sequence[tuple[str, int]], tls: Optional[TlsSettings],
                 timeout: float = 2.0) -> Optional[ConfigurationError]:
    """Handshake with each server as the session would; a ``TlsError`` for the first mismatch found (or, without
    TLS, a ``ConfigurationError`` for an address that answers as an HTTP server), else None."""
    for host, port in hosts:
        problem = None if tls else _not_zookeeper(host, port, timeout)
        if problem is not None:
            return problem
        try:
            raw = socket.create_connection((host, port), timeout=timeout)
        except OSError:
            continue  # nothing listens there: not a TLS problem, the timeout message covers it
        with raw:
            problem = _check_tls(raw, host, port, tls) if tls else _check_plaintext(raw, host, port)
        if problem is not None:
            return problem
    return None


def _not_zookeeper(host: str, port: int, timeout: float) -> Optional[ConfigurationError]:
    """An address that answers an HTTP request with a status line is an HTTP server or proxy, not ZooKeeper. To
    ZooKeeper the request's first 4 bytes are a length beyond any it takes: it hangs up, and no session is made."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            raw.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
            answer = raw.recv(256)
    except OSError:
        return None
    if not answer.startswith(b"HTTP/"):
        return None
    status = answer.split(b"\r\n", 1)[0].decode("ascii", "replace")
    return ConfigurationError(f"{host}:{port} is not ZooKeeper: it answered {status!r}, as an HTTP server or proxy "
                              "does. Point --zk (TIDEMARK_ZK) at your ZooKeeper servers' client port")


def _check_tls(raw: socket.socket, host: str, port: int, tls: TlsSettings) -> Optional[TlsError]:
    where = f"{host}:{port}"
    try:
        with tls.context().wrap_socket(raw, server_hostname=host) as conn:
            # TLS 1.3 servers check the client certificate after the handshake: an alert arrives on the first read.
            conn.settimeout(0.5)
            try:
                conn.recv(1)
            except ssl.SSLError as exc:
                return _client_certificate_refused(where, exc.reason or str(exc))
            except OSError:  # the server waits for our request: all is well
                pass
    except ssl.SSLCertVerificationError as exc:
        message = exc.verify_message or str(exc)
        if "hostname" in message.lower() or "match" in message.lower():
            return TlsError(f"the TLS certificate of ZooKeeper at {where} does not name {host!r} ({message}): "
                            "connect by a name in the certificate, or set TIDEMARK_ZK_TLS_CHECK_HOSTNAME=0")
        return TlsError(f"the TLS certificate of ZooKeeper at {where} was not accepted ({message}): "
                        "check that --tls-ca (TIDEMARK_ZK_TLS_CA) is the CA that signed the server's certificate")
    except ssl.SSLError as exc:
        if _server_alert(exc):
            return _client_certificate_refused(where, exc.reason or str(exc))
        return TlsError(f"ZooKeeper at {where} answered the TLS handshake with bytes that are not TLS "
                        f"({exc.reason or exc}), as a plaintext clientPort does: connect to its secureClientPort, or "
                        "drop the TLS options")
    except TimeoutError:  # a slow server (a loaded machine) is no sign of a plaintext port, which hangs up at once
        return None
    except OSError as exc:  # reset mid-handshake
        return TlsError(f"ZooKeeper at {where} hung up in the middle of the TLS handshake ({type(exc).__name__}), as "
                        "a plaintext clientPort does: connect to its secureClientPort, or drop the TLS options")
    return None


def _server_alert(exc: ssl.SSLError) -> bool:
    """True when the server answered the handshake with a TLS alert: it speaks TLS and refused something of ours."""
    return "ALERT" in (exc.reason or "")


def _client_certificate_refused(where: str, reason: str) -> TlsError:
    return TlsError(f"ZooKeeper at {where} requires a client certificate it accepts ({reason}): pass --tls-cert "
                    "and --tls-key (TIDEMARK_ZK_TLS_CERT, TIDEMARK_ZK_TLS_KEY) signed by a CA the server trusts")


def _check_plaintext(raw: socket.socket, host: str, port: int) -> Optional[TlsError]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with context.wrap_socket(raw, server_hostname=host):
            pass
    except ssl.SSLError as exc:
        if not _server_alert(exc):
            return None  # not a TLS port: a plaintext server that is slow or unhealthy
    except OSError:
        return None
    return TlsError(f"ZooKeeper at {host}:{port} speaks TLS (a secureClientPort): pass --tls-ca "
                    "(TIDEMARK_ZK_TLS_CA) with the CA of its certificate, or connect to its plaintext clientPort")
