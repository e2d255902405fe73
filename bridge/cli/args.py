"""Argument values the commands share, read with one line of error naming the flag."""

from __future__ import annotations

import argparse

from bridge.message import cut, parse_count


def count(text: str) -> int:
    """An argparse type: a whole number in ASCII digits (``int()`` would take ``٣``)."""
    value = parse_count(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"{cut(text, 40)!r}: a whole number, 0 or more")
    return value


# A bulk command's records a second at most by default: none. It follows the bridge instead
# (bridge.ops.Follow): the records other producers send to those partitions meanwhile wait
# behind no more than bridge.ops.AHEAD of its records.
DEFAULT_RATE = 0.0
