"""``delay-bridge produce`` and ``cancel``: records written to a delay topic from the command line.

Each record is checked with the bridge's own rules before it is sent, so a mistake is an error
now rather than a dead letter later; a cancel goes to the partition its record went to.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import sys
import time
from collections.abc import Iterator

from bridge import ops
from bridge.cli.args import refuse_filters
from bridge.client import cancel_headers, partition_for
from bridge.config import Config, producer_settings
from bridge.dialects import (
    ETF1,
    KASPR,
    KASPR_ACTION,
    KASPR_CANCEL,
    KASPR_DELIVER_AT,
    KASPR_DELIVER_TO,
    KASPR_REQUEST_ID,
    parse_record,
)
from bridge.errors import BridgeError, UsageError
from bridge.kafka import produce
from bridge.message import (
    CONTROL_HEADERS,
    H_AFTER,
    H_CANCEL,
    H_DELIVER_AT,
    H_DUE_AT,
    H_ID,
    H_PRIORITY,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    Headers,
    Priority,
    Reason,
    Rejected,
    Rules,
    format_time_ms,
    parse_duration_ms,
    parse_time_ms,
    wire_headers,
)

# A record the CLI produces: key, value, headers, and its partition (None: by the key).
Outgoing = tuple[bytes | None, bytes | None, Headers, int | None]


def _headers(args: argparse.Namespace, target: str | None, dialect: str | None) -> Headers:
    if dialect == KASPR:
        return _kaspr_headers(args, target)
    headers = _extra_headers(args)
    if target is not None:
        headers.append((H_TARGET_TOPIC, target.encode()))
    if args.after is not None:
        headers.append((H_AFTER, args.after.encode()))
    else:
        headers.append((H_DELIVER_AT, args.at.encode()))
    if args.target_key is not None:
        headers.append((H_TARGET_KEY, args.target_key.encode()))
    if args.id is not None:
        headers.append((H_ID, args.id.encode()))
    return headers


def _extra_headers(args: argparse.Namespace) -> Headers:
    headers: Headers = []
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--header {item!r}: expected NAME=VALUE")
        if name in CONTROL_HEADERS or name.startswith("x-scheduler-"):
            raise UsageError(f"--header {name}: set it with its own option, not --header")
        headers.append((name, value.encode()))
    if args.priority is not None:  # every dialect reads it: none has a priority of its own
        try:
            headers.append((H_PRIORITY, Priority.of(args.priority).label.encode()))
        except ValueError as exc:
            raise UsageError(f"--priority: {exc}") from None
    return headers


def _kaspr_headers(args: argparse.Namespace, target: str | None) -> Headers:
    """A schedule request in Kaspr's headers: its due time is absolute (``--after`` counts from
    now) and it has no target key."""
    if args.target_key is not None:
        raise UsageError(
            "--target-key: Kaspr's headers have no target key (the record's own key is delivered)"
        )
    headers = _extra_headers(args)
    try:
        if args.after is not None:
            due_ms = time.time_ns() // 1_000_000 + parse_duration_ms(args.after)
        else:
            due_ms = parse_time_ms(args.at)
    except ValueError as exc:
        raise UsageError(f"--after/--at: {exc}") from None
    headers.append((KASPR_DELIVER_AT, format_time_ms(due_ms).encode()))
    if target is not None:
        headers.append((KASPR_DELIVER_TO, target.encode()))
    if args.id is not None:
        headers.append((KASPR_REQUEST_ID, args.id.encode()))
    return headers


def _values(value: str) -> Iterator[bytes]:
    if value != "-":
        yield value.encode()
        return
    if sys.stdin.isatty():
        print(
            "delay-bridge: reading values from stdin, one record per line (Ctrl-D ends)",
            file=sys.stderr,
        )
    for line in sys.stdin.buffer:
        yield line.rstrip(b"\r\n")


def _check(
    rules: Rules, topic: str, key: bytes | None, value: bytes | None, headers: Headers
) -> None:
    """Refuse what the bridge would dead-letter a second later, with the bridge's own rules."""
    now = time.time_ns() // 1_000_000
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
        flag = {
            Reason.BAD_DUE_TIME: "--after/--at: ",
            Reason.DELAY_TOO_LONG: "--after/--at: ",
            Reason.TARGET_NOT_ALLOWED: "--target: ",
            Reason.MISSING_TARGET: "--target: ",
        }
        raise UsageError(
            f"{flag.get(rejection.reason, '')}{rejection.detail} (the bridge would dead-letter "
            f"it as {rejection.reason.value})"
        ) from None


def delay_topic(args: argparse.Namespace, config: Config) -> str:
    topic: str = args.topic or config.topics.delay[0]
    if topic not in config.topics.delay:
        raise UsageError(
            f"--topic {topic}: not one of topics.delay ({', '.join(config.topics.delay)})"
        )
    return topic


def produce_command(args: argparse.Namespace, config: Config) -> int:
    """Produce the record ``--value`` describes (one per line of ``-``: standard input) to the
    delay topic, each checked with the bridge's own rules first; a replacement (``--id``) goes
    to the partition where that id waits."""
    topic = delay_topic(args, config)
    if args.target is None and topic not in config.topics.default_target:
        raise UsageError(f"--target is required: topics.default_target has none for {topic}")
    headers = _headers(args, args.target, config.topics.dialect.get(topic))
    key = args.key.encode() if args.key is not None else None
    rules = config.rules()
    partition = None
    if args.id is not None:  # a replacement goes where the id waits, whatever the key says
        _check(rules, topic, key, b"", headers)
        count, found = ops.locate(config, topic, args.id)
        if found:
            partition = _choose(
                [shard.partition for shard, _ in found],
                key,
                count,
                f"{args.id} waits in {topic}",
                "replacement",
            )

    def records() -> Iterator[Outgoing]:
        for value in _values(args.value):
            _check(rules, topic, key, value, headers)
            yield key, value, headers, partition

    target = args.target or config.topics.default_target[topic]
    count = send(config, topic, args.timeout, records(), "scheduled", target=target)
    if args.at is not None and count:
        print(f"{count} record(s) due at {format_time_ms(parse_time_ms(args.at))}", file=sys.stderr)
    return 0


def cancel_command(args: argparse.Namespace, config: Config) -> int:
    """Produce the record that cancels the waiting record with ``--id`` — a ``delay-cancel``
    header, on an etf1 topic a tombstone keyed by the id, on a kaspr topic a CANCEL request — to
    each partition where the id waits (looked up in Redis: the partition a key maps to depends
    on the producer's partitioner). An id that waits nowhere is an error unless ``--force``.
    Without ``--id``: :func:`bridge.cli.bulk.bulk_cancel`."""
    refuse_filters(args)
    topic = delay_topic(args, config)
    dialect = config.topics.dialect.get(topic)
    etf1 = dialect == ETF1
    if etf1 and args.key is not None and args.key != args.id:
        raise UsageError(f"--key: on {topic} (etf1) the key is the delay-id; leave --key out")
    try:
        headers: Headers = [] if etf1 else list(cancel_headers(args.id))  # checks the id too
    except ValueError as exc:
        raise UsageError(f"--id: {exc}") from None
    if dialect == KASPR:
        headers = [(KASPR_ACTION, KASPR_CANCEL.encode()), (KASPR_REQUEST_ID, args.id.encode())]
    given = args.id.encode() if etf1 else None if args.key is None else args.key.encode()
    value = None if etf1 else b""
    _check(config.rules(), topic, given if etf1 else b"k", value, headers)
    count, found = ops.locate(config, topic, args.id)
    records: list[Outgoing] = []
    if not found:
        if not args.force:
            raise BridgeError(
                f"{args.id} waits in no partition of {topic} (already claimed or "
                "delivered, never scheduled, or not read by the bridge yet); "
                "nothing produced — --force produces the cancel anyway"
            )
        if given is None:
            raise UsageError(
                "--force needs --key: it picks the partition of a cancel for an id "
                "that waits nowhere"
            )
        records.append((given, value, headers, None))
    else:
        if given is not None:
            _choose(
                [shard.partition for shard, _ in found],
                given,
                count,
                f"{args.id} waits in {topic}",
                "cancel",
            )
        if len(found) > 1:
            print(
                f"delay-bridge: {args.id} waits in {len(found)} partitions of {topic} "
                f"({', '.join(str(s.partition) for s, _ in found)}): cancelling each",
                file=sys.stderr,
            )
        for shard, rec in found:
            hinted = headers
            if dialect not in (ETF1, KASPR):  # the due time of its record: see Cancel
                hinted = [*headers, (H_DUE_AT, b"%d" % rec.due_ms)]
            records.append((rec.key if given is None else given, value, hinted, shard.partition))
    send(config, topic, args.timeout, iter(records), f"cancel of {args.id}")
    return 0


def _choose(partitions: list[int], key: bytes | None, count: int, where: str, what: str) -> int:
    """The partition (of ``partitions``, where the id waits) a ``what`` goes to: the one
    ``key`` maps to if it is among them, else the first; says so on stderr when the key maps
    elsewhere, since that means the record's producer partitions differently."""
    mapped = None if key is None else partition_for(key, count)
    if mapped in partitions:
        return mapped
    chosen = partitions[0]
    if mapped is not None:
        print(
            f"delay-bridge: {where} partition {chosen}, so the {what} goes there; its "
            f"key maps to partition {mapped} with Java's murmur2 partitioner (the record's "
            "producer partitioned with another, e.g. librdkafka's default CRC32: use one "
            "partitioner for a schedule and its cancels)",
            file=sys.stderr,
        )
    return chosen


def send(
    config: Config,
    topic: str,
    timeout: str,
    records: Iterator[Outgoing],
    what: str,
    *,
    target: str | None = None,
    each: bool = True,
    rate: float = 0,
    follow: ops.Follow | None = None,
) -> int:
    """Produce ``records`` to ``topic`` (each to its partition, or by its key when None; the
    first one is taken, and so checked, before connecting); print each acknowledged offset as
    ``<what> topic:partition:offset`` (unless not ``each``); warn when the records' ``target``
    topic does not exist; ``rate``: at most this many records acted on a second (a record with
    several ``delay-cancel`` headers counts each; 0: no limit); ``follow``: paced by the bridge
    applying them too. Returns how many were produced."""
    from confluent_kafka import KafkaError, KafkaException, Message, Producer

    try:
        timeout_ms = parse_duration_ms(timeout)
    except ValueError as exc:
        raise UsageError(f"--timeout: {exc}") from None
    first = next(records, None)
    if first is None:
        return 0
    errors: list[str] = []
    quiet = logging.getLogger("librdkafka.cli")
    quiet.propagate = False  # librdkafka's own lines would repeat every reconnect
    settings = {
        **producer_settings(config),
        "delivery.timeout.ms": str(timeout_ms),
        "logger": quiet,
        "error_cb": lambda err: errors.append(err.str()),
    }
    producer = Producer(settings)
    # Connect first: a record's timestamp is taken at produce(), and --after counts from it.
    try:
        topic_meta = producer.list_topics(topic, timeout=timeout_ms / 1000).topics[topic]
    except KafkaException as exc:
        last = errors[-1] if errors else exc.args[0].str()
        raise BridgeError(
            f"cannot reach Kafka at {config.kafka.bootstrap_servers} within {timeout}: {last}"
        ) from None
    if topic_meta.error is not None:
        raise BridgeError(f"cannot produce to {topic}: {topic_meta.error.str()}")
    if target is not None:
        with contextlib.suppress(KafkaException):  # the warning is a courtesy, never a failure
            meta = producer.list_topics(target, timeout=timeout_ms / 1000).topics.get(target)
            if meta is None or meta.error is not None:
                print(
                    f"delay-bridge: warning: target topic {target} does not exist (yet): if it "
                    "is still missing when the records fall due, the bridge dead-letters them "
                    "as delivery-failed",
                    file=sys.stderr,
                )
    failures: list[str] = []

    def report(acted: int, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(err.str())
            return
        if follow is not None:
            follow.acknowledged(msg.partition() or 0, msg.offset() or 0, acted)
        if each:
            print(f"{what} {msg.topic()}:{msg.partition()}:{msg.offset()}")

    count, acted, started = 0, 0, time.monotonic()
    record: Outgoing | None = first
    try:
        while record is not None:
            key, value, headers, partition = record
            fields = {} if partition is None else {"partition": partition}
            acts = sum(1 for name, _ in headers if name == H_CANCEL) or 1
            produce(
                producer,
                topic,
                value=value,
                key=key,
                headers=wire_headers(headers),
                on_delivery=functools.partial(report, acts),
                **fields,
            )
            producer.poll(0)
            count += 1
            acted += acts
            if follow is not None:
                follow.sent(acts)
                follow.wait(producer.poll)
            if rate and (ahead := acted / rate - (time.monotonic() - started)) > 0:
                producer.poll(ahead)  # serves delivery reports while it paces
            record = next(records, None)
    except KafkaException as exc:
        raise BridgeError(f"cannot produce to {topic}: {exc.args[0].str()}") from None
    remaining = producer.flush(timeout_ms / 1000 + 1)
    if failures or remaining:
        reason = failures[0] if failures else f"{remaining} records not acknowledged"
        raise BridgeError(f"produce to {topic} failed: {reason}")
    return count
