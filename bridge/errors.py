"""Every error the bridge raises on purpose derives from :class:`BridgeError`."""

from __future__ import annotations


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


class KafkaError(BridgeError):
    """A Kafka client reported an error the bridge cannot handle locally."""
