"""Operator commands that read what the bridge holds and never write: status and list.

``status`` (per delay-topic partition: what waits, what is overdue or in flight, what falls due
next, how far the ingress read and committed) and ``list`` (waiting records in due order). Every
figure comes from an O(log n) Redis command or Kafka's offsets, so both answer at once on a backlog
of millions."""

from __future__ import annotations

import heapq
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from bridge import lookup, reads
from bridge.config import Config, consumer_settings
from bridge.errors import BridgeError, UsageError
from bridge.message import Scheduled, cut, format_time_ms
from bridge.redis_client import redis_client
from bridge.store import (
    REFERENCE_BYTES,
    Shard,
    Store,
    default_id_offset,
    stored_record,
)

if TYPE_CHECKING:
    from confluent_kafka import Consumer, TopicPartition

KAFKA_TIMEOUT_S = 10.0
METADATA_TIMEOUT_S = 5.0  # the first call: how long an operator waits in a Kafka outage


@dataclass(frozen=True)
class PartitionStatus:
    """One delay-topic partition, as ``status`` shows it (times in epoch ms; -1: none)."""

    topic: str
    partition: int
    waiting: int  # held whole in Redis, due or not
    references: int  # far-future records held as references until they are read back
    overdue: int
    in_flight: int
    next_due_ms: int
    oldest_overdue_s: float
    watermark: int
    # From Kafka; None when Kafka could not be read (the rest comes from Redis alone).
    committed: int | None  # the watermark + 1 the bridge committed (-1: none)
    rebuild_from: int | None  # the lowest pending offset it committed with it (-1: none)
    log_end: int | None
    lag: int | None


@dataclass(frozen=True)
class Waiting:
    """One waiting record, as ``list`` shows it."""

    due_ms: int
    delay_id: str
    target: str
    key: str | None
    value_bytes: int
    topic: str
    partition: int
    offset: int
    priority: str


def status(config: Config) -> tuple[int, list[PartitionStatus]]:
    """Redis's now and every configured delay-topic partition's status."""
    partitions = _partitions(config, config.topics.delay)
    store = store_of(config)
    try:
        rows = []
        now = store.time_ms()
        marks = store.inventory.watermarks([p.shard for p in partitions])
        for shard, committed, rebuild_from, end in partitions:
            backlog = store.backlog([shard], now, config.egress.due_by_ms)
            first = store.inventory.first(shard)
            mark = marks.get(shard, -1)
            oldest = backlog.oldest_due_ms
            rows.append(
                PartitionStatus(
                    shard.topic,
                    shard.partition,
                    backlog.scheduled + backlog.overdue,
                    backlog.references,
                    backlog.overdue,
                    backlog.inflight,
                    -1 if first is None else first,
                    round((now - oldest) / 1000, 3) if oldest is not None else 0.0,
                    mark,
                    committed,
                    rebuild_from,
                    end,
                    None if end is None else max(0, end - (mark + 1)) if end >= 0 else -1,
                )
            )
        return now, rows
    finally:
        store.client.close()


def waiting(
    config: Config,
    *,
    topic: str | None = None,
    partition: int | None = None,
    delay_id: str | None = None,
    due_before_ms: int | None = None,
    limit: int = 20,
    skip: int = 0,
) -> tuple[list[Waiting], int]:
    """Waiting records in due order (the ``limit`` earliest over the partitions asked for, after
    the ``skip`` earliest: a page, within :func:`check_page`'s bounds), and how many the
    filters match in all."""
    reads.check_page(limit, skip)
    topics = [topic] if topic else list(config.topics.delay)
    shards = [
        s for s in delay_shards(config, topics) if partition is None or s.partition == partition
    ]
    if partition is not None and not shards:
        raise UsageError(f"--partition {partition}: no such partition of {', '.join(topics)}")
    store = store_of(config)
    try:
        found = _find(config, store, shards, delay_id, due_before_ms, limit, skip=skip)
        total = len(found)
        if delay_id is None and (len(found) == limit or skip):
            total = sum(store.inventory.count(s, due_before_ms) for s in shards)
    finally:
        store.client.close()
    return [
        Waiting(
            due,
            rec.delay_id,
            rec.target,
            None if rec.key is None else rec.key.decode("utf-8", errors="replace"),
            len(rec.value or b""),
            shard.topic,
            shard.partition,
            rec.offset,
            rec.priority.label,
        )
        for due, shard, rec in found
    ], max(total, len(found))


class Located(NamedTuple):
    """Where a delay-id is in a delay topic of ``partitions``: (its shard, the record) for
    each partition where a record with it waits (a delay-id names a schedule per partition), in
    partition order, and the partitions whose schedule registry has a live recurring schedule
    with it (waiting, its occurrence in flight, or its next record on its way in)."""

    partitions: int
    found: list[tuple[Shard, Scheduled]]
    running: list[int]


def locate(config: Config, topic: str, delay_id: str) -> Located:
    """Where ``delay_id`` is in ``topic`` (:class:`Located`), read with one Redis client."""
    shards = delay_shards(config, [topic])
    store = store_of(config)
    try:
        found = _find(config, store, shards, delay_id, None, len(shards))
        running = [s.partition for s in store.registry.live(shards, delay_id)]
    finally:
        store.client.close()
    ordered = sorted(((shard, rec) for _, shard, rec in found), key=lambda sr: sr[0].partition)
    return Located(len(shards), ordered, running)


def _find(
    config: Config,
    store: Store,
    shards: Sequence[Shard],
    delay_id: str | None,
    due_before_ms: int | None,
    limit: int,
    *,
    skip: int = 0,
) -> list[tuple[int, Shard, Scheduled]]:
    """The ``limit`` earliest waiting records of ``shards`` after the ``skip`` earliest (only the
    one with ``delay_id`` when given), as (due ms, shard, record) in due order."""
    found: list[tuple[int, bytes, Shard]] = []
    for shard in shards:
        if delay_id is None:
            page = store.inventory.page(shard, due_before_ms, skip + limit)
        else:  # candidates: the index keeps a hash of the id (confirmed below)
            page = store.inventory.by_id(shard, delay_id)
            # A default id names the record at its offset, and any record given it since
            # (a fire or reschedule of that record: the id index holds those).
            if (offset := default_id_offset(shard, delay_id)) is not None:
                page += lookup.by_default_id(config, store, shard, offset)
        found += [(due, member, shard) for due, member in page]
    chosen = [
        (due, member, shard)
        for due, member, shard in heapq.nsmallest(
            skip + limit if delay_id is None else len(found), found, key=lambda x: x[:2]
        )
        if due_before_ms is None or due < due_before_ms
    ][skip if delay_id is None else 0 :]
    far = [(shard, m) for _, m, shard in chosen if len(m) == REFERENCE_BYTES]
    now_ms = store.time_ms()
    read = lookup.read_back(config, far, now_ms) if far else {}
    records = [
        (
            due,
            shard,
            read[shard, member]
            if len(member) == REFERENCE_BYTES
            else stored_record(member, shard, now_ms),
        )
        for due, member, shard in chosen
    ]
    return [r for r in records if delay_id is None or r[2].delay_id == delay_id][:limit]


def topic_partitions(consumer: Consumer, topic: str, what: str) -> list[TopicPartition]:
    """The partitions of ``topic``; a missing topic is a :class:`BridgeError` naming ``what``
    it is (raises KafkaException when Kafka does not answer)."""
    from confluent_kafka import TopicPartition

    meta = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
    if meta is None or meta.error is not None:
        why = meta.error.str() if meta is not None and meta.error else "unknown topic"
        raise BridgeError(f"{what} {topic}: {why}")
    return [TopicPartition(topic, p) for p in sorted(meta.partitions)]


def store_of(config: Config) -> Store:
    """The store the tools read, or a BridgeError naming why Redis cannot be reached."""
    try:
        return Store(redis_client(config), config.redis.key_prefix)
    except BridgeError:
        raise
    except Exception as exc:  # a client that cannot even be made: a bad URL, no route
        raise BridgeError(f"cannot reach Redis: {exc}") from None


def delay_shards(config: Config, topics: Sequence[str]) -> list[Shard]:
    """The shards of every partition of ``topics`` (delay topics: a UsageError names one that is
    not), from Kafka, else from what Redis holds."""
    return [p.shard for p in _partitions(config, topics, offsets=False)]


class _Partition(NamedTuple):
    """A delay-topic partition as Kafka tells it (-1: none; None: Kafka did not say)."""

    shard: Shard
    committed: int | None = None  # the group's committed offset
    rebuild_from: int | None = None  # the rebuild point the commit names
    end: int | None = None  # the log end offset


def _partitions(config: Config, topics: Sequence[str], *, offsets: bool = True) -> list[_Partition]:
    """Every partition of ``topics``, read with a consumer of the bridge's group that never
    joins it. When Kafka cannot be read, the partitions Redis holds, with the offsets None
    (unknown), said once on stderr."""
    from confluent_kafka import Consumer, KafkaException

    from bridge.positions import rebuild_point

    unknown = [t for t in topics if t not in config.topics.delay]
    if unknown:
        raise UsageError(
            f"--topic {unknown[0]}: not one of topics.delay ({', '.join(config.topics.delay)})"
        )
    consumer = Consumer({**consumer_settings(config), "log_level": 0})
    try:
        tps = [tp for topic in topics for tp in topic_partitions(consumer, topic, "delay topic")]
        if not offsets:
            return [_Partition(Shard(tp.topic, tp.partition), -1, -1, -1) for tp in tps]
        committed = consumer.committed(tps, timeout=KAFKA_TIMEOUT_S)
        out: list[_Partition] = []
        for tp, done in zip(tps, committed, strict=True):
            _, end = consumer.get_watermark_offsets(tp, timeout=KAFKA_TIMEOUT_S, cached=False)
            shard = Shard(tp.topic, tp.partition)
            out.append(_Partition(shard, max(done.offset, -1), max(rebuild_point(done), -1), end))
        return out
    except KafkaException as exc:
        print(
            f"delay-bridge: cannot read the delay topics from Kafka at "
            f"{config.kafka.bootstrap_servers} ({exc.args[0].str()}): using the partitions "
            "Redis holds, Kafka's figures unknown",
            file=sys.stderr,
        )
    finally:
        consumer.close()
    store = store_of(config)
    try:
        return [
            _Partition(shard) for topic in topics for shard in store.inventory.stored_shards(topic)
        ]
    finally:
        store.client.close()


# ------------------------------------------------------------------ printing


def status_json(now_ms: int, rows: list[PartitionStatus]) -> dict[str, Any]:
    """``status --json``: Redis's now, every partition, and the totals over them."""
    return {"now_ms": now_ms, "partitions": [asdict(r) for r in rows], "totals": _totals(rows)}


def _totals(rows: list[PartitionStatus]) -> dict[str, float | None]:
    totals: dict[str, float | None] = {
        name: sum(getattr(r, name) for r in rows)
        for name in ("waiting", "references", "overdue", "in_flight")
    }
    lags = [r.lag for r in rows]
    totals["lag"] = None if None in lags else sum(lag for lag in lags if lag is not None)
    nexts = [r.next_due_ms for r in rows if r.next_due_ms >= 0]
    totals["next_due_ms"] = min(nexts, default=-1)
    totals["oldest_overdue_s"] = max((r.oldest_overdue_s for r in rows), default=0.0)
    return totals


def print_status(now_ms: int, rows: list[PartitionStatus]) -> None:
    """``status`` for a person: a row per partition, the totals, Redis's now."""
    totals = _totals(rows)
    header = [
        "topic",
        "partition",
        "waiting",
        "references",
        "overdue",
        "in flight",
        "next due",
        "oldest overdue",
        "watermark",
        "committed",
        "rebuild from",
        "log end",
        "lag",
    ]
    table = [
        [
            r.topic,
            str(r.partition),
            f"{r.waiting:,}",
            f"{r.references:,}",
            f"{r.overdue:,}",
            f"{r.in_flight:,}",
            _when(r.next_due_ms),
            _age(r.oldest_overdue_s),
            str(r.watermark),
            _kafka(r.committed, "{}"),
            _kafka(r.rebuild_from, "{}"),
            _kafka(r.log_end, "{}"),
            _kafka(r.lag),
        ]
        for r in rows
    ]
    table.append(
        [
            "total",
            "",
            f"{totals['waiting']:,}",
            f"{totals['references']:,}",
            f"{totals['overdue']:,}",
            f"{totals['in_flight']:,}",
            _when(int(totals["next_due_ms"] or -1)),
            _age(float(totals["oldest_overdue_s"] or 0)),
            "",
            "",
            "",
            "",
            _kafka(totals["lag"]),
        ]
    )
    print_table(header, table)
    print(f"(Redis time {format_time_ms(now_ms)})")


def page_note(shown: int, total: int, skip: int = 0) -> str | None:
    """What ``list`` says beside a page: how many more the filters match (None: no more)."""
    if skip:
        span = f"{skip + 1:,}-{skip + shown:,}" if shown else "none"
        more = f"; --skip {skip + shown} for the next" if total > skip + shown else ""
        return f"{span} of {total:,} shown{more}"
    if total > shown:
        return f"{shown:,} of {total:,} shown; --limit to see more"
    return None


def print_waiting(records: list[Waiting], total: int, skip: int = 0) -> None:
    """The records as a table; on stderr, how many more the filters match."""
    note = page_note(len(records), total, skip)
    if note:
        print(note, file=sys.stderr)
    header = [
        "due",
        "delay-id",
        "target",
        "priority",
        "key",
        "value bytes",
        "topic",
        "partition",
        "offset",
    ]
    print_table(
        header,
        [
            [
                _when(r.due_ms),
                r.delay_id,
                r.target,
                r.priority,
                "" if r.key is None else r.key,
                str(r.value_bytes),
                r.topic,
                str(r.partition),
                str(r.offset),
            ]
            for r in records
        ],
    )
    if not records:
        print("(no waiting records)")


def print_table(header: list[str], rows: list[list[str]], cell: int = 80) -> None:
    """An aligned table on stdout, each cell cut with an ellipsis past ``cell`` characters (a
    producer's long field would widen every row; ``--json`` has it whole)."""
    rows = [[cut(text, cell) for text in row] for row in rows]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _kafka(figure: float | None, style: str = "{:,}") -> str:
    """A figure read from Kafka: ``?`` when Kafka could not be read."""
    return "?" if figure is None else style.format(int(figure))


def _when(ms: int) -> str:
    return "-" if ms < 0 else format_time_ms(ms)


def _age(seconds: float) -> str:
    return "-" if seconds <= 0 else f"{seconds:,.1f} s"
