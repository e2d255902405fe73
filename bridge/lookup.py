"""Waiting records found through the delay topic, by offset.

A reference's payload, and a record named by its default delay-id, are read back as the read-back
reads them (one consumer, never a group member), so a lookup reads one record, never the shard's
payloads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from bridge.config import Config, read_back_settings
from bridge.errors import BridgeError
from bridge.message import Rejected, Scheduled
from bridge.store import Shard, Store, offset_bytes, references_in

if TYPE_CHECKING:
    from bridge.readback import Reader


def by_default_id(
    config: Config, store: Store, shard: Shard, offset: int
) -> list[tuple[int, bytes]]:
    """The waiting record at ``offset`` of ``shard`` (named by its default delay-id), held whole
    or as a reference: [(due ms, member)] or []. Its due time comes from the record itself, read
    at its offset in the delay topic; Redis is then asked for that offset at that due time. Only
    a record the delay topic no longer holds (its retention, with ``store.references`` off) is
    looked for by a pass over the records the shard holds whole."""
    if not store.inventory.is_pending(shard, offset):
        return []
    at = offset_bytes(offset)
    due = _due_of(config, shard, offset, store.time_ms())
    if due is None:
        due = store.inventory.wholes(shard, [offset])[offset]
        return store.inventory.at(shard, due, at) if due >= 0 else []
    return store.inventory.at(shard, due, at) or store.inventory.reference_at(shard, at, due)


def _due_of(config: Config, shard: Shard, offset: int, now_ms: int) -> int | None:
    """The due time the record at ``offset`` asks for (None: gone, unreadable, or refused)."""
    from confluent_kafka import Consumer, KafkaException

    from bridge.dialects import parse_message
    from bridge.readback import Reader

    reader = Reader(Consumer({**read_back_settings(config), "log_level": 0}), stall_s=5.0)
    try:
        msg = reader.read(shard, [offset]).get(offset)
    except (BridgeError, KafkaException):
        return None
    finally:
        reader.close()
    if msg is None:
        return None
    try:
        record = parse_message(config.rules(), (shard.topic, shard.partition, offset), msg, now_ms)
    except Rejected:
        return None
    return record.due_ms if isinstance(record, Scheduled) else None


def read_back(
    config: Config, far: Sequence[tuple[Shard, bytes]], now_ms: int
) -> dict[tuple[Shard, bytes], Scheduled]:
    """The records that references stand for, read from the delay topic as the read-back reads
    them (one consumer, never a group member): a record's tier does not show in the tools. A
    record gone from the topic, or Kafka unreachable, shows as bound for the DLQ."""
    from confluent_kafka import Consumer, KafkaException

    from bridge.readback import Reader, missing_record, parse_read_back

    rules = config.rules()
    out: dict[tuple[Shard, bytes], Scheduled] = {}
    reader = Reader(Consumer({**read_back_settings(config), "log_level": 0}), stall_s=5.0)
    try:
        for shard in sorted({s for s, _ in far}):
            refs = {references_in(m)[0]: m for s, m in far if s == shard}
            try:
                messages = reader.read(shard, [offset for offset, _ in refs])
            except (BridgeError, KafkaException) as exc:
                messages, why = {}, f"not read back from Kafka: {exc}"
            else:
                why = "gone from the delay topic"
            for (offset, due), stored in refs.items():
                msg = messages.get(offset)
                out[shard, stored] = (
                    missing_record(shard, offset, due, why)
                    if msg is None
                    else parse_read_back(rules, shard, (offset, due), msg, now_ms)[0]
                )
    finally:
        reader.close()
    return out


def records_at(
    config: Config,
    shard: Shard,
    offsets: Sequence[int],
    now_ms: int,
    reader: Reader | None = None,
) -> list[Scheduled]:
    """The records at ``offsets`` of ``shard`` in the delay topic, as the ingress parsed them
    (read by ``reader``, else by a consumer of its own, never a group member); those gone,
    unreadable or refused are left out."""
    from confluent_kafka import Consumer, KafkaException

    from bridge.dialects import parse_message
    from bridge.readback import Reader

    own = reader is None
    if reader is None:
        reader = Reader(Consumer({**read_back_settings(config), "log_level": 0}), stall_s=5.0)
    try:
        messages = reader.read(shard, sorted(offsets))
    except (BridgeError, KafkaException):
        return []
    finally:
        if own:
            reader.close()
    rules, out = config.rules(), []
    for offset, msg in sorted(messages.items()):
        if msg is None:  # gone from the delay topic
            continue
        try:
            got = parse_message(rules, (shard.topic, shard.partition, offset), msg, now_ms)
        except Rejected:
            continue
        if isinstance(got, Scheduled):
            out.append(got)
    return out
