"""The ``delay-bridge`` command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bridge import __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for every sub-command."""
    parser = argparse.ArgumentParser(prog="delay-bridge", description=__doc__)
    parser.add_argument("--version", action="version", version=f"delay-bridge {__version__}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    build_parser().parse_args(argv)
    return 0
