"""Who may read through ``tidemark serve``: static bearer tokens, and OAuth2 client credentials exchanged for signed
tokens at ``/v1/oauth/tokens``.

    auth = ServerAuth.from_env()                     # TIDEMARK_SERVE_TOKENS, TIDEMARK_SERVE_CLIENT_ID/_SECRET
    token = auth.issue("reader", "s3cret")           # OAuthError("invalid_client") for wrong credentials
    auth.authenticated("Bearer " + token)            # True; RestError 401 when a token is required and wrong

A signed token names its client and expiry and is accepted by every replica that has the same client secret, so
replicas share nothing. With neither tokens nor client credentials, anyone may read, and is not authenticated: such a
client gets no storage credentials (``server.py``).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

from coordinator.errors import ConfigurationError
from coordinator.serving.rest_errors import OAuthError, RestError

TOKEN_LIFETIME_S = 3600


@dataclass(frozen=True)
class ServerAuth:
    """Who may read: static bearer ``tokens``, and OAuth2 client credentials (``client_id``, ``client_secret``) that
    ``/v1/oauth/tokens`` exchanges for a signed token any replica with the same secret accepts. Neither: anyone.

    ``from_env`` reads ``TIDEMARK_SERVE_TOKENS`` (comma-separated), ``TIDEMARK_SERVE_CLIENT_ID`` and
    ``TIDEMARK_SERVE_CLIENT_SECRET``: secrets stay off the command line.
    """

    tokens: tuple[str, ...] = ()
    client_id: Optional[str] = None
    client_secret: Optional[str] = None

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> ServerAuth:
        """The auth the variables configure (see the class docstring); none of them: anyone may read.

        :param env: the variables to read (default ``os.environ``).
        :raises ConfigurationError: only one of the client id and the client secret is set.
        """
        env = os.environ if env is None else env
        tokens = tuple(t.strip() for t in env.get("TIDEMARK_SERVE_TOKENS", "").split(",") if t.strip())
        client_id, secret = env.get("TIDEMARK_SERVE_CLIENT_ID") or None, env.get("TIDEMARK_SERVE_CLIENT_SECRET") or None
        if (client_id is None) != (secret is None):
            raise ConfigurationError("set both TIDEMARK_SERVE_CLIENT_ID and TIDEMARK_SERVE_CLIENT_SECRET (OAuth2 "
                                     "client credentials), or neither")
        return cls(tokens, client_id, secret)

    @property
    def required(self) -> bool:
        """Whether a request needs a bearer token: static tokens or client credentials are configured."""
        return bool(self.tokens or self.client_id)

    def issue(self, client_id: str, client_secret: str, now: Optional[float] = None) -> str:
        """A token for valid client credentials.

        :raises OAuthError: ``invalid_client`` for credentials this server was not given.
        """
        if self.client_id is None or self.client_secret is None or not (
                hmac.compare_digest(client_id.encode(), self.client_id.encode())
                and hmac.compare_digest(client_secret.encode(), self.client_secret.encode())):
            raise OAuthError("invalid_client", "invalid client credentials")
        expires = int((now if now is not None else time.time()) + TOKEN_LIFETIME_S)
        return f"tm.{expires}.{self._signature(client_id, expires)}.{client_id}"

    def accepts(self, token: str, now: Optional[float] = None) -> bool:
        """Whether ``token`` is one of the static ``tokens``, or a token ``issue`` signed with this client secret
        that has not expired (``TOKEN_LIFETIME_S`` after it was issued).

        :param now: the time to judge expiry by, in seconds since 1970 (default: now).
        """
        if any(hmac.compare_digest(token.encode(), t.encode()) for t in self.tokens):
            return True
        parts = token.split(".", 3)
        if self.client_id is None or len(parts) != 4 or parts[0] != "tm" or not parts[1].isdigit():
            return False
        expires, signature, client_id = int(parts[1]), parts[2], parts[3]
        return (expires > (now if now is not None else time.time())
                and hmac.compare_digest(signature.encode(), self._signature(client_id, expires).encode()))

    def authenticated(self, authorization: Optional[str]) -> bool:
        """Whether a request with this ``Authorization`` header is authenticated (False when no auth is configured).

        :raises RestError: 401 when a bearer token is required and this one is missing or not accepted.
        """
        if not self.required:
            return False
        header = authorization or ""
        token = header[7:] if header[:7].lower() == "bearer " else ""
        if not token or not self.accepts(token):
            raise RestError(401, "NotAuthorizedException", "a valid bearer token is required (OAuth2 client "
                            "credentials at /v1/oauth/tokens, or a token the server was given)")
        return True

    def _signature(self, client_id: str, expires: int) -> str:
        key = (self.client_secret or "").encode()
        return hmac.new(key, f"{client_id}:{expires}".encode(), hashlib.sha256).hexdigest()


__all__ = ["TOKEN_LIFETIME_S", "ServerAuth"]
