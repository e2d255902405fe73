"""The HTTP endpoints: metrics, liveness and readiness, and the console.

``/metrics`` (Prometheus), ``/healthz`` (loops alive), ``/readyz`` (can work); GET and HEAD.
``/ui`` and ``/api/`` (GET, and POST for the API's writes): :mod:`bridge.console`, when given.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from bridge.errors import ConfigError
from bridge.message import parse_count

if TYPE_CHECKING:
    from bridge.console import Console, Response

logger = logging.getLogger(__name__)

MAX_BODY = 64 * 1024  # the API's JSON options: a few hundred bytes
Check = Callable[[], list[str]]  # returns the problems; empty means healthy
# A bounded pool answers: WORKERS connections at a time, QUEUED more waiting for one; past that a
# connection is answered 503 at once. Console reads take at most CONSOLE_WORKERS of the workers,
# so probes and scrapes always find one. A connection idle for REQUEST_TIMEOUT_S is closed.
WORKERS, QUEUED, CONSOLE_WORKERS = 8, 32, 4
REQUEST_TIMEOUT_S = 2.0
_BUSY = b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n"


class PooledServer(HTTPServer):
    """An HTTP server whose connections are served by a bounded pool of threads, not a thread
    each: a flood of connections costs the bridge a bounded number of threads and memory."""

    # The listen backlog: socketserver's 5 overflowed at once under a flood, and every connection
    # past it (a kubelet's probe among them) waited for its SYN to be sent again, 1 s, 3 s, 7 s
    # later, instead of being answered; the acceptor takes each in microseconds.
    request_queue_size = 512

    def __init__(self, address: tuple[str, int], handler: Any) -> None:
        self._slots = threading.BoundedSemaphore(WORKERS + QUEUED)
        self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="http")
        self.console_slots = threading.BoundedSemaphore(CONSOLE_WORKERS)
        super().__init__(address, handler)  # closes the socket (server_close) if it cannot bind

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):  # a peer gone already
                request.sendall(_BUSY)
            self.shutdown_request(request)
            return
        self._pool.submit(self._serve, request, client_address)

    def _serve(self, request: socket.socket, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


class HttpServer:
    """A small HTTP server for metrics, probes and the console: it accepts on its own daemon
    thread and serves from a bounded pool (:class:`PooledServer`)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        *,
        health: Check,
        ready: Check,
        console: Console | None = None,
    ) -> None:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            head = False
            timeout = REQUEST_TIMEOUT_S

            def do_HEAD(self) -> None:
                # Probes may use HEAD: the same status and headers as GET, no body.
                self.head = True
                self.do_GET()

            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self._send(200, generate_latest(outer.registry), CONTENT_TYPE_LATEST)
                elif path in ("/healthz", "/readyz"):
                    problems = (outer.health if path == "/healthz" else outer.ready)()
                    body = ("\n".join(problems) if problems else "ok") + "\n"
                    self._send(503 if problems else 200, body.encode(), "text/plain; charset=utf-8")
                elif outer.console is not None and outer.console.serves(path):
                    asked = {"Authorization": self.headers.get("Authorization", "")}
                    self._answer(lambda console: console.get(self.path, asked))
                else:
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")

            def do_POST(self) -> None:
                console = outer.console
                if console is None or not self.path.startswith("/api/"):
                    self._send(404, b"not found\n", "text/plain; charset=utf-8")
                    return
                length = parse_count(self.headers.get("Content-Length") or "0")
                if length is None or length > MAX_BODY:
                    self._send(413, b"body too large\n", "text/plain; charset=utf-8")
                    return
                data = self.rfile.read(length)
                asked = {h: self.headers.get(h, "") for h in ("Authorization", "Content-Type")}
                self._answer(lambda console: console.post(self.path, asked, data))

            def _answer(self, handle: Callable[[Console], Response]) -> None:
                assert outer.console is not None
                slots = outer.server.console_slots
                if not slots.acquire(blocking=False):  # the probes keep workers of their own
                    self._send(503, b"busy: try again\n", "text/plain", {"Retry-After": "1"})
                    return
                try:
                    response = handle(outer.console)
                except Exception:  # a bug must not take the HTTP thread down: say it, log it
                    logger.exception("console: %s %s failed", self.command, self.path)
                    self._send(500, b"internal error: see the bridge's log\n", "text/plain")
                    return
                finally:
                    slots.release()
                self._send(response.status, response.body, response.content_type, response.headers)

            def _send(
                self, code: int, body: bytes, content_type: str, extra: dict[str, str] | None = None
            ) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                for name, value in (extra or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not self.head:
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                logger.debug("http: " + format, *args)

        self.registry = registry
        self.console = console
        self.health = health
        self.ready = ready
        try:
            self.server = PooledServer((host, port), Handler)
        except OSError as exc:
            raise ConfigError(
                f"http.port: cannot listen on {host}:{port}: {exc.strerror}"
            ) from None
        self._thread = threading.Thread(target=self.server.serve_forever, name="http", daemon=True)

    @property
    def port(self) -> int:
        """The bound port (useful when configured as 0)."""
        return int(self.server.server_address[1])

    def start(self) -> None:
        """Serve in the background."""
        self._thread.start()
        logger.info("http listening on %s:%d", self.server.server_address[0], self.port)

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self.server.shutdown()
        self.server.server_close()
