"""``cancel``, ``fire`` and ``reschedule`` on many records: a filter, ``--dry-run`` or ``--yes``.

Each finds the waiting records the filter matches (:mod:`bridge.ops.bulk`) and acts through records
produced to their partitions — cancels, or replacements due at once or at a new time — so the
bridge applies them in offset order like any other, and a Redis rebuild keeps them. ``fire`` and
``reschedule`` take ``--id`` too, for one record. Nothing matching: exit 1.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator

from bridge import ops
from bridge.cli.args import given_filters, refuse_filters
from bridge.cli.records import delay_topic, send
from bridge.config import Config
from bridge.dialects import ETF1, KASPR
from bridge.errors import UsageError
from bridge.message import parse_duration_ms

PROGRESS_EVERY = 10_000


def _filter(args: argparse.Namespace, verb: str, now_ms: int) -> ops.Filter:
    """The bulk form's filter, checked: at least one, and ``--dry-run`` or ``--yes``."""
    if not given_filters(args) and args.topic is None:
        raise UsageError(
            "give --id, or a filter (--target, --key-prefix, --due-after, --due-before, --topic)"
        )
    if not (args.dry_run or args.yes):
        raise UsageError(f"a bulk {verb} needs --dry-run (count what matches) or --yes (act)")
    if args.rate < 0:
        raise UsageError(f"--rate {args.rate:g}: 0 (no limit) or more records a second")
    return ops.Filter(
        target=args.target,
        key_prefix=None if args.key_prefix is None else args.key_prefix.encode(),
        due_after_ms=ops.when("--due-after", args.due_after, now_ms),
        due_before_ms=ops.when("--due-before", args.due_before, now_ms),
    )


Act = Callable[[ops.Match, str | None, str], ops.Outgoing | None]
DONE = {"cancel": "cancelled", "fire": "fired", "reschedule": "rescheduled"}
# What names an operation when --operation does not: the command's verb, filters and new time, as
# given (a relative "10m" stays "10m"), so the same command run again is the same operation.
NAMING = ("topic", "target", "key_prefix", "due_after", "due_before", "at", "after", "shift")


def operation_of(args: argparse.Namespace, verb: str) -> str:
    """The operation id of a bulk command: ``--operation``, else a hash of the command."""
    given: str | None = args.operation
    if given is not None:
        if not 1 <= len(given) <= 64 or not given.isascii() or not given.isprintable():
            raise UsageError(f"--operation {given[:70]!r}: 1 to 64 printable ASCII characters")
        return given
    words = [
        verb,
        *(f"{k}={getattr(args, k)}" for k in NAMING if getattr(args, k, None) is not None),
    ]
    return hashlib.blake2b("\0".join(words).encode(), digest_size=6).hexdigest()


def _run(args: argparse.Namespace, config: Config, verb: str, act: Act, *, read: bool) -> int:
    """Find the matches of every delay topic asked for (``read``: references read back too)
    among what the bridge had stored when the topic's turn began (its snapshot), count them per
    partition, and unless ``--dry-run`` produce what ``act`` makes of each, with the operation's
    id; then follow the bridge applying it and say how much it did."""
    now_ms = time.time_ns() // 1_000_000
    flt = _filter(args, verb, now_ms)
    operation = operation_of(args, verb)
    topics = [delay_topic(args, config)] if args.topic else list(config.topics.delay)
    tally, skipped, done, applied = ops.Tally(Counter()), 0, 0, 0

    def counted(found: Iterator[ops.Match], dialect: str | None) -> Iterator[ops.Outgoing]:
        nonlocal skipped, done
        for match in found:
            if match.done:
                done += 1
                continue
            out = act(match, dialect, operation)
            if out is None:
                skipped += 1
                continue
            tally.counts[match.shard] += 1
            if tally.total % PROGRESS_EVERY == 0 and sys.stderr.isatty():
                print(f"\r{tally.total:,} matched", end="", file=sys.stderr, flush=True)
            yield out

    for topic in topics:
        dialect = config.topics.dialect.get(topic)
        shards = ops.delay_shards(config, [topic])
        store = ops.store_of(config)
        try:
            below = {s: mark + 1 for s, mark in store.inventory.watermarks(shards).items()}
            reads = read or dialect in (ETF1, KASPR)
            mine = None if verb == "cancel" else operation  # a cancelled record is gone anyway
            found = ops.matches(config, shards, flt, read_all=reads, below=below, operation=mine)
            records = counted(found, dialect)
            if verb == "cancel" and dialect not in (ETF1, KASPR):
                records = ops.packed(records, operation)
            if args.dry_run:
                for _ in records:
                    pass
                continue
            follow = ops.Follow(topic, store.inventory.watermarks)
            send(
                config,
                topic,
                args.timeout,
                records,
                verb,
                each=False,
                rate=args.rate,
                follow=follow,
            )
            follow.wait(time.sleep, ahead=0)  # what the bridge applied, not what was produced
            applied += follow.applied
        finally:
            store.client.close()
        if follow.stalled:
            print(
                f"delay-bridge: the bridge applied none of {topic}'s records for "
                f"{ops.STALL_S:.0f} s: the rest were produced without waiting for it",
                file=sys.stderr,
            )
    if tally.total >= PROGRESS_EVERY and sys.stderr.isatty():
        print(file=sys.stderr)
    if skipped:
        print(
            f"delay-bridge: {skipped:,} matched but are bound for the DLQ (their payload is "
            f"gone from the delay topic): left as they are",
            file=sys.stderr,
        )
    if not tally.total:
        if done:
            already = f"{done:,} matching records were {DONE[verb]} by this operation already"
            print(f"{already} ({operation}): nothing left to do")
            return 0
        print("delay-bridge: no waiting record matches", file=sys.stderr)
        return 1
    if args.dry_run:
        print(f"would {verb} {tally.total:,} waiting records: {tally.table()}")
        return 0
    print(
        f"{DONE[verb]} {tally.total:,} waiting records (operation {operation}), applied "
        f"{applied:,}: {tally.table()}"
    )
    return 0


def bulk_cancel(args: argparse.Namespace, config: Config) -> int:
    """``cancel`` with a filter (see the module docstring)."""
    if args.key is not None or args.force:
        raise UsageError(f"{'--key' if args.key is not None else '--force'}: only with --id")
    return _run(args, config, "cancel", lambda m, d, _: ops.cancel_of(m, d), read=False)


def _new_due(args: argparse.Namespace, now_ms: int) -> Callable[[int], int | None]:
    """``reschedule``'s new due time from a record's: ``--at``, ``--after`` or ``--shift``."""
    if args.at is not None:
        at = ops.when("--at", args.at, now_ms)
        return lambda _: at
    text = args.after if args.after is not None else args.shift
    flag = "--after" if args.after is not None else "--shift"
    negative = text.strip().startswith("-")
    try:
        amount = parse_duration_ms(text.strip().lstrip("-"))
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None
    if args.after is not None:
        if negative:
            raise UsageError("--after: a delay from now is not negative (--at gives a time)")
        return lambda _: now_ms + amount
    return lambda due: due + (-amount if negative else amount)


def fire_command(args: argparse.Namespace, config: Config) -> int:
    """``fire``: deliver now the waiting record with ``--id``, or every one a filter matches."""
    return _replace(args, config, "fire", lambda _: None)


def reschedule_command(args: argparse.Namespace, config: Config) -> int:
    """``reschedule``: move the due time of the record with ``--id``, or of every match."""
    return _replace(args, config, "reschedule", _new_due(args, time.time_ns() // 1_000_000))


def _replace(
    args: argparse.Namespace, config: Config, verb: str, due: Callable[[int], int | None]
) -> int:
    for topic in [args.topic] if args.topic else config.topics.delay:
        if config.topics.dialect.get(topic) in (ETF1, KASPR):
            raise UsageError(
                f"{verb}: {topic} speaks {config.topics.dialect[topic]}; "
                "only this contract's delay topics replace by delay-id"
            )

    def act(match: ops.Match, _dialect: str | None, operation: str) -> ops.Outgoing | None:
        return ops.replacement_of(match, due(match.due_ms), operation)

    if args.id is None:
        return _run(args, config, verb, act, read=True)
    refuse_filters(args)
    topic = delay_topic(args, config)
    _, found = ops.locate(config, topic, args.id)
    if not found:
        print(
            f"delay-bridge: {args.id} waits in no partition of {topic} (already claimed or "
            "delivered, never scheduled, or not read by the bridge yet)",
            file=sys.stderr,
        )
        return 1
    made = [
        ops.replacement_of(ops.Match(s, r.offset, r.due_ms, r), due(r.due_ms)) for s, r in found
    ]
    send(config, topic, args.timeout, iter([m for m in made if m is not None]), verb)
    return 0
