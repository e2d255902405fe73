"""When the delay-topic consumer is started again, and why.

librdkafka can leave a partition fetched from no broker for good (bridge.health.FetchWatch): a new
client reads it from its leader. And it fails a consumer for good when Kafka fences its static
membership: after a session lost while the broker answered, its commit of the lost assignment
carries no member id and the instance id's new one fences it; or another consumer runs with its
instance id. Started again, a static member takes its partitions back at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError

from bridge.errors import KafkaFault

logger = logging.getLogger(__name__)

RESTART_EVERY_S = 60.0  # the consumer is started again for a stuck partition at most this often
FATAL_RESTART_S = 10.0  # and after a fatal error at most this often


class Restarts:
    """The reason the consumer is to be started again before the next batch ("": none)."""

    def __init__(self, new_consumer: Callable[[], Consumer] | None) -> None:
        # How a consumer is made again (None: never started again; a fatal error stops the
        # ingress).
        self.new_consumer = new_consumer
        self.why = ""
        self._next = 0.0
        self._next_fatal = 0.0

    def soon(self, why: str) -> None:
        """Start it again for ``why``, unless it was for a stuck partition within a minute."""
        if self.new_consumer is not None and time.monotonic() >= self._next:
            self.why = why

    def failed(self, error: KafkaError) -> None:
        """librdkafka failed the consumer for good (see the module's text); a second replica
        with the same instance id would fence it again: at most every FATAL_RESTART_S."""
        if self.new_consumer is None:
            raise KafkaFault(f"fatal consumer error: {error}")
        if self.why or time.monotonic() < self._next_fatal:
            return
        logger.error(
            "the delay-topic consumer failed: %s; starting it again (if another replica runs "
            "with the same kafka.group_instance_id, give each its own)",
            error.str(),
        )
        self._next_fatal = time.monotonic() + FATAL_RESTART_S
        self.why = "it failed fatally"

    def take(self) -> str:
        """The reason, now acted on."""
        why, self.why = self.why, ""
        self._next = time.monotonic() + RESTART_EVERY_S
        return why
