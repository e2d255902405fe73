"""``delay-bridge produce`` and the writes: records written to a delay topic from the command line.

``produce`` checks each record with the bridge's own rules before it is sent, so a mistake is an
error now rather than a dead letter later. ``cancel``, ``fire``, ``reschedule`` and ``dlq replay``
are the operator's tools (:mod:`bridge.ops`), their options parsed here and their results printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from collections.abc import Iterator
from typing import Any

from bridge import ops
from bridge.config import Config
from bridge.dialects import (
    KASPR,
    KASPR_DELIVER_AT,
    KASPR_DELIVER_TO,
    KASPR_REQUEST_ID,
)
from bridge.errors import UsageError
from bridge.message import (
    CONTROL_HEADERS,
    H_AFTER,
    H_COUNT,
    H_CRON,
    H_DELIVER_AT,
    H_EVERY,
    H_ID,
    H_MISSED,
    H_PRIORITY,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    H_TIMEZONE,
    H_UNTIL,
    Headers,
    Priority,
    format_time_ms,
    parse_duration_ms,
    parse_time_ms,
    recurrence_of,
    wall_ms,
)

# produce's options for a recurring schedule, and the header each sets.
_SCHEDULE_OPTIONS = (
    ("cron", H_CRON),
    ("every", H_EVERY),
    ("tz", H_TIMEZONE),
    ("until", H_UNTIL),
    ("count", H_COUNT),
    ("missed", H_MISSED),
)


def _headers(args: argparse.Namespace, target: str | None, dialect: str | None) -> Headers:
    recurring = args.cron is not None or args.every is not None
    given = [f"--{o}" for o, _ in _SCHEDULE_OPTIONS if getattr(args, o) is not None]
    if given and not recurring:
        raise UsageError(f"{', '.join(given)}: only with --cron or --every (a recurring schedule)")
    if recurring and args.id is None:
        raise UsageError("--id is required with --cron or --every: it names the schedule")
    if not recurring and args.after is None and args.at is None:
        raise UsageError("one of --after, --at, --cron or --every is required")
    if dialect == KASPR:
        if recurring:
            raise UsageError("--cron/--every: Kaspr's headers have no recurring schedule")
        return _kaspr_headers(args, target)
    headers = _extra_headers(args)
    if target is not None:
        headers.append((H_TARGET_TOPIC, target.encode()))
    if args.after is not None:
        headers.append((H_AFTER, args.after.encode()))
    elif args.at is not None:
        headers.append((H_DELIVER_AT, args.at.encode()))
    for option, header in _SCHEDULE_OPTIONS:
        if getattr(args, option) is not None:
            headers.append((header, getattr(args, option).encode()))
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
            due_ms = wall_ms() + parse_duration_ms(args.after)
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


def produce_command(args: argparse.Namespace, config: Config) -> int:
    """Produce the record ``--value`` describes (one per line of ``-``: standard input) to the
    delay topic, each checked with the bridge's own rules first; a replacement (``--id``) goes
    to the partition where that id waits."""
    topic = ops.delay_topic(config, args.topic)
    if args.target is None and topic not in config.topics.default_target:
        raise UsageError(f"--target is required: topics.default_target has none for {topic}")
    headers = _headers(args, args.target, config.topics.dialect.get(topic))
    key = args.key.encode() if args.key is not None else None
    rules = config.rules()
    partition = None
    voice = Terminal().voice()
    if args.id is not None:  # a replacement goes where the id waits, whatever the key says
        ops.check_record(rules, topic, key, b"", headers)
        count, found, _ = ops.locate(config, topic, args.id)
        if found:
            where = [shard.partition for shard, _ in found]
            waits = f"{args.id} waits in {topic}"
            partition = ops.choose(where, key, count, waits, what="replacement", voice=voice)

    def records() -> Iterator[ops.Outgoing]:
        for value in _values(args.value):
            ops.check_record(rules, topic, key, value, headers)
            yield key, value, headers, partition

    target = args.target or config.topics.default_target[topic]
    placed = functools.partial(_say, "scheduled")
    how = ops.Sending(args.timeout, placed=placed)
    count = ops.send(config, topic, records(), how, voice, target=target)
    if count and (args.cron is not None or args.every is not None):
        _say_upcoming(headers)
    elif args.at is not None and count:
        print(f"{count} record(s) due at {format_time_ms(parse_time_ms(args.at))}", file=sys.stderr)
    return 0


def _say_upcoming(headers: Headers) -> None:
    """A schedule's next three occurrences, in its zone and in UTC (on stderr)."""
    texts = {k: (v or b"").decode() for k, v in headers}
    schedule = recurrence_of(texts, wall_ms())
    for at in schedule.upcoming(schedule.start_ms - 1, 3):
        print(f"occurs {schedule.local(at).isoformat()} ({format_time_ms(at)})", file=sys.stderr)


def _say(what: str, place: ops.Placed) -> None:
    print(f"{what} {place}")


class Terminal:
    """A tool's voice on the command line: each note on stderr as it comes; on a terminal,
    ``progress`` (a format of the count) every ``every``, and a line ended after it."""

    def __init__(self, progress: str = "", every: int = 0) -> None:
        self.progress = progress
        self.every = every
        self.shown = False  # a progress line is open

    def note(self, text: str) -> None:
        print(f"delay-bridge: {text}", file=sys.stderr)

    def count(self, count: int) -> None:
        if self.every and count % self.every == 0 and sys.stderr.isatty():
            print("\r" + self.progress.format(count), end="", file=sys.stderr, flush=True)
            self.shown = True

    def voice(self) -> ops.Voice:
        return ops.Voice(self.note, self.count)

    def end(self) -> None:
        """End the progress line, if one was shown."""
        if self.shown:
            print(file=sys.stderr)


PROGRESS = {"replay": ("replayed {:,}", 1_000)}  # the rest: matches counted, every 10,000


def asked(kind: type[Any], args: argparse.Namespace) -> Any:
    """``kind`` (a tool's options) from the parsed command line: each field its option."""
    values = {}
    for f in dataclasses.fields(kind):
        if hasattr(args, f.name):
            given = getattr(args, f.name)
            values[f.name] = tuple(given) if isinstance(given, list) else given
    return kind(**values)


def write_command(name: str, args: argparse.Namespace, config: Config) -> int:
    """Run the write ``name`` (cancel, fire, reschedule, replay, pause, resume): its result's
    lines on stdout, its notes on stderr as they come; exit 1 when nothing matched."""
    kind, tool = ops.WRITES[name]
    terminal = Terminal(*PROGRESS.get(name, ("{:,} matched", 10_000)))
    done = tool(config, asked(kind, args), wall_ms(), terminal.voice())
    terminal.end()
    for line in done.lines():
        print(line)
    return 0 if done.found else 1
