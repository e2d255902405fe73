"""The JSON API at ``/api/``: every read and action of the console, each the CLI's own tool.

A call's options are the command's options by name (``key_prefix`` for ``--key-prefix``, ``true``
for a flag, a list for a repeated option), from the query string of a read or the JSON body of a
write, read into the typed options the command builds (:mod:`bridge.ops`); each call runs the tool
the command runs. A read answers what ``--json`` prints as ``result``, the notes beside it as
``messages``: 400 for an option it does not take, 404 when nothing was found or a service is
unreachable. A write answers what the command prints as ``output``, its notes as ``messages`` and
its typed result as ``result``: 400 for bad options, 422 when nothing matched or it failed.

Reads are open unless ``http.console.read_token_file`` names a token; then they need it (or the
write token) too. Without a token, a read shows no payload value and no header outside the
contract's (``delay-*``): a record's preview keeps its key and sizes.

Writes need ``Authorization: Bearer <token>`` (``http.console.token_file``; none configured: every
write is refused) and a JSON body: a browser sends neither across sites without the bridge's
consent (CORS), which it never gives, so a page elsewhere cannot act through a visitor's browser.
"""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from bridge import ops
from bridge.config import Config
from bridge.console.chart import SPANS, due_over
from bridge.errors import BridgeError, ConfigError, UsageError
from bridge.message import wall_ms

logger = logging.getLogger(__name__)

# Each read: the options it takes, and the tool that answers it (bridge.ops, as the CLI's).
READS: dict[str, tuple[type[Any], Callable[[Config, Any, int], ops.Answer]]] = {
    "/api/status": (ops.StatusAsk, ops.status_answer),
    "/api/records": (ops.ListAsk, ops.list_answer),
    "/api/trace": (ops.TraceAsk, ops.trace_answer),
    "/api/dlq": (ops.DlqAsk, ops.dlq_answer),
    "/api/schedules": (ops.SchedulesAsk, ops.schedules_answer),
}
# Each write: the operator's tool it calls, as the command of that name does (ops.WRITES).
WRITES = {
    "/api/cancel": "cancel",
    "/api/fire": "fire",
    "/api/reschedule": "reschedule",
    "/api/dlq/replay": "replay",
    "/api/schedules/pause": "pause",
    "/api/schedules/resume": "resume",
}


@dataclass
class Reply:
    """An API answer: the HTTP status and the JSON body."""

    status: int
    body: dict[str, Any] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return (json.dumps(self.body, indent=2) + "\n").encode()


def _bearer(headers: Mapping[str, str]) -> str:
    """The token an ``Authorization: Bearer`` header carries ("" when none)."""
    scheme, _, given = headers.get("Authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" else ""


def without_payloads(data: Any) -> Any:
    """``data`` (a read's result) with every record preview's value left out and its headers
    cut to the contract's (``delay-*``)."""
    if isinstance(data, list):
        return [without_payloads(item) for item in data]
    if not isinstance(data, dict):
        return data
    out = {k: without_payloads(v) for k, v in data.items()}
    if "value" in out and "value_bytes" in out:
        out["value"] = None
        out["headers"] = [h for h in out.get("headers") or [] if str(h[0]).startswith("delay-")]
    return out


class Api:
    """Runs API calls with the bridge's ``config``."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def reveals(self, headers: Mapping[str, str]) -> bool:
        """Whether a request with ``headers`` carries the read or the write token."""
        given = _bearer(headers)
        try:
            tokens = [self.config.console_read_token(), self.config.console_token()]
        except ConfigError:  # a token file gone since start-up: no token is known
            return False
        return bool(given) and any(
            hmac.compare_digest(given.encode(), t.encode()) for t in tokens if t
        )

    def read_refused(self, headers: Mapping[str, str]) -> str | None:
        """Why a read is refused: a read token is configured and the request carries neither
        it nor the write token (None: it is not)."""
        if not self.config.http.console.read_token_file or self.reveals(headers):
            return None
        return "a read needs the console's read token: Authorization: Bearer <token>"

    def get(self, path: str, query: Mapping[str, list[str]], *, reveal: bool = False) -> Reply:
        """A read: ``query`` holds the command's options; payloads only if ``reveal`` (the
        request carried a token)."""
        if path == "/api/due":
            span = query.get("span", ["day"])[-1]
            if span not in SPANS:
                return Reply(400, {"error": f"span {span}: one of {', '.join(SPANS)}"})
            return Reply(200, {"result": due_over(self.config, span)})
        if path not in READS:
            return Reply(404, {"error": f"no such call: GET {path}"})
        kind, answer_of = READS[path]
        try:
            answer = answer_of(self.config, ops.from_query(kind, query), wall_ms())
        except (UsageError, ConfigError) as exc:
            return Reply(400, {"error": str(exc)})
        except BridgeError as exc:  # a service unreachable, nothing where it was asked
            return Reply(404, {"error": str(exc), "messages": [str(exc)]})
        body: dict[str, Any] = {
            "messages": answer.notes,
            "result": answer.json if reveal else without_payloads(answer.json),
        }
        if not answer.found:
            body["error"] = answer.notes[-1] if answer.notes else "not found"
        return Reply(200 if answer.found else 404, body)

    def post(self, path: str, headers: Mapping[str, str], data: bytes) -> Reply:
        """A write: ``data`` is the JSON object of the command's options."""
        if path not in WRITES:
            return Reply(404, {"error": f"no such call: POST {path}"})
        refused = self._refused(headers)
        if refused:
            return Reply(403, {"error": refused})
        if headers.get("Content-Type", "").split(";")[0].strip() != "application/json":
            return Reply(415, {"error": "send the options as a JSON object (application/json)"})
        kind, tool = ops.WRITES[WRITES[path]]
        voice = ops.Voice()
        try:
            options = json.loads(data or b"{}")
            if not isinstance(options, dict):
                raise UsageError("the body is not a JSON object")
            done = tool(self.config, ops.from_body(kind, options), wall_ms(), voice)
        except (UsageError, ConfigError, ValueError) as exc:  # JSONDecodeError: a ValueError
            return Reply(400, {"error": str(exc)})
        except BridgeError as exc:  # a service unreachable, the id waits nowhere
            logger.info("console: %s: %s", path, exc)
            return Reply(422, {"error": str(exc), "messages": [*voice.said, str(exc)]})
        said = (done.lines() or voice.said or ["done"])[0]
        logger.info("console: %s %s: %s", path, json.dumps(options)[:200], said)
        body: dict[str, Any] = {
            "output": done.lines(),
            "messages": voice.said,
            "result": done.as_json(),
        }
        if not done.found:
            body["error"] = voice.said[-1] if voice.said else "not found"
        return Reply(200 if done.found else 422, body)

    def _refused(self, headers: Mapping[str, str]) -> str | None:
        """Why a write is refused (None: it is not)."""
        try:
            token = self.config.console_token()  # read at each write: a rotated Secret applies
        except ConfigError as exc:  # the file went away since start-up
            return str(exc)
        if token is None:
            return "writes are off: http.console.token_file names no token"
        if not hmac.compare_digest(_bearer(headers).encode(), token.encode()):
            return "a write needs the console token: Authorization: Bearer <token>"
        return None
