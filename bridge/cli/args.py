"""Argument values the commands share, read with one line of error naming the flag."""

from __future__ import annotations

import argparse

from bridge.errors import UsageError
from bridge.message import parse_when


def when_arg(flag: str, text: str | None, now_ms: int, *, ago: bool = False) -> int | None:
    """A command-line time (see :func:`bridge.message.parse_when`); None when the flag is not
    given."""
    if text is None:
        return None
    try:
        return parse_when(text, now_ms, ago=ago)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


FILTERS = ("--target", "--key-prefix", "--due-after", "--due-before")
# A bulk command's records a second by default: the bridge applies them in line with what other
# producers send meanwhile (the same partitions), and applies cancels at ~7,000-8,000/s beside a
# 2,000/s load. At 5,000/s that load's ack p99 stayed 34 ms; at 10,000/s it was 2.5 s, unpaced
# 3.2 s (100,000 cancels: docs/bench/history.md).
DEFAULT_RATE = 5000.0


def given_filters(args: argparse.Namespace) -> list[str]:
    """The bulk filters given (``--topic`` aside: it goes with ``--id`` too)."""
    return [f for f in FILTERS if getattr(args, f.lstrip("-").replace("-", "_")) is not None]


def refuse_filters(args: argparse.Namespace) -> None:
    """With ``--id``: no filter, no ``--dry-run`` or ``--yes``."""
    acts = [f for f in ("--dry-run", "--yes") if getattr(args, f[2:].replace("-", "_"))]
    extra = given_filters(args) + acts
    if extra:
        raise UsageError(f"{extra[0]}: not with --id")
