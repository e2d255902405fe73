"""Recurring schedules at the egress: each occurrence delivered, and the schedule carried on.

A recurring schedule (``delay-cron`` or ``delay-every``) waits in the store as one record due at
its next occurrence. When it falls due, :func:`step` asks its :class:`Recurrence` what to do at
this moment — the occurrence to deliver, by the schedule's ``delay-missed`` policy when the bridge
comes to it late (bridge.message.recurrence), and the occurrence after — and the egress produces,
together (in one Kafka transaction with ``egress.exactly_once``):

* the occurrence, to the schedule's target, as a one-shot record would be delivered, with
  ``delay-id`` (the schedule's) and ``delay-occurrence`` (the instant it was scheduled for);
* the record that carries the schedule on: the schedule's own record produced again to its
  partition of the delay topic, due at the next occurrence (``delay-deliver-at``), with what is
  left of its ``delay-count`` and ``delay-continues``: this record's offset.

A schedule paused (``delay-pause``; the registry says so when its record is claimed,
:attr:`Claimed.paused`) delivers nothing and is carried on all the same, with ``delay-paused``:
its occurrences are skipped until a ``delay-resume``.

After the last occurrence (its count or its end reached) the second record is one that ends the
schedule (``delay-ended``), so the store's registry forgets it. The record is acknowledged once
Kafka has both. So the delay topic always holds the schedule at its
latest step (its retention never reaches a live schedule older than a step), a Redis rebuilt from
the delay topic finds it there, and an occurrence delivered is never due again. The store takes the
record that carries a schedule on only while its registry still has the schedule at the record it
continues (add.lua): a cancel, a replacement, or the same record carried on twice (delivered again
after a lease ran out) leaves nothing behind.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from bridge.egress.failures import InFlight
from bridge.message import (
    H_AFTER,
    H_CONTINUES,
    H_COUNT,
    H_DELIVER_AT,
    H_DUE_AT,
    H_ENDED,
    H_ID,
    H_OCCURRENCE,
    H_PAUSED,
    STRIPPED_ON_DELIVERY,
    Headers,
    Rejected,
    Scheduled,
    recurrence_at,
    wire_headers,
)
from bridge.store import Shard

logger = logging.getLogger(__name__)

# The headers the record carrying a schedule on sets afresh: its start, what is left of its count,
# the record it continues, and whether it was paused.
_RESET = frozenset((H_DELIVER_AT, H_AFTER, H_COUNT, H_CONTINUES, H_PAUSED))


@dataclass(frozen=True, slots=True)
class Step:
    """What a recurring schedule's record does when it falls due: deliver ``occurrence_ms`` (None:
    nothing, a missed occurrence ``delay-missed: skip`` drops), and be carried on with ``onward``
    headers (None: the schedule has ended)."""

    occurrence_ms: int | None
    onward: Headers | None


@dataclass(frozen=True, slots=True)
class Sending:
    """What the egress produces for a recurring schedule's record that fell due: to ``topic``
    (``partition``; -1: its partitioner's choice), with ``key`` and ``headers``."""

    topic: str
    key: bytes | None
    headers: Headers
    partition: int = -1


def sending(record: Scheduled, shard: Shard, now_ms: int, inflight: InFlight) -> Sending:
    """What to produce of ``record`` (a recurring schedule of ``shard``) at ``now_ms``: its
    occurrence, with the record carrying the schedule on — or, after its last occurrence, the
    record that ends it (:func:`end_headers`) — set as ``inflight``'s :attr:`InFlight.onward`
    (produced beside it, reported as one); or, when no occurrence is delivered (missed and
    skipped, or paused), that record alone, to the schedule's partition of the delay topic."""
    did = step(record, now_ms, paused=inflight.claimed.paused)
    ended = did.onward is None
    headers = end_headers(record) if ended else did.onward
    assert headers is not None
    fields = {
        "partition": shard.partition,
        "key": record.key,
        "value": None if ended else record.value,
        "headers": wire_headers(headers),
    }
    inflight.occurrence_ms = did.occurrence_ms
    if did.occurrence_ms is not None:
        inflight.onward = (shard.topic, fields)
        return Sending(
            record.target, record.delivered_key(), occurrence_headers(record, did.occurrence_ms)
        )
    inflight.onward = None
    return Sending(shard.topic, record.key, headers, shard.partition)


def end_headers(record: Scheduled) -> Headers:
    """The record that ends ``record``'s schedule (its last occurrence delivered or skipped):
    the store's registry forgets the schedule when it reads it (see add.lua)."""
    return [
        (H_ID, record.delay_id.encode()),
        (H_CONTINUES, str(record.offset).encode()),
        (H_ENDED, b"1"),
    ]


def step(record: Scheduled, now_ms: int, *, paused: bool = False) -> Step:
    """What ``record`` (a recurring schedule, due at its next occurrence or, when that is further
    out than a record waits, before it: bridge.message.rules) does at ``now_ms``; ``paused``
    (``delay-pause``): it delivers nothing, and is carried on all the same (the occurrences of a
    paused schedule are skipped, not kept for its resume)."""
    try:
        schedule = recurrence_at(record)
    except Rejected as exc:  # it was read the same way when stored: a bug, or a corrupt record
        logger.error("%s: %s; delivered once, as a one-shot record", record.delay_id, exc)
        return Step(record.due_ms, None)
    occurrence = schedule.first()
    if occurrence is None:  # it was read with one: a bug, or a corrupt record
        logger.error("%s: no occurrence left; the schedule ends", record.delay_id)
        return Step(None, None)
    if occurrence > max(now_ms, record.due_ms):  # carried on towards it, nothing to deliver
        return Step(None, onward_headers(record, occurrence, schedule.count, paused=paused))
    fire = schedule.fire(occurrence, now_ms)
    deliver = None if paused else fire.deliver
    left = schedule.count
    if left is not None and deliver is not None:
        left -= 1
    after = fire.next_ms if left is None or left > 0 else None
    if after is None:
        return Step(deliver, None)
    return Step(deliver, onward_headers(record, after, left, paused=paused))


def onward_headers(
    record: Scheduled, next_ms: int, left: int | None, *, paused: bool = False
) -> Headers:
    """The headers of the record carrying ``record``'s schedule on to ``next_ms``: its own, with
    its start at ``next_ms``, ``left`` occurrences at most (None: no limit), the offset it
    continues and, when ``paused``, ``delay-paused``."""
    kept = [(k, v) for k, v in record.headers if k not in _RESET]
    kept.append((H_DELIVER_AT, str(next_ms).encode()))
    if left is not None:
        kept.append((H_COUNT, str(left).encode()))
    kept.append((H_CONTINUES, str(record.offset).encode()))
    if paused:
        kept.append((H_PAUSED, b"1"))
    return kept


def occurrence_headers(record: Scheduled, occurrence_ms: int) -> Headers:
    """The headers of an occurrence delivered: the schedule's own without the control headers,
    then ``delay-id``, ``delay-due-at`` and ``delay-occurrence``."""
    kept = [(k, v) for k, v in record.headers if k not in STRIPPED_ON_DELIVERY]
    when = str(occurrence_ms).encode()
    kept += [(H_ID, record.delay_id.encode()), (H_DUE_AT, when), (H_OCCURRENCE, when)]
    return kept
