"""Argument values the commands share, read with one line of error naming the flag."""

from __future__ import annotations

from bridge.errors import UsageError
from bridge.message import parse_when


def when_arg(flag: str, text: str | None, now_ms: int, *, ago: bool = False) -> int | None:
    """A command-line time (see :func:`bridge.message.parse_when`); None when the flag is not
    given."""
    if text is None:
        return None
    try:
        return parse_when(text, now_ms, ago=ago)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
