"""What an operator asks the tools: typed options, checked in one place.

The command line and the console's API build them alike: each field is an option by its
command-line name (``due_before`` for ``--due-before``; ``id`` for a delay-id). :func:`from_query`
builds a read's from an API query (every value text, as a URL carries it), :func:`from_body` a
write's from a JSON object; both refuse a name the call does not take. Times stay text until
:func:`when` reads them against a clock: epoch ms, RFC 3339, or a duration from now (or back from
now).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, get_args, get_origin, get_type_hints

from bridge.errors import UsageError
from bridge.message import Reason, cut, parse_count, parse_when

DEFAULT_LIMIT = 20
FILTERS = ("target", "key_prefix", "due_after", "due_before")
# A bulk write's records a second at most by default: none. It follows the bridge instead
# (bridge.ops.Follow): the records other producers send to those partitions meanwhile wait
# behind no more than bridge.ops.AHEAD of its records.
DEFAULT_RATE = 0.0


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


@dataclass(frozen=True)
class BulkAsk:
    """What ``cancel``, ``fire`` and ``reschedule`` share: one record by ``id``, or every
    waiting record the filters match (``target``, ``key_prefix``, ``due_after``, ``due_before``;
    ``topic`` alone matches all of one delay topic), counted (``dry_run``) or acted on (``yes``)
    as ``operation``, at most ``rate`` a second (0: no limit)."""

    verb: ClassVar[str] = ""
    id: str | None = None
    topic: str | None = None
    timeout: str = "10s"
    target: str | None = None
    key_prefix: str | None = None
    due_after: str | None = None
    due_before: str | None = None
    dry_run: bool = False
    yes: bool = False
    operation: str | None = None
    rate: float = DEFAULT_RATE

    def __post_init__(self) -> None:
        if self.dry_run and self.yes:
            raise UsageError("--yes: not with --dry-run")
        if self.id is not None:
            extra = [f"--{f.replace('_', '-')}" for f in self.filters]
            extra += [f for f, given in (("--dry-run", self.dry_run), ("--yes", self.yes)) if given]
            if extra:
                raise UsageError(f"{extra[0]}: not with --id")
            return
        self._check_bulk()

    @property
    def filters(self) -> list[str]:
        """The filters given, by field name (``topic`` aside: it goes with ``id`` too)."""
        return [f for f in FILTERS if getattr(self, f) is not None]

    def _check_bulk(self) -> None:
        if not self.filters and self.topic is None:
            raise UsageError(
                "give --id, or a filter (--target, --key-prefix, --due-after, --due-before, "
                "--topic)"
            )
        if not (self.dry_run or self.yes):
            raise UsageError(
                f"a bulk {self.verb} needs --dry-run (count what matches) or --yes (act)"
            )
        if not self.rate >= 0:  # nan too
            raise UsageError(f"--rate {self.rate:g}: 0 (no limit) or more records a second")
        given = self.operation
        if given is not None and not (
            1 <= len(given) <= 64 and given.isascii() and given.isprintable()
        ):
            raise UsageError(f"--operation {given[:70]!r}: 1 to 64 printable ASCII characters")


@dataclass(frozen=True)
class CancelAsk(BulkAsk):
    """``cancel``: with ``id``, the cancel's ``key`` (its partition when ``force`` produces it
    for an id that waits nowhere)."""

    verb: ClassVar[str] = "cancel"
    key: str | None = None
    force: bool = False

    def __post_init__(self) -> None:
        if self.id is None and (self.key is not None or self.force):
            raise UsageError(f"{'--key' if self.key is not None else '--force'}: only with --id")
        super().__post_init__()


@dataclass(frozen=True)
class FireAsk(BulkAsk):
    """``fire``: deliver now."""

    verb: ClassVar[str] = "fire"


@dataclass(frozen=True)
class RescheduleAsk(BulkAsk):
    """``reschedule``: a new due time — ``at`` a time, ``after`` a delay from now, or each
    record's own moved by ``shift`` (``-30m``: earlier)."""

    verb: ClassVar[str] = "reschedule"
    at: str | None = None
    after: str | None = None
    shift: str | None = None

    def __post_init__(self) -> None:
        given = [f"--{f}" for f in ("at", "after", "shift") if getattr(self, f) is not None]
        if not given:
            raise UsageError("one of the arguments --at --after --shift is required")
        if len(given) > 1:
            raise UsageError(f"{given[1]}: not with {given[0]}")
        super().__post_init__()


@dataclass(frozen=True)
class ReplayAsk(DlqAsk):
    """``dlq replay``: the filters of ``dlq list``, read from where the last replay stopped
    unless ``from_beginning``; ``dry_run`` counts and produces nothing."""

    from_beginning: bool = False
    dry_run: bool = False


@dataclass(frozen=True)
class SchedulesAsk:
    """``schedules list``: the live recurring schedules of ``topic`` (None: every delay topic),
    ``limit`` at most."""

    topic: str | None = None
    limit: int = 100


@dataclass(frozen=True)
class PauseAsk:
    """``schedules pause``: the recurring schedule with ``id``, by a record to the partition its
    registry has it in — or, when it is found nowhere, to ``key``'s partition."""

    verb: ClassVar[str] = "pause"
    id: str | None = None
    topic: str | None = None
    key: str | None = None
    timeout: str = "10s"

    def __post_init__(self) -> None:
        if self.id is None:
            raise UsageError("--id is required: it names the schedule")


@dataclass(frozen=True)
class ResumeAsk(PauseAsk):
    """``schedules resume``: as :class:`PauseAsk`."""

    verb: ClassVar[str] = "resume"


Ask = TypeVar("Ask", StatusAsk, ListAsk, TraceAsk, DlqAsk, SchedulesAsk)
Write = TypeVar("Write", CancelAsk, FireAsk, RescheduleAsk, ReplayAsk, PauseAsk, ResumeAsk)


def from_query(kind: type[Ask], query: Mapping[str, Sequence[str]]) -> Ask:
    """``kind`` from an API query: each name a field, each value text (a list for a repeated
    option); UsageError names what does not fit."""

    def read(name: str, hint: Any, given: Sequence[str]) -> Any:
        if get_origin(hint) is tuple:
            return _typed(name, hint, list(given))
        if len(given) != 1:
            raise UsageError(f"{name}: given {len(given)} times")
        return _typed(name, hint, given[0])

    return _built(kind, query, read)


def from_body(kind: type[Write], body: Mapping[str, Any]) -> Write:
    """``kind`` from the JSON object of an API write: each name a field; a flag ``true``, a
    number for a number, a list (or one text) for a repeated option; null, ``false`` or ``""``
    leave an option out. UsageError names what does not fit."""
    given = {k: v for k, v in body.items() if not (v is None or v is False or v == "")}
    return _built(kind, given, _typed)


Built = TypeVar("Built")


def _built(
    kind: type[Built], given: Mapping[str, Any], read: Callable[[str, Any, Any], Any]
) -> Built:
    """``kind`` of the ``given`` values by field name, each ``read`` as its type hint says."""
    hints = get_type_hints(kind)
    fields = {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for name, value in given.items():
        if name not in fields:
            raise UsageError(f"{name}: not an option of this call")
        values[name] = read(name, hints[name], value)
    return kind(**values)


def _typed(name: str, hint: Any, given: Any) -> Any:
    """``given`` (a JSON value) as the field ``name`` of type ``hint`` takes it."""
    if get_origin(hint) is tuple:
        items = given if isinstance(given, list) else [given]
        if not all(isinstance(item, str) for item in items):
            raise UsageError(f"{name}: text, or a list of texts")
        return tuple(items)
    if hint is bool:
        if given is not True:
            raise UsageError(f"{name}: true or false")
        return True
    if hint is float or hint is int or int in get_args(hint):
        if isinstance(given, bool) or not isinstance(given, int | float | str):
            raise UsageError(f"{name}: a number")
        if hint is float:
            try:
                return float(given)
            except ValueError:
                raise UsageError(f"{name} {cut(str(given), 40)!r}: a number") from None
        number = given if isinstance(given, int) else parse_count(str(given))
        if number is None or number < 0:
            raise UsageError(f"{name} {cut(str(given), 40)!r}: a whole number, 0 or more")
        return number
    if not isinstance(given, str):
        raise UsageError(f"{name}: text")
    return given
