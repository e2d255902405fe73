"""The read tools' answers as data, shared by the command line and the console's API.

What ``status``, ``list``, ``trace`` and ``dlq list`` found, as the command line prints it with
``--json`` and the API returns it.

An :class:`Answer` holds the typed result (the command line's tables are drawn from it), its JSON
and the notes said beside it (how many more match, why nothing was found). The command line and
the API call the same functions with the same :mod:`bridge.ops.asked` options.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from bridge.config import Config
from bridge.ops.asked import DlqAsk, ListAsk, StatusAsk, TraceAsk, when
from bridge.ops.dlq import Filters, Listing, listing
from bridge.ops.records import PartitionStatus, Waiting, page_note, status, status_json, waiting
from bridge.ops.trace import Traced, trace
from bridge.reads import check_page

DLQ_PAGE = 20  # dead letters ``dlq list`` shows unless asked for another page size


@dataclass(frozen=True)
class Answer:
    """What a read found: ``json`` as ``--json`` prints it, ``notes`` said beside it; ``found``
    False when there was nothing to find (the command exits 1, the API answers 404)."""

    json: Any
    notes: list[str] = field(default_factory=list)
    found: bool = True


@dataclass(frozen=True)
class StatusAnswer(Answer):
    now_ms: int = 0
    rows: list[PartitionStatus] = field(default_factory=list)


@dataclass(frozen=True)
class ListAnswer(Answer):
    records: list[Waiting] = field(default_factory=list)
    total: int = 0
    skip: int = 0


@dataclass(frozen=True)
class TraceAnswer(Answer):
    traced: Traced = field(default_factory=lambda: Traced(""))


@dataclass(frozen=True)
class DlqAnswer(Answer):
    listing: Listing = field(default_factory=Listing)


def status_answer(config: Config, _ask: StatusAsk, _now_ms: int) -> StatusAnswer:
    """``status``: every configured delay-topic partition."""
    now, rows = status(config)
    return StatusAnswer(status_json(now, rows), now_ms=now, rows=rows)


def list_answer(config: Config, ask: ListAsk, now_ms: int) -> ListAnswer:
    """``list``: a page of waiting records in due order."""
    records, total = waiting(
        config,
        topic=ask.topic,
        partition=ask.partition,
        delay_id=ask.id,
        due_before_ms=when("--due-before", ask.due_before, now_ms),
        limit=ask.limit,
        skip=ask.skip,
    )
    note = page_note(len(records), total, ask.skip)
    return ListAnswer(
        [asdict(r) for r in records],
        [note] if note else [],
        records=records,
        total=total,
        skip=ask.skip,
    )


def trace_answer(config: Config, ask: TraceAsk, now_ms: int) -> TraceAnswer:
    """``trace``: a record's fate and the events of its life."""
    traced = trace(
        config,
        delay_id=ask.id,
        at=ask.origin,
        topic=ask.topic,
        since_ms=when("--since", ask.since, now_ms, ago=True),
        now_ms=now_ms,
    )
    if traced.fate != "unknown":
        return TraceAnswer(traced.as_json(), traced=traced)
    what = f"--id {ask.id}" if ask.id else f"--origin {ask.origin}"
    why = (
        "stored, but neither in Redis nor in the journal (not read by the bridge yet, or its "
        "fate was not journaled)"
        if traced.events
        else "no trace in Redis or the journal"
    )
    return TraceAnswer(traced.as_json(), [f"{what}: {why}"], found=False, traced=traced)


def dlq_filters(ask: DlqAsk, now_ms: int) -> Filters:
    """The dead-letter filters ``ask`` names, its times read against ``now_ms``."""
    return Filters(
        frozenset(ask.reason),
        when("--since", ask.since, now_ms, ago=True),
        when("--until", ask.until, now_ms, ago=True),
    )


def dlq_answer(config: Config, ask: DlqAsk, now_ms: int) -> DlqAnswer:
    """``dlq list``: the dead letters the filters match, from the topic's beginning."""
    limit = DLQ_PAGE if ask.limit is None else ask.limit
    check_page(limit)
    found = listing(config, dlq_filters(ask, now_ms), limit)
    return DlqAnswer(found.as_json(), [found.summary()], listing=found)
