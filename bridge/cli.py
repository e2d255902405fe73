"""The ``delay-bridge`` command line: run, check-config, produce, --version.

User errors (bad config, bad arguments, unreachable services) print one line on stderr and exit
with code 2 (1 for a failed run); never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from bridge import __version__
from bridge.config import Config, dump, load, producer_settings
from bridge.errors import BridgeError, ConfigError, UsageError
from bridge.message import (
    H_AFTER,
    H_DELIVER_AT,
    H_TARGET_KEY,
    H_TARGET_TOPIC,
    Headers,
    format_time_ms,
    parse_duration_ms,
    parse_time_ms,
    wire_headers,
)

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every sub-command."""
    parser = _Parser(prog="delay-bridge", description="Delayed delivery for Apache Kafka.")
    parser.add_argument("--version", action="version", version=f"delay-bridge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def with_config(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "-c",
            "--config",
            help="config file (default: $DELAY_BRIDGE_CONFIG or config/bridge.yaml)",
        )

    with_config(sub.add_parser("run", help="run ingress, egress and metrics until SIGTERM/SIGINT"))
    with_config(sub.add_parser("check-config", help="validate and print the effective config"))
    produce = sub.add_parser("produce", help="schedule records from the shell")
    with_config(produce)
    produce.add_argument("--target", required=True, help="topic to deliver to")
    when = produce.add_mutually_exclusive_group(required=True)
    when.add_argument("--after", help="delay from now: 250ms, 30s, 15m, 2h, 7d, 1h30m")
    when.add_argument("--at", help="due time: epoch ms or RFC 3339 (2026-11-21T10:00:00Z)")
    produce.add_argument("--key", help="record key")
    produce.add_argument("--target-key", help="key of the delivered record (default: --key)")
    produce.add_argument(
        "--header", action="append", default=[], metavar="K=V", help="extra header (repeatable)"
    )
    produce.add_argument("--topic", help="delay topic to produce to (default: the first in config)")
    produce.add_argument(
        "value", nargs="?", default="-", help="record value; - (default) reads one record per line"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check-config":
            config = load(args.config)
            sys.stdout.write(dump(config))
            return 0
        if args.command == "produce":
            return _produce(args, load(args.config))
        return _run(load(args.config))
    except ConfigError as exc:
        print(f"delay-bridge: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except UsageError as exc:
        print(f"delay-bridge: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BridgeError as exc:
        print(f"delay-bridge: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(config: Config) -> int:
    from bridge.logs import setup
    from bridge.service import Service

    setup(config.logging.level, config.logging.json)
    service = Service(config)
    service.install_signal_handlers()
    return service.run()


def _headers(args: argparse.Namespace) -> Headers:
    headers: Headers = [(H_TARGET_TOPIC, args.target.encode())]
    if args.after is not None:
        try:
            parse_duration_ms(args.after)
        except ValueError as exc:
            raise UsageError(f"--after: {exc}") from None
        headers.append((H_AFTER, args.after.encode()))
    else:
        try:
            parse_time_ms(args.at)
        except ValueError as exc:
            raise UsageError(f"--at: {exc}") from None
        headers.append((H_DELIVER_AT, args.at.encode()))
    if args.target_key is not None:
        headers.append((H_TARGET_KEY, args.target_key.encode()))
    for item in args.header:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UsageError(f"--header {item!r}: expected NAME=VALUE")
        headers.append((name, value.encode()))
    return headers


def _values(value: str) -> Iterator[bytes]:
    if value != "-":
        yield value.encode()
        return
    for line in sys.stdin.buffer:
        yield line.rstrip(b"\r\n")


def _produce(args: argparse.Namespace, config: Config) -> int:
    from confluent_kafka import KafkaError, KafkaException, Message, Producer

    headers = _headers(args)
    topic = args.topic or config.topics.delay[0]
    if topic not in config.topics.delay:
        raise UsageError(
            f"--topic {topic}: not one of topics.delay ({', '.join(config.topics.delay)})"
        )
    refusal = config.rules().target_refusal(args.target)
    if refusal is not None:
        raise UsageError(f"--target: {refusal}")
    settings = {**producer_settings(config), "delivery.timeout.ms": "15000"}
    producer = Producer(settings)
    failures: list[str] = []

    def report(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(err.str())
            return
        print(f"scheduled {msg.topic()}:{msg.partition()}:{msg.offset()}")

    count = 0
    try:
        for value in _values(args.value):
            producer.produce(
                topic,
                value=value,
                key=args.key.encode() if args.key is not None else None,
                headers=wire_headers(headers),
                on_delivery=report,
            )
            producer.poll(0)
            count += 1
    except KafkaException as exc:
        raise UsageError(f"cannot produce to {topic}: {exc.args[0].str()}") from None
    remaining = producer.flush(20)
    if failures or remaining:
        reason = failures[0] if failures else f"{remaining} records not acknowledged"
        print(f"delay-bridge: produce to {topic} failed: {reason}", file=sys.stderr)
        return 1
    if args.at is not None:
        print(f"{count} record(s) due at {format_time_ms(parse_time_ms(args.at))}", file=sys.stderr)
    return 0
