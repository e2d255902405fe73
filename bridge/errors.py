"""Every error the bridge raises on purpose derives from :class:`BridgeError`."""

from __future__ import annotations

from confluent_kafka import KafkaError as _ClientError
from confluent_kafka import Message


class BridgeError(Exception):
    """Root of the bridge's own errors."""


class ConfigError(BridgeError):
    """The configuration is invalid; the message names the key path."""


class UsageError(BridgeError):
    """A command-line argument is invalid."""


class StoreError(BridgeError):
    """Redis could not be reached or a store script failed."""


class KafkaError(BridgeError):
    """A Kafka client reported an error the bridge cannot handle locally."""


def raise_for_msg_error(msg: Message) -> None:
    """Raise :class:`KafkaError` if a consumed message carries an error (not partition EOF)."""
    error = msg.error()
    if error is None or error.code() == _ClientError._PARTITION_EOF:
        return
    raise KafkaError(f"consumer error: {error}")
