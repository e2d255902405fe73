"""What every Kafka client of the bridge (and its test and bench load) does the same way."""

from __future__ import annotations

import logging
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from bridge.config import (
    Config,
    consumer_settings,
    member_instance,
    producer_settings,
    transactional_settings,
)
from bridge.errors import ConfigError
from bridge.message import Headers

QUEUE_FULL_WAIT_S = 0.05


def produce(producer: Producer, topic: str, **fields: Any) -> None:
    """``Producer.produce``, waiting for delivery reports to make room while librdkafka's local
    queue is full. Other refusals (e.g. a record over ``message.max.bytes``) raise
    KafkaException, the caller's to handle per record: a value the client cannot take at all is
    one too (``_INVALID_ARG``), never an error that ends the caller's loop."""
    produce_fields(producer, topic, fields)


def produce_fields(producer: Producer, topic: str, fields: dict[str, Any]) -> None:
    """:func:`produce` with its keyword arguments in a dict: the egress makes it once per record
    and hands it down as it is (unpacked and packed again at each call, it cost 1.8 µs a record,
    as much as the client's own ``produce``)."""
    while True:  # one pass in the common case (try costs nothing until something raises)
        try:
            producer.produce(topic, **fields)
            return
        except BufferError:
            producer.poll(QUEUE_FULL_WAIT_S)
        except KafkaException:
            raise
        except Exception as exc:
            raise _refused(exc) from exc


def _refused(exc: Exception) -> KafkaException:
    """A value the client cannot take at all, as a refusal of the record (``_INVALID_ARG``)."""
    return KafkaException(KafkaError(KafkaError._INVALID_ARG, f"{type(exc).__name__}: {exc}"))


def headers_of(msg: Message) -> Headers:
    """A consumed message's headers as a list (the client returns None for none)."""
    return cast(Headers, list(msg.headers() or []))


def check_settings(config: Config) -> None:
    """Build (without starting) every Kafka client the bridge would, so that what librdkafka
    rejects — an unknown property, a bad value — stops start-up (and ``check-config``) with one
    line naming the config key, not a traceback from deep inside ``run``."""
    clients = [
        ("consumer", consumer_settings(config, instance=member_instance(config, config.http.port))),
        ("producer", producer_settings(config)),
    ]
    if config.egress.exactly_once:  # the shards' producers: transaction.timeout.ms too
        clients.append(("producer", transactional_settings(config, "check")))
    for role, settings in clients:
        message = _refusal(role, settings)
        if message is not None:
            raise ConfigError(f"{_culprit(config, role, settings, message)}: {message}")


# librdkafka's warnings while a client is only built (CONFWARN …) are not the bridge's to print.
_QUIET = logging.getLogger("librdkafka.check")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def _refusal(role: str, settings: dict[str, str]) -> str | None:
    """What librdkafka says when building a ``role`` client from ``settings``, or None."""
    try:
        client = (Consumer if role == "consumer" else Producer)({**settings, "logger": _QUIET})
    except KafkaException as exc:
        return str(exc.args[0].str() if exc.args else exc)
    if isinstance(client, Consumer):
        client.close()
    return None


def _culprit(config: Config, role: str, settings: dict[str, str], message: str) -> str:
    """The config key behind librdkafka's refusal: one its message names, else the one without
    which the client builds (librdkafka names an alias by its canonical name, and a property can
    fail only beside another, so the message alone cannot always say)."""
    given = [
        (section, key)
        for section in (role, "common")
        for key in getattr(config.kafka, section)
        if not key.endswith("_file")
    ]
    for section, key in sorted(given, key=lambda sk: -len(sk[1])):
        if key in message:
            return f"kafka.{section}.{key}"
    for section, key in given:
        if _refusal(role, {k: v for k, v in settings.items() if k != key}) is None:
            return f"kafka.{section}.{key}"
    return f"kafka.{role}"
