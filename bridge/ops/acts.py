"""The write tools: ``cancel``, ``fire`` and ``reschedule``, of one record or of every match.

Each takes its typed options (:mod:`bridge.ops.asked`) and returns what it did as data — the
records it produced and where (:class:`Sent`), or what a bulk operation matched and the bridge
applied (:class:`BulkDone`) — saying its notes through a :class:`~bridge.ops.send.Voice`. The
command line prints the result's lines; the console's API answers them with the result's JSON.

A write by delay-id finds where the id waits (in Redis: the partition a key maps to depends on the
producer's partitioner) and produces to each such partition; a bulk write finds the waiting
records the filter matches among what the bridge had stored when the topic's turn began (its
snapshot) and produces what cancels or replaces each (:mod:`bridge.ops.bulk`), followed by the
bridge applying it.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from bridge.client import cancel_headers, partition_for
from bridge.config import Config
from bridge.dialects import (
    ETF1,
    KASPR,
    KASPR_ACTION,
    KASPR_CANCEL,
    KASPR_REQUEST_ID,
    parse_record,
)
from bridge.errors import BridgeError, UsageError
from bridge.message import H_DUE_AT, Headers, Reason, Rejected, Rules, parse_duration_ms, wall_ms
from bridge.ops.answers import dlq_filters
from bridge.ops.asked import BulkAsk, CancelAsk, FireAsk, ReplayAsk, RescheduleAsk, when
from bridge.ops.bulk import (
    STALL_S,
    Filter,
    Follow,
    Match,
    Outgoing,
    Tally,
    cancel_of,
    matches,
    packed,
    replacement_of,
    snapshot,
)
from bridge.ops.records import delay_shards, locate, store_of
from bridge.ops.replay import Replayed, replay
from bridge.ops.send import Placed, Sending, Voice, send

DONE = {"cancel": "cancelled", "fire": "fired", "reschedule": "rescheduled"}
# What names an operation when --operation does not: the command's verb, filters and new time, as
# given (a relative "10m" stays "10m"), so the same command run again is the same operation.
NAMING = ("topic", "target", "key_prefix", "due_after", "due_before", "at", "after", "shift")


@dataclass(frozen=True)
class Sent:
    """A write by delay-id: ``what`` it produced (``cancel of order-7``, ``fire``), and where
    Kafka took each record; ``found`` False when the id waits nowhere (nothing produced)."""

    what: str
    placed: list[Placed] = field(default_factory=list)
    found: bool = True

    def lines(self) -> list[str]:
        return [f"{self.what} {place}" for place in self.placed]

    def as_json(self) -> dict[str, Any]:
        return {"produced": [asdict(place) for place in self.placed]}


@dataclass(frozen=True)
class BulkDone:
    """A bulk write: the matches per partition, the operation that acted on them (``dry_run``:
    counted only), how many the bridge applied, how many this operation had made already, and
    how many were left as they are (bound for the DLQ: nothing to deliver)."""

    verb: str
    operation: str
    dry_run: bool
    tally: Tally
    applied: int = 0
    already: int = 0
    skipped: int = 0

    @property
    def found(self) -> bool:
        return bool(self.tally.total or self.already)

    def lines(self) -> list[str]:
        total, done = self.tally.total, DONE[self.verb]
        if not total:
            if not self.already:
                return []
            return [
                f"{self.already:,} matching records were {done} by this operation already "
                f"({self.operation}): nothing left to do"
            ]
        if self.dry_run:
            return [f"would {self.verb} {total:,} waiting records: {self.tally.table()}"]
        return [
            f"{done} {total:,} waiting records (operation {self.operation}), applied "
            f"{self.applied:,}: {self.tally.table()}"
        ]

    def as_json(self) -> dict[str, Any]:
        return {
            "operation": self.operation,
            "dry_run": self.dry_run,
            "matched": {
                f"{s.topic}:{s.partition}": n for s, n in sorted(self.tally.counts.items())
            },
            "applied": self.applied,
            "already": self.already,
            "skipped": self.skipped,
        }


def delay_topic(config: Config, topic: str | None) -> str:
    """The delay topic asked for (``None``: the first configured), checked."""
    chosen = topic or config.topics.delay[0]
    if chosen not in config.topics.delay:
        raise UsageError(
            f"--topic {chosen}: not one of topics.delay ({', '.join(config.topics.delay)})"
        )
    return chosen


# A refusal's reason -> the option that caused it.
REFUSED_BY = {
    Reason.BAD_DUE_TIME: "--after/--at: ",
    Reason.DELAY_TOO_LONG: "--after/--at: ",
    Reason.TARGET_NOT_ALLOWED: "--target: ",
    Reason.MISSING_TARGET: "--target: ",
}


def check_record(
    rules: Rules, topic: str, key: bytes | None, value: bytes | None, headers: Headers
) -> None:
    """Refuse what the bridge would dead-letter a second later, with the bridge's own rules."""
    now = wall_ms()
    try:
        parse_record(
            rules,
            topic=topic,
            partition=0,
            offset=0,
            timestamp_ms=now,
            key=key,
            value=value,
            headers=headers,
            now_ms=now,
        )
    except Rejected as rejection:
        raise UsageError(
            f"{REFUSED_BY.get(rejection.reason, '')}{rejection.detail} (the bridge would "
            f"dead-letter it as {rejection.reason.value})"
        ) from None


def choose(
    partitions: list[int], key: bytes | None, count: int, where: str, *, what: str, voice: Voice
) -> int:
    """The partition (of ``partitions``, where the id waits) a ``what`` goes to: the one
    ``key`` maps to if it is among them, else the first; says so when the key maps elsewhere,
    since that means the record's producer partitions differently."""
    mapped = None if key is None else partition_for(key, count)
    if mapped in partitions:
        return mapped
    chosen = partitions[0]
    if mapped is not None:
        voice(
            f"{where} partition {chosen}, so the {what} goes there; its key maps to partition "
            f"{mapped} with Java's murmur2 partitioner (the record's producer partitioned with "
            "another, e.g. librdkafka's default CRC32: use one partitioner for a schedule and "
            "its cancels)"
        )
    return chosen


def operation_of(ask: BulkAsk) -> str:
    """The operation id of a bulk write: ``operation``, else a hash of the command as given."""
    if ask.operation is not None:
        return ask.operation
    words = [
        ask.verb,
        *(f"{k}={getattr(ask, k)}" for k in NAMING if getattr(ask, k, None) is not None),
    ]
    return hashlib.blake2b("\0".join(words).encode(), digest_size=6).hexdigest()


def cancel(config: Config, ask: CancelAsk, now_ms: int, voice: Voice) -> Sent | BulkDone:
    """Cancel the record with ``ask.id`` — a ``delay-cancel`` header, on an etf1 topic a
    tombstone keyed by the id, on a kaspr topic a CANCEL request — in each partition where it
    waits; an id that waits nowhere is an error unless ``ask.force``. Without an id: every
    waiting record the filters match."""
    if ask.id is None:
        return _bulk(config, ask, now_ms, voice, lambda m, d, _: cancel_of(m, d))
    topic = delay_topic(config, ask.topic)
    dialect = config.topics.dialect.get(topic)
    headers, given, value = _cancel_record(topic, dialect, ask.id, ask.key)
    check_record(config.rules(), topic, given if dialect == ETF1 else b"k", value, headers)
    count, found, live = locate(config, topic, ask.id)
    # A recurring schedule may wait nowhere (its occurrence in flight, its next record on its way
    # in) and yet live in its partition's registry: a cancel there ends it (add.lua).
    waiting = {shard.partition for shard, _ in found}
    running = [p for p in live if p not in waiting]
    records: list[Outgoing] = []
    if not found and not running:
        if not ask.force:
            raise BridgeError(
                f"{ask.id} waits in no partition of {topic} (already claimed or delivered, never "
                "scheduled, or not read by the bridge yet); nothing produced — --force produces "
                "the cancel anyway"
            )
        if given is None:
            raise UsageError(
                "--force needs --key: it picks the partition of a cancel for an id that waits "
                "nowhere"
            )
        records.append((given, value, headers, None))
    else:
        where = sorted(waiting.union(running))
        if given is not None:
            choose(where, given, count, f"{ask.id} waits in {topic}", what="cancel", voice=voice)
        if len(where) > 1:
            voice(
                f"{ask.id} waits in {len(where)} partitions of {topic} "
                f"({', '.join(str(p) for p in where)}): cancelling each"
            )
        for partition in running:
            voice(f"{ask.id}: a recurring schedule running in partition {partition}, ended there")
            records.append((given, value, headers, partition))
        for shard, rec in found:
            hinted = headers
            if dialect not in (ETF1, KASPR):  # the due time of its record: see Cancel
                hinted = [*headers, (H_DUE_AT, b"%d" % rec.due_ms)]
            records.append((rec.key if given is None else given, value, hinted, shard.partition))
    return _sent(config, topic, records, ask, what=f"cancel of {ask.id}", voice=voice)


def _cancel_record(
    topic: str, dialect: str | None, delay_id: str, key: str | None
) -> tuple[Headers, bytes | None, bytes | None]:
    """The headers, key (None: the record's own) and value of a cancel of ``delay_id`` on
    ``topic`` in its ``dialect``."""
    etf1 = dialect == ETF1
    if etf1 and key is not None and key != delay_id:
        raise UsageError(f"--key: on {topic} (etf1) the key is the delay-id; leave --key out")
    try:
        headers: Headers = [] if etf1 else list(cancel_headers(delay_id))  # checks the id too
    except ValueError as exc:
        raise UsageError(f"--id: {exc}") from None
    if dialect == KASPR:
        headers = [(KASPR_ACTION, KASPR_CANCEL.encode()), (KASPR_REQUEST_ID, delay_id.encode())]
    given = delay_id.encode() if etf1 else None if key is None else key.encode()
    return headers, given, None if etf1 else b""


def fire(config: Config, ask: FireAsk, now_ms: int, voice: Voice) -> Sent | BulkDone:
    """Deliver now the waiting record with ``ask.id``, or every one the filters match."""
    return _replace(config, ask, now_ms, voice, lambda _: None)


def reschedule(config: Config, ask: RescheduleAsk, now_ms: int, voice: Voice) -> Sent | BulkDone:
    """Move the due time of the record with ``ask.id``, or of every match."""
    return _replace(config, ask, now_ms, voice, new_due(ask, now_ms))


def new_due(ask: RescheduleAsk, now_ms: int) -> Callable[[int], int | None]:
    """``reschedule``'s new due time from a record's: ``at``, ``after`` or ``shift``."""
    if ask.at is not None:
        at = when("--at", ask.at, now_ms)
        return lambda _: at
    text = ask.after if ask.after is not None else ask.shift or ""
    flag = "--after" if ask.after is not None else "--shift"
    negative = text.strip().startswith("-")
    try:
        amount = parse_duration_ms(text.strip().lstrip("-"))
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if ask.after is not None:
        if negative:
            raise UsageError("--after: a delay from now is not negative (--at gives a time)")
        return lambda _: now_ms + amount
    return lambda due: due + (-amount if negative else amount)


def replay_dead_letters(config: Config, ask: ReplayAsk, now_ms: int, voice: Voice) -> Replayed:
    """``dlq replay``: the dead letters the filters match back to their delay topics."""
    return replay(
        config,
        filters=dlq_filters(ask, now_ms),
        limit=ask.limit,
        dry_run=ask.dry_run,
        from_beginning=ask.from_beginning,
        progress=voice.progress,
    )


def _replace(
    config: Config, ask: BulkAsk, now_ms: int, voice: Voice, due: Callable[[int], int | None]
) -> Sent | BulkDone:
    for topic in [ask.topic] if ask.topic else config.topics.delay:
        if config.topics.dialect.get(topic) in (ETF1, KASPR):
            raise UsageError(
                f"{ask.verb}: {topic} speaks {config.topics.dialect[topic]}; "
                "only this contract's delay topics replace by delay-id"
            )

    def act(match: Match, _dialect: str | None, operation: str) -> Outgoing | None:
        return replacement_of(match, due(match.due_ms), operation)

    if ask.id is None:
        return _bulk(config, ask, now_ms, voice, act, read=True)
    topic = delay_topic(config, ask.topic)
    found = locate(config, topic, ask.id).found
    if not found:
        voice(
            f"{ask.id} waits in no partition of {topic} (already claimed or delivered, never "
            "scheduled, or not read by the bridge yet)"
        )
        return Sent(ask.verb, found=False)
    if any(r.recurring for _, r in found):
        raise UsageError(
            f"{ask.id} is a recurring schedule: {ask.verb} moves one-shot records; pause, resume "
            "or cancel it (schedules pause|resume, cancel), or produce it again with its id"
        )
    made = [replacement_of(Match(s, r.offset, r.due_ms, r), due(r.due_ms)) for s, r in found]
    kept = [m for m in made if m is not None]
    return _sent(config, topic, kept, ask, what=ask.verb, voice=voice)


def _sent(
    config: Config, topic: str, records: list[Outgoing], ask: BulkAsk, *, what: str, voice: Voice
) -> Sent:
    placed: list[Placed] = []
    send(config, topic, iter(records), Sending(ask.timeout, placed=placed.append), voice)
    return Sent(what, placed)


Act = Callable[[Match, str | None, str], Outgoing | None]  # a match -> what acts on it


def _bulk(
    config: Config, ask: BulkAsk, now_ms: int, voice: Voice, act: Act, *, read: bool = False
) -> BulkDone:
    """Find the matches of every delay topic asked for (``read``: references read back too)
    among what the bridge had stored when the topic's turn began (its snapshot), count them per
    partition, and unless ``dry_run`` produce what ``act`` makes of each, with the operation's
    id; then follow the bridge applying it."""
    flt = ask_filter(ask, now_ms)
    operation = operation_of(ask)
    topics = [delay_topic(config, ask.topic)] if ask.topic else list(config.topics.delay)
    tally, skipped, already, applied, schedules = Tally(Counter()), 0, 0, 0, 0

    def counted(found: Iterator[Match], dialect: str | None) -> Iterator[Outgoing]:
        nonlocal skipped, already, schedules
        for match in found:
            if match.done:
                already += 1
                continue
            if ask.verb != "cancel" and match.record is not None and match.record.recurring:
                schedules += 1  # fire and reschedule move one-shot records
                continue
            out = act(match, dialect, operation)
            if out is None:
                skipped += 1
                continue
            tally.counts[match.shard] += 1
            voice.progress(tally.total)
            yield out

    for topic in topics:
        dialect = config.topics.dialect.get(topic)
        shards = delay_shards(config, [topic])
        store = store_of(config)
        try:
            taken = snapshot(store, shards)
            reads = read or dialect in (ETF1, KASPR)
            mine = None if ask.verb == "cancel" else operation  # a cancelled record is gone anyway
            found = matches(config, shards, flt, read_all=reads, snapshot=taken, operation=mine)
            records = counted(found, dialect)
            if ask.verb == "cancel" and dialect not in (ETF1, KASPR):
                records = packed(records, operation)
            if ask.dry_run:
                for _ in records:
                    pass
                continue
            follow = Follow(topic, store.inventory.watermarks)
            send(config, topic, records, Sending(ask.timeout, ask.rate, follow), voice)
            follow.wait(time.sleep, ahead=0)  # what the bridge applied, not what was produced
            applied += follow.applied
        finally:
            store.client.close()
        if follow.stalled:
            voice(
                f"the bridge applied none of {topic}'s records for {STALL_S:.0f} s: the rest "
                "were produced without waiting for it"
            )
    if skipped:
        voice(
            f"{skipped:,} matched but are bound for the DLQ (their payload is gone from the "
            "delay topic): left as they are"
        )
    if schedules:
        many = schedules > 1
        voice(
            f"{schedules:,} recurring schedule{'s' * many} matched: left as "
            f"{'they are' if many else 'it is'} ({ask.verb} moves one-shot records)"
        )
    if not tally.total and not already:
        voice("no waiting record matches")
    return BulkDone(ask.verb, operation, ask.dry_run, tally, applied, already, skipped)


def ask_filter(ask: BulkAsk, now_ms: int) -> Filter:
    """The bulk form's filter, its times read against ``now_ms``."""
    return Filter(
        target=ask.target,
        key_prefix=None if ask.key_prefix is None else ask.key_prefix.encode(),
        due_after_ms=when("--due-after", ask.due_after, now_ms),
        due_before_ms=when("--due-before", ask.due_before, now_ms),
    )


# Each write: its options, and the tool that does it (the command line's and the API's).
WRITES: dict[str, tuple[type[Any], Callable[[Config, Any, int, Voice], Any]]] = {
    "cancel": (CancelAsk, cancel),
    "fire": (FireAsk, fire),
    "reschedule": (RescheduleAsk, reschedule),
    "replay": (ReplayAsk, replay_dead_letters),
}
