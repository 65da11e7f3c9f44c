"""The two error models of the Iceberg REST spec, as exceptions a route raises and the HTTP layer answers with.

``RestError`` is the catalog's (``{"error": {"message", "type", "code"}}``, pyiceberg's ``ErrorResponse``): engines map
its ``type`` to their own exceptions. ``OAuthError`` is the token endpoint's (RFC 6749, pyiceberg's
``OAuthErrorResponse``): an OAuth client reads ``error`` and ``error_description`` there, nothing else.
"""
from __future__ import annotations

from typing import Literal

from pyiceberg.catalog.rest.response import ErrorResponse, ErrorResponseMessage, OAuthErrorResponse

OAuthErrorKind = Literal["invalid_request", "invalid_client", "invalid_grant", "unauthorized_client",
                         "unsupported_grant_type", "invalid_scope"]


class RestError(Exception):
    """An answer in the catalog's error model: ``status``, the exception ``kind`` engines map, and the message."""

    status: int
    kind: str

    def __init__(self, status: int, kind: str, message: str) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind

    def body(self) -> bytes:
        """The answer's JSON body, ``{"error": {"message", "type", "code"}}``."""
        message = ErrorResponseMessage(message=str(self), type=self.kind, code=self.status)
        return ErrorResponse(error=message).model_dump_json().encode()


class OAuthError(Exception):
    """An answer of the token endpoint in OAuth's error model: 401 for ``invalid_client``, else 400."""

    kind: OAuthErrorKind

    def __init__(self, kind: OAuthErrorKind, description: str) -> None:
        super().__init__(description)
        self.kind = kind

    @property
    def status(self) -> int:
        return 401 if self.kind == "invalid_client" else 400

    def body(self) -> bytes:
        """The answer's JSON body, ``{"error", "error_description"}``."""
        return OAuthErrorResponse(error=self.kind, error_description=str(self)).model_dump_json().encode()


def first_line(exc: BaseException) -> str:
    """An exception's message in one line (what a client and the log are told), its type when it has none."""
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


__all__ = ["OAuthError", "RestError", "first_line"]
