"""What an operator asks the read tools: typed options, checked in one place.

The command line and the console's API build them alike.

Each field is an option by its command-line name (``due_before`` for ``--due-before``; ``id`` for
a delay-id); :func:`from_query` builds one from an API query (every value text, as a URL carries
it), refusing a name the read does not take. Times stay text until :func:`when` reads them against
a clock: epoch ms, RFC 3339, or a duration from now (or back from now).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, get_args, get_origin, get_type_hints

from bridge.errors import UsageError
from bridge.message import Reason, cut, parse_count, parse_when

DEFAULT_LIMIT = 20


def when(flag: str, text: str | None, now_ms: int, *, ago: bool = False) -> int | None:
    """An asked time (see :func:`bridge.message.parse_when`); None when it is not asked."""
    if text is None:
        return None
    try:
        return parse_when(text, now_ms, ago=ago)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


@dataclass(frozen=True)
class StatusAsk:
    """``status``: it takes no option."""


@dataclass(frozen=True)
class ListAsk:
    """``list``: waiting records in due order, a page at a time."""

    topic: str | None = None
    partition: int | None = None
    id: str | None = None
    due_before: str | None = None
    limit: int = DEFAULT_LIMIT
    skip: int = 0

    def __post_init__(self) -> None:
        if self.skip and self.id is not None:
            raise UsageError(f"--skip {self.skip}: not with --id")


@dataclass(frozen=True)
class TraceAsk:
    """``trace``: a record by its delay-id, or by its origin (``topic:partition:offset``)."""

    id: str | None = None
    origin: str | None = None
    topic: str | None = None
    since: str | None = None

    def __post_init__(self) -> None:
        if (self.id is None) == (self.origin is None):
            raise UsageError("one of the arguments --id --origin is required")


@dataclass(frozen=True)
class DlqAsk:
    """``dlq list`` and ``dlq replay``'s filters: delay-errors, a time span, how many."""

    reason: tuple[str, ...] = ()
    since: str | None = None
    until: str | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        known = {r.value for r in Reason}
        for reason in self.reason:
            if reason not in known:
                raise UsageError(
                    f"--reason {reason}: not a delay-error ({', '.join(sorted(known))})"
                )
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"--limit {self.limit}: at least 1")


Ask = TypeVar("Ask", StatusAsk, ListAsk, TraceAsk, DlqAsk)


def from_query(kind: type[Ask], query: Mapping[str, Sequence[str]]) -> Ask:
    """``kind`` from an API query: each name a field, each value text (a list for a repeated
    option); UsageError names what does not fit."""
    hints = get_type_hints(kind)
    fields = {f.name for f in dataclasses.fields(kind)}
    values: dict[str, Any] = {}
    for name, given in query.items():
        if name not in fields:
            raise UsageError(f"{name}: not an option of this call")
        hint = hints[name]
        if get_origin(hint) is tuple:
            values[name] = tuple(given)
            continue
        if len(given) != 1:
            raise UsageError(f"{name}: given {len(given)} times")
        text = given[0]
        if hint is int or int in get_args(hint):
            number = parse_count(text)
            if number is None:
                raise UsageError(f"{name} {cut(text, 40)!r}: a whole number, 0 or more")
            values[name] = number
        else:
            values[name] = text
    return kind(**values)
