"""Headers for a service that schedules records: build them here, produce with any Kafka client.

    from bridge.client import delay_headers, cancel_headers

    expire = f"expire-{order_id}"
    producer.produce("delay", key=order_id, value=payload,
                     headers=delay_headers("orders.expired", after="30m", delay_id=expire))
    producer.produce("delay", key=order_id, value=b"", headers=cancel_headers(expire))

A cancel (or a replacement: the same ``delay_id`` again) must go to the partition of the record
it refers to: give it the same key **and the same partitioner**. librdkafka clients (kcat,
confluent-kafka for Python and Go) hash keys with CRC32 by default, Java clients with murmur2, so
one key can land in different partitions; set ``"partitioner": "murmur2_random"`` in a librdkafka
producer to agree with Java and with ``delay-bridge cancel``, or pick the partition yourself with
:func:`partition_for`. The values are checked here with the bridge's own rules
(one of ``after``/``at``, durations, millisecond precision, id length), raising ``ValueError`` with
the reason instead of a dead letter later. Only the standard library is needed: this module and
:mod:`bridge.message` import neither redis, prometheus-client nor confluent-kafka.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bridge.message import (
    H_AFTER,
    H_CANCEL,
    H_DELIVER_AT,
    H_ID,
    H_PRIORITY,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    MAX_ID_BYTES,
    Priority,
    parse_duration_ms,
    parse_time_ms,
    topic_refusal,
)

__all__ = ["cancel_headers", "delay_headers", "partition_for"]


def delay_headers(
    target: str,
    *,
    after: int | str | timedelta | None = None,
    at: int | str | datetime | None = None,
    delay_id: str | None = None,
    target_key: bytes | str | None = None,
    priority: str | None = None,
) -> list[tuple[str, bytes]]:
    """The headers that schedule a record for ``target``: due ``after`` a delay counted from
    the record's timestamp (milliseconds, a duration such as ``"1h30m"``, or a timedelta) or
    ``at`` a moment (epoch milliseconds, RFC 3339 text, or a timezone-aware datetime), with an
    optional ``delay_id`` (a later record with the same id replaces this one while it waits)
    and the key the delivered record gets (``target_key``; default: the record's own key), and
    its ``priority`` among records due together: ``"high"``, ``"normal"`` (the default) or
    ``"low"``."""
    if not isinstance(target, str):
        raise ValueError(f"target {target!r} is not a topic name")
    refusal = topic_refusal(target)
    if refusal is not None:
        raise ValueError(f"target {refusal}")
    if (after is None) == (at is None):
        raise ValueError("give exactly one of after= (a delay) or at= (a due time)")
    headers = [(H_TARGET_TOPIC, target.encode())]
    if after is not None:
        headers.append((H_AFTER, _after(after).encode()))
    else:
        headers.append((H_DELIVER_AT, _at(at).encode()))  # type: ignore[arg-type]
    if target_key is not None:
        headers.append(
            (
                H_TARGET_KEY,
                target_key.encode() if isinstance(target_key, str) else bytes(target_key),
            )
        )
    if delay_id is not None:
        headers.append((H_ID, _id(delay_id)))
    if priority is not None:
        if not isinstance(priority, str):
            raise ValueError(f"priority {priority!r} is not one of high, normal, low")
        headers.append((H_PRIORITY, Priority.of(priority).label.encode()))
    return headers


def cancel_headers(delay_id: str, *more: str) -> list[tuple[str, bytes]]:
    """The headers of a record that cancels the waiting record with ``delay_id`` (produce it
    with that record's key, so it lands in the same partition; its value is ignored), and the
    waiting records with the ids ``more`` too, in order: one record for many cancels."""
    return [(H_CANCEL, _id(i)) for i in (delay_id, *more)]


def partition_for(key: bytes | str, partitions: int) -> int:
    """The partition of ``partitions`` that Java's default partitioner (and librdkafka's
    ``murmur2_random``) gives a record with ``key``: murmur2 of the key bytes, made positive,
    modulo the partition count."""
    raw = key.encode() if isinstance(key, str) else bytes(key)
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise ValueError(f"partitions={partitions!r}: give the topic's partition count (>= 1)")
    return (murmur2(raw) & 0x7FFFFFFF) % partitions


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 hash of ``data`` (``org.apache.kafka.common.utils.Utils.murmur2``), as
    a signed 32-bit integer."""
    m, mask = 0x5BD1E995, 0xFFFFFFFF
    length = len(data)
    h = (0x9747B28C ^ length) & mask
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * m) & mask
        k ^= k >> 24
        k = (k * m) & mask
        h = ((h * m) & mask) ^ k
    tail = data[whole:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _after(after: int | str | timedelta) -> str:
    if isinstance(after, bool):
        raise ValueError(f"after={after!r} is not a delay")
    if isinstance(after, timedelta):  # a part below a millisecond rounds up: never early
        after = -(-after // timedelta(milliseconds=1))
    if isinstance(after, int):
        if after < 0:
            raise ValueError(f"after={after} is negative")
        return str(after)
    if not isinstance(after, str):
        raise ValueError(f"after={after!r}: give milliseconds, a duration or a timedelta")
    parse_duration_ms(after)  # raises ValueError naming what is wrong
    return after


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _at(at: int | str | datetime) -> str:
    if isinstance(at, bool):
        raise ValueError(f"at={at!r} is not a time")
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise ValueError(f"at={at.isoformat()} has no timezone: give an aware datetime")
        # A part below a millisecond rounds up, as in the header: never early.
        at = -(-(at - _EPOCH) // timedelta(milliseconds=1))
    if isinstance(at, int):
        at = str(at)
    if not isinstance(at, str):
        raise ValueError(f"at={at!r}: give epoch milliseconds, RFC 3339 text or a datetime")
    parse_time_ms(at)  # raises ValueError naming what is wrong (e.g. epoch seconds)
    return at


def _id(delay_id: str) -> bytes:
    if not isinstance(delay_id, str):
        raise ValueError(f"delay_id must be text, got {type(delay_id).__name__}")
    raw = delay_id.encode()
    if not 1 <= len(raw) <= MAX_ID_BYTES:
        raise ValueError(f"delay_id must be 1 to {MAX_ID_BYTES} bytes of UTF-8, got {len(raw)}")
    return raw
