"""Test certificates made at test time with ``openssl``: a CA, a server and a client certificate, and a stranger CA."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certificates:
    ca: Path               # the CA that signed the server and client certificates
    other_ca: Path         # a CA that signed nothing here: the wrong CA
    server_keystore: Path  # the server's key, then its certificate (ZooKeeper's PEM keystore)
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _self_signed_ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=directory)


def _signed(directory: Path, name: str, ca: str, extensions: str) -> None:
    (directory / f"{name}.ext").write_text(extensions + "\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=directory)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=directory)


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    _self_signed_ca(directory, "ca")
    _self_signed_ca(directory, "other-ca")
    _signed(directory, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost")
    _signed(directory, "client", "ca", "extendedKeyUsage=clientAuth")
    keystore = directory / "server-keystore.pem"
    keystore.write_text((directory / "server.key").read_text() + (directory / "server.pem").read_text())
    return Certificates(directory / "ca.pem", directory / "other-ca.pem", keystore, directory / "client.pem",
                        directory / "client.key")
