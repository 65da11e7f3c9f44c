"""An HTTP proxy in front of a real REST catalog that makes commits' outcomes unknown, as a flaky network or a
load balancer does: the commit reaches the catalog and lands, and the client is answered 502, 504 or nothing.

    with CommitOutcomeProxy(lakehouse.catalog_uri) as proxy:   # proxy.uri: give it to the client instead
        proxy.fail_commits(every=3, status=504, times=4)        # every 3rd table commit, 4 times: landed, 504
        proxy.fail_commits(every=2, status=None, times=4)       # landed, the connection closed without an answer
        proxy.fail_commits(every=1, status=None, times=1, matching="counts", then=lakehouse.kill)
                                                                # the next commit of a table named *counts*
                                                                # lands, then the catalog is killed, unanswered
        proxy.fail_commits(every=1, status=REAL_ANSWER, times=1, then=cut)
                                                                # the next commit lands, ``cut`` runs, then the
                                                                # catalog's own answer goes back (over the cut)
        proxy.failed                                            # the commits answered so (table paths)

A table commit is ``POST /v1/{prefix}/namespaces/{ns}/tables/{table}`` (and ``POST /v1/{prefix}/transactions/
commit``), as in the Iceberg REST specification; every other request passes through unchanged.
"""
from __future__ import annotations

import http.client
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional
from urllib.parse import urlsplit

REAL_ANSWER = -1   # a commit's ``status``: the catalog's own answer, after ``then``
PUBLISH = b'"ref-name":"main"'   # in a commit that moves ``main`` (pyiceberg's compact JSON): not a staging one
COMMIT = re.compile(r"^/v1/(.+/)?(namespaces/[^/]+/tables/[^/?]+|transactions/commit)(\?.*)?$")


class CommitOutcomeProxy:
    def __init__(self, upstream: str) -> None:
        target = urlsplit(upstream)
        self.host, self.port = target.hostname or "127.0.0.1", target.port or 80
        self.every: int = 0
        self.times = 0
        self.status: Optional[int] = None
        self.matching = ""
        self.containing = b""
        self.then: Optional[Callable[[], object]] = None
        self.commits = 0
        self.failed: list[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _forward(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                upstream_conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                try:
                    upstream_conn.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream_conn.getresponse()
                    payload = answer.read()
                except OSError:  # the catalog is down (a fault test killed it): a load balancer's answer
                    self.send_error(502, "the catalog behind the proxy does not answer")
                    return
                finally:
                    upstream_conn.close()
                failing = self.command == "POST" and COMMIT.match(self.path) and proxy._should_fail(self.path, body)
                if failing and proxy.then is not None:
                    proxy.then()
                if failing and proxy.status != REAL_ANSWER:
                    if proxy.status is None:
                        self.close_connection = True
                        self.connection.close()  # landed; the client never hears so
                        return
                    message = b'{"error": {"message": "gateway timeout", "type": "ServerError", "code": %d}}' % (
                        proxy.status)
                    self.send_response(proxy.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_POST = do_DELETE = do_HEAD = do_PUT = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def fail_commits(self, every: int, status: Optional[int], times: int, *, matching: str = "",
                     containing: bytes = b"", then: Optional[Callable[[], object]] = None) -> None:
        """From now on, every ``every``-th table commit (of a path containing ``matching``, whose request body
        contains ``containing``: ``PUBLISH`` for a move of ``main``) lands and is answered
        ``status`` (None: no answer; ``REAL_ANSWER``: the catalog's own), ``times`` times (a bound: a writer's
        recovery makes commits too, which must get through in the end); ``then`` runs after the commit landed,
        before the client is answered."""
        with self._lock:
            self.every, self.status, self.times, self.commits, self.failed = every, status, times, 0, []
            self.matching, self.containing, self.then = matching, containing, then

    def _should_fail(self, path: str, body: bytes) -> bool:
        with self._lock:
            if (not self.every or len(self.failed) >= self.times or self.matching not in path
                    or self.containing not in body):
                return False
            self.commits += 1
            if self.commits % self.every:
                return False
            self.failed.append(path)
            return True

    def __enter__(self) -> CommitOutcomeProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
