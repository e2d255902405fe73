"""The ``delay-bridge`` command line."""

from bridge.cli.entry import build_parser, main

__all__ = ["build_parser", "main"]
