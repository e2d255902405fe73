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
