"""The console's requests are answered here: routing, static files, and safe headers.

The headers keep the pages to what the bridge serves: a Content-Security-Policy that allows nothing
from elsewhere, no framing, no sniffing, no caching."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from urllib.parse import parse_qs

from bridge.config import Config
from bridge.console.api import Api, Reply
from bridge.console.pages import dead_letters, overview, record, records, schedules

logger = logging.getLogger(__name__)

JSON = "application/json"
HTML = "text/html; charset=utf-8"
STATIC = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
SAFE_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
    "img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
    "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


@dataclass
class Response:
    """What the HTTP server sends back."""

    status: int
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=lambda: dict(SAFE_HEADERS))


def _json(reply: Reply) -> Response:
    return Response(reply.status, reply.encoded(), JSON)


class Console:
    """The console and its API, acting with ``config``."""

    def __init__(self, config: Config) -> None:
        self.api = Api(config)
        self._pages: dict[str, Callable[[Mapping[str, str], bool], str]] = {
            "/ui": lambda _, __: overview(self.api),
            "/ui/records": lambda q, _: records(self.api, q),
            "/ui/record": lambda q, reveal: record(self.api, q, reveal=reveal),
            "/ui/schedules": lambda q, _: schedules(self.api, q),
            "/ui/dlq": lambda q, _: dead_letters(self.api, q),
        }

    @staticmethod
    def serves(path: str) -> bool:
        """Whether ``path`` is the console's."""
        return path == "/ui" or path.startswith(("/ui/", "/api/"))

    def get(self, target: str, headers: Mapping[str, str]) -> Response:
        """A GET of ``target`` (path and query) with the request's ``headers``."""
        path, _, raw = target.partition("?")
        query = parse_qs(raw, keep_blank_values=False)
        refused = None if path.startswith("/ui/static/") else self.api.read_refused(headers)
        if refused:
            return _json(Reply(401, {"error": refused}))
        reveal = self.api.reveals(headers)
        if path.startswith("/api/"):
            return _json(self.api.get(path, query, reveal=reveal))
        if path.startswith("/ui/static/") and path.removeprefix("/ui/static/") in STATIC:
            name = path.removeprefix("/ui/static/")
            data = resources.files("bridge.console").joinpath("static", name).read_bytes()
            return Response(200, data, STATIC[name])
        render = self._pages.get(path.rstrip("/") or path)
        if render is None:
            return Response(404, b"not found\n", "text/plain; charset=utf-8")
        return Response(200, render({k: v[0] for k, v in query.items()}, reveal).encode(), HTML)

    def post(self, target: str, headers: Mapping[str, str], data: bytes) -> Response:
        """A POST of ``data`` to ``target``."""
        return _json(self.api.post(target.partition("?")[0], headers, data))
