"""The recurring schedules a deployment runs, as the tools and the console read them.

Each delay-topic partition's schedule registry (add.lua) names the record that holds each live
schedule; that record, read in the delay topic, says the rest: its id, expression, zone, and the
occurrences to come."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bridge import lookup
from bridge.config import Config
from bridge.message import (
    H_CRON,
    H_EVERY,
    H_TIMEZONE,
    Scheduled,
    format_time_ms,
    recurrence_of,
    wall_ms,
)
from bridge.ops.records import delay_shards, store_of


@dataclass(frozen=True)
class ScheduleRow:
    """One live recurring schedule: where its record is, what it says, and when it next occurs
    (epoch ms, and as local times in its zone)."""

    delay_id: str
    topic: str
    partition: int
    offset: int
    cron: str
    every: str
    zone: str
    paused: bool
    target: str
    upcoming_ms: tuple[int, ...]
    upcoming_local: tuple[str, ...]

    def lines(self) -> list[str]:
        """The schedule as ``schedules list`` prints it."""
        how = f"cron {self.cron!r} in {self.zone}" if self.cron else f"every {self.every}"
        state = " (paused: its occurrences are skipped)" if self.paused else ""
        head = f"{self.delay_id}: {how} -> {self.target}{state}"
        where = f"  at {self.topic}[{self.partition}] offset {self.offset}"
        times = [
            f"  next {local} ({format_time_ms(at)})"
            for at, local in zip(self.upcoming_ms, self.upcoming_local, strict=True)
        ]
        return [head, where, *times]


def schedules(config: Config, topics: Sequence[str], limit: int) -> list[ScheduleRow]:
    """Up to ``limit`` live recurring schedules of ``topics`` (by partition, then offset), each
    with its next three occurrences."""
    shards = delay_shards(config, topics)
    store = store_of(config)
    try:
        registry = store.registry.at(shards)
    finally:
        store.client.close()
    rows: list[ScheduleRow] = []
    now = wall_ms()
    for shard in shards:
        live = registry[shard]
        chosen = sorted(live)[: max(0, limit - len(rows))]
        if not chosen:
            continue
        for record in lookup.records_at(config, shard, chosen, now):
            if record.recurring:
                rows.append(_row(shard.topic, shard.partition, record, live[record.offset], now))
    return rows


def _row(topic: str, partition: int, record: Scheduled, paused: bool, now_ms: int) -> ScheduleRow:
    texts = {k: (v or b"").decode(errors="replace") for k, v in reversed(record.headers)}
    schedule = recurrence_of(texts, record.timestamp_ms)
    upcoming = tuple(schedule.upcoming(max(now_ms, record.due_ms - 1), 3))
    return ScheduleRow(
        record.delay_id,
        topic,
        partition,
        record.offset,
        texts.get(H_CRON, ""),
        texts.get(H_EVERY, ""),
        texts.get(H_TIMEZONE, "UTC"),
        paused,
        record.target,
        upcoming,
        tuple(schedule.local(at).isoformat() for at in upcoming),
    )


def schedule_partitions(config: Config, topic: str, delay_id: str) -> list[int]:
    """The partitions of ``topic`` whose schedule registry has a live recurring schedule with
    ``delay_id`` (waiting, its occurrence in flight, or its next record on its way in)."""
    shards = delay_shards(config, [topic])
    store = store_of(config)
    try:
        return [s.partition for s in store.registry.live(shards, delay_id)]
    finally:
        store.client.close()
