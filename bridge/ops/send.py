"""Records produced to a delay topic by an operator's tool, each to its partition.

What the command line's ``produce`` and every write (``cancel``, ``fire``, ``reschedule``, single
or bulk) send goes through :func:`send`: it connects before the first record (a record's timestamp
is taken when it is produced, and ``delay-after`` counts from it), says where each record landed,
and paces a bulk write by the bridge applying it (:class:`bridge.ops.bulk.Follow`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bridge.config import Config, producer_settings
from bridge.errors import BridgeError, UsageError
from bridge.kafka import produce
from bridge.message import H_CANCEL, parse_duration_ms, wire_headers
from bridge.ops.bulk import Follow, Outgoing

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message, Producer


@dataclass(frozen=True)
class Placed:
    """Where Kafka took a record: its topic, partition and offset."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}:{self.partition}:{self.offset}"


@dataclass
class Voice:
    """What a tool says beside its result: each note as it comes (kept in :attr:`said`, and
    ``echo``-ed at once: the command line prints it), and its progress on a long run."""

    echo: Callable[[str], None] | None = None
    progress: Callable[[int], None] = lambda count: None
    said: list[str] = field(default_factory=list)

    def __call__(self, note: str) -> None:
        self.said.append(note)
        if self.echo is not None:
            self.echo(note)


@dataclass(frozen=True)
class Sending:
    """How :func:`send` produces: its ``timeout`` (as given: ``10s``), at most ``rate`` records
    acted on a second (a record of several ``delay-cancel`` headers counts each; 0: no limit),
    paced by ``follow`` (the bridge applying them) when one is given; each record's place handed
    to ``placed`` as Kafka acknowledges it."""

    timeout: str = "10s"
    rate: float = 0.0
    follow: Follow | None = None
    placed: Callable[[Placed], None] | None = None

    @property
    def timeout_ms(self) -> int:
        try:
            return parse_duration_ms(self.timeout)
        except ValueError as exc:
            raise UsageError(f"--timeout: {exc}") from None


def _connected(
    config: Config, topic: str, how: Sending, voice: Voice, target: str | None
) -> Producer:
    """A producer that reached ``topic``'s leaders (a record's timestamp is taken when it is
    produced, and ``delay-after`` counts from it); ``voice`` warns when ``target`` is missing."""
    from confluent_kafka import KafkaException, Producer

    timeout_s = how.timeout_ms / 1000
    errors: list[str] = []
    quiet = logging.getLogger("librdkafka.cli")
    quiet.propagate = False  # librdkafka's own lines would repeat every reconnect
    settings = {
        **producer_settings(config),
        "delivery.timeout.ms": str(how.timeout_ms),
        "logger": quiet,
        "error_cb": lambda err: errors.append(err.str()),
    }
    producer = Producer(settings)
    try:
        topic_meta = producer.list_topics(topic, timeout=timeout_s).topics[topic]
    except KafkaException as exc:
        last = errors[-1] if errors else exc.args[0].str()
        raise BridgeError(
            f"cannot reach Kafka at {config.kafka.bootstrap_servers} within {how.timeout}: {last}"
        ) from None
    if topic_meta.error is not None:
        raise BridgeError(f"cannot produce to {topic}: {topic_meta.error.str()}")
    if target is not None:
        with contextlib.suppress(KafkaException):  # the warning is a courtesy, never a failure
            meta = producer.list_topics(target, timeout=timeout_s).topics.get(target)
            if meta is None or meta.error is not None:
                voice(
                    f"warning: target topic {target} does not exist (yet): if it is still "
                    "missing when the records fall due, the bridge dead-letters them as "
                    "delivery-failed"
                )
    return producer


def send(
    config: Config,
    topic: str,
    records: Iterator[Outgoing],
    how: Sending,
    voice: Voice,
    *,
    target: str | None = None,
) -> int:
    """Produce ``records`` to ``topic`` (each to its partition, or by its key when None; the
    first one is taken, and so checked, before connecting) as ``how`` says; ``voice`` warns when
    the records' ``target`` topic does not exist. Returns how many were produced."""
    from confluent_kafka import KafkaException

    timeout_ms = how.timeout_ms
    first = next(records, None)
    if first is None:
        return 0
    producer = _connected(config, topic, how, voice, target)
    failures: list[str] = []

    def report(acted: int, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failures.append(err.str())
            return
        if how.follow is not None:
            how.follow.acknowledged(msg.partition() or 0, msg.offset() or 0, acted)
        if how.placed is not None:
            how.placed(Placed(topic, msg.partition() or 0, msg.offset() or 0))

    count, acted, started = 0, 0, time.monotonic()
    record: Outgoing | None = first
    try:
        while record is not None:
            key, value, headers, partition = record
            fields = {} if partition is None else {"partition": partition}
            acts = sum(1 for name, _ in headers if name == H_CANCEL) or 1
            produce(
                producer,
                topic,
                value=value,
                key=key,
                headers=wire_headers(headers),
                on_delivery=functools.partial(report, acts),
                **fields,
            )
            producer.poll(0)
            count += 1
            acted += acts
            if how.follow is not None:
                how.follow.sent(acts)
                how.follow.wait(producer.poll)
            if how.rate and (ahead := acted / how.rate - (time.monotonic() - started)) > 0:
                producer.poll(ahead)  # serves delivery reports while it paces
            record = next(records, None)
    except KafkaException as exc:
        raise BridgeError(f"cannot produce to {topic}: {exc.args[0].str()}") from None
    remaining = producer.flush(timeout_ms / 1000 + 1)
    if failures or remaining:
        reason = failures[0] if failures else f"{remaining} records not acknowledged"
        raise BridgeError(f"produce to {topic} failed: {reason}")
    return count
