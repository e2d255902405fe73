"""Argument values the commands share, read with one line of error naming the flag."""

from __future__ import annotations

import argparse

from bridge.errors import UsageError
from bridge.message import cut, parse_count


def count(text: str) -> int:
    """An argparse type: a whole number in ASCII digits (``int()`` would take ``٣``)."""
    value = parse_count(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{cut(text, 40)!r}: a whole number, 0 or more")
    return value


FILTERS = ("--target", "--key-prefix", "--due-after", "--due-before")
# A bulk command's records a second at most by default: none. It follows the bridge instead
# (bridge.ops.Follow): the records other producers send to those partitions meanwhile wait
# behind no more than bridge.ops.AHEAD of its records.
DEFAULT_RATE = 0.0


def given_filters(args: argparse.Namespace) -> list[str]:
    """The bulk filters given (``--topic`` aside: it goes with ``--id`` too)."""
    return [f for f in FILTERS if getattr(args, f.lstrip("-").replace("-", "_")) is not None]


def refuse_filters(args: argparse.Namespace) -> None:
    """With ``--id``: no filter, no ``--dry-run`` or ``--yes``."""
    acts = [f for f in ("--dry-run", "--yes") if getattr(args, f[2:].replace("-", "_"))]
    extra = given_filters(args) + acts
    if extra:
        raise UsageError(f"{extra[0]}: not with --id")
