"""The recurring schedules a deployment runs, as the tools and the console read them.

Each delay-topic partition's schedule registry (add.lua) names the record that holds each live
schedule; that record, read in the delay topic, says the rest: its id, expression, zone, and the
occurrences to come."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from bridge import lookup
from bridge.config import Config
from bridge.errors import BridgeError
from bridge.message import (
    H_CRON,
    H_EVERY,
    H_PAUSE,
    H_RESUME,
    H_TIMEZONE,
    Headers,
    Scheduled,
    format_time_ms,
    recurrence_at,
)
from bridge.ops.acts import Sent, check_record, delay_topic
from bridge.ops.answers import Answer
from bridge.ops.asked import PauseAsk, SchedulesAsk
from bridge.ops.records import delay_shards, locate, store_of
from bridge.ops.send import Placed, Sending, Voice, send


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


@dataclass(frozen=True)
class SchedulesAnswer(Answer):
    rows: list[ScheduleRow] = field(default_factory=list)


def schedules_answer(config: Config, ask: SchedulesAsk, now_ms: int) -> SchedulesAnswer:
    """``schedules list``: the live recurring schedules, each with its next three occurrences."""
    topics = [delay_topic(config, ask.topic)] if ask.topic else list(config.topics.delay)
    rows = schedules(config, topics, ask.limit, now_ms)
    notes = [] if rows else [f"no recurring schedule in {', '.join(topics)}"]
    return SchedulesAnswer([asdict(r) for r in rows], notes, bool(rows), rows=rows)


def hold(config: Config, ask: PauseAsk, now_ms: int, voice: Voice) -> Sent:
    """``schedules pause|resume``: the record that pauses (or resumes) the schedule with
    ``ask.id``, to the partition its registry has it in, else to ``ask.key``'s; an id found
    nowhere without a key is an error."""
    assert ask.id is not None  # PauseAsk refuses none
    topic = delay_topic(config, ask.topic)
    headers: Headers = [(H_PAUSE if ask.verb == "pause" else H_RESUME, ask.id.encode())]
    key = ask.key.encode() if ask.key is not None else None
    check_record(config.rules(), topic, key, None, headers)
    partitions = locate(config, topic, ask.id).running
    if not partitions and key is None:
        raise BridgeError(
            f"no recurring schedule with delay-id {ask.id!r} in {topic} (ended, or not read "
            "yet): give --key to send it to that key's partition all the same"
        )
    placed: list[Placed] = []
    partition = partitions[0] if partitions else None
    record = (key, None, headers, partition)
    send(config, topic, iter([record]), Sending(ask.timeout, placed=placed.append), voice)
    return Sent(f"{ask.verb} of {ask.id}", placed)


def schedules(config: Config, topics: Sequence[str], limit: int, now: int) -> list[ScheduleRow]:
    """Up to ``limit`` live recurring schedules of ``topics`` (by partition, then offset), each
    with its next three occurrences after ``now`` (epoch ms)."""
    shards = delay_shards(config, topics)
    store = store_of(config)
    try:
        registry = store.registry.at(shards)
    finally:
        store.client.close()
    rows: list[ScheduleRow] = []
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
    schedule = recurrence_at(record)
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
