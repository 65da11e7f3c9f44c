"""The limits ``tidemark serve`` answers every request within: one home for the HTTP layer (``asgi.py``) and the
command line, which imports nothing heavier to show them."""
from __future__ import annotations

DEFAULT_MAX_CONNECTIONS = 4_096  # open connections at most; a request beyond them is answered 503
WORKER_THREADS = 64  # catalog routes at once; beyond, requests queue for a thread (the connections are bounded)
HEAD_TIMEOUT_S = 10.0  # a request's line and headers, from the connection or the previous answer: a slow client's
KEEP_ALIVE_S = 15  # an idle connection between requests (engines keep theirs open across a query's loads)
GRACEFUL_S = 10  # requests in flight at shutdown finish within this
MAX_HEAD_BYTES = 32 * 1024  # a request's line and headers (a client reading many groups sends a cookie for each)
MAX_FORM_BYTES = 16 * 1024  # the token route's form, the one body read
BODY_TIMEOUT_S = 10.0  # for that form to arrive

__all__ = ["BODY_TIMEOUT_S", "DEFAULT_MAX_CONNECTIONS", "GRACEFUL_S", "HEAD_TIMEOUT_S", "KEEP_ALIVE_S",
           "MAX_FORM_BYTES", "MAX_HEAD_BYTES", "WORKER_THREADS"]
