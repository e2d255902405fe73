"""The header sets a delay topic may speak, each read into this bridge's own contract.

Each is read (``topics.dialect``) before :func:`bridge.message.parse` validates the record.

``delay-bridge`` (the default) is the contract's own headers. ``etf1`` is that of
etf1/kafka-message-scheduler, so its producers work unchanged: ``scheduler-epoch`` (unix seconds)
is the due time, ``scheduler-target-topic`` and ``scheduler-target-key`` the target and its key,
the record key is the delay-id, and a tombstone (no value) with that key cancels the schedule.
Its consumers too: the record is delivered as etf1 delivers it — the schedule's headers, its
``scheduler-*`` ones included, plus ``scheduler-timestamp`` (the schedule's timestamp, unix
seconds), ``scheduler-key`` and ``scheduler-topic``, and a null key when no target key is given
(etf1's runner/kafka/handler.go).

``kaspr`` is the request topic of Kaspr's scheduler (its user guide, "Scheduler"):
``x-scheduler-action`` ``ADD`` (the default), ``REPLACE`` or ``CANCEL``;
``x-scheduler-deliver-to`` the target and ``x-scheduler-deliver-at`` the due time (ISO 8601, UTC
unless it names an offset), both required by ADD and REPLACE; ``x-scheduler-request-id`` the
delay-id, required by REPLACE and CANCEL. A past time is due at once. Kaspr delivers the record's
key, value and headers without its ``x-scheduler-*`` ones, and so does the bridge (plus the
contract's ``delay-id`` and ``delay-due-at``). Pure, like :mod:`bridge.message`.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, cast

from bridge.message import (
    H_CANCEL,
    H_DELIVER_AT,
    H_ID,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    MAX_ID_BYTES,
    MIN_EPOCH_MS,
    Cancel,
    Headers,
    Reason,
    Rejected,
    Rules,
    Scheduled,
    origin,
    parse,
    parse_count,
)

if TYPE_CHECKING:
    from confluent_kafka import Message

logger = logging.getLogger(__name__)

ETF1 = "etf1"
ETF1_EPOCH = "scheduler-epoch"
ETF1_TARGET_TOPIC = "scheduler-target-topic"
ETF1_TARGET_KEY = "scheduler-target-key"
# What etf1 adds to a record it delivers.
ETF1_TIMESTAMP = "scheduler-timestamp"
ETF1_KEY = "scheduler-key"
ETF1_TOPIC = "scheduler-topic"
# An epoch this large is milliseconds (unix seconds reach it in the year 5138).
ETF1_MS_EPOCH = 100_000_000_000
# etf1 header -> the contract's header it becomes (the due time is converted on the way).
_ETF1_AS = {
    ETF1_EPOCH: H_DELIVER_AT,
    ETF1_TARGET_TOPIC: H_TARGET_TOPIC,
    ETF1_TARGET_KEY: H_TARGET_KEY,
}

KASPR = "kaspr"
KASPR_ACTION = "x-scheduler-action"
KASPR_DELIVER_TO = "x-scheduler-deliver-to"
KASPR_DELIVER_AT = "x-scheduler-deliver-at"
KASPR_REQUEST_ID = "x-scheduler-request-id"
KASPR_ADD, KASPR_REPLACE, KASPR_CANCEL = "ADD", "REPLACE", "CANCEL"
_KASPR_HEADERS = frozenset({KASPR_ACTION, KASPR_DELIVER_TO, KASPR_DELIVER_AT, KASPR_REQUEST_ID})


def parse_record(
    rules: Rules,
    *,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    now_ms: int,
) -> Scheduled | Cancel:
    """:func:`bridge.message.parse` for a record of ``topic``, in the dialect it speaks. Raises
    :class:`Rejected` and nothing else: a record the parser fails on (a bug) is a ``bad-header``
    "unparseable", dead-lettered on its own, not the end of the loop that read it."""
    try:
        dialect = rules.dialects.get(topic)
        if dialect == ETF1:
            stamp_ms = timestamp_ms if timestamp_ms is not None and timestamp_ms >= 0 else now_ms
            translated = from_etf1(offset, key, value, headers, topic=topic, timestamp_ms=stamp_ms)
            if isinstance(translated, Cancel):
                return translated
            headers = translated
        elif dialect == KASPR:
            headers = from_kaspr(headers, default_target=topic in rules.default_targets)
        return parse(
            rules,
            topic=topic,
            partition=partition,
            offset=offset,
            timestamp_ms=timestamp_ms,
            key=key,
            value=value,
            headers=headers,
            now_ms=now_ms,
        )
    except Rejected:
        raise
    except Exception as exc:
        logger.exception("parsing %s failed", origin(topic, partition, offset))
        raise Rejected(Reason.BAD_HEADER, f"unparseable: {type(exc).__name__}: {exc}") from exc


def parse_message(
    rules: Rules, at: tuple[str, int, int], msg: Message, now_ms: int
) -> Scheduled | Cancel:
    """:func:`parse_record` of a message consumed ``at`` (topic, partition, offset): the one way
    the read-back and a lookup by default delay-id read a delay-topic record, so each gets the due
    time the ingress did (its timestamp counts unless the broker gave none)."""
    topic, partition, offset = at
    ts_type, ts = msg.timestamp()
    return parse_record(
        rules,
        topic=topic,
        partition=partition,
        offset=offset,
        timestamp_ms=ts if ts_type != 0 else None,
        key=msg.key(),
        value=msg.value(),
        headers=cast(Headers, list(msg.headers() or [])),
        now_ms=now_ms,
    )


def from_etf1(
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    *,
    topic: str,
    timestamp_ms: int,
) -> Headers | Cancel:
    """An etf1 record as this contract's headers — its own headers and those etf1 adds on
    delivery, then the delay-* control headers that say the same (stripped on delivery), the key
    as delay-id — or the :class:`Cancel` a tombstone is; raises :class:`Rejected` for a record
    etf1 would not take either."""
    if not key:
        raise Rejected(Reason.BAD_HEADER, "an etf1 record needs a key: it is the schedule's id")
    if len(key) > MAX_ID_BYTES:
        raise Rejected(
            Reason.BAD_HEADER, f"an etf1 key is the delay-id: at most {MAX_ID_BYTES} bytes"
        )
    try:
        delay_id = key.decode("utf-8")
    except UnicodeDecodeError:
        raise Rejected(Reason.BAD_HEADER, "an etf1 key is the delay-id: it must be UTF-8") from None
    if value is None:
        return Cancel(offset, delay_id, timestamp_ms)
    theirs: dict[str, bytes] = {}
    for name, hvalue in headers:
        if name in _ETF1_AS:
            if name in theirs:
                raise Rejected(Reason.BAD_HEADER, f"header {name} appears more than once")
            theirs[name] = hvalue or b""
    if ETF1_EPOCH not in theirs:
        raise Rejected(Reason.MISSING_DUE_TIME, f"no {ETF1_EPOCH} header (unix seconds)")
    text = theirs[ETF1_EPOCH].decode("utf-8", errors="replace").strip()
    seconds = parse_count(text)
    if seconds is None:
        raise Rejected(Reason.BAD_DUE_TIME, f"{ETF1_EPOCH} {text[:40]!r} is not unix seconds")
    if seconds >= ETF1_MS_EPOCH:
        raise Rejected(
            Reason.BAD_DUE_TIME,
            f"{ETF1_EPOCH} {text} looks like milliseconds: etf1 takes unix seconds",
        )
    # An epoch in the past is due at once; the contract's floor for epoch ms is 2000-01-01.
    control: Headers = [(H_DELIVER_AT, str(max(seconds * 1000, MIN_EPOCH_MS)).encode())]
    if ETF1_TARGET_TOPIC in theirs:
        control.append((H_TARGET_TOPIC, theirs[ETF1_TARGET_TOPIC]))
    # etf1 delivers the target key, or none: a null key, not the schedule's id.
    control += [(H_TARGET_KEY, theirs.get(ETF1_TARGET_KEY)), (H_ID, key)]
    added: Headers = [
        (ETF1_TIMESTAMP, str(timestamp_ms // 1000).encode()),
        (ETF1_KEY, key),
        (ETF1_TOPIC, topic.encode()),
    ]
    return [*headers, *added, *control]


def from_kaspr(headers: Headers, *, default_target: bool = False) -> Headers:
    """A Kaspr schedule request as this contract's headers: its own headers without the
    ``x-scheduler-*`` ones (Kaspr delivers them so), then the ``delay-*`` control headers that say
    the same — a CANCEL becomes a ``delay-cancel`` record; raises :class:`Rejected` for a request
    Kaspr would reject too (a missing header), and for an action it does not name
    (``default_target``: the config gives this topic a target, so ``x-scheduler-deliver-to`` may
    be left out)."""
    theirs: dict[str, str] = {}
    kept: Headers = []
    for name, hvalue in headers:
        if name not in _KASPR_HEADERS:
            kept.append((name, hvalue))
            continue
        if name in theirs:
            raise Rejected(Reason.BAD_HEADER, f"header {name} appears more than once")
        try:
            theirs[name] = (hvalue or b"").decode("utf-8")
        except UnicodeDecodeError:
            raise Rejected(Reason.BAD_HEADER, f"header {name} is not valid UTF-8") from None
    action = theirs.get(KASPR_ACTION, KASPR_ADD)
    request_id = theirs.get(KASPR_REQUEST_ID) or None
    if action not in (KASPR_ADD, KASPR_REPLACE, KASPR_CANCEL):
        raise Rejected(
            Reason.BAD_HEADER,
            f"{KASPR_ACTION} {action[:40]!r} is not ADD, REPLACE "
            "or CANCEL (cron schedules are not supported)",
        )
    if action != KASPR_ADD and request_id is None:
        raise Rejected(Reason.BAD_HEADER, f"a {action} needs {KASPR_REQUEST_ID}")
    if action == KASPR_CANCEL:
        assert request_id is not None
        return [*kept, (H_CANCEL, request_id.encode())]
    text = theirs.get(KASPR_DELIVER_AT)
    if not text:
        raise Rejected(Reason.MISSING_DUE_TIME, f"no {KASPR_DELIVER_AT} header (UTC ISO 8601)")
    target = theirs.get(KASPR_DELIVER_TO)
    if not target and not default_target:
        raise Rejected(Reason.MISSING_TARGET, f"no {KASPR_DELIVER_TO} header")
    # A past time is due at once; the contract's floor for epoch ms is 2000-01-01.
    control: Headers = [(H_DELIVER_AT, str(max(kaspr_time_ms(text), MIN_EPOCH_MS)).encode())]
    if target:
        control.append((H_TARGET_TOPIC, target.encode()))
    if request_id is not None:
        control.append((H_ID, request_id.encode()))
    return [*kept, *control]


def kaspr_time_ms(text: str) -> int:
    """``x-scheduler-deliver-at`` (ISO 8601; UTC unless it names an offset, as Kaspr reads it in
    a UTC process) as epoch ms, a fraction of a millisecond rounded up: never early."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise Rejected(
            Reason.BAD_DUE_TIME, f"{KASPR_DELIVER_AT} {text[:60]!r} is not an ISO 8601 time"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1000 + math.ceil(delta.microseconds / 1000)
