"""The console's pure parts, no server needed: a write's JSON body read into the tool's typed
options, what a write is refused for before anything runs, the chart, and the HTTP server without
a console."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from bridge import ops
from bridge.config import from_mapping
from bridge.console import Console
from bridge.console.api import Api
from bridge.console.chart import svg
from bridge.errors import ConfigError, UsageError
from bridge.http import HttpServer


def test_a_write_s_body_becomes_its_typed_options() -> None:
    body = {
        "key_prefix": "c-",
        "yes": True,
        "dry_run": False,
        "shift": "-30m",
        "rate": 5,
        "topic": None,
        "target": "",
    }
    assert ops.from_body(ops.RescheduleAsk, body) == ops.RescheduleAsk(
        key_prefix="c-", yes=True, shift="-30m", rate=5.0
    )
    replay = ops.from_body(ops.ReplayAsk, {"reason": ["expired", "delivery-failed"], "limit": 5})
    assert replay == ops.ReplayAsk(reason=("expired", "delivery-failed"), limit=5)
    assert ops.from_body(ops.ReplayAsk, {"reason": "expired"}).reason == ("expired",)
    assert ops.from_body(ops.CancelAsk, {"id": "order-7"}) == ops.CancelAsk(id="order-7")


@pytest.mark.parametrize(
    ("kind", "body", "message"),
    [
        (ops.CancelAsk, {"config": "/etc/passwd", "id": "x"}, "config: not an option of this call"),
        (ops.CancelAsk, {"json": True, "id": "x"}, "json: not an option of this call"),
        (ops.CancelAsk, {"he": True}, "he: not an option of this call"),
        (ops.CancelAsk, {"id": ["a", "b"]}, "id: text"),
        (ops.CancelAsk, {"id": 7}, "id: text"),
        (ops.CancelAsk, {"id": "x", "force": "yes"}, "force: true or false"),
        (ops.CancelAsk, {"target": "t", "yes": True, "rate": "fast"}, "rate 'fast': a number"),
        (ops.CancelAsk, {"target": "t", "yes": True, "rate": "nan"}, "--rate nan: 0 (no limit)"),
        (ops.CancelAsk, {"target": "t", "yes": True, "rate": True}, "rate: a number"),
        (ops.CancelAsk, {"target": "t", "dry_run": True, "yes": True}, "--yes: not with --dry-"),
        (ops.CancelAsk, {"target": "t"}, "a bulk cancel needs --dry-run"),
        (ops.CancelAsk, {}, "give --id, or a filter"),
        (ops.CancelAsk, {"key": "k", "target": "t", "yes": True}, "--key: only with --id"),
        (ops.FireAsk, {"id": "x", "target": "t"}, "--target: not with --id"),
        (ops.RescheduleAsk, {"id": "x"}, "one of the arguments --at --after --shift"),
        (ops.RescheduleAsk, {"id": "x", "at": "1", "shift": "1h"}, "--shift: not with --at"),
        (ops.ReplayAsk, {"limit": -1}, "limit '-1': a whole number"),
        (ops.ReplayAsk, {"limit": "\u0663"}, "a whole number"),
        (ops.ReplayAsk, {"reason": [1]}, "reason: text, or a list of texts"),
        (ops.ReplayAsk, {"reason": ["soon"]}, "--reason soon: not a delay-error"),
    ],
)
def test_a_write_s_body_is_refused_in_one_line_naming_the_option(
    kind: Any, body: dict[str, object], message: str
) -> None:
    with pytest.raises(UsageError) as refused:
        ops.from_body(kind, body)
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("the-token\n")
    return path


def _api(token_file: Path | None) -> Api:
    console = {"token_file": str(token_file)} if token_file else {}
    return Api(from_mapping({"http": {"console": console}}, env={}))


JSON = {"Content-Type": "application/json", "Authorization": "Bearer the-token"}


def test_a_write_is_refused_before_anything_runs(token_file: Path) -> None:
    api = _api(token_file)
    body = b'{"id": "x"}'
    assert api.post("/api/cancel", {**JSON, "Authorization": ""}, body).status == 403
    assert api.post("/api/cancel", {**JSON, "Authorization": "Bearer nope"}, body).status == 403
    assert api.post("/api/cancel", {**JSON, "Authorization": "Basic the-token"}, body).status == 403
    assert api.post("/api/cancel", {**JSON, "Content-Type": "text/plain"}, body).status == 415
    assert api.post("/api/cancel", JSON, b"[1]").body == {"error": "the body is not a JSON object"}
    assert api.post("/api/cancel", JSON, b"{").status == 400
    assert api.post("/api/produce", JSON, body).status == 404  # only the four writes
    token_file.unlink()  # a Secret unmounted since start-up: refused, said
    gone = api.post("/api/cancel", JSON, body)
    assert gone.status == 403 and gone.body["error"].startswith("http.console.token_file: cannot")
    off = _api(None).post("/api/cancel", JSON, body)
    assert (off.status, off.body["error"]) == (
        403,
        "writes are off: http.console.token_file names no token",
    )


def test_a_bad_option_is_refused_in_the_cli_s_words(token_file: Path) -> None:
    reply = _api(token_file).post("/api/cancel", JSON, b'{"bogus": 1}')
    assert reply.status == 400
    assert reply.body["error"] == "bogus: not an option of this call"
    reply = _api(token_file).post("/api/reschedule", JSON, b'{"id": "x"}')
    assert (
        reply.status == 400 and "one of the arguments --at --after --shift" in reply.body["error"]
    )


def test_reads_refuse_what_is_not_a_call() -> None:
    api = _api(None)
    assert api.get("/api/nothing", {}).status == 404
    assert api.get("/api/due", {"span": ["year"]}).body == {
        "error": "span year: one of hour, day, month"
    }
    assert api.get("/api/status", {"config": ["/etc/x"]}).status == 400


def test_the_token_file_is_checked_at_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^http.console.token_file: cannot read"):
        from_mapping({"http": {"console": {"token_file": str(tmp_path / "none")}}}, env={})
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match=r"^http.console.token_file: .* is empty"):
        from_mapping({"http": {"console": {"token_file": str(tmp_path / "empty")}}}, env={})


def test_the_chart_draws_a_bar_per_span_to_scale() -> None:
    drawn = svg({"span": "hour", "step_ms": 300_000, "counts": [0, 4, 2] + [0] * 9})
    assert drawn.count("<rect") == 12 and 'data-count="4"' in drawn
    assert 'aria-label="records falling due over the next hour, 6 in all"' in drawn
    assert "<title>+5m to +10m: 4</title>" in drawn
    heights = [float(part.split('height="')[1].split('"')[0]) for part in drawn.split("<rect")[1:]]
    assert heights[1] == 2 * heights[2] and heights[0] == 0


def _request(server: HttpServer, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("enabled", [True, False])
def test_the_http_server_serves_the_console_only_when_enabled(enabled: bool) -> None:
    config = from_mapping({}, env={})
    server = HttpServer(
        "127.0.0.1",
        0,
        CollectorRegistry(),
        health=list,
        ready=list,
        console=Console(config) if enabled else None,
    )
    server.start()
    try:
        status, body = _request(server, "GET", "/ui/static/console.js")
        assert status == (200 if enabled else 404)
        status, body = _request(server, "POST", "/api/cancel", b"{}")
        assert status == 403 if enabled else 404
        if enabled:
            assert json.loads(body)["error"].startswith("writes are off")
            status, _ = _request(server, "POST", "/api/cancel", b"x" * 70_000)
            assert status == 413
        assert _request(server, "GET", "/metrics")[0] == 200
    finally:
        server.stop()
