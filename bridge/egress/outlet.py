"""Where the egress's records leave by.

A producer as is (at-least-once), or a shard's Kafka transaction (exactly once,
:mod:`.transactions`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from confluent_kafka import KafkaError, Message, Producer

from bridge.egress.failures import Ident, InFlight
from bridge.kafka import produce

# A record's delivery report: Kafka's error, and the record as Kafka took it (None: not taken).
Report = Callable[[KafkaError | None, Message | None], None]


class Outlet(Protocol):
    # Records unacknowledged at shutdown stay leased for the next owner, who reconciles them
    # with the journal (their transaction may yet commit): not released.
    exactly_once: bool

    def send(
        self, ident: Ident, inflight: InFlight, topic: str, report: Report, **fields: Any
    ) -> None:
        """Produce a claimed record; ``report`` is called with its delivery report. Raises
        KafkaException if it is refused at once (too large)."""

    def poll(self, timeout_s: float) -> None:
        """Serve delivery reports, waiting up to ``timeout_s`` for the first."""

    def flush(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the delivery reports of every record sent."""

    def stop(self) -> None:
        """No more records are sent (shutdown, after the last flush)."""


class Direct:
    """At-least-once: records go out through the producer, reported when Kafka has them."""

    exactly_once = False

    def __init__(self, producer: Producer) -> None:
        self.producer = producer

    def send(
        self, ident: Ident, inflight: InFlight, topic: str, report: Report, **fields: Any
    ) -> None:
        produce(self.producer, topic, on_delivery=report, **fields)

    def poll(self, timeout_s: float) -> None:
        self.producer.poll(timeout_s)

    def flush(self, timeout_s: float) -> None:
        self.producer.flush(timeout_s)

    def stop(self) -> None:
        pass
