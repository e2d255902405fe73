"""Every error the bridge raises on purpose derives from :class:`BridgeError`."""

from __future__ import annotations

import logging
from collections.abc import Mapping


class BridgeError(Exception):
    """Root of the bridge's own errors."""


class ConfigError(BridgeError):
    """The configuration is invalid; the message names the key path."""


class UsageError(BridgeError):
    """A command-line argument is invalid."""


class StoreError(BridgeError):
    """Redis could not be reached or a store script failed."""


class WriteRefused(StoreError):
    """Redis answered but refused to write: out of memory, or a read-only replica."""


class KafkaFault(BridgeError):
    """A Kafka client reported an error the bridge cannot handle locally."""


def log_failed_turn(
    logger: logging.Logger,
    exc: Exception,
    message: str,
    *args: object,
    level: int = logging.ERROR,
    extra: Mapping[str, object] | None = None,
) -> None:
    """Log a turn of a main loop that failed and is tried again: a fault the loop expects (a
    :class:`BridgeError`: Redis or Kafka away) in one line, anything else — a bug, a value
    nobody foresaw — with its traceback. Either way the loop goes on: no value takes the process
    down. ``message`` is a %-format of ``args``."""
    logger.log(
        level, message, *args, exc_info=None if isinstance(exc, BridgeError) else exc, extra=extra
    )
