"""A schedule's identity is (delay topic, delay-id): cancels and replacements across partitions.

add.lua applies a cancel or a replacement in its own partition's shard, in offset order. One that
finds nothing there (a producer whose partitioner differs from the schedule's, a topic that gained
partitions since) withdraws what it names in the topic's other partitions, if that record is
stamped no later than itself (withdraw.lua): a schedule produced after a cancel stands. Such a
cancel is applied when the ingress reads it, so it wins against its record's due time only if read
before then (the same partition gives the stronger guarantee: see docs/cancel-replace.md).

A default delay-id, ``<topic>:<partition>:<offset>``, is not in the id index: a cancel of one,
in the partition it names, finds its record by offset (:func:`default_id_entry`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import cast

from bridge.message import Cancel, Scheduled
from bridge.store.calls import withdrawn_from
from bridge.store.inventory import Inventory
from bridge.store.keys import (
    Keys,
    Shard,
    default_id_offset,
    id_entry,
    offset_bytes,
    read_id_entry,
)
from bridge.store.redis_errors import as_store_error
from bridge.store.scripts import Call, Scripts


def withdraw_elsewhere(
    scripts: Scripts,
    keys: Keys,
    unmatched: Sequence[tuple[Shard, Scheduled | Cancel]],
    partitions: Mapping[str, int],
) -> dict[tuple[Shard, int], tuple[Shard, int, int]]:
    """Withdraw what ``unmatched`` cancels and replacements name in the other partitions of
    their topic; returns, for the (shard, offset) of each that found its record, where that
    record was and its due time: (shard, offset, due ms or -1). The id indexes
    are read first (one HMGET per other partition, in one round trip) and withdraw.lua runs only
    where one names a record stamped no later: a record with its own id first seen, the usual
    case, costs a hash lookup per other partition, not a script's."""
    by_topic: dict[str, list[tuple[Shard, Scheduled | Cancel]]] = {}
    for shard, rec in unmatched:
        if partitions.get(shard.topic, 0) > 1:
            by_topic.setdefault(shard.topic, []).append((shard, rec))
    asked: list[tuple[Shard, list[tuple[Shard, Scheduled | Cancel]]]] = []
    for topic, items in by_topic.items():
        for partition in range(partitions[topic]):
            theirs = [(s, r) for s, r in items if s.partition != partition]
            if theirs:
                asked.append((Shard(topic, partition), theirs))
    if not asked:
        return {}
    with as_store_error():
        pipe = scripts.client.pipeline(transaction=False)
        for there, theirs in asked:
            pipe.hmget(keys.of(there).ids, [r.delay_id for _, r in theirs])
        entries = cast(list[list[bytes | None]], pipe.execute())
    calls: list[Call] = []
    named: list[tuple[Shard, list[tuple[Shard, Scheduled | Cancel]]]] = []
    for (there, theirs), found_entries in zip(asked, entries, strict=True):
        hits = [
            (s, r)
            for (s, r), e in zip(theirs, found_entries, strict=True)
            if e is not None and read_id_entry(e)[2] <= r.timestamp_ms
        ]
        if hits:
            k = keys.of(there)
            args = [x for _, r in hits for x in (r.delay_id, r.timestamp_ms)]
            calls.append(
                ("withdraw", [k.due, k.ids, k.low, k.pending, k.inflight, k.refs, k.waits], args)
            )
            named.append((there, hits))
    found: dict[tuple[Shard, int], tuple[Shard, int, int]] = {}
    for (there, hits), reply in zip(named, scripts.run(calls) if calls else [], strict=True):
        withdrawn = withdrawn_from(reply)
        for s, r in hits:
            if r.delay_id in withdrawn:
                found[s, r.offset] = (there, *withdrawn[r.delay_id])
    return found


def default_id_entry(
    inventory: Inventory,
    shard: Shard,
    cancel: Cancel,
    batch: Sequence[Scheduled | Cancel],
    refer_after_ms: int,
) -> bytes:
    """For a ``cancel`` of a default delay-id of ``shard``, an id entry naming its record where it
    waits — in Redis, or earlier in the ``batch`` being added (kept as a reference if due after
    ``refer_after_ms``); due -1 when in no index (a reference, or gone) — b"" for any other id."""
    offset = default_id_offset(shard, cancel.delay_id)
    if offset is None:
        return b""
    for rec in batch:
        if rec.offset == offset and isinstance(rec, Scheduled):
            return id_entry(offset_bytes(offset), -1 if rec.due_ms > refer_after_ms else rec.due_ms)
    found = inventory.by_id(shard, cancel.delay_id)
    return id_entry(offset_bytes(offset), found[0][0] if found else -1)
