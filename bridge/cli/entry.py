"""The ``delay-bridge`` command line: arguments parsed, a subcommand run, errors in one line.

Subcommands: run, check-config, produce, cancel, fire, reschedule, status, list, trace, dlq
replay, dlq list, --version.

User errors (bad config, bad arguments, unreachable services) print one line on stderr and exit
with code 2 (1 for a failed run); never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from bridge import __version__, ops
from bridge.cli.args import count
from bridge.cli.records import produce_command, write_command
from bridge.config import Config, dump, load
from bridge.errors import BridgeError, ConfigError, UsageError
from bridge.kafka import check_settings
from bridge.message import wall_ms

EXIT_USAGE = 2
EXIT_BROKEN_PIPE = 141  # what a shell reports for a process ended by SIGPIPE


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def with_filters(p: argparse.ArgumentParser) -> None:
    """The bulk form's filters, instead of ``--id``."""
    bulk = p.add_argument_group(
        "bulk", "instead of --id: every waiting record all the filters given match"
    )
    bulk.add_argument("--target", help="bound for this target topic")
    bulk.add_argument("--key-prefix", help="whose key starts with this")
    bulk.add_argument("--due-after", help="due at or after: a time or a duration from now")
    bulk.add_argument("--due-before", help="due before: a time or a duration from now (1h)")
    act = bulk.add_mutually_exclusive_group()
    act.add_argument("--dry-run", action="store_true", help="count the matches per partition")
    act.add_argument("--yes", action="store_true", help="act on them")
    bulk.add_argument(
        "--operation",
        metavar="ID",
        help="the operation's id, carried on what it produces: run again or resumed, it passes "
        "over the records it made (default: a hash of the command as given)",
    )
    bulk.add_argument(
        "--rate",
        type=float,
        default=ops.DEFAULT_RATE,
        help="records produced a second at most (0, the default: no limit); either way at most "
        f"{ops.AHEAD:,} are produced ahead of what the bridge applied, as other producers' records "
        "wait behind them",
    )


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
    produce.add_argument(
        "--target", help="topic to deliver to (default: topics.default_target of the delay topic)"
    )
    when = produce.add_mutually_exclusive_group()
    when.add_argument(
        "--after", help="delay from now: 250ms, 30s, 15m, 2h, 7d, 1h30m (a schedule's start)"
    )
    when.add_argument(
        "--at", help="due time: epoch ms or RFC 3339 (2026-11-21T10:00:00Z) (a schedule's start)"
    )
    recurring = produce.add_mutually_exclusive_group()
    recurring.add_argument(
        "--cron", help="a recurring schedule: five cron fields ('0 9 * * 1-5') or @daily, …"
    )
    recurring.add_argument("--every", help="a recurring schedule: every 30s, 5m, 1h30m, …")
    produce.add_argument("--tz", help="the time zone of --cron (IANA, default UTC)")
    produce.add_argument("--until", help="a schedule's end: epoch ms or RFC 3339")
    produce.add_argument("--count", help="a schedule's occurrences at most")
    produce.add_argument(
        "--missed", help="a schedule's missed occurrences: latest (default), all, skip"
    )
    produce.add_argument("--key", help="record key")
    produce.add_argument("--target-key", help="key of the delivered record (default: --key)")
    produce.add_argument("--id", help="delay-id: the schedule's id (1-256 bytes of UTF-8)")
    produce.add_argument(
        "--priority", help="who goes first among records due together: high, normal (default), low"
    )
    produce.add_argument(
        "--timeout", default="10s", help="how long to try reaching Kafka and delivering (10s)"
    )
    produce.add_argument(
        "--header", action="append", default=[], metavar="K=V", help="extra header (repeatable)"
    )
    produce.add_argument("--topic", help="delay topic to produce to (default: the first in config)")
    produce.add_argument(
        "value", nargs="?", default="-", help="record value; - (default) reads one record per line"
    )
    schedules = sub.add_parser(
        "schedules", help="list the recurring schedules, or pause or resume one"
    )
    schedules_sub = schedules.add_subparsers(dest="schedules_command", required=True)
    listed_schedules = schedules_sub.add_parser(
        "list", help="each live schedule with its next three occurrences, in its zone and UTC"
    )
    with_config(listed_schedules)
    listed_schedules.add_argument("--topic", help="a delay topic (default: every one)")
    listed_schedules.add_argument(
        "--limit", type=count, default=100, help="show at most this many (100)"
    )
    listed_schedules.add_argument("--json", action="store_true", help="JSON for scripts")
    for verb in ("pause", "resume"):
        held = schedules_sub.add_parser(verb, help=f"{verb} the recurring schedule with --id")
        with_config(held)
        held.add_argument("--id", required=True, help="the schedule's delay-id")
        held.add_argument("--topic", help="delay topic (default: the first in config)")
        held.add_argument(
            "--key",
            help="key to send it with when the schedule is not found (its partition: where the "
            "schedule's own key maps)",
        )
        held.add_argument(
            "--timeout", default="10s", help="how long to try reaching Kafka and delivering (10s)"
        )
    cancel = sub.add_parser(
        "cancel", help="cancel a waiting record by its delay-id, or every one a filter matches"
    )
    with_config(cancel)
    cancel.add_argument("--id", help="delay-id of the record to cancel")
    cancel.add_argument(
        "--key",
        help="key of the cancel record (default: the key of the record "
        "it cancels; on an etf1 topic the key is the delay-id)",
    )
    cancel.add_argument("--topic", help="delay topic to produce to (default: the first in config)")
    cancel.add_argument(
        "--force",
        action="store_true",
        help="produce it even when the id waits "
        "nowhere (a record still on its way in), to --key's partition",
    )
    cancel.add_argument(
        "--timeout", default="10s", help="how long to try reaching Kafka and delivering (10s)"
    )
    with_filters(cancel)
    fire = sub.add_parser(
        "fire", help="deliver now a waiting record by its delay-id, or every one a filter matches"
    )
    reschedule = sub.add_parser(
        "reschedule", help="move the due time of a record by its delay-id, or of every match"
    )
    for command in (fire, reschedule):
        with_config(command)
        command.add_argument("--id", help="delay-id of the record")
        command.add_argument(
            "--topic",
            help="delay topic (default: the first in config; with a filter: every delay topic)",
        )
        command.add_argument(
            "--timeout", default="10s", help="how long to try reaching Kafka (10s)"
        )
        with_filters(command)
    moved = reschedule.add_mutually_exclusive_group(required=True)
    moved.add_argument("--at", help="the new due time: a time, or a duration from now")
    moved.add_argument("--after", help="due this long from now: 30m, 2h")
    moved.add_argument("--shift", help="each due time moved by this: 1h, or =-30m (earlier)")
    status = sub.add_parser(
        "status",
        help="per delay-topic partition: what waits, is overdue, "
        "in flight; offsets and lag (reads only)",
    )
    with_config(status)
    status.add_argument("--json", action="store_true", help="JSON for scripts")
    listing = sub.add_parser("list", help="waiting records in due order (reads only)")
    with_config(listing)
    listing.add_argument("--topic", help="one delay topic (default: all of topics.delay)")
    listing.add_argument("--partition", type=count, help="one partition")
    listing.add_argument("--id", help="the record with this delay-id")
    listing.add_argument(
        "--due-before",
        help="only records due before: epoch ms, RFC 3339 or a duration from now (1h; =-30m)",
    )
    listing.add_argument("--limit", type=count, default=20, help="at most this many (20)")
    listing.add_argument(
        "--skip", type=count, default=0, help="after the first this many (a page: --skip 20)"
    )
    listing.add_argument("--json", action="store_true", help="JSON for scripts")
    tracing = sub.add_parser(
        "trace", help="a record's whole life: waiting, delivered, cancelled… (reads only)"
    )
    with_config(tracing)
    which = tracing.add_mutually_exclusive_group(required=True)
    which.add_argument("--id", help="the record's delay-id")
    which.add_argument("--origin", help="the record's place: TOPIC:PARTITION:OFFSET")
    tracing.add_argument("--topic", help="the delay topic of --id (default: all of topics.delay)")
    tracing.add_argument(
        "--since",
        help="for an --id no longer waiting: read the journal from (epoch ms, RFC 3339, or a "
        "duration back from now such as 7d; default 1d)",
    )
    tracing.add_argument("--json", action="store_true", help="JSON for scripts")
    dlq = sub.add_parser("dlq", help="the dead-letter topic")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, parser_class=_Parser)
    again = dlq_sub.add_parser(
        "replay",
        help="send dead-lettered records back to their delay "
        "topic, to be validated and scheduled again",
    )
    with_config(again)
    again.add_argument(
        "--reason",
        action="append",
        default=[],
        metavar="R",
        help="only this delay-error (repeatable), e.g. delivery-failed",
    )
    again.add_argument(
        "--since",
        help="only records dead-lettered at or after: epoch ms, RFC 3339 or a duration back "
        "from now (2h)",
    )
    again.add_argument(
        "--until",
        help="only records dead-lettered before: epoch ms, RFC 3339 or a duration back from now",
    )
    again.add_argument("--limit", type=count, help="replay at most this many")
    again.add_argument(
        "--from-beginning",
        action="store_true",
        help="read the whole DLQ, not from where the last replay stopped "
        "(with filters: what earlier filtered runs passed over)",
    )
    again.add_argument(
        "--dry-run",
        action="store_true",
        help="count what would be replayed; produce and commit nothing",
    )
    listed = dlq_sub.add_parser(
        "list", help="dead-lettered records with their reasons and details (reads only)"
    )
    with_config(listed)
    listed.add_argument(
        "--reason",
        action="append",
        default=[],
        metavar="R",
        help="only this delay-error (repeatable), e.g. expired",
    )
    listed.add_argument(
        "--since", help="only records dead-lettered at or after: a time or a duration back (2h)"
    )
    listed.add_argument("--until", help="only records dead-lettered before: likewise")
    listed.add_argument("--limit", type=count, default=20, help="show at most this many (20)")
    listed.add_argument("--json", action="store_true", help="JSON for scripts")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "produce":
            return produce_command(args, load(args.config))
        if args.command == "schedules" and args.schedules_command == "list":
            return _schedules(args, load(args.config))
        if args.command == "schedules":
            return write_command(args.schedules_command, args, load(args.config))
        if args.command in ("cancel", "fire", "reschedule"):
            return write_command(args.command, args, load(args.config))
        if args.command == "status":
            return _status(args, load(args.config))
        if args.command == "list":
            return _list(args, load(args.config))
        if args.command == "dlq" and args.dlq_command == "list":
            return _dlq_list(args, load(args.config))
        if args.command == "dlq":
            return write_command("replay", args, load(args.config))
        if args.command == "trace":
            return _trace(args, load(args.config))
        loaded = load(args.config)
        check_settings(loaded)
        if args.command == "check-config":
            sys.stdout.write(dump(loaded))
            return 0
        return _run(loaded)
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
    except BrokenPipeError:  # `status | head`: the reader has what it wanted
        # Python would flush stdout again at exit and complain; point it at nothing instead.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _status(args: argparse.Namespace, config: Config) -> int:
    answer = ops.status_answer(config, ops.StatusAsk(), wall_ms())
    if args.json:
        return _said(answer)
    ops.print_status(answer.now_ms, answer.rows)
    return 0


def _list(args: argparse.Namespace, config: Config) -> int:
    ask = ops.ListAsk(args.topic, args.partition, args.id, args.due_before, args.limit, args.skip)
    answer = ops.list_answer(config, ask, wall_ms())
    if args.json:
        return _said(answer)
    ops.print_waiting(answer.records, answer.total, answer.skip)
    return 0


def _schedules(args: argparse.Namespace, config: Config) -> int:
    answer = ops.schedules_answer(config, ops.SchedulesAsk(args.topic, args.limit), wall_ms())
    if args.json:
        return _said(answer)
    for row in answer.rows:
        print("\n".join(row.lines()))
    for note in answer.notes:
        print(f"delay-bridge: {note}", file=sys.stderr)
    return 0 if answer.found else 1


def _trace(args: argparse.Namespace, config: Config) -> int:
    answer = ops.trace_answer(
        config, ops.TraceAsk(args.id, args.origin, args.topic, args.since), wall_ms()
    )
    if args.json:
        return _said(answer)
    ops.print_trace(answer.traced)
    for note in answer.notes:
        print(f"delay-bridge: {note}", file=sys.stderr)
    return 0 if answer.found else 1


def _dlq_ask(args: argparse.Namespace) -> ops.DlqAsk:
    return ops.DlqAsk(tuple(args.reason), args.since, args.until, args.limit)


def _dlq_list(args: argparse.Namespace, config: Config) -> int:
    answer = ops.dlq_answer(config, _dlq_ask(args), wall_ms())
    if args.json:
        return _said(answer)
    ops.print_listing(answer.listing)
    return 0


def _said(answer: ops.Answer) -> int:
    """``--json``: the answer on stdout, its notes on stderr; the exit code (1: nothing found)."""
    print(json.dumps(answer.json, indent=2))
    for note in answer.notes:
        print(note if answer.found else f"delay-bridge: {note}", file=sys.stderr)
    return 0 if answer.found else 1


def _run(config: Config) -> int:
    from bridge.console import Console
    from bridge.logs import setup
    from bridge.service import Service

    setup(config.logging.level, config.logging.json)
    service = Service(config)
    if config.http.console.enabled:
        service.http.console = Console(config)
    service.install_signal_handlers()
    return service.run()
