"""Rejected delay-topic records sent to the DLQ with their reason, acknowledged before going on."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from confluent_kafka import KafkaError as ClientError
from confluent_kafka import KafkaException, Message, Producer

from bridge.errors import KafkaError
from bridge.health import Readiness
from bridge.ingress.batch import coords
from bridge.kafka import headers_of, produce
from bridge.message import Headers, Rejected, Rules, dead_letter_headers, origin, wire_headers
from bridge.metrics import Metrics

logger = logging.getLogger(__name__)

DLQ_FLUSH_TIMEOUT_S = 30.0


class DeadLetters:
    """The ingress's DLQ producer: a batch's rejected records go out, and Kafka acknowledges
    them, before the batch's valid records are stored (else the batch is read again)."""

    def __init__(
        self, producer: Producer, rules: Rules, metrics: Metrics, readiness: Readiness
    ) -> None:
        self.producer = producer
        self.rules = rules
        self.metrics = metrics
        self.readiness = readiness

    def send(self, rejected: list[tuple[Message, Rejected]]) -> None:
        """Dead-letter these records and wait for Kafka to take them; raise
        :class:`KafkaError` if it does not."""
        errors: list[str] = []

        def report(err: ClientError | None, _msg: Message) -> None:
            if err is not None:
                errors.append(err.str())

        for msg, rejection in rejected:
            where = origin(*coords(msg))
            logger.info("dead-lettering %s: %s", where, rejection, extra={"origin": where})
            headers = dead_letter_headers(
                headers_of(msg), rejection.reason, rejection.detail, where
            )
            self._produce(msg.key(), msg.value(), headers, report)
        remaining = self.producer.flush(DLQ_FLUSH_TIMEOUT_S)
        if remaining or errors:
            self.metrics.dlq_errors.inc(len(errors) + remaining)
            detail = (f"DLQ produce to {self.rules.dead_letter} failed: "
                      f"{errors[0] if errors else f'{remaining} unacknowledged'}")  # fmt: skip
            self.readiness.fail("dlq-writes", detail)
            raise KafkaError(detail)
        self.readiness.ok("dlq-writes")
        for reason, n in Counter(rejection.reason for _, rejection in rejected).items():
            self.metrics.dead_lettered.labels(reason=reason.value).inc(n)

    def _produce(
        self,
        key: str | bytes | None,
        value: str | bytes | None,
        headers: Headers,
        report: Callable[[ClientError | None, Message], None],
    ) -> None:
        topic = self.rules.dead_letter
        try:
            produce(self.producer, topic, value=value, key=key, headers=wire_headers(headers),
                    on_delivery=report)  # fmt: skip
        except KafkaException as exc:
            detail = f"DLQ produce to {topic} failed: {exc.args[0].str()}"
            self.metrics.dlq_errors.inc()
            self.readiness.fail("dlq-writes", detail)
            raise KafkaError(detail) from exc
        self.producer.poll(0)

    def flush(self) -> None:
        """Wait for what is still on its way to the DLQ (shutdown)."""
        self.producer.flush(DLQ_FLUSH_TIMEOUT_S)
