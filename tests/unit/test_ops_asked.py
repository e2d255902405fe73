"""The read tools' options, built from an API query as the command line builds them: the same
checks, one place (bridge.ops.asked)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.errors import UsageError
from bridge.ops import DlqAsk, ListAsk, StatusAsk, TraceAsk, from_query, when


def test_a_query_becomes_typed_options() -> None:
    asked = from_query(ListAsk, {"topic": ["delay"], "limit": ["5"], "skip": ["10"]})
    assert asked == ListAsk(topic="delay", limit=5, skip=10)
    assert from_query(DlqAsk, {"reason": ["expired", "delivery-failed"], "since": ["2h"]}) == (
        DlqAsk(reason=("expired", "delivery-failed"), since="2h")
    )
    assert from_query(StatusAsk, {}) == StatusAsk()


@pytest.mark.parametrize(
    ("kind", "query", "says"),
    [
        (StatusAsk, {"config": ["/etc/x"]}, "config: not an option of this call"),
        (ListAsk, {"json": ["1"]}, "json: not an option of this call"),
        (ListAsk, {"limit": ["²"]}, "limit '²': a whole number, 0 or more"),
        (ListAsk, {"partition": ["-1"]}, "partition '-1': a whole number, 0 or more"),
        (ListAsk, {"limit": ["1", "2"]}, "limit: given 2 times"),
        (ListAsk, {"id": ["x"], "skip": ["3"]}, "--skip 3: not with --id"),
        (TraceAsk, {}, "one of the arguments --id --origin is required"),
        (TraceAsk, {"id": ["x"], "origin": ["d:0:1"]}, "one of the arguments --id --origin"),
        (DlqAsk, {"reason": ["nope"]}, "--reason nope: not a delay-error"),
        (DlqAsk, {"limit": ["0"]}, "--limit 0: at least 1"),
    ],
)
def test_what_does_not_fit_is_refused_in_words(
    kind: type[Any], query: dict[str, list[str]], says: str
) -> None:
    with pytest.raises(UsageError, match=f"^{says}"):
        from_query(kind, query)


def test_an_asked_time_is_read_against_the_clock_or_refused() -> None:
    now = 1_800_000_000_000
    assert when("--since", None, now) is None
    assert when("--due-before", "1h", now) == now + 3_600_000
    assert when("--since", "1h", now, ago=True) == now - 3_600_000
    with pytest.raises(UsageError, match=r"^--since: "):
        when("--since", "soon", now)
