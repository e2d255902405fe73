"""The dead-letter topic as the command line reads it: its records with their reasons, filtered.

:func:`dead_letters` reads the DLQ from given offsets up to where each partition ended when the
read began (a DLQ written to meanwhile never keeps a command running), as :class:`DeadLetter`;
``dlq replay`` (bridge.ops.replay) and ``dlq list`` (:func:`listing`) read it so, with the same
filters (:class:`Filters`). ``dlq list`` reads from the beginning without a consumer group: it
commits nothing and leaves ``dlq replay``'s progress alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bridge.config import Config, consumer_settings
from bridge.errors import BridgeError
from bridge.kafka import headers_of
from bridge.message import (
    H_ERROR,
    H_ERROR_DETAIL,
    H_ORIGIN,
    H_TARGET_TOPIC,
    Headers,
    format_time_ms,
)
from bridge.ops.records import KAFKA_TIMEOUT_S, print_table, topic_partitions

if TYPE_CHECKING:
    from confluent_kafka import Consumer, TopicPartition


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One record of the DLQ: where it is, when it was dead-lettered, why, and the record."""

    partition: int
    offset: int
    timestamp_ms: int
    reason: str  # its delay-error ("" when it has none: not the bridge's)
    detail: str
    origin: str  # delay-origin: <topic>:<partition>:<offset> of the delay-topic record
    key: bytes | None
    value: bytes | None
    headers: Headers

    @property
    def origin_topic(self) -> str:
        return self.origin.rsplit(":", 2)[0]

    @property
    def target(self) -> str:
        """The target topic it was bound for (its ``delay-target-topic``; "" when none)."""
        for name, value in self.headers:
            if name == H_TARGET_TOPIC:
                return (value or b"").decode("utf-8", errors="replace")
        return ""


@dataclass(frozen=True)
class Filters:
    """Which dead letters a command takes: all given must match."""

    reasons: frozenset[str] = frozenset()
    since_ms: int | None = None  # dead-lettered at or after
    until_ms: int | None = None  # dead-lettered before

    def match(self, letter: DeadLetter) -> bool:
        return (
            (not self.reasons or letter.reason in self.reasons)
            and (self.since_ms is None or letter.timestamp_ms >= self.since_ms)
            and (self.until_ms is None or letter.timestamp_ms < self.until_ms)
        )


def dead_letters(consumer: Consumer, starts: Sequence[TopicPartition]) -> Iterator[DeadLetter]:
    """The DLQ's records from ``starts`` (each partition's offset; one below its log start reads
    from there) up to where each partition ends now, read with ``consumer`` (assigned here)."""
    ends: dict[int, int] = {}
    for tp in starts:
        low, high = consumer.get_watermark_offsets(tp, timeout=KAFKA_TIMEOUT_S, cached=False)
        tp.offset = max(tp.offset, low)
        if tp.offset < high:
            ends[tp.partition] = high
    consumer.assign([tp for tp in starts if tp.partition in ends])
    while ends:
        msg = consumer.poll(1.0)
        if msg is None:  # the end may be a transaction marker no record is read at
            at = consumer.position([tp for tp in starts if tp.partition in ends])
            ends = {tp.partition: ends[tp.partition] for tp in at if tp.offset < ends[tp.partition]}
            continue
        error = msg.error()
        if error is not None:
            raise BridgeError(f"reading {msg.topic()}: {error.str()}")
        partition, offset = msg.partition() or 0, msg.offset() or 0
        if offset + 1 >= ends.get(partition, 0):
            ends.pop(partition, None)
        headers = headers_of(msg)
        found = {
            k: (v or b"").decode("utf-8", errors="replace")
            for k, v in headers
            if k in (H_ERROR, H_ERROR_DETAIL, H_ORIGIN)
        }
        yield DeadLetter(
            partition,
            offset,
            msg.timestamp()[1],
            found.get(H_ERROR, ""),
            found.get(H_ERROR_DETAIL, ""),
            found.get(H_ORIGIN, ""),
            msg.key(),
            msg.value(),
            headers,
        )


@dataclass
class Listing:
    """What ``dlq list`` found: the first ``limit`` matching dead letters, and how many match
    by reason."""

    shown: list[DeadLetter] = field(default_factory=list)
    matched: Counter[str] = field(default_factory=Counter)

    def as_json(self) -> list[dict[str, Any]]:
        """``dlq list --json``: each dead letter shown, its value left out (its size kept)."""
        return [
            {
                "partition": d.partition,
                "offset": d.offset,
                "at_ms": d.timestamp_ms,
                "reason": d.reason,
                "detail": d.detail,
                "origin": d.origin,
                "target": d.target,
                "key": None if d.key is None else d.key.decode("utf-8", errors="replace"),
                "value_bytes": len(d.value or b""),
            }
            for d in self.shown
        ]

    def summary(self) -> str:
        total = sum(self.matched.values())
        by_reason = sorted(self.matched.items())
        line = f"{total:,} match" + ": " * bool(by_reason)
        line += ", ".join(f"{n:,} {reason or '(no reason)'}" for reason, n in by_reason)
        if total > len(self.shown):
            line = f"{len(self.shown):,} of {total:,} shown; --limit to see more; {line}"
        return line


def listing(config: Config, filters: Filters, limit: int) -> Listing:
    """The DLQ read from its beginning: the first ``limit`` dead letters ``filters`` match, and
    the count of all that match."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    consumer = Consumer(
        {
            **consumer_settings(config),
            "group.id": f"{config.kafka.group_id}.dlq-list",
            "log_level": 0,
            "enable.auto.commit": "false",
            "statistics.interval.ms": "0",
        }
    )
    found = Listing()
    try:
        dlq = config.topics.dead_letter
        tps = topic_partitions(consumer, dlq, "DLQ topic")
        starts = [TopicPartition(dlq, tp.partition, 0) for tp in tps]
        for letter in dead_letters(consumer, starts):
            if filters.match(letter):
                found.matched[letter.reason] += 1
                if len(found.shown) < limit:
                    found.shown.append(letter)
        return found
    except KafkaException as exc:
        raise BridgeError(f"reading the DLQ failed: {exc.args[0].str()}") from None
    finally:
        consumer.close()


def print_listing(found: Listing) -> None:
    """The dead letters as a table, then the summary."""
    header = ["dead-lettered", "reason", "origin", "target", "key", "value bytes", "detail"]
    print_table(
        header,
        [
            [
                format_time_ms(d.timestamp_ms),
                d.reason,
                d.origin,
                d.target,
                "" if d.key is None else d.key.decode("utf-8", errors="replace"),
                str(len(d.value or b"")),
                d.detail,
            ]
            for d in found.shown
        ],
    )
    print(found.summary())
