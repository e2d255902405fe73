"""The line the bridge logs once when it is first ready: what `make run` waits for."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from bridge.announce import READY_CHECK_S, ReadyLine, base_url
from bridge.config import from_mapping


@dataclass
class Http:
    """The HTTP server as the ready line reads it."""

    port: int
    console: object | None


def test_a_wildcard_bind_is_reached_at_localhost() -> None:
    assert base_url("0.0.0.0", 9464) == "http://localhost:9464"
    assert base_url("::", 9464) == "http://localhost:9464"
    assert base_url("127.0.0.1", 8080) == "http://127.0.0.1:8080"


def test_ready_is_said_once_the_first_time_nothing_is_wrong(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = from_mapping({"topics": {"delay": ["delay", "later"]}}, env={})
    problems = ["consumer has not joined its group"]
    line = ReadyLine(lambda: list(problems), config, Http(9464, object()))
    caplog.set_level(logging.INFO, logger="bridge.announce")
    line.check()
    assert not line.said and line.wait_s(60) == READY_CHECK_S
    problems.clear()
    line.check()
    line.check()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ready:")]
    assert said == [
        "ready: delivering from delay,later; metrics at http://localhost:9464/metrics, "
        "console at http://localhost:9464/ui"
    ]
    assert line.wait_s(60) == 60


def test_no_console_is_named_when_none_is_served(caplog: pytest.LogCaptureFixture) -> None:
    config = from_mapping({"http": {"host": "127.0.0.1"}}, env={})
    caplog.set_level(logging.INFO, logger="bridge.announce")
    ReadyLine(lambda: [], config, Http(19464, None)).check()
    [said] = [r.getMessage() for r in caplog.records]
    assert said.endswith("metrics at http://127.0.0.1:19464/metrics")
