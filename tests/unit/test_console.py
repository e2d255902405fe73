"""The console's pure parts, no server needed: options to arguments, what a write is refused for
before anything runs, the chart, the per-thread capture, and the HTTP server without a console."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from bridge.cli import main
from bridge.config import from_mapping
from bridge.console import Console
from bridge.console.api import Api, argv
from bridge.console.capture import captured
from bridge.console.chart import svg
from bridge.errors import ConfigError
from bridge.http import HttpServer


def test_options_become_the_cli_arguments() -> None:
    options = {
        "key_prefix": "c-",
        "yes": True,
        "dry_run": False,
        "reason": ["a", "b"],
        "shift": "-30m",
        "limit": 5,
        "topic": None,
        "target": "",
    }
    assert argv(options) == [
        "--key-prefix=c-",
        "--yes",
        "--reason=a",
        "--reason=b",
        "--shift=-30m",
        "--limit=5",
    ]


@pytest.mark.parametrize("name", ["config", "json", "help", "he", "c", "a b", "x;y"])
def test_options_the_api_does_not_pass_on_are_refused(name: str) -> None:
    with pytest.raises(ValueError, match="not an option of this call"):
        argv({name: "x"})


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("the-token\n")
    return path


def _api(token_file: Path | None) -> Api:
    console = {"token_file": str(token_file)} if token_file else {}
    return Api(from_mapping({"http": {"console": console}}, env={}), main)


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


def test_a_bad_option_is_the_cli_parser_s_own_one_line_error(token_file: Path) -> None:
    reply = _api(token_file).post("/api/cancel", JSON, b'{"bogus": 1}')
    assert reply.status == 400
    assert reply.body["error"] == "error: unrecognized arguments: --bogus=1"
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


def test_what_a_thread_prints_is_captured_for_that_thread_alone() -> None:
    seen: dict[str, str] = {}
    started = threading.Barrier(2)

    def command(name: str) -> None:
        with captured() as (out, err):
            started.wait(5)
            for _ in range(50):
                print(name)
                print(f"{name}!", file=sys.stderr)
        seen[name] = out.getvalue() + "|" + err.getvalue()

    threads = [threading.Thread(target=command, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {n: f"{n}\n" * 50 + "|" + f"{n}!\n" * 50 for n in ("a", "b")}


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
        console=Console(config, main) if enabled else None,
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
